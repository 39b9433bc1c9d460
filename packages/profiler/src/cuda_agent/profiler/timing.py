"""The timing protocol: measure one program, or several interleaved, inside the current process.

Per timed call (CUDA):
1. fresh values: floating inputs of the round's input set are multiplied in place by
   ``1 + jitter*N(0,1)`` (sign and zero pattern kept; content caches miss), then the device is
   synchronised, so every call of a round starts from the same idle device (since ca-timing-2);
2. persisting-L2 lines are reset and L2 is flushed by writing a buffer of >= 2x the L2 size;
3. the start event is recorded on the caller's stream after the flush; the call runs;
4. a "local" end event is recorded on the same stream (what KernelBench-style timers see);
5. threads the call started are joined, the whole device is synchronised, then a "global" end
   event is recorded: work on side streams or deferred to a thread is inside it;
6. if global - local exceeds the calibrated synchronisation overhead in at least 10% of the
   calls (and twice), every sample is the global time minus that overhead and the result is
   flagged ``async_work``; otherwise samples are the local times;
7. the host wall-clock of the same call and the NVML SM clock are recorded;
8. after a short sleep (threads that outlive the call get to run) the device is synchronised
   again; if that finds new work in at least half of the calls (``deferred_min_fraction``: below
   that the median is a call that kept its work), the result is flagged ``deferred_work``.
Samples are taken until the relative standard error of the median is below the target (after
``min_samples``), or a sample/time cap. Programs under ``graph_threshold_ms`` are replayed from
CUDA graphs (every side of a paired comparison alike), but only once every captured graph is
shown to do its program's work: each replay, on inputs whose values were permuted after the
capture and with its outputs poisoned (NaN) first, must give what an eager call gives on the
same inputs. A kernel launched on the legacy default stream (``kernel<<<g, b>>>``, no stream,
as most model-written extensions do) runs outside the capture, so its graph replays nothing;
such a program is timed without graphs on every side (``cuda_graph_inert``).

On ``device="cpu"`` the same API times with ``perf_counter`` (a cache-sized buffer is written
before each call when ``flush_l2``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuda_agent.records import TimingStats
from cuda_agent.records.nested import SLICE_ELEMENTS, flat_slices, tensor_leaves

from .config import PROTOCOL_VERSION, TimingConfig
from .nvml import Sampler, nvml_index
from .stats import bootstrap_ratio_ci, ratio_of_medians, summarize

InputSets = Sequence[Sequence[Any]]

# flags (stable strings; documented in the README)
F_ASYNC = "async_work"  # work outside the caller's stream finished after the local end event
F_THREAD = "background_thread"  # the call started threads; they were joined inside the timing
F_STREAM = "stream_changed"  # the call left a different current stream; restored
F_STALE = "stale_output"  # output unchanged although the inputs' values changed
F_GRAPH = "cuda_graph"  # samples are CUDA-graph replays
F_GRAPH_FAIL = "cuda_graph_failed"  # graph capture failed; timed eagerly
F_GRAPH_INERT = "cuda_graph_inert"  # a captured graph did not redo its program's work; eager
F_TIME_CAP = "time_cap"  # stopped by the time cap before reaching the target RSE
F_MAX_SAMPLES = "max_samples"
F_WARMUP = "warmup_unstable"  # warm-up hit its time cap without settling
F_THROTTLED = "throttled"  # many samples were taken at a throttled SM clock (kept)
F_WALLCLOCK = "wallclock_mismatch"  # event time and host wall-clock of the same call disagree
F_TRACE = "trace_mismatch"  # kernel time in a trace exceeds the event time per call
F_NO_FLUSH = "no_l2_flush"
F_NO_NVML = "no_clock_sampling"
F_DEFERRED = "deferred_work"  # device work kept arriving after the call was synchronised
F_UNSYNCED = "refresh_unsynced"  # sync_after_refresh=False: ca-timing-1's round, for A/B only


def _tensor_type():
    import torch

    return torch.Tensor


def output_fingerprint(
    out: Any, *, slice_elements: int = SLICE_ELEMENTS
) -> tuple[float, ...] | None:
    """A cheap fingerprint of the floating tensors in ``out`` (sum, abs-sum, first, last), the
    float64 sums taken slice by slice (no float64 copy of a whole multi-GB output)."""
    import torch

    fp: list[float] = []
    with torch.no_grad():
        for t in tensor_leaves(out):
            if t.is_floating_point() and t.numel() > 0:
                f = t.detach().reshape(-1)
                acc = torch.zeros(2, dtype=torch.float64, device=f.device)
                for _, part in flat_slices(f, slice_elements):
                    p64 = part.double()
                    acc[0] += p64.sum()
                    acc[1] += p64.abs().sum()
                total, abs_total = acc.tolist()
                fp.extend([total, abs_total, float(f[0]), float(f[-1])])
    return tuple(fp) if fp else None


def _jitter_inputs(inputs: Sequence[Any], rel: float, gen) -> bool:
    """Multiply floating tensors in place by ``1 + rel*N(0,1)``; True if any tensor changed."""
    import torch

    changed = False
    with torch.no_grad():
        for t in tensor_leaves(list(inputs)):
            if not t.is_floating_point() or t.numel() == 0 or t.requires_grad:
                continue
            eps = torch.finfo(t.dtype).eps
            r = max(rel, 4.0 * eps)
            noise = torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float32)
            t.mul_((noise.mul_(r).add_(1.0)).to(t.dtype))
            changed = True
    return changed


# ---------------------------------------------------------------- device timers


def l2_size_bytes(device: str = "cuda") -> int:
    """The device's L2 cache size in bytes (from the driver; 50 MiB if not reported)."""
    import torch

    props = torch.cuda.get_device_properties(torch.device(device))
    size = int(getattr(props, "L2_cache_size", 0) or 0)
    return size if size > 0 else 50 << 20


