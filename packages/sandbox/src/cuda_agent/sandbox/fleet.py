"""A distributed evaluation pool on Ray: :class:`RayPool`, the :class:`~.pool.SandboxPool` API
over the nodes of a Ray cluster (the engine verl, OpenRLHF and SkyRL run on)::

    with RayPool(SandboxConfig(backend="cuda"), address="auto") as pool:  # a worker per GPU
        for c, r in pool.map_unordered(candidates):
            ...

Each worker is a Ray actor (:class:`SandboxWorker`) holding a local ``SandboxPool`` on its node.
On the cuda backend it reserves ``gpus_per_worker`` GPUs (its pool's devices, from the
``CUDA_VISIBLE_DEVICES`` Ray gives it) and ``cpus_per_worker`` CPUs (its compile threads); on
the cpu backend ``cpus_per_worker`` CPUs. Workers are spread over the nodes (Ray's ``SPREAD``
strategy); a candidate is compiled and run on the node of the worker it is sent to. Candidates
travel as encoded records (JSON bytes) and results come back the same way: the records are the
only coupling, so every node needs the same cuda-agent install, not the caller's objects.

What it guarantees:

* One result per submitted candidate (its future is set once). A job whose worker or node died
  (any Ray system error: the actor died or became unreachable, its node was lost) is sent again,
  to another worker where one is up, up to ``max_attempts`` in all; after that its result is an
  ``infra_error`` naming each failure. A lost attempt's result is never delivered, so no job is
  written twice. An evaluation that raised (a sandbox bug) raises from its future, as in
  ``SandboxPool``; a candidate's own failures are results, as everywhere.
* A worker that died is restarted by Ray (``max_restarts``, on any node with the resources) and
  takes jobs again once it answers; one that cannot be restarted is replaced by a new actor (at
  most ``workers`` replacements in all). Queued jobs wait for a worker; when none has been up for
  ``stall_timeout_s`` (or none is left) they become ``infra_error`` results.
* Back-pressure: at most ``window`` candidates in flight (queued here or running), ``submit``
  blocks beyond that and ``map``/``map_unordered`` read their items only that far ahead; a worker
  is sent at most its pool's ``default_window`` at once.

``result.meta["ray"]`` says where a result came from: node id, host, pid, worker index, attempt.
Needs the ``ray`` extra (``uv sync --extra ray``). Ray's ``uv run`` integration (shipping the
project to workers run with ``uv run``) is off unless ``RAY_ENABLE_UV_RUN_RUNTIME_ENV`` is set
before Ray is imported: workers use the Python environment their node already has.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from cuda_agent.records import Candidate, EvalResult, Status
from cuda_agent.records.jsonl import decode, encode

from .config import SandboxConfig, resolve_backend
from .windowed import map_as_done, map_in_order

DEFAULT_MAX_ATTEMPTS = 3
START_GRACE_S = 30.0  # RayPool() returns once workers are up and no other came up this long
_log = logging.getLogger(__name__)


def import_ray() -> Any:
    """The ``ray`` module, or an ImportError saying which extra to install."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            "RayPool needs Ray: install the sandbox's `ray` extra (`uv sync --extra ray` in this "
            "repository, or `pip install 'cuda-agent-sandbox[ray]'`)"
        ) from e
    return ray


def connect(address: str | None) -> bool:
    """Connect this process to Ray: the session already open if any, else ``address``
    (``"local"``: start a cluster of this machine alone, on the loopback address; ``"auto"``: the
    running cluster; ``HOST:PORT`` or ``ray://...``; None: Ray's default, $RAY_ADDRESS or a new
    local one). True when this call opened the connection (``RayPool.close`` then ends it)."""
    if address == "local" and "ray" not in sys.modules:
        # a cluster of this machine alone: Ray then takes the loopback address for its own,
        # not the host's interface (it reads this when imported)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = import_ray()
    if ray.is_initialized():
        return False
    if address == "local":
        ray.init(address="local", include_dashboard=False)
    else:
        ray.init(address=address)
    return True


