"""What the evaluator asks of the profiler (``cuda_agent.profiler``): the task's baselines on
this device (from the task record, the profiler's cache, or measured holding the device's gate),
the candidate's timing protocol, the count of the task's work, and its speed-of-light floor.
Every measurement runs in a process of the profiler's; results are cached per task.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from cuda_agent.records import Candidate, TimingStats

from .config import SandboxConfig

if TYPE_CHECKING:
    from .phases import _Turn

_BASELINE_LOCK = threading.Lock()


_TASK_WORK: dict[str, Any] = {}


def _task_work(c: Candidate) -> Any:
    """The profiler's count of the task's work (``sol.Work``: FLOPs, input, output and weight
    bytes, on the meta device: no GPU), once per task; None when it cannot be counted."""
    tid = c.task.id
    if tid not in _TASK_WORK:
        try:
            from cuda_agent.profiler.sol import count_work

            _TASK_WORK[tid] = count_work(c.task.ref_code)
        except Exception:  # noqa: BLE001 - unknown: no floor, no early run alone
            _TASK_WORK[tid] = None
    return _TASK_WORK[tid]


_SOL_LOCK = threading.Lock()
_CEIL_LOCK = threading.Lock()
_SOL_CACHE: dict[str, Any] = {}


def _read_ceilings() -> Any:
    """The profiler's cached ceilings of this machine's GPU, or None (never measures)."""
    try:
        from cuda_agent.profiler.sol import cached_ceilings

        return cached_ceilings("cuda")
    except Exception:  # noqa: BLE001 - unreadable: measure
        return None


def _speed_of_light_ms(
    c: Candidate, backend: str, gpu: str | None, turn: _Turn, output_storage_bytes: int | None
) -> tuple[float | None, float | None]:
    """The profiler's output floor of the task on this device (``sol.output_floor_ms``: what any
    correct implementation must write), for the candidate's output storage, and the roofline
    estimate (``sol.estimate``, which may only flag); (None, None) when unknown.
    The device ceilings are measured once, in a subprocess on the worker's GPU holding the
    device's gate exclusive, then cached on disk."""
    if backend != "cuda":
        return None, None
    with _SOL_LOCK:
        got = _SOL_CACHE.get(c.task.id)
    if got is None:
        got = _SOL_CACHE[c.task.id] = _work_and_ceilings(c, gpu, turn)
    work, ceilings = got
    if work is None or ceilings is None:
        return None, None
    from cuda_agent.profiler.sol import estimate, output_floor_ms

    floor = output_floor_ms(work, ceilings, output_storage_bytes=output_storage_bytes)
    return floor, estimate(work, ceilings).bound_ms


def _work_and_ceilings(c: Candidate, gpu: str | None, turn: _Turn) -> tuple[Any, Any]:
    try:
        ceilings = _read_ceilings()
        if ceilings is None:
            import subprocess

            env = dict(os.environ)
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpu
            code = "from cuda_agent.profiler.sol import get_ceilings; get_ceilings('cuda')"
            # gate first, then the lock (the order everywhere: never wait for a gate holding a lock)
            with turn.exclusive("ceilings"), _CEIL_LOCK:
                ceilings = _read_ceilings()
                if ceilings is None:
                    subprocess.run(
                        [sys.executable, "-c", code], env=env, capture_output=True, timeout=600
                    )
                    # read the cache the subprocess filled (no CUDA context in the parent)
                    ceilings = _read_ceilings()
        return _task_work(c), ceilings
    except Exception:  # noqa: BLE001 - no bound rather than no result
        return None, None


def _protocol() -> str:
    from cuda_agent.profiler import PROTOCOL_VERSION

    return PROTOCOL_VERSION


def _timing_config(cfg: SandboxConfig, backend: str, baseline: Any = None) -> dict[str, Any]:
    """The candidate's timing protocol. Unless the user's ``timing_config`` sets ``cuda_graph``,
    the task's baseline decides it: graph replays where the baseline was graph-timed (the
    profiler still times eagerly a candidate whose graph does not redo its work, and that
    candidate is then compared with the baseline's figures without graphs), none otherwise.
    The candidate's own pilot, noisy near the threshold, no longer decides."""
    from cuda_agent.profiler import TimingConfig, quick_config

    base = quick_config() if backend == "cpu" else TimingConfig()
    d = base.to_dict()
    if baseline is not None and baseline.eager is not None:
        from cuda_agent.profiler.timing import F_GRAPH

        d["cuda_graph"] = "on" if F_GRAPH in baseline.eager.flags else "off"
    d.update(cfg.timing_config or {})
    return d


def _comparable_baseline(b: Any, cand: TimingStats) -> tuple[Any, Any]:
    """The baseline's (eager, compile) timed as the candidate was: with CUDA graphs only if the
    candidate's samples are graph replays."""
    from cuda_agent.profiler.timing import F_GRAPH

    if F_GRAPH in cand.flags or b.eager_nograph is None:
        return b.eager, b.compile
    return b.eager_nograph, b.compile_nograph or b.compile


def timed_as(report: dict[str, Any]) -> dict[str, Any]:
    """The timing settings a partner needs to be timed as the candidate of ``report`` was: CUDA
    graph replays only if the candidate's samples were (the profiler times a candidate whose
    graph does not redo its work without graphs)."""
    from cuda_agent.profiler.timing import F_GRAPH

    flags = (report.get("stats") or {}).get("flags") or []
    return {"cuda_graph": "on" if F_GRAPH in flags else "off"}


