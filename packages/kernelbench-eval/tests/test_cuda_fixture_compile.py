"""The CUDA fixture solutions (tests/fixtures/solutions_cuda, used by bin/gpu-check-kbeval.sh)
compile with nvcc on a machine without a GPU.

Default: every ``.cu`` unit is compiled by nvcc with the sandbox's own CUDA flags (the honest and
the incorrect ones build, the broken one does not): seconds. ``KBEVAL_FULL_CUDA_BUILD=1`` also
runs the sandbox's complete build (bindings, precompiled prelude, link) of every candidate on the
cuda backend (about 80 s on 2 cores)."""

import os
import subprocess
from pathlib import Path

import pytest

from cuda_agent.kernelbench_eval.solutions import import_solutions, scan_dir
from cuda_agent.kernelbench_eval.tree import iter_problems
from cuda_agent.records import Task

FIX = Path(__file__).parent / "fixtures"
HONEST_OR_INCORRECT = [(1, 1), (1, 2), (2, 1)]
BROKEN = (2, 2)


def _nvcc() -> str | None:
    from cuda_agent.sandbox.toolchain import nvcc

    return nvcc()


def _candidates():
    tasks = [t for t in iter_problems(FIX) if isinstance(t, Task)]
    found, bad = scan_dir(FIX / "solutions_cuda")
    assert not bad
    rep = import_solutions(tasks, found)
    return {(c.task.level, c.task.problem_id): c for c in rep.candidates}


def test_cuda_fixture_tree_pairs_like_the_cpu_one():
    cands = _candidates()
    assert set(cands) == {(1, 1), (1, 2), (2, 1), (2, 2), (3, 1)}
    for key in [*HONEST_OR_INCORRECT, BROKEN]:
        assert any(f.endswith(".cu") for f in cands[key].solution.files), key
    assert cands[(3, 1)].solution.format == "kernelbench"


@pytest.mark.skipif(_nvcc() is None, reason="nvcc not found")
def test_cuda_fixture_kernels_compile_with_sandbox_flags(tmp_path):
    from cuda_agent.sandbox.toolchain import flags_for

    flags = flags_for("cuda")
    cands = _candidates()
    rc = {}
    for key in [*HONEST_OR_INCORRECT, BROKEN]:
        for name, src in cands[key].solution.files.items():
            if not name.endswith(".cu"):
                continue
            p = tmp_path / f"{key[0]}_{key[1]}_{Path(name).name}"
            p.write_text(src)
            cmd = [flags.nvcc, *flags.cuda_cflags, "-c", str(p), "-o", str(p) + ".o"]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            rc[key] = (r.returncode, r.stderr[-2000:])
    for key in HONEST_OR_INCORRECT:
        assert rc[key][0] == 0, (key, rc[key][1])
    assert rc[BROKEN][0] != 0 and "error" in rc[BROKEN][1]


@pytest.mark.slow
@pytest.mark.skipif(
    _nvcc() is None or os.environ.get("KBEVAL_FULL_CUDA_BUILD") != "1",
    reason="needs nvcc and KBEVAL_FULL_CUDA_BUILD=1 (about 80 s)",
)
def test_cuda_fixture_solutions_build_in_sandbox(tmp_path):
    from cuda_agent.sandbox.build import ObjectCache, build_workdir
    from cuda_agent.sandbox.workspace import materialise

    cands = _candidates()
    cache = ObjectCache(tmp_path / "cache")
    built = {}
    for key in [*HONEST_OR_INCORRECT, BROKEN]:
        c = cands[key]
        w = materialise(c.task, c.solution, tmp_path / f"w{key[0]}_{key[1]}", "cuda")
        built[key] = build_workdir(
            w, w / "build", backend="cuda", cache=cache, jobs=2, timeout_s=900
        )
    for key in HONEST_OR_INCORRECT:
        assert built[key].ok, (key, built[key].log[-3000:])
    assert not built[BROKEN].ok and "scale_add_tanh.cu" in built[BROKEN].log
    # each module (linked against stand-ins of torch's libraries) loads with every symbol bound
    # to the real libraries, GPU or not
    import sys

    probe = (
        "import importlib.util, sys, torch\n"
        "s = importlib.util.spec_from_file_location('cuda_extension', sys.argv[1])\n"
        "s.loader.exec_module(importlib.util.module_from_spec(s)); print('bound')\n"
    )
    for key in HONEST_OR_INCORRECT:
        assert built[key].link_stubs or built[key].cached, key
        r = subprocess.run(
            [sys.executable, "-c", probe, str(built[key].so_path)],
            capture_output=True,
            text=True,
            env={**os.environ, "LD_BIND_NOW": "1"},
            timeout=300,
        )
        assert r.returncode == 0 and "bound" in r.stdout, (key, r.stderr[-3000:])