_cudart = None


def _reset_persisting_l2() -> bool:
    """cudaCtxResetPersistingL2Cache through the CUDA runtime torch loaded; False if unavailable."""
    global _cudart
    import ctypes

    if _cudart is None:
        _cudart = False
        import glob
        import os

        import torch

        cands = []
        libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
        cands += glob.glob(os.path.join(libdir, "libcudart.so*"))
        try:
            import nvidia  # type: ignore[import-not-found]

            for p in nvidia.__path__:
                cands += glob.glob(os.path.join(p, "*", "lib", "libcudart.so*"))
        except Exception:  # noqa: BLE001
            pass
        cands += ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
        for c in cands:
            try:
                lib = ctypes.CDLL(c)
                lib.cudaCtxResetPersistingL2Cache.restype = ctypes.c_int
                _cudart = lib
                break
            except (OSError, AttributeError):
                continue
    if not _cudart:
        return False
    return _cudart.cudaCtxResetPersistingL2Cache() == 0


@dataclass
class _Sample:
    ms: float  # the sample used
    local_ms: float
    global_ms: float
    host_ms: float
    clock: float | None
    async_: bool = False
    mem_clock: float | None = None
    threads: bool = False
    stale: bool = False
    async_ms: float = 0.0  # global - sync overhead: the sample if the call leaves async work
    deferred: bool = False  # device work appeared after the call had been synchronised


