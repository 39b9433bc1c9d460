"""Execution checks on one loaded KernelBench program (run inside the probe subprocess).

Each check returns ``None`` when the program passes, or a short reason code plus detail. The
reason codes are stable (they are counted and written to rejected records):

``load_error``, ``eager_error``, ``not_tensor``, ``empty_output``, ``nonfinite``,
``rng_consumed``, ``nondeterministic``, ``input_independent``, ``constant_output``,
``saturated_output``, ``compile_error``, ``compile_mismatch``, ``too_fast``, ``too_slow``.
"""

from __future__ import annotations

import random
from typing import Any

# the verifier's tolerance (PAPER.md: atol = rtol = 1e-2)
ATOL = 1e-2
RTOL = 1e-2


def rng_snapshot(device: str) -> tuple[Any, ...]:
    import torch

    state: list[Any] = [torch.get_rng_state(), random.getstate()]
    try:
        import numpy as np

        state.append(np.random.get_state()[1].tobytes())
    except ImportError:
        pass
    if device.startswith("cuda"):
        state.append(torch.cuda.get_rng_state())
    return tuple(state)


def rng_changed(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    import torch

    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            if not torch.equal(x, y):
                return True
        elif x != y:
            return True
    return False


def consumes_rng(model: Any, inputs: list[Any], device: str) -> bool:
    """Whether one forward of ``model`` advances any global RNG (torch, python, numpy, cuda)."""
    import torch

    before = rng_snapshot(device)
    with torch.no_grad():
        model(*inputs)
    return rng_changed(before, rng_snapshot(device))


def probe_stochastic(prog: Any, device: str = "cpu", seed: int = 0) -> dict[str, bool]:
    """RNG use of a program's forward, in train mode (as constructed, the way KernelBench runs
    a reference) and in eval mode: ``{"train": bool, "eval": bool}``."""
    import torch

    torch.manual_seed(seed)
    with torch.device(device):
        model = prog.model_cls(*prog.init_inputs())
    model = model.to(device)
    inputs = prog.make_inputs(device=device, seed=seed)
    res = {"train": consumes_rng(model.train(), inputs, device)}
    res["eval"] = consumes_rng(model.eval(), inputs, device)
    return res


def output_problem(outs: list[Any]) -> tuple[str, str] | None:
    """Empty, non-finite, constant or saturated outputs (a reward hack waiting to happen)."""
    import torch

    if not outs:
        return "not_tensor", "forward returned no tensor"
    for i, o in enumerate(outs):
        if o.numel() == 0:
            return "empty_output", f"output {i} has shape {tuple(o.shape)}"
        of = o.detach().float() if (o.is_floating_point() or o.is_complex()) else o.detach()
        if of.is_floating_point() and not torch.isfinite(of).all():
            n_bad = int((~torch.isfinite(of)).sum())
            return "nonfinite", f"output {i}: {n_bad} of {of.numel()} values are NaN/Inf"
    big = [o for o in outs if o.numel() > 1]
    for i, o in enumerate(big):
        of = o.detach().float()
        if torch.all(of == of.reshape(-1)[0]):
            return "constant_output", f"output {i}: every value is {of.reshape(-1)[0].item():.4g}"
        # saturated: nearly all values equal the min or the max (e.g. sigmoid of huge inputs)
        lo, hi = of.min(), of.max()
        at_edge = ((of == lo) | (of == hi)).float().mean().item()
        if at_edge > 0.99 and of.numel() >= 100:
            return (
                "saturated_output",
                f"output {i}: {at_edge:.1%} of values sit at min {lo.item():.4g} or max {hi.item():.4g}",
            )
    return None


def close(a: list[Any], b: list[Any], atol: float = ATOL, rtol: float = RTOL) -> tuple[bool, float]:
    """Whether two output lists match at the tolerance, and the largest absolute difference."""
    import torch

    if len(a) != len(b):
        return False, float("inf")
    worst = 0.0
    ok = True
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape:
            return False, float("inf")
        xf, yf = x.detach().float().cpu(), y.detach().float().cpu()
        d = (xf - yf).abs()
        worst = max(worst, float(d.max()) if d.numel() else 0.0)
        if not torch.allclose(xf, yf, atol=atol, rtol=rtol, equal_nan=False):
            ok = False
    return ok, worst


def identical(a: list[Any], b: list[Any]) -> bool:
    import torch

    return len(a) == len(b) and all(
        x.shape == y.shape and torch.equal(x.detach().cpu(), y.detach().cpu())
        for x, y in zip(a, b, strict=True)
    )
