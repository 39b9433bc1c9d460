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
    timing: TimingDetail,
    lower_bound_ms: float | None,
    policy: str = "strict",
    slack: float = 0.8,
    estimate_ms: float | None = None,
) -> list[GuardViolation]:
    """Rejects from the profiler's protocol flags (see ``PROTOCOL_FLAG_CHECKS``); ``G-SOL``
    reject when the candidate's median is below ``slack * lower_bound_ms``, flag when the median
    or the fastest sample is below the bound itself. ``lower_bound_ms`` must hold for every
    correct implementation (the profiler's ``sol.output_floor_ms``; none: no such finding).
    ``estimate_ms`` (the roofline of the reference's work, ``SolEstimate.bound_ms``) only
    flags: a median under ``slack`` x it means less work than the reference, honest or not."""
    fs = Findings(policy)
    cand = timing.candidate
    if cand is not None:
        for flag in cand.flags:
            if flag in PROTOCOL_FLAG_CHECKS:
                code, message = PROTOCOL_FLAG_CHECKS[flag]
                fs.add(code, message, f"profiler flag {flag!r} on the candidate's timing")
    if cand is None:
        return fs.items
    if lower_bound_ms is not None and lower_bound_ms > 0:
        ev = f"median {cand.median_ms:.4g} ms, min {cand.min_ms}, floor {lower_bound_ms:.4g} ms"
        if cand.median_ms < slack * lower_bound_ms:
            fs.add(
                "G-SOL",
                f"median time is {cand.median_ms / lower_bound_ms:.2f}x the output floor",
                ev,
            )
        elif cand.median_ms < lower_bound_ms:
            fs.add("G-SOL", "median time is below the output floor (within the slack)", ev, "flag")
        elif cand.min_ms is not None and cand.min_ms < slack * lower_bound_ms:
            fs.add("G-SOL", "fastest sample is below the output floor", ev, severity="flag")
    if estimate_ms is not None and estimate_ms > 0 and cand.median_ms < slack * estimate_ms:
        fs.add(
            "G-SOL",
            "median time is under the roofline estimate of the reference's work (less work "
            "than the reference: a better algorithm or skipped work)",
            f"median {cand.median_ms:.4g} ms = {cand.median_ms / estimate_ms:.2f}x the "
            f"roofline estimate {estimate_ms:.4g} ms",
            severity="flag",
        )
    return fs.items
