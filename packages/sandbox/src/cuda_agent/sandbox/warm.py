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
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import shutil
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

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
# environment keys that differ per evaluation and are read where used, not at import
VOLATILE = (
    "HOME",
    "TMPDIR",
    "TORCH_EXTENSIONS_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    RUN_MARK,
)


class WarmPool:
    """Spare runner launchers, ``per_key`` per distinct environment; thread-safe."""

    def __init__(self, modules: Sequence[str] = RUNNER_MODULES, per_key: int = 2) -> None:
        self.modules = tuple(modules)
        self.per_key = per_key
        self._spares: dict[tuple, list[WarmProcess]] = {}
        self._pending: dict[tuple, int] = {}
        self._lock = threading.Lock()
        self._dir: Path | None = None
        self._orders: queue.SimpleQueue[tuple[tuple, dict[str, str]] | None] = queue.SimpleQueue()
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
            key, env = order
            try:
                w = start_warm(self.modules, env, self._home())
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

    def _home(self) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="cuda-agent-warm-"))
        return self._dir

    @staticmethod
    def key(env: dict[str, str]) -> tuple:
        return tuple(sorted((k, v) for k, v in env.items() if k not in VOLATILE))

    def take(self, cmd: Sequence[str], env: dict[str, str]) -> WarmProcess | None:
        """A spare for ``cmd`` (``[sys.executable, "-m", RUNNER, ...]``) under ``env``, or None
        (start it cold); either way the spares for ``env`` are topped up to ``per_key``."""
        if len(cmd) < 3 or cmd[0] != sys.executable or cmd[1] != "-m" or cmd[2] != self.modules[0]:
            return None
        key = self.key(env)
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
            home = self._home()
            base = {**env, **{k: str(home) for k in VOLATILE if k in env and k != RUN_MARK}}
            for _ in range(self.per_key - len(spares) - self._pending.get(key, 0)):
                self._pending[key] = self._pending.get(key, 0) + 1
                self._orders.put((key, base))
        for w in dead:
            w.discard()
        return got

    def close(self) -> None:
        """Stop every spare and remove the pool's directory."""
        with self._lock:
            self.closed = True
            spares = [w for ws in self._spares.values() for w in ws]
            self._spares.clear()
        self._orders.put(None)
        for w in spares:
            w.discard()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


_POOLS: dict[int, WarmPool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(per_key: int) -> WarmPool | None:
    """The process-wide pool with ``per_key`` spares per environment (None for 0: off); stopped
    at interpreter exit."""
    if per_key <= 0:
        return None
    with _POOLS_LOCK:
        pool = _POOLS.get(per_key)
        if pool is None:
            pool = _POOLS[per_key] = WarmPool(per_key=per_key)
            if len(_POOLS) == 1:
                atexit.register(close_all)
        return pool


def close_all() -> None:
    """Stop the spares of every shared pool (e.g. before measuring something CPU-bound)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        with contextlib.suppress(Exception):
            pool.close()