def _wants_baseline(cfg: SandboxConfig) -> bool:
    return cfg.timing and cfg.baselines


def _known_baseline(c: Candidate, cfg: SandboxConfig, backend: str, gpu: str | None) -> Any:
    """The task's baseline on this device when it is known without measuring: from the task
    record when it matches, else from the profiler's cache; None otherwise."""
    from cuda_agent.profiler import PROTOCOL_VERSION
    from cuda_agent.profiler.baseline import device_name

    want_compile = cfg.compile_baseline if cfg.compile_baseline is not None else backend == "cuda"
    device = "cuda" if backend == "cuda" else "cpu"
    b = c.task.baseline
    if (
        b is not None
        and b.backend == backend
        and b.protocol_version == PROTOCOL_VERSION
        and b.eager is not None
        and (not want_compile or b.compile_mode == cfg.baseline_compile_mode)
    ):
        with contextlib.suppress(Exception):
            if b.device == device_name(device):
                return b
    return _cached_baseline(c, backend, gpu, device, _compile_mode(cfg, want_compile))


def _compile_mode(cfg: SandboxConfig, want_compile: bool) -> str | None:
    """The torch.compile mode of the task's baseline (None: eager only)."""
    return cfg.baseline_compile_mode if want_compile else None


def _ratio_ci(base: TimingStats, cand: TimingStats) -> tuple[float, float] | None:
    if None in (base.ci95_low_ms, base.ci95_high_ms, cand.ci95_low_ms, cand.ci95_high_ms):
        return None
    lo = base.ci95_low_ms / cand.ci95_high_ms if cand.ci95_high_ms else None  # type: ignore[operator]
    hi = base.ci95_high_ms / cand.ci95_low_ms if cand.ci95_low_ms else None  # type: ignore[operator]
    return (lo, hi) if lo and hi else None


def _gpu_env(backend: str, gpu: str | None) -> dict[str, str] | None:
    """The profiler worker's environment: this process's, seeing only the worker's GPU (None:
    this process's as it is)."""
    if backend != "cuda" or gpu is None:
        return None
    return dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)


_TASK_LOCKS: dict[str, threading.Lock] = {}


def _task_lock(task_id: str) -> threading.Lock:
    """One lock per task: a task's baseline is measured once, different tasks' side by side."""
    with _BASELINE_LOCK:
        return _TASK_LOCKS.setdefault(task_id, threading.Lock())


def _baseline(c: Candidate, cfg: SandboxConfig, backend: str, gpu: str | None, turn: _Turn):
    """The task's eager/compile baseline on this device: from the task record when it matches,
    else from the profiler's cache, else measured by the profiler (own process, holding the
    device's gate exclusive, then cached per task and device)."""
    from cuda_agent.profiler import TimingConfig, quick_config

    hit = _known_baseline(c, cfg, backend, gpu)
    if hit is not None:
        return hit
    want_compile = cfg.compile_baseline if cfg.compile_baseline is not None else backend == "cuda"
    device = "cuda" if backend == "cuda" else "cpu"
    tc = quick_config() if backend == "cpu" else TimingConfig()
    if cfg.timing_config:
        tc = TimingConfig.from_dict({**tc.to_dict(), **cfg.timing_config})
    # the profiler's worker compiles the reference under a shared hold and is timed under an
    # exclusive one (torch.compile, 10-30 s of mostly CPU, used to sit in the exclusive hold).
    # The task's lock is taken first and held while waiting for the gate: no thread waits for
    # it while holding the gate (cached baselines are read outside any hold)
    with _task_lock(c.task.id):
        hit = _cached_baseline(c, backend, gpu, device, _compile_mode(cfg, want_compile))
        if hit is not None:
            return hit
        entered: list[bool] = []
        try:
            return _baseline_locked(c, cfg, backend, gpu, device, want_compile, tc, turn, entered)
        finally:
            if entered:
                turn.leave()


def _cached_baseline(c: Candidate, backend: str, gpu: str | None, device: str, mode: str | None):
    """The profiler's cached baseline of the task on this device with torch.compile ``mode``
    (None: eager only), or None (never measures)."""
    try:
        from cuda_agent.profiler.baseline import cached_baseline

        return cached_baseline(
            c.task,
            device=device,
            compile_mode=mode,
            env=_gpu_env(backend, gpu),
        )
    except Exception:  # noqa: BLE001 - a miss
        return None


def _baseline_locked(
    c: Candidate,
    cfg: SandboxConfig,
    backend: str,
    gpu: str | None,
    device: str,
    want_compile: bool,
    tc: Any,
    turn: _Turn,
    entered: list[bool],
):
    from cuda_agent.profiler.baseline import baseline_for_task

    @contextlib.contextmanager
    def setup() -> Iterator[None]:
        # present (holding device memory) from the set-up's grant to the end of the timing:
        # marked inside the hold, as the timing op does, so a present baseline never waits
        # for a shared hold (an ``alone`` request waits for every present occupant to leave)
        with turn.shared("baseline_setup", lengthy=True):  # torch.compile: tens of s
            turn.enter()
            entered.append(True)
            yield

    return baseline_for_task(
        c.task,
        device=device,
        compile_mode=_compile_mode(cfg, want_compile),
        timeout_s=cfg.baseline_timeout_s,
        config=tc,
        setup=setup,
        hold=lambda: turn.exclusive("baseline"),
        env=_gpu_env(backend, gpu),
    )
