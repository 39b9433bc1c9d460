"""Failures of the sandbox's own making are ``infra_error``, never a silent pass or the
candidate's fault: a cache the unprivileged user cannot reach (found on the H200: a private
``--cache-dir`` made every KernelBench build go unseen), our code failing in the compile process,
a verify process failing before it imports the candidate's module."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cuda_agent.records import Status
from cuda_agent.records.jsonl import encode
from cuda_agent.sandbox.config import SandboxConfig
from cuda_agent.sandbox.evaluate import prepare, unreachable_parent
from cuda_agent.sandbox.isolation import caps

from .conftest import kb_candidate

needs_drop_user = pytest.mark.skipif(
    not caps().drop_user, reason="needs root that can drop to an unprivileged uid"
)

# builds nothing: the compile process fails before (or would import plain torch code)
KB_WITH_LOAD_INLINE = (
    "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
    "class ModelNew(nn.Module):\n"
    "    def __init__(self, *args):\n        super().__init__()\n"
    "    def forward(self, x, y):\n        return x * 2.0 + y\n"
)


def _private(path):
    path.mkdir()
    path.chmod(0o700)
    return path


def test_unreachable_parent_names_the_directory_that_blocks_the_path(tmp_path):
    blocked = _private(tmp_path / "private")
    target = blocked / "cache"
    assert unreachable_parent(target) == blocked
    blocked.chmod(0o711)
    # no longer the blocker (pytest's own 0700 ancestors may still be)
    assert unreachable_parent(target) != blocked


@needs_drop_user
def test_eval_refuses_a_cache_dir_the_sandbox_user_cannot_reach(tmp_path, scale_add_task):
    blocked = _private(tmp_path / "private")
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(encode(kb_candidate(scale_add_task, KB_WITH_LOAD_INLINE)))
    out = subprocess.run(
        [sys.executable, "-m", "cuda_agent.sandbox.cli", "eval", str(inp), "--backend", "cpu",
         "--cache-dir", str(blocked / "cache")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert "not reachable" in out.stderr and str(blocked) in out.stderr
    assert out.stdout == ""


@needs_drop_user
def test_our_failure_in_the_compile_process_is_an_infra_error(
    tmp_path, scale_add_task, reach_for_other_users
):
    cache = tmp_path / "cache"
    cache.mkdir()
    reach_for_other_users(cache)  # the cache itself is reachable ...
    hidden = _private(tmp_path / "hidden") / "kb_ext"
    hidden.mkdir()
    os.symlink(hidden, cache / "kb_ext")  # ... its KernelBench build cache is not
    cfg = SandboxConfig(backend="cpu", cache_dir=str(cache), guard_policy="off")
    p = prepare(kb_candidate(scale_add_task, KB_WITH_LOAD_INLINE), cfg, backend="cpu")
    assert p.result is not None, "compile stage passed although its process failed"
    assert p.result.status == Status.INFRA_ERROR
    assert "compile process" in p.result.message and "PermissionError" in p.result.message
    assert p.compile is not None and not p.compile.ok


def _run_candidate_op(tmp_path, ref_src: str | None, model_new: str) -> dict:
    """One real `candidate` op of the runner (unconfined), returning its report."""
    import json

    work = tmp_path / "work"
    work.mkdir()
    (work / "model_new.py").write_text(model_new)
    ref = work / "model.py"
    if ref_src is not None:
        ref.write_text(ref_src)
    spec = {
        "op": "candidate", "device": "cpu", "backend": "cpu", "format": "kernelbench",
        "guard_policy": "off", "ref_path": str(ref), "workdir": str(work),
        "io_dir": str(tmp_path), "trials": [], "report": str(tmp_path / "report.json"),
    }  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    subprocess.run(
        [sys.executable, "-m", "cuda_agent.sandbox.runner", str(tmp_path / "spec.json")],
        capture_output=True, timeout=300, cwd=work,
    )  # fmt: skip
    return json.loads((tmp_path / "report.json").read_text())


def test_a_failure_before_the_candidates_code_is_told_apart(tmp_path, scale_add_task):
    from cuda_agent.sandbox.evaluate import failed_in_setup

    # the sandbox's own set-up fails (its reference file is missing): not the candidate's fault
    setup = _run_candidate_op(_mk(tmp_path / "a"), None, KB_WITH_LOAD_INLINE)
    assert setup["ok"] is False and failed_in_setup(setup), setup
    # the candidate's module raises on import: the candidate's fault
    mine = _run_candidate_op(
        _mk(tmp_path / "b"), scale_add_task.ref_code, "raise RuntimeError('mine')\n"
    )
    assert mine["ok"] is False and mine.get("stage") == "load" and not failed_in_setup(mine)
    assert "mine" in mine["error"]["message"]


def _mk(path):
    path.mkdir()
    return path


OOM_AFTER = """import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.w = nn.Parameter(torch.empty(cols))
        self.b = nn.Parameter(torch.empty(cols))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > CALLS:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB")
        return cuda_extension.run(x, self.w, self.b)
