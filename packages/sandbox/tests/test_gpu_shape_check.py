"""Shape generalisation on the cuda backend (skipped without CUDA): cuda_mul's honest kernel
(sizes from the tensors) passes at the resized 385 x 769 after its timing; one with the published
column count baked in is ``ok`` at 512 x 1024 and ``incorrect`` with G-SHAPE-GENERALISATION
under the check, on a pool's device worker."""

from __future__ import annotations

import pytest

from cuda_agent.records import Status
from cuda_agent.sandbox import SandboxConfig, SandboxPool, evaluate

from .cuda_cases import mul_candidate

pytestmark = pytest.mark.gpu

SIZES = "rows 512->385, cols 1024->769"


def _cfg(cache_dir, **kw) -> SandboxConfig:
    base = dict(backend="cuda", cache_dir=str(cache_dir), timing=False, guard_policy="strict")
    return SandboxConfig(**{**base, **kw})


def test_an_honest_cuda_kernel_passes_at_the_resized_shape(cache_dir):
    cfg = _cfg(cache_dir, shape_check=True, timing=True, baselines=False)
    r = evaluate(mul_candidate(), cfg)
    assert r.status is Status.OK, (r.message, r.meta.get("shape_check"))
    assert r.backend == "cuda"
    sc = r.meta["shape_check"]
    assert sc["passed"] is True and len(sc["instances"]) == 1, sc
    inst = sc["instances"][0]
    assert inst["sizes"] == {"rows": [512, 385], "cols": [1024, 769]}
    assert inst["status"] == "ok" and inst["factor"] == 0.75
    assert inst["build_cached"] is True  # the same sources: only the link ran
    assert "shape_check" in r.meta["stages_s"]
    assert not [g for g in r.guards if g.code == "G-SHAPE-GENERALISATION"]
    # the timing is the task's own shape's, done before the check
    assert r.timing is not None and r.timing.candidate is not None
    assert r.timing.candidate.median_ms > 0


def test_a_hard_coded_cuda_kernel_fails_the_shape_check_and_passes_without_it(cache_dir):
    c = mul_candidate("mul_hard_coded.cu")
    plain = evaluate(c, _cfg(cache_dir))  # off by default: right at the published shape
    assert plain.status is Status.OK, plain.message
    assert "shape_check" not in plain.meta
    with SandboxPool(_cfg(cache_dir, shape_check=True), compile_workers=1) as pool:
        r = pool.evaluate(c)  # the device worker runs the second prepare and verification
    assert r.status is Status.INCORRECT, r.message
    assert r.message.startswith(f"shape check: incorrect at resized sizes ({SIZES})"), r.message
    found = [g for g in r.guards if g.code == "G-SHAPE-GENERALISATION"]
    assert len(found) == 1 and found[0].severity == "flag", r.guards
    assert SIZES in found[0].message
    assert r.correctness is not None and r.correctness.passed is False
    assert all(t.passed for t in r.correctness.trials)  # right at the task's shape
    sc = r.meta["shape_check"]
    assert sc["passed"] is False and sc["instances"][0]["status"] == "incorrect"
