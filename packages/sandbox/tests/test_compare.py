"""The trusted comparison: two-sided tolerance, relative norm, structure, NaN."""

import math

import torch

from cuda_agent.sandbox.compare import Tolerance, compare

TOL = Tolerance()


def test_identical_and_close_pass():
    r = torch.randn(100, 50)
    assert compare(r, r.clone(), TOL).passed
    assert compare(r, r + 1e-3, TOL).passed


def test_elementwise_error_fails():
    r = torch.randn(100)
    c = r.clone()
    c[3] += 0.5
    v = compare(r, c, TOL)
    assert not v.passed and "outside atol" in v.message


def test_all_zero_output_fails_on_small_valued_task():
    r = torch.randn(1000) * 1e-3  # every element is below atol: allclose alone would pass zeros
    z = torch.zeros_like(r)
    assert torch.allclose(z, r, atol=1e-2, rtol=1e-2)
    v = compare(r, z, TOL)
    assert not v.passed and "relative error norm" in v.message
    assert v.rel_norm_err is not None and math.isclose(v.rel_norm_err, 1.0)
    assert compare(r, r * 1.001, TOL).passed  # an honest answer still passes


def test_nan_never_matches_a_number():
    r = torch.ones(10)
    c = r.clone()
    c[0] = float("nan")
    assert not compare(r, c, TOL).passed
    r2 = r.clone()
    r2[0] = float("nan")
    assert compare(r2, r2.clone(), TOL).passed  # a NaN of the reference must be reproduced
    assert not compare(r2, r, TOL).passed
    inf = torch.tensor([float("inf"), 1.0])
    assert not compare(inf, torch.tensor([float("-inf"), 1.0]), TOL).passed


def test_structure_shape_dtype():
    r = torch.randn(4, 4)
    assert "shape" in compare(r, r.reshape(16), TOL).message
    assert "dtype" in compare(r, r.double(), TOL).message
    assert not compare((r, r), (r,), TOL).passed
    assert not compare((r, r), r, TOL).passed
    assert compare((r, [r, 3]), (r.clone(), [r.clone(), 3]), TOL).passed
    assert not compare((r, 3), (r, 4), TOL).passed
    assert compare(torch.arange(5), torch.arange(5), TOL).passed
    assert not compare(torch.arange(5), torch.arange(5) + 1, TOL).passed


def test_fast_path_gives_the_exact_verdict(monkeypatch):
    """The fp32 fast path and the float64 reference path agree on every case, including elements
    at the tolerance edge, outputs at the norm limit, non-finite values and half dtypes."""
    import cuda_agent.sandbox.compare as cmp

    g = torch.Generator().manual_seed(0)
    cases = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        r = torch.randn(4096, generator=g).to(dtype)
        cases += [
            (r, r.clone()),
            (r, (r.float() + 1e-3).to(dtype)),
            (r, (r.float() * 1.0199).to(dtype)),  # scaled: near the 2e-2 norm limit
            (r, (r.float() * 1.0201).to(dtype)),
        ]
    r = torch.randn(4096, generator=g)
    edge = r.clone()
    edge[7] = r[7] + (TOL.atol + TOL.rtol * r[7].abs()) * 0.99999  # just inside the bound
    over = r.clone()
    over[7] = r[7] + (TOL.atol + TOL.rtol * r[7].abs()) * 1.00001  # just outside
    nan = r.clone()
    nan[3] = float("nan")
    small = torch.randn(4096, generator=g) * 1e-3
    cases += [(r, edge), (r, over), (r, nan), (nan, nan.clone()), (small, small * 0.5)]
    wrong = []  # clearly incorrect outputs, the common failure: the fast path decides them
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        rr = torch.randn(4096, generator=g).to(dtype)
        one = rr.clone()
        one[100] = rr[100] + 1
        wrong += [(rr, (rr.float() * 0.5 + 0.25).to(dtype)), (rr, one), (rr, torch.zeros_like(rr))]
    for ref, cand in wrong:
        decided = cmp._compare_float_fast("out", ref, cand, TOL)
        assert decided is not None and not decided.passed, ref.dtype
        with monkeypatch.context() as m:
            m.setattr(cmp, "_compare_float_fast", lambda *a: None)
            exact = cmp.compare(ref, cand, TOL)
        assert not exact.passed
        # same message (the count of elements outside, the largest error to 3 digits)
        assert decided.message == exact.message, (decided.message, exact.message)
    cases += wrong
    for ref, cand in cases:
        fast = cmp.compare(ref, cand, TOL)
        with monkeypatch.context() as m:
            m.setattr(cmp, "_compare_float_fast", lambda *a: None)
            exact = cmp.compare(ref, cand, TOL)
        assert fast.passed == exact.passed, (ref.dtype, fast.message, exact.message)
        if exact.rel_norm_err is not None and fast.rel_norm_err is not None:
            assert math.isclose(fast.rel_norm_err, exact.rel_norm_err, rel_tol=1e-2, abs_tol=1e-9)


def test_fast_path_hands_every_non_finite_case_to_the_exact_path():
    """Without an isfinite() pass, a NaN or Inf anywhere (vector body or tail, reference or
    candidate, half dtypes) must still reach the exact path, never a fast verdict."""
    import cuda_agent.sandbox.compare as cmp

    g = torch.Generator().manual_seed(1)
    n = 1_000_003  # not a multiple of any vector width: the scalar tail is exercised
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        r = torch.randn(n, generator=g).to(dtype)
        for pos in (0, n // 2, n - 1):
            for bad in (float("nan"), float("inf"), float("-inf")):
                cand = r.clone()
                cand[pos] = bad
                ref = r.clone()
                ref[pos] = bad
                for a, b in ((r, cand), (ref, r), (ref, ref.clone())):
                    assert cmp._compare_float_fast("out", a, b, TOL) is None, (dtype, pos, bad)
        assert cmp._compare_float_fast("out", r, r.clone(), TOL) is not None  # finite: fast
