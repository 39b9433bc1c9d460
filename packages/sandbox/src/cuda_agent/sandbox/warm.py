"""Runner processes started ahead of need, so that no evaluation phase waits for ``import torch``.

Every phase of an evaluation (reference, compile, candidate, time) is a fresh confined process
running ``python -m cuda_agent.sandbox.runner SPEC``; each used to start by importing torch
(3-5 s). A :class:`WarmPool` keeps, per environment, a few confinement launchers
(:func:`isolation.start_warm`) that have imported the runner and torch and wait for a job; a
phase takes one (:func:`isolation.run_confined` with ``warm=``), which confines itself exactly
as a cold launcher would (namespaces, read-only file system, limits, uid drop) and then runs the
runner in-process, and a replacement starts at once, importing while the phase runs.

The import happens before the job exists, as the launcher's user, from the environment the
phase will have except the keys that name per-evaluation directories (:data:`VOLATILE`), which
are read when used, not at import (``tempfile``'s cached directory is reset per job); a phase
whose environment differs in any other key gets its own spares. Nothing of the candidate's is
seen before the job: its code runs only after the confinement, in a fresh child process.

With ``fork=True`` (the default of the evaluation, ``SandboxConfig.fork_server``) a pool keeps
instead one :class:`forkserver.ForkServer` per environment, which imports once and forks a
launcher per phase: the import is then saved, not only moved (about 3 s of CPU per phase on a
small host). A phase whose server is still importing waits for it (about what a cold start
costs, and no second import); one whose server could not start runs cold. A pool keeps at
most ``max_servers`` servers (each holds an imported torch, a few hundred MB): a new
environment beyond that stops the least recently used server that has no launcher running.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

from .forkserver import ForkServer, start_server
from .isolation import RUN_MARK, WarmProcess, start_warm

RUNNER = "cuda_agent.sandbox.runner"
# what the runner's operations import (the first must import; the others only save time)
RUNNER_MODULES = (
    RUNNER,
    "torch",
    "msgspec",
    "cuda_agent.profiler",
    "cuda_agent.profiler.program",
    "cuda_agent.sandbox.kbcache",
    "cuda_agent.guards.api",
)
# imported too where no GPU is visible (the kernelbench compile phase, the cpu backend): its
# import (setuptools, about 0.1 s) asks ``torch.cuda.is_available()``, which initialises the
# CUDA driver, and a process forked after that cannot use CUDA, so never where a GPU is visible
NO_GPU_MODULES = ("torch.utils.cpp_extension",)
# environment keys that differ per evaluation and are read where used, not at import
VOLATILE = (
    "HOME",
    "TMPDIR",
    "TORCH_EXTENSIONS_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    RUN_MARK,
)


class _Server:
    """A fork server being started for one environment key, and the launchers it forked."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.server: ForkServer | None = None
        self.last_used = time.monotonic()
        # weak: a job's pipes close when its caller drops it, not when the server goes
        self.launchers: list[weakref.ref] = []

    def busy(self) -> bool:
        """Whether it is starting or a launcher it forked has not ended (stopping the server
        would kill that launcher's job)."""
        if not self.done.is_set():
            return True
        self.launchers = [r for r in self.launchers if (p := r()) is not None and p.poll() is None]
        return bool(self.launchers)


