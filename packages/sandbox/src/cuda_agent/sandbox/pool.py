"""A reusable evaluation pool: compilation in a CPU pool, one device worker per GPU.

``SandboxPool`` is what ``agent``, ``opsynth`` and ``ppo`` hold for a whole run::

    with SandboxPool(SandboxConfig(), gpus=["0", "1"]) as pool:
        result = pool.evaluate(candidate)               # blocking
        fut = pool.submit(candidate)                    # concurrent.futures.Future[EvalResult]
        for r in pool.map(candidates):                  # results in input order
            ...
        for c, r in pool.map_unordered(candidates):     # (candidate, result) as each finishes
            ...

Each candidate is prepared (static guards, materialise, compile) by one of ``compile_workers``
threads, then verified and timed by one of the device workers: ``workers_per_device`` per GPU
(default ``SandboxConfig.workers_per_gpu`` = 2), or ``cpu_workers`` on the cpu backend. Workers of
one device overlap their reference and verification processes and take the device alone for
anything timed (``gate.DeviceGate``; on the cpu backend all workers share one timing domain, the
host; the gate is host-wide: other processes timing on the device, e.g. other ranks, are held
off too). With several workers per GPU each process's CUDA allocator is capped to
``GPU_MEMORY_SHARE / workers_per_device`` of the GPU (a task too large for that share gets a
larger one, or the device alone: ``admission.device_share``), and a memory failure met while
sharing is re-run alone (``evaluate`` module docstring). Every process that runs candidate code is fresh
and confined (see ``isolation``); each worker has its own slot (uid).
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from cuda_agent.profiler.cpus import install as install_timing_cpus
from cuda_agent.records import Candidate, EvalResult

from .admission import GPU_MEMORY_SHARE
from .config import SandboxConfig, resolve_backend
from .evaluate import Prepared, prepare, prewarm_servers, run_on_device
from .gate import device_gate, domain_of
from .windowed import map_as_done, map_in_order


def pool_gpus(gpus: Sequence[str] | None) -> list[str]:
    """The GPUs a cuda pool on ``gpus`` uses: those given, else the first visible one."""
    return list(gpus) if gpus else (visible_gpus()[:1] or ["0"])


def visible_gpus() -> list[str]:
    """GPU indices visible to this process ($CUDA_VISIBLE_DEVICES, else nvidia-smi)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip()]
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        p = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return [ln.strip() for ln in p.stdout.splitlines() if ln.strip()]
    except (OSError, subprocess.TimeoutExpired):
        return []


def parse_gpus(spec: str | None) -> list[str] | None:
    """``"all"`` -> every visible GPU, ``"0,1"`` -> the first two visible GPUs (physical ids when
    CUDA_VISIBLE_DEVICES is set), None -> None (default)."""
    if spec is None:
        return None
    if spec.strip() == "all":
        return visible_gpus()
    ids = [g.strip() for g in spec.split(",") if g.strip()]
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:  # indices are relative to the devices this process may see
        visible = [g.strip() for g in env.split(",") if g.strip()]
        try:
            return [visible[int(i)] for i in ids]
        except (ValueError, IndexError):
            raise ValueError(
                f"--gpus {spec}: CUDA_VISIBLE_DEVICES={env} has {len(visible)} devices"
            ) from None
    return ids


