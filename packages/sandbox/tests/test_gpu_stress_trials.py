"""Numerics stress trials on the cuda backend (skipped without CUDA): an honest CUDA kernel passes
every stress trial, a kernel whose product flushes subnormals (``mul.ftz.f32``, what ``-ftz=true``
compiles) fails the ``denormal`` trial only and is ``ok`` without stress trials, gpu_fused's clamp
(``fminf``/``fmaxf``, which drop a NaN) fails the ``nan_inf`` trial only and a NaN-propagating
clamp passes, and the stressed inputs drawn on the device are the same bits in two processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cuda_agent.records import Status
from cuda_agent.sandbox import SandboxConfig, evaluate
from cuda_agent.sandbox.runner import STRESS_VARIANTS

from .cuda_cases import MUL, fused_candidate, mul_candidate

pytestmark = pytest.mark.gpu


def _cfg(cache_dir, **kw) -> SandboxConfig:
    base = dict(
        backend="cuda",
        cache_dir=str(cache_dir),
        timing=False,
        guard_policy="off",
        stress_trials=True,
    )
    return SandboxConfig(**{**base, **kw})


def _plain_and_stress(r) -> tuple[list, list]:
    assert r.correctness is not None
    trials = r.correctness.trials
    return trials[:5], trials[5:]


def test_an_honest_cuda_kernel_passes_every_stress_trial(cache_dir):
    """Under the strict guards, which must not mistake stressed inputs for a hack."""
    r = evaluate(mul_candidate(), _cfg(cache_dir, guard_policy="strict"))
    assert r.status == Status.OK, (r.status, r.message)
    assert r.backend == "cuda"
    plain, stress = _plain_and_stress(r)
    assert [t.variant for t in stress] == list(STRESS_VARIANTS)
    assert all(t.passed and not t.message for t in plain + stress), r.correctness
    assert r.meta["stress_trials"] == {
        "variants": list(STRESS_VARIANTS),
        "failed": [],
        "reference_unstable": [],
    }
    assert not [g for g in r.guards if g.severity == "reject"], r.guards


def test_a_cuda_kernel_that_flushes_subnormals_fails_the_denormal_trial(cache_dir):
    cand = mul_candidate("mul_ftz.cu")
    plain_only = evaluate(cand, _cfg(cache_dir, stress_trials=()))
    # the paper's five trials see no subnormal product: ok
    assert plain_only.status == Status.OK, plain_only.message
    assert plain_only.correctness is not None and len(plain_only.correctness.trials) == 5
    assert "stress_trials" not in plain_only.meta

    r = evaluate(cand, _cfg(cache_dir))
    assert r.status == Status.INCORRECT, r.message
    assert r.message.startswith("stress trial denormal (trial 6): "), r.message
    assert "flushes subnormal values to zero" in r.message
    plain, stress = _plain_and_stress(r)
    assert all(t.passed for t in plain)
    # NaN, Inf, near-max and offset inputs are computed as the reference does
    assert [t.variant for t in stress if not t.passed] == ["denormal"]
    assert [f["variant"] for f in r.meta["stress_trials"]["failed"]] == ["denormal"]


@pytest.mark.slow
def test_gpu_fused_clamp_drops_nans_and_fails_only_the_nan_inf_trial(cache_dir):
    """gpu_fused (2 x 256 MB inputs) as test_gpu.py times it: ``fmaxf(NaN, -3)`` is -3, so a NaN
    input comes out as exp(-3) - 1 where ``torch.clamp`` keeps the NaN."""
    r = evaluate(fused_candidate(), _cfg(cache_dir))
    assert r.status == Status.INCORRECT, r.message
    assert r.message.startswith("stress trial nan_inf (trial 5): "), r.message
    assert "non-finite reference values not reproduced" in r.message and "NaN" in r.message
    plain, stress = _plain_and_stress(r)
    assert all(t.passed for t in plain)
    assert [t.variant for t in stress if not t.passed] == ["nan_inf"]
    assert [f["variant"] for f in r.meta["stress_trials"]["failed"]] == ["nan_inf"]


@pytest.mark.slow
def test_gpu_fused_with_a_nan_propagating_clamp_passes_every_stress_trial(cache_dir):
    """The same kernel with ``t != t ? t : clamp(t)``: NaN stays NaN, the rest is unchanged."""
    r = evaluate(fused_candidate(nan_faithful=True), _cfg(cache_dir))
    assert r.status == Status.OK, (r.status, r.message)
    plain, stress = _plain_and_stress(r)
    assert [t.variant for t in stress] == list(STRESS_VARIANTS)
    assert all(t.passed and not t.message for t in plain + stress), r.correctness
    assert r.meta["stress_trials"]["failed"] == []


# One process: the stressed bits of a few tensors drawn on the GPU (``stress_input`` directly,
# and a trial's inputs as the judge and the candidate draw them), as sha256 per variant.
DRAW = r"""
import hashlib, json, sys
import torch
from cuda_agent.profiler.program import Program
from cuda_agent.sandbox.runner import STRESS_VARIANTS, _trial_inputs, stress_input

seed, ref_path = int(sys.argv[1]), sys.argv[2]
g = torch.Generator().manual_seed(1)
base = [
    torch.randn(512, 1024, generator=g),
    torch.randn(3000, generator=g).to(torch.float16),
    torch.randn(777, generator=g, dtype=torch.float64),
    torch.randn(64, 64, generator=g).to(torch.bfloat16),
]


def digest(xs):
    h = hashlib.sha256()
    for x in xs:
        assert x.device.type == "cuda", x.device
        h.update(str((x.dtype, tuple(x.shape))).encode())
        h.update(x.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


out, facts = {}, {}
for v in STRESS_VARIANTS:
    ys = [stress_input(x.to("cuda"), v, seed, i) for i, x in enumerate(base)]
    out[v] = digest(ys)
    y = ys[0]
    facts[v] = {
        "nan": int(y.isnan().sum()),
        "inf": int(y.isinf().sum()),
        "subnormal": int(((y != 0) & (y.abs() < torch.finfo(y.dtype).tiny)).sum()),
        "numel": y.numel(),
    }
ref = Program.from_source(open(ref_path).read(), name="stress_ref")
for v in STRESS_VARIANTS:
    out["trial:" + v] = digest(_trial_inputs(ref, {"seed": seed, "variant": v}, "cuda"))
print(json.dumps({"digests": out, "facts": facts}))
"""


def _draw(seed: int) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", DRAW, str(seed), str(MUL / "model.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_stress_inputs_drawn_on_the_device_are_the_same_in_two_processes():
    a, b, other = _draw(1234567), _draw(1234567), _draw(7654321)
    assert a == b
    for v in STRESS_VARIANTS:
        # offset has no random part: the same base, the same bits; a trial's base draw differs
        same = a["digests"][v] == other["digests"][v]
        assert same == (v == "offset"), v
        assert a["digests"]["trial:" + v] != other["digests"]["trial:" + v], v
    f = a["facts"]
    assert 0 < f["nan_inf"]["nan"] <= 64 and 0 < f["nan_inf"]["inf"] <= 128
    assert f["denormal"]["subnormal"] > f["denormal"]["numel"] // 5
    assert f["near_max"]["nan"] == f["near_max"]["inf"] == 0
    assert f["offset"]["nan"] == f["offset"]["subnormal"] == 0