class WarmPool:
    """Spare runner launchers, ``per_key`` per distinct environment, or (``fork``) a fork
    server per environment; thread-safe."""

    def __init__(
        self,
        modules: Sequence[str] = RUNNER_MODULES,
        per_key: int = 2,
        fork: bool = False,
        max_servers: int = 16,
    ) -> None:
        self.modules = tuple(modules)
        self.per_key = per_key
        self.fork = fork
        self.max_servers = max(1, max_servers)
        self._servers: dict[tuple, _Server] = {}
        # why fork servers did not start or serve, newest last (the last few)
        self.server_errors: collections.deque[str] = collections.deque(maxlen=20)
        self._spares: dict[tuple, list[WarmProcess]] = {}
        self._pending: dict[tuple, int] = {}
        self._lock = threading.Lock()
        self._dir: Path | None = None
        self._orders: queue.SimpleQueue[tuple[tuple, dict[str, str], _Server | None] | None] = (
            queue.SimpleQueue()
        )
        # spares are started by one long-lived thread: a launcher dies with the thread that
        # started it (PR_SET_PDEATHSIG follows the parent thread), and a phase's thread ends
        # while the spares it asked for wait for later phases
        self._starter = threading.Thread(target=self._start_loop, name="warm-starter", daemon=True)
        self._starter.start()
        self.started = 0
        self.closed = False

    def _start_loop(self) -> None:
        while True:
            order = self._orders.get()
            if order is None:
                return
            key, env, server = order
            if server is not None:
                self._start_server(server, env)
                continue
            try:
                w = start_warm(self.modules_for(env), env, self._home())
            except OSError:
                w = None
            with self._lock:
                self._pending[key] = self._pending.get(key, 1) - 1
                if w is not None and not self.closed:
                    self._spares.setdefault(key, []).append(w)
                    self.started += 1
                    w = None
            if w is not None:
                w.discard()

    def _start_server(self, slot: _Server, env: dict[str, str]) -> None:
        srv: ForkServer | None = None
        try:
            srv = start_server(self.modules_for(env), env, self._home())
        except OSError as e:
            self.server_errors.append(f"fork server not started: {e}")
        if srv is not None and not srv.ready:
            self.server_errors.append(srv.error)
            srv = None
        with self._lock:
            if self.closed and srv is not None:
                srv.close()
                srv = None
            slot.server = srv
        slot.done.set()

    def _home(self) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="cuda-agent-warm-"))
        return self._dir

    def modules_for(self, env: dict[str, str]) -> tuple[str, ...]:
        """What a launcher for ``env`` imports: the pool's modules, and where ``env`` shows no
        GPU (``CUDA_VISIBLE_DEVICES`` empty) the runner's :data:`NO_GPU_MODULES` too."""
        if self.modules == RUNNER_MODULES and env.get("CUDA_VISIBLE_DEVICES") == "":
            return self.modules + NO_GPU_MODULES
        return self.modules

    @staticmethod
    def key(env: dict[str, str]) -> tuple:
        return tuple(sorted((k, v) for k, v in env.items() if k not in VOLATILE))

    def take(self, cmd: Sequence[str], env: dict[str, str]) -> WarmProcess | None:
        """A launcher for ``cmd`` (``[sys.executable, "-m", RUNNER, ...]``) under ``env``, or None
        (start it cold): forked from ``env``'s fork server (``fork``; its first take waits for the
        server's import), else a spare, the spares for ``env`` then topped up to ``per_key``."""
        if len(cmd) < 3 or cmd[0] != sys.executable or cmd[1] != "-m" or cmd[2] != self.modules[0]:
            return None
        key = self.key(env)
        if self.fork:
            return self._forked(key, env)
        got: WarmProcess | None = None
        dead: list[WarmProcess] = []
        with self._lock:
            spares = self._spares.setdefault(key, [])
            while spares and got is None:
                w = spares.pop(0)
                if w.alive():
                    got = w
                else:
                    dead.append(w)
            base = self._base_env(env)
            for _ in range(self.per_key - len(spares) - self._pending.get(key, 0)):
                self._pending[key] = self._pending.get(key, 0) + 1
                self._orders.put((key, base, None))
        for w in dead:
            w.discard()
        return got

    def _base_env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with the per-evaluation directories pointed at the pool's own (a launcher
        reads the job's when the job comes)."""
        home = self._home()
        return {**env, **{k: str(home) for k in VOLATILE if k in env and k != RUN_MARK}}

    def prewarm(self, env: dict[str, str]) -> None:
        """Start ``env``'s fork server now, if it has none, without waiting for it: its import
        then overlaps whatever the caller does before its first phase (e.g. the build)."""
        if self.fork:
            self._server_for(self.key(env), env)

    def _server_for(self, key: tuple, env: dict[str, str]) -> _Server | None:
        """``key``'s server slot, one being started if it has none or its server died (None:
        the pool is closed)."""
        with self._lock:
            if self.closed:
                return None
            slot = self._servers.get(key)
            dead = slot is not None and slot.done.is_set() and slot.server is not None
            dead = dead and not slot.server.alive()  # type: ignore[union-attr]
            if dead:
                slot.server.close()  # type: ignore[union-attr]  # its socket, its process
            evicted = None
            if slot is None or dead:
                if slot is None:
                    evicted = self._evict_one()
                slot = self._servers[key] = _Server()
                self._orders.put((key, self._base_env(env), slot))
            slot.last_used = time.monotonic()
        if evicted is not None:
            evicted.close()
        return slot

    def _forked(self, key: tuple, env: dict[str, str], wait_s: float = 300.0) -> WarmProcess | None:
        slot = self._server_for(key, env)
        if slot is None:
            return None
        if not slot.done.wait(wait_s) or slot.server is None:
            return None  # could not start (``server_errors``): this run starts cold
        w = slot.server.spawn()
        if w is None:
            self.server_errors.append(slot.server.error)
        else:
            self.started += 1
            with self._lock:
                slot.launchers.append(weakref.ref(w.proc))
        return w

    def _evict_one(self) -> ForkServer | None:
        """With the lock held and ``max_servers`` reached: forget the least recently used
        server with no launcher running and return it for closing (None: every one is busy,
        and the pool goes over its cap rather than kill a job)."""
        if len(self._servers) < self.max_servers:
            return None
        idle = [(s.last_used, k) for k, s in self._servers.items() if not s.busy()]
        if not idle:
            return None
        slot = self._servers.pop(min(idle)[1])
        return slot.server

    def close(self) -> None:
        """Stop every spare and remove the pool's directory."""
        with self._lock:
            self.closed = True
            spares = [w for ws in self._spares.values() for w in ws]
            self._spares.clear()
            servers = [s.server for s in self._servers.values() if s.server is not None]
            self._servers.clear()
        self._orders.put(None)
        for w in spares:
            w.discard()
        for srv in servers:
            srv.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


_POOLS: dict[tuple[int, bool], WarmPool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(per_key: int, fork: bool = False) -> WarmPool | None:
    """The process-wide pool with a fork server per environment (``fork``), else with
    ``per_key`` spares per environment (None for 0: off); stopped at interpreter exit."""
    if fork:
        per_key = 0
    elif per_key <= 0:
        return None
    with _POOLS_LOCK:
        pool = _POOLS.get((per_key, fork))
        if pool is None:
            pool = _POOLS[(per_key, fork)] = WarmPool(per_key=per_key, fork=fork)
            if len(_POOLS) == 1:
                atexit.register(close_all)
        return pool


def _forget_pools_in_child() -> None:
    """In a child forked from a process with pools: their starter threads did not survive the
    fork and their fork servers' sockets are the parent's, so the child starts its own."""
    global _POOLS_LOCK
    _POOLS_LOCK = threading.Lock()
    _POOLS.clear()


os.register_at_fork(after_in_child=_forget_pools_in_child)


def close_all() -> None:
    """Stop the spares of every shared pool (e.g. before measuring something CPU-bound)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        with contextlib.suppress(Exception):
            pool.close()
