"""Reward schemes over ``EvalResult`` records.

``paper`` is the CUDA Agent schedule: -1 when the candidate is not correct (any status other than
``ok``, a guard rejection included); 3 when it is more than ``threshold`` (5%) faster than both
eager and ``torch.compile``; 2 when more than 5% faster than eager only; 1 otherwise.

"Faster by more than 5%" means ``(t0 - t) / t0 > 0.05``, i.e. speed-up ``t0 / t > 1 / 0.95``.
The exact boundary does not count as faster. When the result carries a 95% confidence interval
of the speed-up (the profiler's paired mode), the conservative choice is used by default: the
*lower* end of the interval must clear the bar, so measurement noise can lower a reward but never
raise it. Pass ``use_ci=False`` to decide on the medians alone.

A missing baseline can never count as beaten: without a compile baseline the best reward is 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from cuda_agent.records import EvalResult, Status

# relative slack so that t0 = 1.0, t = 0.95 (exactly 5%) is not "faster" through rounding
_EPS = 1e-9


@dataclass(frozen=True)
class RewardConfig:
    scheme: str = "paper"
    threshold: float = 0.05
    use_ci: bool = True
    clip: float = 10.0  # upper clip for the speedup schemes


@dataclass(frozen=True)
class Reward:
    value: float
    reason: str


def _speedup(result: EvalResult, which: str, use_ci: bool) -> tuple[float | None, str]:
    """The speed-up used for the decision: CI lower bound when present and wanted, else median."""
    median = result.speedup_vs_eager if which == "eager" else result.speedup_vs_compile
    if median is None:
        return None, "missing"
    if use_ci and result.timing is not None:
        ci = (
            result.timing.speedup_vs_eager_ci
            if which == "eager"
            else result.timing.speedup_vs_compile_ci
        )
        if ci is not None:
            return min(ci[0], median), "ci-low"
    return median, "median"


def beats(speedup: float | None, threshold: float) -> bool:
    """b(t, t0) of the paper: ``(t0 - t) / t0 > threshold`` written over the speed-up ``t0 / t``."""
    if speedup is None or not math.isfinite(speedup) or speedup <= 0:
        return False
    # (t0 - t)/t0 = 1 - 1/s
    return (1.0 - 1.0 / speedup) > threshold + _EPS


def _failure(result: EvalResult) -> Reward | None:
    if result.status is Status.OK:
        return None
    if result.status is Status.INFRA_ERROR:  # the value stays -1 for consumers that do not filter
        return Reward(
            -1.0, "infra_error: the sandbox failed, not the candidate (no learning signal)"
        )
    if result.status is Status.GUARD_VIOLATION:
        codes = sorted({g.code for g in result.guards if g.severity == "reject"})
        return Reward(-1.0, "guard_violation: " + (",".join(codes) or "unspecified"))
    return Reward(-1.0, f"not correct: {result.status}")


def paper_reward(result: EvalResult, cfg: RewardConfig = RewardConfig()) -> Reward:
    """The paper's -1/1/2/3 schedule (see the module docstring)."""
    if (f := _failure(result)) is not None:
        return f
    se, how_e = _speedup(result, "eager", cfg.use_ci)
    sc, how_c = _speedup(result, "compile", cfg.use_ci)
    pct = f"{cfg.threshold:.0%}"
    fe, fc = beats(se, cfg.threshold), beats(sc, cfg.threshold)
    desc_e = "no eager baseline" if se is None else f"vs eager {se:.3f}x ({how_e})"
    desc_c = "no compile baseline" if sc is None else f"vs compile {sc:.3f}x ({how_c})"
    if fe and fc:
        return Reward(3.0, f"correct, >{pct} faster than eager and compile: {desc_e}, {desc_c}")
    if fe:
        return Reward(2.0, f"correct, >{pct} faster than eager only: {desc_e}, {desc_c}")
    return Reward(1.0, f"correct, not >{pct} faster than eager: {desc_e}, {desc_c}")


def speedup_reward(result: EvalResult, cfg: RewardConfig = RewardConfig()) -> Reward:
    """-1 if not correct, else the speed-up vs compile (vs eager when compile is missing), clipped
    to ``[0, clip]``."""
    if (f := _failure(result)) is not None:
        return f
    s, how = _speedup(result, "compile", cfg.use_ci)
    base = "compile"
    if s is None:
        s, how = _speedup(result, "eager", cfg.use_ci)
        base = "eager"
    if s is None:
        return Reward(0.0, "correct, no baseline to compare with")
    return Reward(min(max(s, 0.0), cfg.clip), f"correct, {s:.3f}x vs {base} ({how})")


def log_speedup_reward(result: EvalResult, cfg: RewardConfig = RewardConfig()) -> Reward:
    """-1 if not correct, else ``1 + log2(speed-up vs compile)`` clipped to ``[0, 1 + log2(clip)]``:
    a correct kernel always earns more than a failure, and each doubling adds 1."""
    if (f := _failure(result)) is not None:
        return f
    s, how = _speedup(result, "compile", cfg.use_ci)
    base = "compile"
    if s is None:
        s, how = _speedup(result, "eager", cfg.use_ci)
        base = "eager"
    if s is None or s <= 0:
        return Reward(0.0, "correct, no baseline to compare with")
    v = 1.0 + math.log2(s)
    return Reward(
        min(max(v, 0.0), 1.0 + math.log2(cfg.clip)), f"correct, {s:.3f}x vs {base} ({how})"
    )


SCHEMES: dict[str, Callable[[EvalResult, RewardConfig], Reward]] = {
    "paper": paper_reward,
    "speedup": speedup_reward,
    "log-speedup": log_speedup_reward,
}


def score(result: EvalResult | None, cfg: RewardConfig = RewardConfig()) -> Reward:
    """Reward of one evaluation under ``cfg.scheme``; ``None`` (nothing submitted) gives -1."""
    if cfg.scheme not in SCHEMES:
        raise ValueError(f"unknown reward scheme {cfg.scheme!r}; one of {', '.join(SCHEMES)}")
    if result is None:
        return Reward(-1.0, "no solution evaluated")
    return SCHEMES[cfg.scheme](result, cfg)


def apply(record, cfg: RewardConfig = RewardConfig()):
    """A copy of an ``EvalResult`` or ``Trajectory`` with ``reward`` and ``reward_reason`` filled.

    For a trajectory, its ``eval_result`` is scored and also filled in.
    """
    import msgspec

    from cuda_agent.records import Trajectory

    if isinstance(record, EvalResult):
        r = score(record, cfg)
        return msgspec.structs.replace(record, reward=r.value, reward_reason=r.reason)
    if isinstance(record, Trajectory):
        r = score(record.eval_result, cfg)
        ev = record.eval_result
        if ev is not None:
            ev = msgspec.structs.replace(ev, reward=r.value, reward_reason=r.reason)
        return msgspec.structs.replace(
            record, eval_result=ev, reward=r.value, reward_reason=r.reason
        )
    raise TypeError(f"cannot score a {type(record).__name__}")
