"""Output comparison, run in the trusted parent.

Two-sided: the structure must match (tensor vs container, count, shape, dtype), every element
must satisfy ``|c - r| <= atol + rtol * |r|`` (NaN never matches a number; a NaN or an infinity
of the reference must be reproduced exactly), and the error's norm relative to the reference's
norm must be at most ``norm_tol``, so an all-zero (or scaled-down) output cannot pass a task
whose values are all below ``atol``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Tolerance:
    atol: float = 1e-2
    rtol: float = 1e-2
    norm_tol: float = 2e-2


@dataclass
class Verdict:
    passed: bool
    message: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    rel_norm_err: float | None = None


def _describe(x: Any) -> str:
    import torch

    if isinstance(x, torch.Tensor):
        return f"Tensor{tuple(x.shape)}:{str(x.dtype).replace('torch.', '')}"
    return type(x).__name__


def _flatten(obj: Any, path: str, out: list[tuple[str, Any]]) -> None:
    if isinstance(obj, (list, tuple)):
        out.append((path, ("seq", len(obj))))
        for i, x in enumerate(obj):
            _flatten(x, f"{path}[{i}]", out)
    elif isinstance(obj, dict):
        out.append((path, ("dict", tuple(sorted(map(str, obj))))))
        for k in sorted(obj, key=str):
            _flatten(obj[k], f"{path}[{k!r}]", out)
    else:
        out.append((path, obj))


def compare(ref: Any, cand: Any, tol: Tolerance) -> Verdict:
    """Compare a candidate's output with the reference's (both already on the CPU)."""
    import torch

    rl: list[tuple[str, Any]] = []
    cl: list[tuple[str, Any]] = []
    _flatten(ref, "out", rl)
    _flatten(cand, "out", cl)
    if len(rl) != len(cl):
        return Verdict(
            False, f"output structure differs: reference has {len(rl)} parts, candidate {len(cl)}"
        )
    worst_abs = worst_rel = worst_norm = 0.0
    for (path, r), (_, c) in zip(rl, cl, strict=True):
        if isinstance(r, tuple) and r and r[0] in ("seq", "dict"):
            if r != c:
                return Verdict(
                    False, f"{path}: structure differs: reference {r}, candidate {_short(c)}"
                )
            continue
        if isinstance(r, torch.Tensor):
            if not isinstance(c, torch.Tensor):
                return Verdict(False, f"{path}: expected {_describe(r)}, got {_describe(c)}")
            if r.dtype != c.dtype:
                return Verdict(False, f"{path}: dtype {c.dtype} != reference {r.dtype}")
            if tuple(r.shape) != tuple(c.shape):
                return Verdict(
                    False, f"{path}: shape {tuple(c.shape)} != reference {tuple(r.shape)}"
                )
            if c.layout != torch.strided or c.is_quantized:
                return Verdict(False, f"{path}: unsupported tensor layout {c.layout}")
            v = _compare_tensor(path, r, c, tol)
            if not v.passed:
                return v
            worst_abs = max(worst_abs, v.max_abs_err or 0.0)
            worst_rel = max(worst_rel, v.max_rel_err or 0.0)
            worst_norm = max(worst_norm, v.rel_norm_err or 0.0)
        else:
            if isinstance(c, torch.Tensor) or type(r) is not type(c):
                return Verdict(False, f"{path}: expected {_describe(r)}, got {_describe(c)}")
            if isinstance(r, float):
                if r != r or c != c:
                    if not (r != r and c != c):
                        return Verdict(False, f"{path}: NaN mismatch ({c} vs reference {r})")
                elif abs(c - r) > tol.atol + tol.rtol * abs(r):
                    return Verdict(False, f"{path}: {c} != reference {r}")
            elif r != c:
                return Verdict(False, f"{path}: {_short(c)} != reference {_short(r)}")
    return Verdict(True, "", worst_abs, worst_rel, worst_norm)


def _scalar(x: Any) -> str:
    v = x.item()
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _short(x: Any) -> str:
    s = repr(x)
    return s if len(s) < 80 else s[:77] + "..."


CHUNK = 1 << 24  # elements compared at a time (float64 temporaries stay small)


def _compare_tensor(path: str, r: Any, c: Any, tol: Tolerance) -> Verdict:
    import torch

    if r.numel() == 0:
        return Verdict(True, "", 0.0, 0.0, 0.0)
    if not (r.is_floating_point() or r.is_complex()):
        eq = torch.equal(r, c)
        msg = "" if eq else f"{path}: values differ ({int((r != c).sum())} of {r.numel()} elements)"
        return Verdict(eq, msg, 0.0 if eq else None)
    fast = _compare_float_fast(path, r, c, tol)
    if fast is not None:
        return fast
    rf_all = r.reshape(-1)
    cf_all = c.reshape(-1)
    wide = torch.complex128 if r.is_complex() else torch.float64
    n = rf_all.numel()
    max_abs = max_rel = 0.0
    rsq = dsq = 0.0
    over = nonfin_bad = fin_bad = nan_bad = 0
    first_bad: int | None = None
    for start in range(0, n, CHUNK):
        r64 = rf_all[start : start + CHUNK].to(wide)
        c64 = cf_all[start : start + CHUNK].to(wide)
        r_fin = torch.isfinite(r64)
        c_fin = torch.isfinite(c64)
        nonfin = ~r_fin
        if bool(nonfin.any()):
            # non-finite reference values must be reproduced exactly (NaN where NaN, same inf)
            r_nan, c_nan = torch.isnan(r64), torch.isnan(c64)
            bad = (r_nan & ~c_nan) | (~r_nan & nonfin & (c64 != r64))
            nonfin_bad += int(bad.sum())
            nan_bad += int((r_nan & ~c_nan).sum())
            if first_bad is None and bool(bad.any()):
                first_bad = start + int(bad.nonzero()[0, 0])
        bad_fin = r_fin & ~c_fin
        fin_bad += int(bad_fin.sum())
        if first_bad is None and bool(bad_fin.any()):
            first_bad = start + int(bad_fin.nonzero()[0, 0])
        rz = torch.where(r_fin, r64, torch.zeros_like(r64))
        cz = torch.where(r_fin & c_fin, c64, torch.zeros_like(c64))
        diff = (cz - rz).abs()
        over += int((diff > tol.atol + tol.rtol * rz.abs()).sum())
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float((diff / rz.abs().clamp_min(1e-12)).max()))
        rsq += float((rz.abs() ** 2).sum())
        dsq += float((diff**2).sum())
    if nonfin_bad or fin_bad:
        at = ""
        if first_bad is not None:
            at = (
                f" (first at flat index {first_bad}: candidate {_scalar(cf_all[first_bad])}, "
                f"reference {_scalar(rf_all[first_bad])})"
            )
        if nonfin_bad:
            kinds = f"{nan_bad} NaN, {nonfin_bad - nan_bad} Inf"
            return Verdict(
                False,
                f"{path}: {nonfin_bad} non-finite reference values not reproduced ({kinds}: "
                f"NaN must stay NaN, +Inf/-Inf the same infinity){at}",
            )
        return Verdict(False, f"{path}: {fin_bad} NaN/Inf where the reference is finite{at}")
    rnorm, dnorm = rsq**0.5, dsq**0.5
    rel_norm = dnorm / rnorm if rnorm > 0 else (0.0 if dnorm == 0 else float("inf"))
    if over:
        return Verdict(
            False,
            f"{path}: {over} of {n} elements outside atol={tol.atol} rtol={tol.rtol} (max abs err {max_abs:.3g})",
            max_abs,
            max_rel,
            rel_norm,
        )
    if rnorm > 0 and rel_norm > tol.norm_tol:
        return _norm_failure(path, rel_norm, tol, max_abs, max_rel)
    return Verdict(True, "", max_abs, max_rel, rel_norm)


_FAST_DTYPES = ("float32", "float16", "bfloat16")
MARGIN = 1e-4  # elements this close to the tolerance bound are decided by the exact path
NORM_MARGIN = 2e-2  # fp32 norms of ~1e8 elements are good to ~1e-3: a wide band goes exact


def _compare_float_fast(path: str, r: Any, c: Any, tol: Tolerance) -> Verdict | None:
    """The common cases in a few fp32 passes (several times faster than the float64 chunks):
    all values finite and every element clearly inside (the norm clearly decided), or some
    element clearly outside its bound. Returns
    ``None`` whenever the exact path must decide (non-finite values, elements within
    ``MARGIN`` of the bound, overflowing norms), so the verdict is always the exact one."""
    import torch

    if str(r.dtype).replace("torch.", "") not in _FAST_DTYPES:
        return None
    rf = r.reshape(-1).float()
    cf = c.reshape(-1).float()
    # no isfinite() pass (the slowest step on the CPU): a NaN or Inf in either tensor makes
    # ``rnorm`` or ``dnorm`` non-finite below, which hands the case to the exact path before
    # any verdict; a NaN difference also never trips the bound check (comparisons are False)
    rabs = rf.abs()
    diff = (cf - rf).abs_()
    bound = rabs.mul(tol.rtol).add_(tol.atol)
    near_or_over = bool((diff > bound * (1.0 - MARGIN)).any())
    rnorm = float(torch.linalg.vector_norm(rf))
    dnorm = float(torch.linalg.vector_norm(diff))
    if not (rnorm < float("inf") and dnorm < float("inf")):
        return None
    if near_or_over:
        # finite norms mean every value is finite, so an element beyond its bound by more than
        # the margin fails the exact path too (an incorrect output is the common failing case:
        # decided here, several times faster); only edge cases go exact
        clearly_over = int((diff > bound * (1.0 + MARGIN)).sum())
        if not clearly_over:
            return None
        over = int((diff > bound).sum())
        max_abs = float(diff.max())
        max_rel = float(diff.div_(rabs.clamp_min_(1e-12)).max())
        rel_norm = dnorm / rnorm if rnorm > 0 else float("inf")
        return Verdict(
            False,
            f"{path}: {over} of {rf.numel()} elements outside atol={tol.atol} rtol={tol.rtol} (max abs err {max_abs:.3g})",
            max_abs,
            max_rel,
            rel_norm,
        )
    rel_norm = dnorm / rnorm if rnorm > 0 else (0.0 if dnorm == 0 else float("inf"))
    if rnorm > 0 and abs(rel_norm - tol.norm_tol) <= NORM_MARGIN * tol.norm_tol:
        return None
    max_abs = float(diff.max())
    max_rel = float(diff.div_(rabs.clamp_min_(1e-12)).max())
    if rnorm > 0 and rel_norm > tol.norm_tol:
        return _norm_failure(path, rel_norm, tol, max_abs, max_rel)
    return Verdict(True, "", max_abs, max_rel, rel_norm)


def _norm_failure(
    path: str, rel_norm: float, tol: Tolerance, max_abs: float, max_rel: float
) -> Verdict:
    return Verdict(
        False,
        f"{path}: relative error norm {rel_norm:.3g} > {tol.norm_tol} (output does not follow the reference's values)",
        max_abs,
        max_rel,
        rel_norm,
    )


SUBNORMAL_FLOOR_ULPS = 16  # |values| below this many of the dtype's smallest subnormal: rounding


def stress_check(variant: str, ref: Any, cand: Any) -> Verdict:
    """A stress trial's own rule on an output that already passed :func:`compare` (the NaN/Inf
    rule and the tolerance hold on every trial). ``denormal``: see :func:`subnormal_check`;
    the other variants have none beyond :func:`compare`."""
    if variant != "denormal":
        return Verdict(True)
    return subnormal_check(ref, cand)


def subnormal_check(ref: Any, cand: Any) -> Verdict:
    """Subnormal outputs must be treated as the reference treats them (no tolerance shows
    this: they all lie far below ``atol``). Fails when the candidate is exactly zero at more
    than half of the positions where the reference's output is a nonzero subnormal (above
    ``SUBNORMAL_FLOOR_ULPS`` of the smallest one, below rounding's reach): it flushes them
    to zero; or, where the reference has no subnormal output at all, when the candidate has
    subnormal values at more than ``max(8, 1%)`` of the positions where the reference is
    exactly zero: the reference flushes them and the candidate does not."""
    import torch

    rl: list[tuple[str, Any]] = []
    cl: list[tuple[str, Any]] = []
    _flatten(ref, "out", rl)
    _flatten(cand, "out", cl)
    for (path, r), (_, c) in zip(rl, cl, strict=False):
        if not (isinstance(r, torch.Tensor) and isinstance(c, torch.Tensor)):
            continue
        if not r.is_floating_point() or r.dtype != c.dtype or r.shape != c.shape:
            continue
        fi = torch.finfo(r.dtype)
        tiny, floor = fi.tiny, SUBNORMAL_FLOOR_ULPS * fi.tiny * fi.eps
        rf, cf = r.reshape(-1), c.reshape(-1)
        n_sub = flushed = ref_zero = kept = 0
        for start in range(0, rf.numel(), CHUNK):
            ra, ca = rf[start : start + CHUNK].abs(), cf[start : start + CHUNK].abs()
            sub = (ra >= floor) & (ra < tiny)
            n_sub += int(sub.sum())
            flushed += int((sub & (ca == 0)).sum())
            zero = ra == 0
            ref_zero += int(zero.sum())
            kept += int((zero & (ca >= floor) & (ca < tiny)).sum())
        if flushed and 2 * flushed > n_sub:
            return Verdict(
                False,
                f"{path}: {flushed} of the {n_sub} outputs the reference leaves subnormal "
                f"(0 < |r| < {tiny:.3g}) are exactly zero in the candidate: it flushes subnormal "
                "values to zero (flush-to-zero/denormals-are-zero, or an explicit flush) where "
                "the reference does not",
            )
        if not n_sub and kept > max(8, rf.numel() // 100):
            return Verdict(
                False,
                f"{path}: {kept} of the {ref_zero} outputs the reference flushes to zero are "
                f"subnormal in the candidate (0 < |c| < {tiny:.3g}): the reference flushes "
                "subnormal values and the candidate does not",
            )
    return Verdict(True)
