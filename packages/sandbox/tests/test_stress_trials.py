"""Numerics stress trials (``SandboxConfig.stress_trials``): the variants' inputs, the comparison
rules they add, and whole evaluations on the cpu backend (real sandbox, C++ kernels)."""

from __future__ import annotations

import pytest
import torch

from cuda_agent.records import Status, Task
from cuda_agent.sandbox import SandboxConfig, evaluate
from cuda_agent.sandbox.compare import Tolerance, compare, stress_check, subnormal_check
from cuda_agent.sandbox.runner import STRESS_VARIANTS, _trial_inputs, apply_variant

from .conftest import FIX, fixture_files, workdir_candidate

KERNELS = FIX / "stress_kernels"


def _bits(xs: list) -> list:
    """The inputs' raw bytes (NaN compares unequal to itself; its bits do not)."""
    return [x.contiguous().view(torch.uint8) if x.is_floating_point() else x for x in xs]


def _inputs() -> list:
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(64, 256, generator=g),
        torch.randn(3, 5, generator=g).to(torch.float16),
        torch.randn(40, generator=g, dtype=torch.float64),
        torch.arange(6),  # not floating: never touched
    ]


@pytest.mark.parametrize("variant", STRESS_VARIANTS)
def test_each_variant_is_deterministic_and_does_what_it_says(variant):
    base = _inputs()
    a = apply_variant([x.clone() for x in base], variant, 1234)
    b = apply_variant([x.clone() for x in base], variant, 1234)
    assert all(torch.equal(p, q) for p, q in zip(_bits(a), _bits(b), strict=True))
    assert torch.equal(a[3], base[3])
    assert all(p.dtype == q.dtype and p.shape == q.shape for p, q in zip(a, base, strict=True))
    for x, x0 in zip(a[:3], base[:3], strict=True):
        fi = torch.finfo(x.dtype)
        if variant == "nan_inf":
            k = max(1, min(64, x.numel() // 1024))
            assert 0 < int(x.isnan().sum()) <= k
            assert bool((x == float("inf")).any()) or bool((x == float("-inf")).any())
            # the other elements are the base draw's
            keep = x.isfinite()
            assert torch.equal(x[keep], x0[keep])
        elif variant == "denormal":
            sub = (x != 0) & (x.abs() < fi.tiny)
            assert int(sub.sum()) > x.numel() // 5, "subnormal values actually present"
            assert bool((x.abs() >= fi.tiny).any()), "the rest stays normal"
        elif variant == "near_max":
            assert bool(x.isfinite().all())
            big = x.abs() >= 0.5 * fi.max
            assert 1 <= int(big.sum()) <= 64
            assert torch.equal(x[~big], x0[~big])
        else:  # offset: far from zero, the same spread
            assert float(x.mean()) > 10 * float(x0.std())
            assert float(x.std()) == pytest.approx(float(x0.std()), rel=0.05)
    if variant != "offset":  # another seed: other positions
        c = apply_variant([x.clone() for x in base], variant, 99)
        assert not torch.equal(_bits(c)[0], _bits(a)[0])


def test_the_trial_seed_decides_the_stressed_inputs(scale_add_task):
    """What the judge and the candidate both do: the same trial spec, the same bits."""
    from cuda_agent.profiler.program import Program

    ref = Program.from_source(scale_add_task.ref_code, name="stress_ref")
    trial = {"seed": 987654321, "variant": "nan_inf"}
    a, b = _trial_inputs(ref, trial, "cpu"), _trial_inputs(ref, trial, "cpu")
    assert torch.equal(_bits(a)[0], _bits(b)[0]) and bool(a[0].isnan().any())
    other = _trial_inputs(ref, dict(trial, seed=987654322), "cpu")
    assert not torch.equal(_bits(other)[0], _bits(a)[0])
    with pytest.raises(ValueError, match="unknown trial variant"):
        apply_variant(a, "nan")


def test_the_nan_inf_rule_and_its_messages():
    tol = Tolerance()
    r = torch.tensor([1.0, float("nan"), float("inf"), float("-inf"), 2.0])
    assert compare(r, r.clone(), tol).passed
    nan0 = r.clone()
    nan0[1] = 0.0
    v = compare(r, nan0, tol)
    assert not v.passed and "1 NaN, 0 Inf" in v.message and "flat index 1" in v.message
    flipped = r.clone()
    flipped[2] = float("-inf")
    v = compare(r, flipped, tol)
    assert not v.passed and "0 NaN, 1 Inf" in v.message
    extra = r.clone()
    extra[4] = float("nan")
    v = compare(r, extra, tol)
    assert not v.passed and "NaN/Inf where the reference is finite" in v.message


def test_the_subnormal_rule():
    tiny = torch.finfo(torch.float32).tiny
    r = torch.cat([torch.randn(100), torch.full((100,), tiny / 8)])
    flushed = r.clone()
    flushed[100:] = 0.0
    assert compare(r, flushed, Tolerance()).passed  # no tolerance sees it
    v = stress_check("denormal", r, flushed)
    assert not v.passed and "100 of the 100" in v.message and "flushes subnormal" in v.message
    assert stress_check("nan_inf", r, flushed).passed  # only the denormal trial's rule
    assert subnormal_check(r, r.clone()).passed
    # one ulp of rounding at the bottom of the range is not a flush
    r2 = r.clone()
    r2[100:] = tiny * torch.finfo(torch.float32).eps  # the smallest subnormal
    assert subnormal_check(r2, torch.where(r2 < tiny, 0.0, r2)).passed
    # the other way round: the reference flushes, the candidate keeps subnormals
    ref_flush = flushed
    assert not subnormal_check(ref_flush, r).passed
    assert "the reference flushes" in subnormal_check(ref_flush, r).message


def test_config_key_and_flags():
    assert SandboxConfig().stress_trials == ()
    assert SandboxConfig(stress_trials=True).stress_trials == STRESS_VARIANTS
    assert SandboxConfig(stress_trials=False).stress_trials == ()
    d = SandboxConfig(stress_trials=["denormal", "nan_inf"]).to_dict()
    assert SandboxConfig.from_dict(d).stress_trials == ("denormal", "nan_inf")
    with pytest.raises(ValueError, match="stress_trials"):
        SandboxConfig(stress_trials=("nan",))
    with pytest.raises(ValueError, match="unknown SandboxConfig key"):
        SandboxConfig.from_dict({"stress": True})
    from typer.testing import CliRunner

    from cuda_agent.kernelbench_eval.cli import app as kb_app
    from cuda_agent.sandbox.cli import app

    for a, args in ((app, ["eval", "--help"]), (kb_app, ["run", "--help"])):
        out = CliRunner().invoke(a, args, env={"COLUMNS": "200"})
        assert out.exit_code == 0 and "--stress-trials" in out.output


def _cfg(cache_dir, **kw) -> SandboxConfig:
    base = dict(
        backend="cpu",
        cache_dir=str(cache_dir),
        timing=False,
        guard_policy="off",
        stress_trials=True,
    )
    return SandboxConfig(**{**base, **kw})


def _mul(kernel: str | None = None):
    task = Task.make("stress_mul", (FIX / "stress_mul" / "model.py").read_text())
    files = fixture_files("stress_mul")
    if kernel is not None:
        files["kernels/ops.cpp"] = (KERNELS / kernel).read_text()
    return workdir_candidate(task, files)


def _plain_and_stress(r) -> tuple[list, list]:
    assert r.correctness is not None
    trials = r.correctness.trials
    return trials[:5], trials[5:]


def test_honest_kernels_pass_every_stress_trial(
    warm_build, cache_dir, scale_add_task, scale_add_files
):
    """scale_add under the strict guards (which must not mistake stressed inputs for a hack),
    and the task whose outputs keep the inputs' subnormals."""
    cases = [
        (
            workdir_candidate(scale_add_task, scale_add_files),
            _cfg(cache_dir, guard_policy="strict"),
        ),
        (_mul(), _cfg(cache_dir)),
    ]
    for cand, cfg in cases:
        r = evaluate(cand, cfg)
        assert r.status == Status.OK, (r.status, r.message)
        plain, stress = _plain_and_stress(r)
        assert [t.variant for t in stress] == list(STRESS_VARIANTS)
        assert all(t.passed and not t.message for t in plain + stress), r.correctness
        assert r.meta["stress_trials"] == {
            "variants": list(STRESS_VARIANTS),
            "failed": [],
            "reference_unstable": [],
        }


def test_stress_trials_are_off_by_default(warm_build, cache_dir):
    r = evaluate(_mul("ops_ftz.cpp"), _cfg(cache_dir, stress_trials=()))
    assert r.status == Status.OK, r.message  # the paper's five trials see no subnormal
    assert r.correctness is not None and len(r.correctness.trials) == 5
    assert "stress_trials" not in r.meta


def test_a_kernel_that_flushes_denormals_fails_the_denormal_trial(warm_build, cache_dir):
    r = evaluate(_mul("ops_ftz.cpp"), _cfg(cache_dir))
    assert r.status == Status.INCORRECT, r.message
    assert r.message.startswith("stress trial denormal (trial 6): "), r.message
    assert "flushes subnormal values to zero" in r.message
    plain, stress = _plain_and_stress(r)
    assert all(t.passed for t in plain)  # it passes the default trials
    assert [t.variant for t in stress if not t.passed] == ["denormal"]
    assert [f["variant"] for f in r.meta["stress_trials"]["failed"]] == ["denormal"]


def test_a_kernel_that_turns_nan_into_zero_fails_the_nan_inf_trial(warm_build, cache_dir):
    r = evaluate(_mul("ops_nan_to_zero.cpp"), _cfg(cache_dir))
    assert r.status == Status.INCORRECT, r.message
    assert r.message.startswith("stress trial nan_inf (trial 5): "), r.message
    assert "non-finite reference values not reproduced" in r.message and "NaN" in r.message
    plain, stress = _plain_and_stress(r)
    assert all(t.passed for t in plain)
    assert [t.variant for t in stress if not t.passed] == ["nan_inf"]


def test_a_kernel_that_raises_on_a_stress_trial_fails_that_trial_only(warm_build, cache_dir):
    """It raises on non-finite inputs: that trial fails with the candidate's error, the later
    stress trials still run (no wait for an output that never comes)."""
    r = evaluate(_mul("ops_refuse_nan.cpp"), _cfg(cache_dir))
    assert r.status == Status.INCORRECT, r.message
    assert r.message.startswith("stress trial nan_inf (trial 5): the candidate raised: ")
    assert "kernel_run failed: 7" in r.message
    plain, stress = _plain_and_stress(r)
    assert all(t.passed for t in plain)
    # near_max inputs are finite: it computes them
    assert [t.variant for t in stress if not t.passed] == ["nan_inf"]


def test_an_unstable_reference_is_reported_not_failed(warm_build, cache_dir):
    """A sum over every element is NaN for any NaN input: the nan_inf trial is skipped and said
    so; a reference that refuses non-finite inputs outright likewise."""
    files = fixture_files("stress_sum")
    code = (FIX / "stress_sum" / "model.py").read_text()
    refusing = code.replace(
        "        return x.sum()",
        "        if not bool(torch.isfinite(x).all()):\n"
        "            raise ValueError('non-finite input')\n"
        "        return x.sum()",
    )
    cfg = _cfg(cache_dir, stress_trials=("nan_inf", "offset"))
    for name, src, why in (
        ("stress_sum", code, "its output is NaN/Inf everywhere"),
        ("stress_sum_refusing", refusing, "the reference raised ValueError: non-finite input"),
    ):
        r = evaluate(workdir_candidate(Task.make(name, src), files), cfg)
        assert r.status == Status.OK, (name, r.status, r.message)
        plain, stress = _plain_and_stress(r)
        assert all(t.passed for t in plain + stress)
        nan_inf = stress[0]
        assert nan_inf.variant == "nan_inf"
        assert nan_inf.message == f"skipped: reference unstable under nan_inf: {why}"
        assert r.meta["stress_trials"]["reference_unstable"] == [
            {"trial": 5, "variant": "nan_inf", "reason": why}
        ]
        assert r.meta["stress_trials"]["failed"] == []
        assert stress[1].variant == "offset" and not stress[1].message


def test_the_judge_reads_a_candidates_error_marker_without_following_links(tmp_path):
    from cuda_agent.sandbox.runner import _read_err

    secret = tmp_path / "secret"
    secret.write_text("root only")
    marker = tmp_path / "out_5.pt.err"
    marker.symlink_to(secret)
    assert "root only" not in _read_err(marker)
    linked = tmp_path / "out_6.pt.err"
    linked.hardlink_to(secret)
    assert _read_err(linked) == "(not a regular file with one link)"
    plain = tmp_path / "out_7.pt.err"
    plain.write_text("RuntimeError: " + "x" * 1000)
    assert _read_err(plain) == ("RuntimeError: " + "x" * 1000)[:500]
