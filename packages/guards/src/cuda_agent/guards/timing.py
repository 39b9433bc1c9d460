"""Timing checks: a measured time below the physical lower bound is impossible for honest work."""

from __future__ import annotations

from cuda_agent.records import GuardViolation, TimingDetail

from .checks import Findings


def timing_findings(
    timing: TimingDetail, lower_bound_ms: float | None, policy: str = "strict", slack: float = 0.8
) -> list[GuardViolation]:
    """``G-SOL`` reject when the candidate's median is below ``slack * lower_bound_ms``; flag when
    the median or the fastest sample is below the bound itself. No bound, no finding."""
    fs = Findings(policy)
    cand = timing.candidate
    if cand is None or lower_bound_ms is None or lower_bound_ms <= 0:
        return fs.items
    ev = f"median {cand.median_ms:.4g} ms, min {cand.min_ms}, bound {lower_bound_ms:.4g} ms"
    if cand.median_ms < slack * lower_bound_ms:
        fs.add(
            "G-SOL",
            f"median time is {cand.median_ms / lower_bound_ms:.2f}x the speed-of-light bound",
            ev,
        )
    elif cand.median_ms < lower_bound_ms:
        fs.add(
            "G-SOL",
            "median time is below the speed-of-light bound (within the slack)",
            ev,
            severity="flag",
        )
    elif cand.min_ms is not None and cand.min_ms < slack * lower_bound_ms:
        fs.add("G-SOL", "fastest sample is below the speed-of-light bound", ev, severity="flag")
    return fs.items
