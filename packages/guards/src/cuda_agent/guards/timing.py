"""Timing checks: a measured time below the physical lower bound is impossible for honest work."""

from __future__ import annotations

from cuda_agent.records import GuardViolation, TimingDetail

from .checks import Findings

# The profiler's protocol flags on the candidate's timing that mean the time is NOT its true cost
# (the profiler measured them on the H200: a worker thread or a pointer-keyed cache look 45x and
# 2190x faster than eager). Flags where the protocol already charged the true cost (async_work,
# background_thread) are recorded by the profiler and need no guard.
PROTOCOL_FLAG_CHECKS = {
    "deferred_work": (
        "G-DEFERRED",
        "device work kept arriving after the timed call was synchronised",
    ),
    "stale_output": (
        "G-CACHE",
        "timed calls returned an unchanged output for changed input values",
    ),
    "trace_mismatch": ("G-DEFERRED", "kernel time in a trace exceeds the event time of the call"),
}


def timing_findings(
    timing: TimingDetail, lower_bound_ms: float | None, policy: str = "strict", slack: float = 0.8
) -> list[GuardViolation]:
    """Rejects from the profiler's protocol flags (see ``PROTOCOL_FLAG_CHECKS``); ``G-SOL``
    reject when the candidate's median is below ``slack * lower_bound_ms``; flag when the median
    or the fastest sample is below the bound itself (no bound, no ``G-SOL`` finding)."""
    fs = Findings(policy)
    cand = timing.candidate
    if cand is not None:
        for flag in cand.flags:
            if flag in PROTOCOL_FLAG_CHECKS:
                code, message = PROTOCOL_FLAG_CHECKS[flag]
                fs.add(code, message, f"profiler flag {flag!r} on the candidate's timing")
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
