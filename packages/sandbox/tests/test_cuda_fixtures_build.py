"""The CUDA solutions of the GPU tests of the robust settings (``cuda_cases``) compile with the
sandbox's cuda build, and the CPU half of an evaluation (strict static guards, materialise,
build) readies them for the device; the honest kernel's product is IEEE (``mul.f32``) under the
sandbox's flags, the ftz variant's is ``mul.ftz.f32``. Compile-only: they need nvcc, not a GPU."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from cuda_agent.sandbox import SandboxConfig
from cuda_agent.sandbox.build import ObjectCache, build_workdir
from cuda_agent.sandbox.toolchain import flags_for
from cuda_agent.sandbox.workspace import materialise

from .cuda_cases import CASES, MUL, VARIANTS

needs_nvcc = pytest.mark.skipif(flags_for("cuda").nvcc is None, reason="needs nvcc")


@needs_nvcc
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_fixture_compiles_with_the_sandboxs_cuda_build(name, cache_dir, tmp_path):
    c = CASES[name]()
    work = materialise(c.task, c.solution, tmp_path / "work", "cuda")
    res = build_workdir(
        work,
        work / "build",
        backend="cuda",
        cache=ObjectCache(cache_dir / "build"),
        jobs=2,
        timeout_s=900,
    )
    assert res.ok, res.log[-4000:]
    assert res.so_path is not None and res.so_path.exists()
    cu = [f for f in c.solution.files if f.endswith(".cu")]
    units = {u["file"]: u for u in res.units}
    assert cu and all(f in units for f in cu), res.units


@needs_nvcc
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_cpu_half_readies_it_for_the_device(name, cache_dir):
    """``prepare`` on the cuda backend: no static guard finding under the strict policy (the
    tests run them strict or off), built, nothing decided before the device."""
    from cuda_agent.sandbox.evaluate import prepare

    cfg = SandboxConfig(backend="cuda", cache_dir=str(cache_dir), guard_policy="strict")
    p = prepare(CASES[name](), cfg, backend="cuda")
    try:
        assert p.result is None, (p.result.status, p.result.message)
        assert not p.guards, p.guards
    finally:
        if p.root is not None:
            shutil.rmtree(p.root, ignore_errors=True)


def _ptx(src, tmp_path) -> str:
    fl = flags_for("cuda")
    out = tmp_path / f"{src.stem}.ptx"
    cmd = [fl.nvcc, *fl.cuda_cflags, "-ptx", str(src), "-o", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return out.read_text()


@needs_nvcc
def test_the_honest_product_is_ieee_and_the_ftz_one_flushes(tmp_path):
    honest = _ptx(MUL / "kernels" / "mul.cu", tmp_path)
    assert re.search(r"\bmul(\.rn)?\.f32\b", honest) and ".ftz" not in honest
    ftz = _ptx(VARIANTS / "mul_ftz.cu", tmp_path)
    assert re.search(r"\bmul\.ftz\.f32\b", ftz)