def _median_or_none(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return float(np.median(got)) if got else None


def _frequent(samples: Sequence[_Sample], attr: str, share: float) -> bool:
    """Whether at least ``share`` of the samples (and two) have ``attr`` set."""
    k = sum(bool(getattr(x, attr)) for x in samples)
    return k >= max(2, share * len(samples))


class _CpuTimer:
    kind = "cpu"

    def __init__(self, cfg: TimingConfig):
        import torch

        self.cfg = cfg
        self.buf = torch.empty(cfg.cpu_flush_bytes, dtype=torch.uint8) if cfg.flush_l2 else None
        self.flags: set[str] = set()
        self.overhead_ms = 0.0
        self.overhead_allow_ms = math.inf

    def calibrate(self) -> None:
        pass

    def time_call(self, call: Callable[[], Any]) -> tuple[Any, _Sample]:
        if self.buf is not None:
            self.buf.fill_(1)
        before = set(threading.enumerate())
        t0 = time.perf_counter()
        out = call()
        t_local = time.perf_counter()
        new = [t for t in threading.enumerate() if t not in before]
        for t in new:
            t.join(timeout=self.cfg.thread_join_timeout_s)
        t1 = time.perf_counter()
        local = (t_local - t0) * 1e3
        glob_ = (t1 - t0) * 1e3
        return out, _Sample(glob_, local, glob_, glob_, None, threads=bool(new), async_ms=glob_)

    def clock_ok(self) -> bool:
        return True


class _CudaTimer:
    kind = "cuda"

    def __init__(self, cfg: TimingConfig, device: str):
        import torch

        self.torch = torch
        self.cfg = cfg
        self.device = torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(self.device)
        # bind the functions now: a program loaded later cannot swap them under us
        self._sync = torch.cuda.synchronize
        self._Event = torch.cuda.Event
        self.stream = torch.cuda.current_stream(self.device)
        self.flags: set[str] = set()
        self.buf = None
        if cfg.flush_l2:
            nbytes = int(l2_size_bytes(str(self.device)) * cfg.l2_flush_factor)
            self.buf = torch.empty(nbytes // 4, dtype=torch.int32, device=self.device)
        else:
            self.flags.add(F_NO_FLUSH)
        self.reset_l2 = cfg.reset_persisting_l2 and _reset_persisting_l2()
        self.clock = Sampler(nvml_index(self.device.index))
        if self.clock.handle is None:
            self.flags.add(F_NO_NVML)
        self.ev = [self._Event(enable_timing=True) for _ in range(3)]
        self.overhead_ms = 0.0
        self.overhead_allow_ms = 0.05
        self._flush_val = 0

    def _flush(self) -> None:
        if self.reset_l2:
            _reset_persisting_l2()
        if self.buf is not None:
            self._flush_val = (self._flush_val + 1) & 0x7FFFFFFF
            self.buf.fill_(self._flush_val)

    def calibrate(self, n: int = 30) -> None:
        """Measure the device-sync overhead (global minus local end event) of an empty call."""
        diffs = []
        for _ in range(n):
            _, s = self.time_call(lambda: None, _raw=True)
            diffs.append(s.global_ms - s.local_ms)
        d = np.asarray(diffs)
        self.overhead_ms = float(np.median(d))
        self.overhead_allow_ms = float(np.percentile(d, 95)) * 1.5 + 0.02

    def time_call(self, call: Callable[[], Any], _raw: bool = False) -> tuple[Any, _Sample]:
        torch = self.torch
        start, end_local, end_global = self.ev
        self._flush()
        before = set(threading.enumerate())
        start.record(self.stream)
        t0 = time.perf_counter()
        out = call()
        end_local.record(self.stream)
        new = [t for t in threading.enumerate() if t not in before]
        for t in new:
            t.join(timeout=self.cfg.thread_join_timeout_s)
        self._sync(self.device)
        t1 = time.perf_counter()
        end_global.record(self.stream)
        end_global.synchronize()
        cur = torch.cuda.current_stream(self.device)
        if cur != self.stream:
            self.flags.add(F_STREAM)
            torch.cuda.set_stream(self.stream)
        local = start.elapsed_time(end_local)
        glob_ = start.elapsed_time(end_global)
        host = (t1 - t0) * 1e3
        clock = self.clock.clock_mhz()
        s = _Sample(local, local, glob_, host, clock, threads=bool(new), async_ms=local)
        s.mem_clock = self.clock.clock_mhz("MEM")
        if not _raw and glob_ - local > self.overhead_allow_ms + 0.02 * local:
            s.async_ms = max(glob_ - self.overhead_ms, local)
            s.async_ = True
        if not _raw and self.cfg.settle_ms > 0:
            # let threads that outlive the call run, then see whether the device got new work
            time.sleep(self.cfg.settle_ms / 1e3)
            t2 = time.perf_counter()
            self._sync(self.device)
            s.deferred = (time.perf_counter() - t2) * 1e3 > self.cfg.deferred_threshold_ms
        return out, s


# ---------------------------------------------------------------- the engine


@dataclass
class PairedResult:
    """Interleaved timings of several programs on the same inputs, round by round."""

    stats: dict[str, TimingStats]
    samples: dict[str, list[float]]  # kept samples, index i = round i for every name
    flags: list[str] = field(default_factory=list)
    protocol_version: str = PROTOCOL_VERSION
    cuda_graph: bool = False
    rounds: int = 0
    seconds: float = 0.0
    stop_reason: str = ""
    config: TimingConfig = field(default_factory=TimingConfig)

    def speedup(self, base: str, other: str) -> float:
        """median(base) / median(other): > 1 means ``other`` is faster."""
        return ratio_of_medians(self.samples[base], self.samples[other])

    def speedup_ci(self, base: str, other: str, level: float = 0.95) -> tuple[float, float]:
        """Paired-bootstrap CI of median(base)/median(other) over rounds."""
        return bootstrap_ratio_ci(
            self.samples[base],
            self.samples[other],
            n_boot=self.config.bootstrap,
            seed=self.config.seed,
            level=level,
            paired=True,
        )


def _as_call_source(input_sets: InputSets | Callable[[int], Sequence[Any]]):
    if callable(input_sets):
        return input_sets
    sets = [list(s) for s in input_sets]
    if not sets:
        raise ValueError("input_sets is empty: give at least one list of inputs")
    return lambda i: sets[i % len(sets)]


def paired(
    fns: Mapping[str, Callable[..., Any]],
    input_sets: InputSets,
    *,
    device: str = "cuda",
    config: TimingConfig | None = None,
) -> PairedResult:
    """Time every ``fn(*inputs)`` of ``fns`` interleaved (A/B/C, B/C/A, ...) on the same inputs.

    Each round takes the next input set of the pool ``input_sets`` (rotated), refreshes its
    floating values in place, then times each function once with the full per-call protocol.
    Stops when every function's median has RSE <= target (after min_samples rounds) or at a cap.
    A round with a throttled clock is discarded for every function (the pairing is kept).
    Guarantees: all functions have the same number of kept samples, one per kept round.
    """
    import torch

    cfg = config or TimingConfig()
    names = list(fns)
    if not names:
        raise ValueError("fns is empty")
    get_set = _as_call_source(input_sets)
    n_slots = len(input_sets) if not callable(input_sets) else 0
    is_cuda = torch.device(device).type == "cuda"
    timer: _CpuTimer | _CudaTimer = _CudaTimer(cfg, device) if is_cuda else _CpuTimer(cfg)
    gen = None
    if cfg.fresh_values:
        gen = torch.Generator(device=timer.device if is_cuda else "cpu")
        gen.manual_seed(cfg.seed + 12345)
    flags: set[str] = set()
    t_start = time.monotonic()

    # per-slot calls: eager by default, graph replays when chosen
    def eager_call(name: str, inputs: Sequence[Any]) -> Callable[[], Any]:
        fn = fns[name]
        return lambda: fn(*inputs)

    calls: dict[tuple[str, int], Callable[[], Any]] = {}

    def call_for(name: str, slot: int, inputs: Sequence[Any]) -> Callable[[], Any]:
        return calls.get((name, slot)) or eager_call(name, inputs)

    rnd = 0

    def next_inputs() -> tuple[int, list[Any], bool]:
        nonlocal rnd
        slot = rnd % n_slots if n_slots else rnd
        inputs = list(get_set(rnd))
        rnd += 1
        changed = False
        if gen is not None:
            changed = _jitter_inputs(inputs, cfg.jitter, gen)
            if changed and is_cuda and cfg.sync_after_refresh:
                # the refresh runs on the device: left queued, it would lead only the round's
                # first call and hide that call's host-side launch time (ca-timing-1 did)
                torch.cuda.synchronize(timer.device)
            elif changed and is_cuda:
                flags.add(F_UNSYNCED)
        return slot, inputs, changed

    old_threads = torch.get_num_threads()
    if not is_cuda and cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    try:
        return _run(
            fns,
            names,
            get_set,
            n_slots,
            is_cuda,
            timer,
            gen,
            cfg,
            call_for,
            calls,
            next_inputs,
            flags,
            t_start,
        )
    finally:
        if not is_cuda and cfg.cpu_threads:
            torch.set_num_threads(old_threads)


def _run(
    fns,
    names,
    get_set,
    n_slots,
    is_cuda,
    timer,
    gen,
    cfg,
    call_for,
    calls,
    next_inputs,
    flags,
    t_start,
):
    import torch

    with torch.no_grad():
        timer.calibrate()
        # ---- warm-up (time-based; every function, interleaved)
        warm: dict[str, list[float]] = {n: [] for n in names}
        t_w = time.monotonic()
        while True:
            slot, inputs, _ = next_inputs()
            for name in names:
                _, s = timer.time_call(call_for(name, slot, inputs))
                warm[name].append(s.ms)
            nw = len(warm[names[0]])
            el = time.monotonic() - t_w
            if nw >= cfg.warmup_min_calls and el * 1e3 >= cfg.warmup_ms:
                w = cfg.warmup_window
                if nw >= 2 * w and all(_stable(warm[n], w, cfg.warmup_stable_rel) for n in names):
                    break
            if el >= cfg.warmup_max_s:
                if nw >= 2 * cfg.warmup_window:
                    flags.add(F_WARMUP)
                    break
                if el >= 4 * cfg.warmup_max_s:
                    flags.add(F_WARMUP)
                    break

        # ---- CUDA graphs for short programs (all sides or none)
        use_graph = False
        if is_cuda and cfg.cuda_graph != "off":
            pilot = max(float(np.median(warm[n][-cfg.warmup_window :])) for n in names)
            want = cfg.cuda_graph == "on" or pilot < cfg.graph_threshold_ms
            if want:
                if n_slots == 0:
                    flags.add(F_GRAPH_FAIL)  # fresh sets per round cannot be captured
                else:
                    try:
                        graphs = _capture_graphs(fns, get_set, n_slots, timer)
                        inert = _inert_graphs(graphs, fns, get_set, timer)
                        if inert:
                            flags.add(F_GRAPH_INERT)
                        else:
                            calls.update(graphs)
                            use_graph = True
                            flags.add(F_GRAPH)
                            for _ in range(max(cfg.warmup_min_calls, 3)):
                                slot, inputs, _ = next_inputs()
                                for name in names:
                                    timer.time_call(call_for(name, slot, inputs))
                    except Exception:  # noqa: BLE001 - capture failure is a finding, not an error
                        calls.clear()
                        flags.add(F_GRAPH_FAIL)
                        torch.cuda.synchronize()

        # ---- sampling
        kept: dict[str, list[_Sample]] = {n: [] for n in names}

        def frequent(ss: list[_Sample], attr: str) -> bool:
            return _frequent(ss, attr, cfg.async_min_fraction)

        def vals(name: str) -> list[float]:
            use_async = frequent(all_samples[name], "async_")
            return [x.async_ms if use_async else x.ms for x in kept[name]]

        all_samples: dict[str, list[_Sample]] = {n: [] for n in names}
        rounds_clock: list[float | None] = []
        last_fp: dict[tuple[str, int], tuple[float, ...] | None] = {}
        stale_count = {n: 0 for n in names}
        checked = {n: 0 for n in names}
        discarded = 0
        t_s = time.monotonic()
        stop_reason = ""
        while True:
            slot, inputs, changed = next_inputs()
            k = len(rounds_clock) % len(names)
            order = names[k:] + names[:k]
            round_s: dict[str, _Sample] = {}
            for name in order:
                out, s = timer.time_call(call_for(name, slot, inputs))
                round_s[name] = s
                if changed:
                    fp = output_fingerprint(out)
                    key = (name, slot)
                    if fp is not None:
                        if key in last_fp and last_fp[key] is not None:
                            checked[name] += 1
                            if fp == last_fp[key]:
                                stale_count[name] += 1
                        last_fp[key] = fp
                del out
            clocks = [s.clock for s in round_s.values() if s.clock is not None]
            rounds_clock.append(min(clocks) if clocks else None)
            for name in names:
                all_samples[name].append(round_s[name])
            if _throttled(rounds_clock, cfg) and cfg.discard_throttled:
                discarded += 1
            else:
                for name in names:
                    kept[name].append(round_s[name])
            if discarded > cfg.max_discard_fraction * max(len(rounds_clock), 10):
                # too many throttled rounds: keep everything rather than bias the result
                flags.add(F_THROTTLED)
                kept = {n: list(all_samples[n]) for n in names}
                discarded = 0
                cfg = cfg.with_(discard_throttled=False)
            reasons = [
                _stop(vals(n), time.monotonic() - t_s, cfg) for n in names
            ]  # every side must be done
            if all(r is not None for r in reasons) or any(
                r in ("max_samples", "time_cap") for r in reasons
            ):
                stop_reason = next(
                    (r for r in reasons if r in ("time_cap", "max_samples")), "converged"
                )
                break

        if stop_reason == "time_cap":
            flags.add(F_TIME_CAP)
        elif stop_reason == "max_samples":
            flags.add(F_MAX_SAMPLES)

        # ---- per-function flags and cross-checks
        per_flags: dict[str, set[str]] = {n: set() for n in names}
        for name in names:
            ss = all_samples[name]
            if frequent(ss, "async_"):
                per_flags[name].add(F_ASYNC)
            if _frequent(ss, "deferred", cfg.deferred_min_fraction):
                per_flags[name].add(F_DEFERRED)
            if any(s.threads for s in ss):
                per_flags[name].add(F_THREAD)
            if checked[name] >= 3 and stale_count[name] > 0.5 * checked[name]:
                per_flags[name].add(F_STALE)
            if is_cuda:
                ev = np.median([s.global_ms for s in ss])
                host = np.median([s.host_ms for s in ss])
                # the host window starts before the start event fires (flush still running)
                if ev > host * 1.05 + 0.05:
                    per_flags[name].add(F_WALLCLOCK)
        if is_cuda and cfg.trace_check and not use_graph:
            for name in names:
                try:
                    ktime = _trace_kernel_ms(fns[name], get_set, cfg.trace_calls, n_slots)
                except Exception:  # noqa: BLE001 - the trace is a cross-check only
                    continue
                med = float(np.median(vals(name))) if kept[name] else math.inf
                if ktime is not None and ktime > med * 1.10 + 0.02:
                    per_flags[name].add(F_TRACE)
        flags |= timer.flags

    samples = {n: vals(n) for n in names}
    stats = {n: summarize(samples[n], discarded, sorted(flags | per_flags[n])) for n in names}
    gpu = timer.clock.uuid() if isinstance(timer, _CudaTimer) else None
    for n in names:  # where and at which clocks: for comparing runs on different machines
        stats[n].sm_clock_mhz = _median_or_none([x.clock for x in kept[n]])
        stats[n].mem_clock_mhz = _median_or_none([x.mem_clock for x in kept[n]])
        stats[n].gpu_uuid = gpu
    all_flags = sorted(flags.union(*per_flags.values()))
    return PairedResult(
        stats=stats,
        samples=samples,
        flags=all_flags,
        cuda_graph=use_graph,
        rounds=len(rounds_clock),
        seconds=time.monotonic() - t_start,
        stop_reason=stop_reason,
        config=cfg,
    )


def measure(
    fn: Callable[..., Any],
    input_sets: InputSets,
    *,
    device: str = "cuda",
    config: TimingConfig | None = None,
) -> TimingStats:
    """Time ``fn(*inputs)`` with the full protocol; ``TimingStats`` in ms with the protocol's flags.

    ``input_sets`` is a pool of input lists (rotated, values refreshed before every call) or a
    callable ``i -> inputs`` giving fresh inputs for call ``i``.
    """
    return paired({"fn": fn}, input_sets, device=device, config=config).stats["fn"]


def _stable(xs: list[float], w: int, rel: float) -> bool:
    a = float(np.median(xs[-w:]))
    b = float(np.median(xs[-2 * w : -w]))
    return abs(a - b) <= rel * max(b, 1e-9) or abs(a - b) <= 0.002  # 2 us absolute floor


def _stop(samples: list[float], elapsed: float, cfg: TimingConfig) -> str | None:
    from .stats import should_stop

    return should_stop(
        samples,
        elapsed_s=elapsed,
        min_samples=cfg.min_samples,
        max_samples=cfg.max_samples,
        target_rse=cfg.target_rse,
        time_cap_s=cfg.time_cap_s,
    )


def _throttled(clocks: list[float | None], cfg: TimingConfig) -> bool:
    """Whether the last round's SM clock is more than ``throttle_rel`` under the median so far."""
    vals = [c for c in clocks if c is not None]
    if not vals or clocks[-1] is None or len(vals) < 5:
        return False
    ref = float(np.median(vals))
    return clocks[-1] < ref * (1.0 - cfg.throttle_rel)


def _capture_graphs(fns, get_set, n_slots: int, timer) -> dict[tuple[str, int], _Replay]:
    """One CUDA graph per (function, input slot); replays return the captured outputs."""
    import torch

    out: dict[tuple[str, int], Callable[[], Any]] = {}
    side = torch.cuda.Stream(timer.device)
    pool = None
    for slot in range(n_slots):
        inputs = list(get_set(slot))
        for name, fn in fns.items():
            side.wait_stream(torch.cuda.current_stream(timer.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    fn(*inputs)
            torch.cuda.current_stream(timer.device).wait_stream(side)
            torch.cuda.synchronize(timer.device)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                res = fn(*inputs)
            if pool is None:
                pool = g.pool()

            out[(name, slot)] = _Replay(g, res)
    torch.cuda.synchronize(timer.device)
    return out


@dataclass
class _Replay:
    """A captured graph as a call: replays it and returns the outputs the capture produced."""

    graph: Any
    outputs: Any

    def __call__(self) -> Any:
        self.graph.replay()
        return self.outputs


def _inert_graphs(
    graphs: dict[tuple[str, int], _Replay], fns, get_set, timer
) -> list[tuple[str, int]]:
    """The (function, slot) graphs whose replay does not reproduce an eager call.

    For each graph: the slot's floating inputs are permuted in place (same values, other
    positions: the task's distribution is kept), an eager call gives the expected output, the
    graph's own output tensors are filled with NaN (unless they alias an input), and one replay
    must then give the expected output (``rtol`` 1e-3). A graph that recorded none or only part
    of the work (kernels launched on the legacy default stream run outside a capture) leaves
    NaN or stale values and is named here."""
    import torch

    inert = []
    with torch.no_grad():
        for (name, slot), replay in graphs.items():
            inputs = list(get_set(slot))
            _permute_inputs(inputs)
            torch.cuda.synchronize(timer.device)
            expected = _clone_tensors(fns[name](*inputs))
            torch.cuda.synchronize(timer.device)
            in_ptrs = {t.untyped_storage().data_ptr() for t in tensor_leaves(inputs)}
            for t in tensor_leaves(replay.outputs):
                if t.is_floating_point() and t.untyped_storage().data_ptr() not in in_ptrs:
                    t.fill_(float("nan"))
            got = replay()
            torch.cuda.synchronize(timer.device)
            if not _outputs_match(got, expected):
                inert.append((name, slot))
    return inert


def _permute_inputs(inputs: Sequence[Any]) -> None:
    """Roll every floating input tensor's values by one position, in place."""
    for t in tensor_leaves(list(inputs)):
        if t.is_floating_point() and t.numel() > 1 and not t.requires_grad:
            t.copy_(t.reshape(-1).roll(1).reshape(t.shape))


def _clone_tensors(out: Any) -> list[Any]:
    return [t.detach().clone() for t in tensor_leaves(out)]


def _outputs_match(got: Any, expected: list[Any], *, slice_elements: int = SLICE_ELEMENTS) -> bool:
    """Whether ``got``'s tensors equal ``expected`` (NaN where NaN; floats within 1e-3 of each
    other, relative to the largest finite magnitude of the expected tensor), compared in
    float64 slice by slice (no float64 copy of a whole multi-GB output)."""
    import torch

    tensors = list(tensor_leaves(got))
    if len(tensors) != len(expected):
        return False
    for a, b in zip(tensors, expected, strict=True):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if not a.is_floating_point():
            if not torch.equal(a, b):
                return False
            continue
        fa, fb = a.reshape(-1), b.reshape(-1)
        scale = 0.0
        for _, part in flat_slices(fb, slice_elements):
            scale = max(scale, float(part.double().nan_to_num(0.0, 0.0, 0.0).abs().max()))
        for start, part in flat_slices(fb, slice_elements):
            a64, b64 = fa[start : start + part.numel()].double(), part.double()
            if torch.isnan(a64).ne(torch.isnan(b64)).any():
                return False
            ok = torch.isclose(a64, b64, rtol=1e-3, atol=1e-3 * scale + 1e-6, equal_nan=True)
            if not bool(ok.all()):
                return False
    return True


_TRACE_READY = False


def warm_kernel_trace() -> float:
    """Start and stop one CUDA kernel trace (``torch.profiler``, CUDA activity) unless this
    process already has: the tracer's one-time set-up (CUPTI; 3.6-4.6 s in a fresh process on
    the H200: packages/guards/benchmarks/kernel_trace_start.py) and the native threads it
    leaves then happen here, not inside the first traced call. Seconds spent (0.0 once done,
    and without CUDA). It creates the CUDA context if there is none."""
    global _TRACE_READY
    import torch

    if _TRACE_READY or not torch.cuda.is_available():
        return 0.0
    from torch.profiler import ProfilerActivity, profile

    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]):
        torch.empty(1, device="cuda").fill_(0.0)
        torch.cuda.synchronize()
    _TRACE_READY = True
    return time.perf_counter() - t


def _trace_kernel_ms(fn, get_set, calls: int, n_slots: int) -> float | None:
    """Sum of device kernel time per call over ``calls`` calls under ``torch.profiler``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    sets = [list(get_set(i)) for i in range(max(1, min(calls, n_slots or calls)))]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for i in range(calls):
            fn(*sets[i % len(sets)])
        torch.cuda.synchronize()
    from torch.autograd import DeviceType

    total_us = 0.0
    for e in prof.events():
        if e.device_type != DeviceType.CPU and not e.is_async:
            total_us += float(e.time_range.elapsed_us())
    if total_us == 0.0:
        return None
    return total_us / 1e3 / calls
