"""The timing protocol's version and its knobs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

#: Goes into every result (TimingDetail, Baseline, cache keys). Bump when the protocol changes
#: in a way that moves numbers: warm-up rule, flush, statistic, stop rule, sample selection.
#: ca-timing-2: the device is synchronised after the per-round input refresh (ca-timing-1 left it
#: queued ahead of the round's first call only, which hid that call's host-side launch time:
#: torch.compile's baseline was bimodal by its position in the round).
#: ca-timing-3: a CUDA graph is used only after each replay is shown to redo its program's work
#: (default-stream kernels run outside a capture: their replays did nothing and read as a cache
#: hack); a baseline replayed from graphs is also timed without them (``Baseline.*_nograph``).
PROTOCOL_VERSION = "ca-timing-3"


@dataclass(frozen=True)
class TimingConfig:
    """How :func:`cuda_agent.profiler.measure` and :func:`paired` sample a program.

    Times are per call. Defaults are the protocol of :data:`PROTOCOL_VERSION`; callers may
    tighten them (tests) but results then say which config was used only through their flags.
    """

    # warm-up: at least this long AND this many calls, then until the last window is stable
    warmup_ms: float = 200.0
    warmup_min_calls: int = 3
    warmup_window: int = 3
    warmup_stable_rel: float = 0.02
    warmup_max_s: float = 5.0
    # adaptive sampling: stop when rel. standard error of the median <= target_rse
    min_samples: int = 10
    max_samples: int = 2000
    target_rse: float = 0.005
    time_cap_s: float = 10.0
    # L2: flush with a buffer of l2_flush_factor * L2 size before every timed call
    flush_l2: bool = True
    l2_flush_factor: float = 2.0
    reset_persisting_l2: bool = True
    cpu_flush_bytes: int = 8 << 20
    # CPU path: torch intra-op threads while timing (1 = stable on shared machines; None = as set)
    cpu_threads: int | None = 1
    # fresh values: multiply floating inputs by (1 + jitter * N(0,1)) before every call/round
    fresh_values: bool = True
    jitter: float = 1e-3
    # synchronise after the refresh (ca-timing-2); False is ca-timing-1's behaviour, kept for the
    # A/B that measures the difference (results say `refresh_unsynced`)
    sync_after_refresh: bool = True
    # CUDA graph replay for short programs (applied to every side of a paired comparison)
    cuda_graph: Literal["auto", "on", "off"] = "auto"
    # a 1024-element ReLU measured ~33 us per call under this protocol on an H200 (launch-bound)
    graph_threshold_ms: float = 0.050
    # clocks: discard samples taken while the SM clock was throttled (never change clocks)
    discard_throttled: bool = True
    throttle_rel: float = 0.10
    max_discard_fraction: float = 0.5
    # cross-checks
    thread_join_timeout_s: float = 30.0  # wait for threads a timed call started to finish
    async_min_fraction: float = 0.1  # share of calls with async work that switches to global times
    settle_ms: float = 0.5  # sleep after each CUDA call before checking for deferred work
    deferred_threshold_ms: float = 0.1  # a device sync after settle_ms longer than this: deferred
    # share of calls that must show deferred work for the flag: the median can only be a call
    # whose work was deferred when at least half of the calls deferred theirs, while a host-side
    # stall of the timing process (page reclaim beside a multi-GB problem: seen on the H200 in
    # 2 of 10 calls of an honest 11 ms MLP) makes single calls look so
    deferred_min_fraction: float = 0.5
    trace_check: bool = True
    trace_calls: int = 3
    # bootstrap for paired speed-up CIs
    bootstrap: int = 2000
    seed: int = 0

    def with_(self, **kw: Any) -> TimingConfig:
        """A copy with some fields replaced (unknown names raise ``TypeError``)."""
        return replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def unknown_keys(d: dict[str, Any]) -> list[str]:
        """The keys of ``d`` that are no TimingConfig field (a user's typo: callers reject them)."""
        names = {f.name for f in fields(TimingConfig)}
        return sorted(k for k in d if k not in names)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TimingConfig:
        """Build from a dict, ignoring unknown keys (configs from newer versions still load)."""
        names = {f.name for f in fields(TimingConfig)}
        return TimingConfig(**{k: v for k, v in d.items() if k in names})


def quick_config(**kw: Any) -> TimingConfig:
    """A short config for smoke tests and the CPU path: little warm-up, 1 s cap."""
    base = dict(warmup_ms=20.0, warmup_max_s=1.0, time_cap_s=1.0, max_samples=200, bootstrap=500)
    base.update(kw)
    return TimingConfig(**base)