"""


def test_out_of_memory_in_the_guards_probe_is_ours(
    warm_build, cache_dir, scale_add_task, scale_add_files
):
    """Found on the H200: the probe's re-runs after the five trials (a poisoned allocator, the
    re-runs' outputs) ran KernelBench's 6-8 GB problems out of device memory, and honest
    candidates got ``runtime_error``. Out of memory there is the evaluator's (``infra_error``);
    out of memory during a trial stays the candidate's."""
    from cuda_agent.sandbox.evaluate import evaluate

    from .conftest import workdir_candidate

    cfg = SandboxConfig(
        backend="cpu", cache_dir=str(cache_dir), guard_policy="kernelbench", timing=False
    )
    verdicts = {}
    for calls in (5, 2):  # 5: every trial passes, the probe's first re-run fails
        src = OOM_AFTER.replace("CALLS", str(calls))
        c = workdir_candidate(scale_add_task, scale_add_files, **{"model_new.py": src})
        verdicts[calls] = evaluate(c, cfg)
    assert verdicts[5].status == Status.INFRA_ERROR, verdicts[5].message
    assert "guards' probe" in verdicts[5].message and "out of memory" in verdicts[5].message
    assert verdicts[2].status == Status.RUNTIME_ERROR, verdicts[2].message


WIDE_REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(1024, 1024)

    def forward(self, x):
        return self.fc(x)


def get_inputs():
    return [torch.randn(4, 1024)]


def get_init_inputs():
    return []
"""
WIDE_NEW = WIDE_REF.replace("class Model(", "class ModelNew(").replace(
    "return self.fc(x)", "return torch.addmm(self.fc.bias, x, self.fc.weight.t())"
)


def test_the_references_weights_file_has_no_candidate_file_size_cap(cache_dir):
    """Found on the H200: KernelBench L3/2 (ShallowWideMLP, 8.7 GB of weights at today's sizes)
    failed as ``infra_error``: the trusted reference process, which writes the weights file the
    candidate loads, ran under the candidate's file-size limit. Here the limit is 1 MB and the
    weights 4 MB: the reference (and the judge) are not capped, the candidate still is."""
    from cuda_agent.records import Task
    from cuda_agent.sandbox.evaluate import evaluate

    task = Task.make("wide_linear", WIDE_REF)
    cfg = SandboxConfig(backend="cpu", cache_dir=str(cache_dir), guard_policy="off", fsize_mb=1)
    r = evaluate(kb_candidate(task, WIDE_NEW), cfg.with_(timing=False))
    assert r.status == Status.OK, r.message
    # the candidate's own files stay capped: a 4 MB output exceeds its 1 MB
    # (which would otherwise be judged incorrect: a wrong shape)
    big = WIDE_NEW.replace(
        "return torch.addmm(self.fc.bias, x, self.fc.weight.t())", "return torch.zeros(1 << 20)"
    )
    r = evaluate(kb_candidate(task, big), cfg.with_(timing=False))
    assert r.status == Status.RUNTIME_ERROR, (r.status, r.message)
    assert "unexpected pos" in r.message or "iostream" in r.message, r.message  # the write refused