class SandboxWorker:
    """One Ray worker: a local :class:`~.pool.SandboxPool` on its node, evaluating candidates
    sent as encoded records (created as a Ray actor by :class:`RayPool`)."""

    def __init__(self, config: dict[str, Any], pool_kw: dict[str, Any], env: dict[str, str]):
        os.environ.update(env)
        import ray

        from .pool import SandboxPool, visible_gpus

        cfg = SandboxConfig.from_dict(config)
        gpus = visible_gpus() if cfg.backend == "cuda" else None  # what Ray assigned this actor
        self.pool = SandboxPool(cfg, gpus=gpus or None, **pool_kw)
        node = ray.get_runtime_context().get_node_id()
        self.where = {"node": node, "host": socket.gethostname(), "pid": os.getpid()}

    def info(self) -> dict[str, Any]:
        """Where this worker runs and what its pool has."""
        p = self.pool
        return {
            **self.where,
            "devices": list(p.devices),
            "workers_per_device": p.workers_per_device,
            "compile_workers": p.compile_workers,
            "default_window": p.default_window,
        }

    def evaluate(self, data: bytes) -> bytes:
        """Evaluate one encoded Candidate; the encoded EvalResult."""
        r = self.pool.evaluate(decode(data, Candidate))
        r.meta["ray"] = dict(self.where)
        return encode(r)

    def close(self) -> None:
        self.pool.close()


@dataclass(eq=False)
class _Job:
    candidate: Candidate
    data: bytes
    future: Future
    attempts: int = 0
    failures: list[str] = field(default_factory=list)
    avoid: set[int] = field(default_factory=set)  # workers an attempt was lost on
    finished: bool = False


@dataclass(eq=False)
class _Worker:
    index: int
    handle: Any
    capacity: int
    state: str = "starting"  # starting | up | down (restarting or unreachable) | dead
    info: dict[str, Any] = field(default_factory=dict)
    running: dict[Any, _Job] = field(default_factory=dict)  # ObjectRef -> job
    error: str = ""


@dataclass
class FleetStats:
    """What a :class:`RayPool` did: jobs submitted and finished, attempts sent again after a lost
    worker, jobs given up (``infra_error``), workers lost, back up and replaced."""

    submitted: int = 0
    finished: int = 0
    retried: int = 0
    given_up: int = 0
    workers_lost: int = 0
    workers_back: int = 0
    workers_replaced: int = 0


