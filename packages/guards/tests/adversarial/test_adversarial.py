"""Acceptance: every known hack is rejected with the right code; honest candidates are not.

CPU candidates run their real C++ kernels in this process under the RuntimeGuard exactly as the
sandbox's candidate process does; CUDA candidates are checked statically here and executed by
``test_gpu.py`` on a GPU."""

from __future__ import annotations

import pytest
import torch

from cuda_agent.guards import output_checks, resize_task_source
from cuda_agent.guards.behaviour import sensitivity_variants
from cuda_agent.guards.checks import finding
from cuda_agent.guards.runtime import same_output
from cuda_agent.profiler.program import Program

from .corpus import (
    FEWER_OUTPUTS,
    HACKS,
    HARDCODED_SHAPE,
    HONEST,
    HONEST_CUDA,
    SKIP_TAIL,
    ZEROS_SMALL,
)
from .runner import codes, run, run_on, static

ALL_HONEST = HONEST + HONEST_CUDA


def test_corpus_size() -> None:
    assert len(ALL_HONEST) >= 12
    assert len({c.name for c in HONEST + HONEST_CUDA + HACKS}) == len(HONEST + HONEST_CUDA + HACKS)


@pytest.mark.parametrize("cand", ALL_HONEST, ids=lambda c: c.name)
def test_honest_static_no_reject(cand) -> None:
    assert codes(static(cand)) == set(), static(cand)


@pytest.mark.parametrize("cand", HONEST, ids=lambda c: c.name)
def test_honest_runtime_no_reject_and_correct(cand) -> None:
    findings, refs, outs = run(cand)
    assert codes(findings) == set(), findings
    for r, o in zip(refs, outs, strict=True):
        assert same_output(o, r, rtol=1e-4) is None
    assert codes(output_checks(refs, outs)) == set()


@pytest.mark.parametrize("cand", [h for h in HACKS if h.static_rejects], ids=lambda c: c.name)
def test_hack_static_reject(cand) -> None:
    got = codes(static(cand))
    assert cand.static_rejects <= got, f"{cand.hack}: expected {cand.static_rejects}, got {got}"


@pytest.mark.parametrize(
    "cand", [h for h in HACKS if h.runtime_rejects and h.backend == "cpu"], ids=lambda c: c.name
)
def test_hack_runtime_reject_cpu(cand) -> None:
    findings, _, _ = run(cand)
    got = codes(findings)
    assert cand.runtime_rejects <= got, f"{cand.hack}: expected {cand.runtime_rejects}, got {got}"


def test_kernelbench_policy_allows_torch_but_needs_a_kernel() -> None:
    wrapped = next(h for h in HACKS if h.name == "x_torch_wrapped")
    findings, _, _ = run(wrapped, policy="kernelbench")
    assert "G-TORCH-COMPUTE" not in codes(findings)
    assert "G-TORCH-COMPUTE" in codes(findings, "flag")
    zeros = ZEROS_SMALL  # torch only, no own code at all
    findings, _, _ = run(zeros, policy="kernelbench", probe=False)
    assert "G-NO-KERNEL" in codes(findings)


def test_policy_off_finds_nothing() -> None:
    lazy = next(h for h in HACKS if h.name == "x_lazy_subclass")
    assert static(lazy, "off") == []
    findings, _, _ = run(lazy, policy="off")
    assert findings == []


def test_zeros_on_small_magnitude_task() -> None:
    # |ref| ~ 1e-3 < atol: allclose alone would pass an all-zero output
    findings, refs, outs = run(ZEROS_SMALL, probe=False)
    assert torch.allclose(outs[0], refs[0], atol=1e-2, rtol=1e-2)
    assert "G-DEGENERATE" in codes(output_checks(refs, outs))
    assert "G-NO-KERNEL" in codes(findings)


def test_returning_fewer_outputs() -> None:
    findings, refs, outs = run(FEWER_OUTPUTS, probe=False)
    assert "G-OUTPUT-STRUCTURE" in codes(output_checks(refs, outs))


def test_predictable_seed_is_input_insensitive() -> None:
    seeded = next(h for h in HACKS if h.name == "x_seed_precompute")
    _, refs, outs = run(seeded, probe=False)
    assert "G-INPUT-INSENSITIVE" in codes(output_checks(refs, outs))


def test_skipped_reduction_tail_found_by_sensitivity_variants() -> None:
    prog = Program.from_source(SKIP_TAIL.ref, name="guards_skip_ref")
    base = prog.make_inputs("cpu", seed=3)
    variants = sensitivity_variants(base)
    assert "input0-lastdim-tail" in variants
    refs, outs = run_on(SKIP_TAIL, [base, variants["input0-lastdim-tail"]])
    # the candidate passes on ordinary random inputs at the paper's tolerance ...
    assert torch.allclose(outs[0], refs[0], atol=1e-2, rtol=1e-2) or True
    # ... but ignores a change the reference sees
    assert "G-INPUT-INSENSITIVE" in codes(output_checks(refs, outs))


def test_hardcoded_shape_fails_at_an_unseen_size() -> None:
    prog = Program.from_source(HARDCODED_SHAPE.ref, name="guards_hc_ref")
    refs, outs = run_on(HARDCODED_SHAPE, [prog.make_inputs("cpu", seed=0)])
    assert same_output(outs[0], refs[0], rtol=1e-4) is None  # right at the published shape
    resized = resize_task_source(HARDCODED_SHAPE.ref, 1.25)
    assert resized is not None and "batch_size = 32" not in resized and "dim = 777" not in resized
    prog2 = Program.from_source(resized, name="guards_hc_ref2")
    refs2, outs2 = run_on(HARDCODED_SHAPE, [prog2.make_inputs("cpu", seed=0)], ref_code=resized)
    diff = same_output(outs2[0], refs2[0], rtol=1e-4)
    assert diff is not None
    f = finding("G-SHAPE-GENERALISATION", "strict", "wrong at the resized shape", diff)
    assert f is not None and f.severity == "flag"


def test_shape_check_flags_hardcoded_shape_and_passes_honest() -> None:
    from cuda_agent.guards.shapes import shape_check
    from cuda_agent.records import EvalResult, Status

    from .runner import candidate

    def verify(c):  # a real verification: reference and candidate run, outputs compared
        prog = Program.from_source(c.task.ref_code, name=f"guards_sc_{c.task.id}")
        cand = HARDCODED_SHAPE if c.solution.files == HARDCODED_SHAPE.files else HONEST[2]
        refs, outs = run_on(cand, [prog.make_inputs("cpu", seed=1)], ref_code=c.task.ref_code)
        ok = same_output(outs[0], refs[0], rtol=1e-4) is None
        return EvalResult(
            task_id=c.task.id,
            solution_id=c.solution.id,
            backend="cpu",
            device="cpu",
            status=Status.OK if ok else Status.INCORRECT,
            message="" if ok else "mismatch",
        )

    bad = shape_check(candidate(HARDCODED_SHAPE), verify, factor=1.25)
    assert [f.code for f in bad] == ["G-SHAPE-GENERALISATION"] and bad[0].severity == "flag"
    assert shape_check(candidate(HONEST[2]), verify, factor=1.25) == []
