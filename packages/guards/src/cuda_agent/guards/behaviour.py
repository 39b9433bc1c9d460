"""Parent-side checks on outputs of several trials: structure, degenerate outputs, and input
sensitivity (the candidate's output must change where the reference's does)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from cuda_agent.records import GuardViolation
from cuda_agent.records.nested import leaves

from .checks import Findings


def torch_equal(a, b) -> bool:  # noqa: ANN001
    import torch

    return a.shape == b.shape and bool(torch.equal(a, b))


def _tensor(x: Any):  # noqa: ANN202
    import torch

    if isinstance(x, torch.Tensor):
        return torch.Tensor.detach(x).to("cpu", torch.float32)
    try:
        return torch.as_tensor(x, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        return None


# The checks below run in the parent on every trial's outputs (256 MB each for a large task):
# each first tries one reduction that decides the common all-finite case, and falls back to
# the masked computation only when a NaN or Inf shows up (``isfinite`` masks cost ~20 passes).


def _minmax(t) -> tuple[float, float]:  # noqa: ANN001
    import torch

    lo, hi = torch.aminmax(t.reshape(-1))  # NaN anywhere makes both NaN
    return float(lo), float(hi)


def _is_constant(t) -> bool:  # noqa: ANN001
    """Every value the same (NaNs ignored; all-NaN counts as constant)."""
    if t.numel() <= 1:
        return False
    import torch

    lo, hi = _minmax(t)
    if lo == lo and hi == hi:  # no NaN: constant iff min == max
        return lo == hi
    first = t.reshape(-1)[0]
    if torch.isnan(first):
        return bool(torch.isnan(t).all())
    return bool(((t == first) | torch.isnan(t)).all())


def _spread(t) -> float:  # noqa: ANN001
    """(max - min) / max |value| over the finite values: 0 for a constant, ~2 for centred data."""
    import torch

    if t.numel() < 2:
        return 0.0
    hi, lo = _minmax(t)[::-1]
    if not (math.isfinite(lo) and math.isfinite(hi)):
        f = t[torch.isfinite(t)]
        if f.numel() < 2:
            return 0.0
        hi, lo = float(f.max()), float(f.min())
    return (hi - lo) / max(abs(hi), abs(lo), 1e-30)


def _finite_norm(t) -> float:  # noqa: ANN001
    """The 2-norm over the finite values."""
    import torch

    n = float(t.norm())
    if math.isfinite(n):  # then every value is finite: nothing to mask
        return n
    return float(torch.where(torch.isfinite(t), t, 0.0).norm())


def _rel_diff(a, b) -> float:  # noqa: ANN001
    import torch

    if a.shape != b.shape:
        return float("inf")
    fin = torch.isfinite(a) & torch.isfinite(b)
    d = float(torch.where(fin, a - b, 0.0).norm())
    s = max(float(torch.where(fin, a, 0.0).norm()), float(torch.where(fin, b, 0.0).norm()), 1e-30)
    return d / s


def output_findings(
    ref_outputs: Sequence[Any], cand_outputs: Sequence[Any], policy: str = "strict"
) -> list[GuardViolation]:
    """Findings over trials: ``G-OUTPUT-STRUCTURE``, ``G-DEGENERATE``, ``G-INPUT-INSENSITIVE``."""
    fs = Findings(policy)
    if policy == "off":
        return fs.items
    refs = [[_tensor(x) for x in leaves(r)] for r in ref_outputs]
    cands = [[_tensor(x) for x in leaves(c)] for c in cand_outputs]
    for t, (r, c) in enumerate(zip(refs, cands, strict=False)):
        if len(r) != len(c):
            fs.add(
                "G-OUTPUT-STRUCTURE", f"trial {t}: {len(c)} outputs, the reference has {len(r)}", ""
            )
            return fs.items
        for i, (x, y) in enumerate(zip(r, c, strict=True)):
            if x is not None and y is not None and tuple(x.shape) != tuple(y.shape):
                fs.add(
                    "G-OUTPUT-STRUCTURE",
                    f"trial {t}: output {i} has shape {tuple(y.shape)}, the "
                    f"reference {tuple(x.shape)}",
                    "",
                )
                return fs.items
    n_out = len(refs[0]) if refs else 0
    for i in range(n_out):
        rs = [r[i] for r in refs if r[i] is not None]
        cs = [c[i] for c in cands if c[i] is not None]
        if len(rs) != len(cs) or not rs:
            continue
        for t, (x, y) in enumerate(zip(rs, cs, strict=True)):
            if _is_constant(y) and _spread(x) > 1e-2:
                fs.add(
                    "G-DEGENERATE",
                    f"output {i} is constant ({y.reshape(-1)[0].item():.3g}) where the reference's "
                    "is not",
                    f"trial {t}",
                )
                break
            rn, cn = _finite_norm(x), _finite_norm(y)
            if rn > 0 and cn < 0.1 * rn:
                fs.add(
                    "G-DEGENERATE",
                    f"output {i} has {cn / rn:.3g}x the reference's norm",
                    f"trial {t}: |cand| {cn:.3g}, |ref| {rn:.3g}",
                )
                break
        for a in range(len(rs) - 1):  # consecutive trials: exact equality first (cheap)
            b = a + 1
            if rs[a].shape == rs[b].shape and torch_equal(cs[a], cs[b]):
                rd = _rel_diff(rs[a], rs[b])
                if rd > 1e-3:
                    fs.add(
                        "G-INPUT-INSENSITIVE",
                        f"output {i} is identical in trials {a} and {b} where the reference's "
                        "changes",
                        f"reference rel. change {rd:.3g}",
                    )
                    break
    return fs.items


def sensitivity_variants(inputs: Sequence[Any], seed: int = 0) -> dict[str, list[Any]]:
    """Input variants that expose skipped work: for each floating input, the last eighth, the first
    eighth, and every seventh element (flattened) shifted by a few standard deviations. The sandbox
    runs them as extra trials; a candidate that ignores part of an input fails them."""
    import torch

    out: dict[str, list[Any]] = {}
    for k, x in enumerate(inputs):
        if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() >= 8):
            continue
        s = float(x.float().std()) or 1.0
        n = x.numel()
        for name, idx in (
            ("tail", slice(n - n // 8, n)),
            ("head", slice(0, n // 8)),
            ("strided", slice(seed % 7, n, 7)),
        ):
            v = [y.clone() if isinstance(y, torch.Tensor) else y for y in inputs]
            flat = v[k].view(-1) if v[k].is_contiguous() else v[k].reshape(-1)
            flat[idx] += 3.0 * s
            if not v[k].is_contiguous():
                v[k] = flat.view(x.shape)
            out[f"input{k}-{name}"] = v
        if x.dim() >= 1 and x.shape[-1] >= 8:
            v = [y.clone() if isinstance(y, torch.Tensor) else y for y in inputs]
            k8 = x.shape[-1] // 8
            v[k][..., -k8:] += 3.0 * s
            out[f"input{k}-lastdim-tail"] = v
    return out