class RayPool:
    """Evaluate candidates on the workers of a Ray cluster with the ``SandboxPool`` API (see the
    module docstring). Thread-safe.

    ``address``: see :func:`connect`. ``workers``: Ray actors to start (default: the cluster's
    GPUs / ``gpus_per_worker`` on cuda, its CPUs / ``cpus_per_worker`` on cpu). Each worker's
    pool has ``compile_workers`` compile threads (default: ``cpus_per_worker``, at least 1),
    ``cpu_workers`` device workers on the cpu backend and ``workers_per_device`` per GPU on cuda
    (default ``SandboxConfig.workers_per_gpu``). ``resources``: extra Ray resources each worker
    needs (e.g. ``{"sandbox": 1}`` to keep them to labelled nodes). ``env``: environment
    variables set in each worker before its pool starts. Several workers per GPU: raise
    ``workers_per_device`` rather than give a worker a fraction of a GPU (each pool would size its
    processes' memory share as if it had the GPU alone)."""

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        address: str | None = None,
        workers: int | None = None,
        gpus_per_worker: float = 1,
        cpus_per_worker: float = 1,
        compile_workers: int | None = None,
        cpu_workers: int = 1,
        workers_per_device: int | None = None,
        window: int | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        max_restarts: int = 3,
        spread: bool = True,
        resources: dict[str, float] | None = None,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 300.0,
        stall_timeout_s: float = 1800.0,
    ):
        self._ray = ray = import_ray()
        self._workers: list[_Worker] = []
        self._closed = False
        self._owns_ray = connect(address)
        try:
            cfg = config or SandboxConfig()
            have = ray.cluster_resources()
            if cfg.backend == "auto":  # what the cluster has, not what this process sees
                self.backend = "cuda" if have.get("GPU", 0) > 0 else "cpu"
            else:
                self.backend = resolve_backend(cfg.backend)
            cuda = self.backend == "cuda"
            if cuda and have.get("GPU", 0) < gpus_per_worker:
                raise RuntimeError(
                    f"the Ray cluster has {have.get('GPU', 0):g} GPUs; a worker needs "
                    f"{gpus_per_worker:g} (use the cpu backend without GPUs)"
                )
            self.config = cfg.with_(backend=self.backend)
            if workers is None:  # as many as the cluster has room for
                per_worker, kind = (gpus_per_worker, "GPU") if cuda else (cpus_per_worker, "CPU")
                workers = int(have.get(kind, 1) // max(per_worker, 1e-9))
            n = max(1, workers)
            n_compile = compile_workers or max(1, int(cpus_per_worker))
            if cuda:
                per = max(1, workers_per_device or self.config.workers_per_gpu)
                pool_kw: dict[str, Any] = {"compile_workers": n_compile, "workers_per_device": per}
                devs_each = max(1, math.ceil(gpus_per_worker))
            else:
                per = max(1, cpu_workers)
                pool_kw = {"compile_workers": n_compile, "cpu_workers": per}
                devs_each = 1
            self.workers_per_device = per
            # what a worker's pool keeps in flight (SandboxPool.default_window)
            self._cap = 2 * devs_each * per + 2 * n_compile
            self.window = window or n * self._cap
            self.max_attempts = max(1, max_attempts)
            self.stall_timeout_s = stall_timeout_s
            self.stats = FleetStats()
            self._replacements_left = n
            opts: dict[str, Any] = {
                "num_cpus": cpus_per_worker,
                "num_gpus": gpus_per_worker if cuda else 0,
                "max_restarts": max_restarts,
                "max_task_retries": 0,  # a lost attempt is sent again by the pool, elsewhere
                "max_concurrency": self._cap + 2,  # its jobs, and info/close calls beside them
                "scheduling_strategy": "SPREAD" if spread else "DEFAULT",
            }
            if resources:
                opts["resources"] = dict(resources)
            self._actor_cls = ray.remote(SandboxWorker).options(**opts)
            self._actor_args = (self.config.to_dict(), pool_kw, dict(env or {}))
            self._cond = threading.Condition()  # guards everything below, the workers' state
            self._queue: deque[_Job] = deque()
            self._refs: dict[Any, tuple[_Worker, _Job | None]] = {}  # ObjectRef -> its call
            self._outstanding = 0
            self._slots = threading.BoundedSemaphore(self.window)
            self._last_up = time.monotonic()
            self._error: BaseException | None = None
            with self._cond:
                for i in range(n):
                    handle = self._actor_cls.remote(*self._actor_args)
                    self._workers.append(_Worker(index=i, handle=handle, capacity=self._cap))
                    self._probe(self._workers[-1])
            self._thread = threading.Thread(target=self._loop, name="raypool", daemon=True)
            self._thread.start()
            self._wait_started(start_timeout_s)
        except BaseException:
            self._teardown()
            raise

    def _wait_started(self, timeout_s: float) -> None:
        """Wait for every worker, or, once one is up, until none has come up for a while (the
        rest, e.g. more than the cluster has room for now, join when Ray places them)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while any(w.state == "starting" for w in self._workers) and self._error is None:
                now = time.monotonic()
                if now >= deadline or (
                    any(w.state == "up" for w in self._workers)
                    and now - self._last_up > START_GRACE_S
                ):
                    break
                self._cond.wait(min(deadline - now, 1.0))
            if self._error is not None:
                raise RuntimeError(f"RayPool dispatcher failed: {self._error}")
            if not any(w.state == "up" for w in self._workers):
                errors = "; ".join(f"worker {w.index}: {w.error or w.state}" for w in self._workers)
                raise RuntimeError(f"no Ray worker started in {timeout_s:.0f}s ({errors})")

    # -- what eval_stream and people read ---------------------------------------------------

    @property
    def devices(self) -> list[str]:
        """The devices of the workers up now, as ``NODE:DEVICE`` (node id prefix)."""
        with self._cond:
            return [
                f"{w.info['node'][:8]}:{d}"
                for w in self._workers
                if w.state == "up"
                for d in w.info["devices"]
            ]

    @property
    def compile_workers(self) -> int:
        """Compile threads of the workers up now, all together."""
        with self._cond:
            return sum(w.info["compile_workers"] for w in self._workers if w.state == "up")

    @property
    def default_window(self) -> int:
        """Candidates in flight at most (``window``): every worker's pool kept busy."""
        return self.window

    def workers_info(self) -> list[dict[str, Any]]:
        """Each worker: index, state, node, host, pid, jobs running, capacity, last error."""
        with self._cond:
            return [
                {
                    "index": w.index,
                    "state": w.state,
                    "node": w.info.get("node", ""),
                    "host": w.info.get("host", ""),
                    "pid": w.info.get("pid"),
                    "running": len(w.running),
                    "capacity": w.capacity,
                    "error": w.error,
                }
                for w in self._workers
            ]

    # -- API ---------------------------------------------------------------------------------

    def submit(self, candidate: Candidate) -> Future[EvalResult]:
        """Start evaluating ``candidate`` (blocks while ``window`` candidates are in flight);
        the future's result is its ``EvalResult``."""
        if self._closed:
            raise RuntimeError("pool is closed")
        self._slots.acquire()
        job = _Job(candidate=candidate, data=encode(candidate), future=Future())
        with self._cond:
            if self._closed or self._error is not None:
                self._slots.release()
                raise RuntimeError(f"pool is closed{f' ({self._error})' if self._error else ''}")
            self._queue.append(job)
            self._outstanding += 1
            self.stats.submitted += 1
            self._dispatch()
            self._cond.notify_all()
        return job.future

    def evaluate(self, candidate: Candidate) -> EvalResult:
        """Evaluate one candidate (blocking)."""
        return self.submit(candidate).result()

    def map(
        self, items: Iterable[Any], window: int | None = None, *, return_exceptions: bool = False
    ) -> Iterator[Any]:
        """Results in input order, at most ``window`` in flight (``SandboxPool.map``): items that
        are not ``Candidate`` pass through in their place; ``items`` is read lazily."""
        return map_in_order(self.submit, items, window or self.default_window, return_exceptions)

    def map_unordered(
        self, items: Iterable[Any], window: int | None = None, *, return_exceptions: bool = False
    ) -> Iterator[tuple[Any, Any]]:
        """``(item, result)`` as each finishes, at most ``window`` in flight
        (``SandboxPool.map_unordered``); items that are not ``Candidate`` come back at once as
        ``(item, item)``."""
        return map_as_done(self.submit, items, window or self.default_window, return_exceptions)

    def close(self) -> None:
        """Finish the jobs in flight, stop the workers (and end the Ray connection this pool
        opened)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        with self._cond:
            while self._outstanding and self._error is None:
                self._cond.wait(1.0)
            self._cond.notify_all()
        self._thread.join(timeout=60)
        self._teardown()

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the dispatcher ----------------------------------------------------------------------

    def _teardown(self) -> None:
        ray = self._ray
        self._closed = True
        workers = list(getattr(self, "_workers", []))
        up = [w for w in workers if w.state == "up"]
        if up:  # each pool closes its fork servers; then the actors go, restarts off
            refs = [w.handle.close.remote() for w in up]
            ray.wait(refs, num_returns=len(refs), timeout=60)
        for w in workers:
            _kill(ray, w.handle)
        if self._owns_ray:
            self._owns_ray = False
            ray.shutdown()

    def _probe(self, w: _Worker) -> None:
        """Ask ``w`` where it is; Ray holds the call while the actor (re)starts."""
        ref = w.handle.info.options(max_task_retries=-1).remote()
        self._refs[ref] = (w, None)

    def _pick(self, job: _Job) -> _Worker | None:
        free = [w for w in self._workers if w.state == "up" and len(w.running) < w.capacity]
        if not free:
            return None
        return min(free, key=lambda w: (w.index in job.avoid, len(w.running) / w.capacity))

    def _dispatch(self) -> None:
        """Send queued jobs to workers with room (under the lock)."""
        while self._queue:
            w = self._pick(self._queue[0])
            if w is None:
                return
            job = self._queue.popleft()
            job.attempts += 1
            ref = w.handle.evaluate.remote(job.data)
            w.running[ref] = job
            self._refs[ref] = (w, job)

    def _loop(self) -> None:
        ray = self._ray
        try:
            while True:
                with self._cond:
                    if self._closed and not self._outstanding:
                        return
                    self._dispatch()
                    stalled = self._stalled()
                    refs = list(self._refs)
                for job, why in stalled:  # outside the lock: callbacks may call the pool
                    self._finish(job, result=self._given_up(job, why))
                if not refs:
                    with self._cond:
                        self._cond.wait(0.2)
                    continue
                ready, rest = ray.wait(refs, num_returns=1, timeout=0.2)
                if ready and rest:
                    more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                    ready += more
                for ref in ready:
                    self._settle(ref)
        except BaseException as e:  # noqa: BLE001 - every future learns of it
            with self._cond:
                self._error = e
                jobs = list(self._queue) + [j for _, j in self._refs.values() if j is not None]
                self._queue.clear()
                self._refs.clear()
                self._cond.notify_all()
            for job in jobs:
                self._finish(job, exc=RuntimeError(f"RayPool dispatcher failed: {e!r}"))

    def _settle(self, ref: Any) -> None:
        """A finished call: a probe (worker up, or dead) or an attempt (result or lost)."""
        ray = self._ray
        with self._cond:
            w, job = self._refs.pop(ref)
            if job is not None:
                w.running.pop(ref, None)
        try:
            value = ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # the worker's code raised
            if job is None:
                self._worker_failed(w, e)
            else:
                self._finish(job, exc=e.as_instanceof_cause())
            return
        except ray.exceptions.RayError as e:  # the actor or its node is gone or unreachable
            if job is None:
                self._worker_failed(w, e)
            else:
                self._lost(w, job, e)
            return
        if job is None:
            self._worker_up(w, value)
            return
        try:
            r = decode(value, EvalResult)
            r.meta.setdefault("ray", {}).update(worker=w.index, attempt=job.attempts)
        except Exception as e:  # noqa: BLE001 - delivered to the caller
            self._finish(job, exc=e)
            return
        self._finish(job, result=r)

    def _worker_up(self, w: _Worker, info: dict[str, Any]) -> None:
        with self._cond:
            back = w.state == "down"
            w.state, w.info, w.error = "up", info, ""
            w.capacity = max(1, int(info.get("default_window") or self._cap))
            self._last_up = time.monotonic()
            if back:
                self.stats.workers_back += 1
                _log.warning("ray pool: worker %d is back on node %s", w.index, info["node"][:8])
            self._dispatch()
            self._cond.notify_all()

    def _worker_failed(self, w: _Worker, e: BaseException) -> None:
        """``w``'s probe failed: it cannot come back (restarts spent, or its start failed); a
        new actor takes its place while replacements are left."""
        with self._cond:
            w.error = f"{type(e).__name__}: {_first_line(e)}"
            if self._replacements_left > 0 and not self._closed:
                self._replacements_left -= 1
                self.stats.workers_replaced += 1
                _log.warning(
                    "ray pool: worker %d is gone (%s); starting a new one", w.index, w.error
                )
                _kill(self._ray, w.handle)
                w.handle = self._actor_cls.remote(*self._actor_args)
                w.state = "starting" if not w.info else "down"
                self._probe(w)
            else:
                w.state = "dead"
                _log.warning("ray pool: worker %d is gone (%s)", w.index, w.error)
            self._cond.notify_all()

    def _lost(self, w: _Worker, job: _Job, e: BaseException) -> None:
        """An attempt lost with its worker: the job is queued again, first, or given up."""
        where = w.info.get("node", "")[:8] or "?"
        job.failures.append(
            f"worker {w.index} on node {where}: {type(e).__name__}: {_first_line(e)}"
        )
        job.avoid.add(w.index)
        give_up = job.attempts >= self.max_attempts
        with self._cond:
            if w.state == "up":  # wait for Ray to restart it (or learn that it cannot)
                w.state = "down"
                w.error = job.failures[-1]
                self.stats.workers_lost += 1
                _log.warning("ray pool: lost worker %d (%s)", w.index, job.failures[-1])
                self._probe(w)
            if not give_up:
                self.stats.retried += 1
                self._queue.appendleft(job)
                self._dispatch()
                return
        self._finish(job, result=self._given_up(job, "lost with its worker"))

    def _stalled(self) -> list[tuple[_Job, str]]:
        """Queued jobs that no worker can take, for too long or for good, taken off the queue
        with the reason (under the lock)."""
        if not self._queue:
            return []
        if any(w.state == "up" for w in self._workers):
            self._last_up = time.monotonic()
            return []
        gone = all(w.state == "dead" for w in self._workers)
        waited = time.monotonic() - self._last_up
        if not gone and waited < self.stall_timeout_s:
            return []
        why = "no Ray worker is left" if gone else f"no Ray worker up for {waited:.0f}s"
        jobs = list(self._queue)
        self._queue.clear()
        for job in jobs:
            job.failures.append(why)
        return [(job, why) for job in jobs]

    def _given_up(self, job: _Job, why: str) -> EvalResult:
        c = job.candidate
        with self._cond:
            self.stats.given_up += 1
        return EvalResult(
            task_id=c.task.id,
            solution_id=c.solution.id,
            backend=self.backend,  # type: ignore[arg-type]
            device="ray",
            status=Status.INFRA_ERROR,
            message=f"ray pool: {why} after {job.attempts} attempt(s): "
            + "; ".join(job.failures)[-1500:],
            meta={"ray": {"attempts": job.attempts, "failures": list(job.failures)}},
        )

    def _finish(
        self, job: _Job, *, result: EvalResult | None = None, exc: BaseException | None = None
    ) -> None:
        """Deliver ``job``'s one result (or exception) and free its slot; a job is finished once."""
        with self._cond:
            if job.finished:
                return
            job.finished = True
            self._outstanding -= 1
            self.stats.finished += 1
            self._cond.notify_all()
        self._slots.release()
        if exc is not None:
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)


def _kill(ray: Any, handle: Any) -> None:
    """End an actor for good (no restart); one already gone is fine."""
    with contextlib.suppress(Exception):
        ray.kill(handle, no_restart=True)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""