class SandboxPool:
    """Evaluate many candidates concurrently (see the module docstring). Thread-safe."""

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        gpus: Sequence[str] | None = None,
        compile_workers: int | None = None,
        cpu_workers: int = 1,
        workers_per_device: int | None = None,
    ):
        self.config = config or SandboxConfig()
        self.backend = resolve_backend(self.config.backend)
        install_timing_cpus(self.config.timing_cpus)  # before any process is started
        if self.backend == "cuda":
            devs = pool_gpus(gpus)
            per = max(1, workers_per_device or self.config.workers_per_gpu)
            workers = [(d, domain_of("cuda", d)) for d in devs for _ in range(per)]
            self.mem_fraction: float | None = GPU_MEMORY_SHARE / per if per > 1 else None
        else:
            devs = [f"cpu{i}" for i in range(max(1, cpu_workers))]
            per = len(devs)  # one timing domain: the host
            workers = [(d, domain_of("cpu", None)) for d in devs]
            self.mem_fraction = None
        self.devices = devs
        self.workers_per_device = per
        n_compile = compile_workers or max(1, min(8, (os.cpu_count() or 2) // 2))
        self.compile_workers = n_compile
        self._slots = itertools.count(len(workers))
        self._local = threading.local()
        self._compile = ThreadPoolExecutor(
            max_workers=n_compile, thread_name_prefix="sandbox-compile"
        )
        self._queue: queue.Queue[tuple[Future[Prepared], Future[EvalResult]] | None] = queue.Queue()
        self._workers = [
            threading.Thread(
                target=self._device_loop,
                args=(d, dom, i),
                name=f"sandbox-dev-{d}-{i}",
                daemon=True,
            )
            for i, (d, dom) in enumerate(workers)
        ]
        for w in self._workers:
            w.start()
        self._closed = False
        # the device phases' fork servers import while the first candidates compile
        prewarm_servers(
            self.config,
            self.backend,
            list(dict.fromkeys(d if self.backend == "cuda" else None for d in devs)),
        )

    # -- stages ----------------------------------------------------------------------------

    def _prepare(self, c: Candidate, submitted: float) -> Prepared:
        waited = time.monotonic() - submitted
        slot = getattr(self._local, "slot", None)
        if slot is None:
            slot = self._local.slot = next(self._slots)
        p = prepare(c, self.config, backend=self.backend, slot=slot)
        # before prepare's clock: a decided result's stages are written already
        p.stages["compile_queue"] = waited
        if p.result is not None:
            p.result.meta.setdefault("stages_s", {})["compile_queue"] = round(waited, 3)
        return p

    def _device_loop(self, device: str, domain: str, slot: int) -> None:
        gpu = device if self.backend == "cuda" else None
        gate = device_gate(domain)
        while True:
            item = self._queue.get()
            if item is None:
                return
            pf, rf = item
            try:
                r = run_on_device(
                    pf.result(), gpu=gpu, slot=slot, gate=gate, mem_fraction=self.mem_fraction
                )
                r.meta.setdefault("worker", device)
                r.meta.setdefault("workers_on_device", self.workers_per_device)
                r.meta.setdefault("pool_pid", os.getpid())  # the process whose pool ran it
                rf.set_result(r)
            except BaseException as e:  # noqa: BLE001 - delivered to the caller
                rf.set_exception(e)

    # -- API --------------------------------------------------------------------------------

    def submit(self, candidate: Candidate) -> Future[EvalResult]:
        """Start evaluating ``candidate``; the future's result is its ``EvalResult``."""
        if self._closed:
            raise RuntimeError("pool is closed")
        rf: Future[EvalResult] = Future()
        pf = self._compile.submit(self._prepare, candidate, time.monotonic())
        pf.add_done_callback(lambda f: self._to_device(f, rf))
        return rf

    def _to_device(self, pf: Future[Prepared], rf: Future[EvalResult]) -> None:
        """A compiled candidate to the device workers' queue; one whose verdict the CPU half
        already decided (a static rejection, a compile error) is delivered at once instead of
        waiting behind others' device work for a worker that would only hand it back."""
        if pf.exception() is None and pf.result().result is not None:
            r = run_on_device(pf.result())  # its decided result, its directories removed
            r.meta.setdefault("pool_pid", os.getpid())  # no device worker: no meta.worker
            rf.set_result(r)
            return
        self._queue.put((pf, rf))

    def evaluate(self, candidate: Candidate) -> EvalResult:
        """Evaluate one candidate (blocking)."""
        return self.submit(candidate).result()

    @property
    def default_window(self) -> int:
        """Candidates ``map`` keeps in flight by default: enough to keep every compile worker and
        device worker busy."""
        return 2 * len(self._workers) + 2 * self.compile_workers

    def map(
        self, items: Iterable[Any], window: int | None = None, *, return_exceptions: bool = False
    ) -> Iterator[Any]:
        """Evaluate candidates from ``items`` concurrently, yielding results in input order.

        Items that are not ``Candidate`` pass through unchanged, in order (the CLI uses this for
        error records). At most ``window`` candidates are in flight (default:
        ``default_window``; 1: one at a time), and ``items`` is read only as far as that allows.
        An evaluation that raised raises here, or with ``return_exceptions`` is yielded as its
        exception in its place."""
        return map_in_order(self.submit, items, window or self.default_window, return_exceptions)

    def map_unordered(
        self, items: Iterable[Any], window: int | None = None, *, return_exceptions: bool = False
    ) -> Iterator[tuple[Any, Any]]:
        """Like :meth:`map`, but yields ``(item, result)`` as each evaluation finishes, so that one
        slow candidate holds back no other result. Items that are not ``Candidate`` come back at
        once as ``(item, item)``. At most ``window`` candidates are in flight."""
        return map_as_done(self.submit, items, window or self.default_window, return_exceptions)

    def close(self) -> None:
        """Finish queued work and stop the workers."""
        if self._closed:
            return
        self._closed = True
        self._compile.shutdown(wait=True)
        for _ in self._workers:
            self._queue.put(None)
        for t in self._workers:
            t.join()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
