"""How the device half runs its phases' processes: one runner op in a confined process
(:func:`_run_op`), a device half's use of its device's gate (:class:`_Turn`), and the ops started
ahead of their stage, waiting after ``import torch`` for their start signal: the timing op with
its ``ready``/``go`` handshake around the exclusive hold (:class:`_TimeOp`) and the
verification started while the reference runs (:class:`_EarlyVerify`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import SandboxConfig
from .gate import DeviceGate, Occupant
from .isolation import Limits, Outcome, caps, run_confined
from .profiling import timed_as
from .warm import RUNNER, shared_pool

GO_TIMEOUT_S = 4 * 3600.0  # the timing process's own bound on waiting for its exclusive turn


@dataclass
class _Turn:
    """How one device half uses its device's gate. ``held``: the caller already holds it
    exclusive (a re-run alone): phases run without acquiring it again."""

    gate: DeviceGate
    occ: Occupant
    held: bool = False

    def shared(self, phase: str, *, lengthy: bool = False) -> Any:
        if self.held:
            return contextlib.nullcontext()
        return self.gate.shared(self.occ, phase, lengthy=lengthy)

    def exclusive(self, phase: str) -> Any:
        return contextlib.nullcontext() if self.held else self.gate.exclusive(self.occ, phase)

    def enter(self) -> None:
        if not self.held:
            self.gate.enter(self.occ)

    def leave(self) -> None:
        if not self.held:
            self.gate.leave(self.occ)


def _run_op(
    spec: dict[str, Any],
    spec_dir: Path,
    *,
    cwd: Path,
    env: dict[str, str],
    limits: Limits,
    slot: int,
    writable: list[Path],
    hidden: list[Path] | None = None,
    extend: Any = None,
    warm: int = 0,
    fork: bool = False,
) -> tuple[Outcome, dict[str, Any]]:
    """Run one runner op; returns the outcome and the op's report ({} when it wrote none).
    ``warm``: spares per environment of the shared :class:`warm.WarmPool` (0: start cold);
    ``fork``: launchers forked from the pool's fork server instead (``warm`` unused)."""
    spec_path = spec_dir / f"{spec['op']}.spec.json"
    spec_path.write_text(json.dumps(spec))
    os.chmod(spec_path, 0o644)
    cmd = [sys.executable, "-m", RUNNER, str(spec_path)]
    pool = shared_pool(warm, fork)
    spare = pool.take(cmd, env) if pool is not None else None
    t_spawn = time.time()
    out = run_confined(
        cmd,
        cwd=cwd,
        env=env,
        limits=limits,
        slot=slot,
        writable=writable,
        hidden=hidden or [],
        extend=extend,
        warm=spare,
    )
    report: dict[str, Any] = {}
    with contextlib.suppress(OSError, json.JSONDecodeError):
        report = json.loads(Path(spec["report"]).read_text())
    if isinstance(report.get("t_import"), (int, float)):
        # confinement set-up plus interpreter start, up to the runner's own import
        report["startup_s"] = round(float(report["t_import"]) - t_spawn, 4)
    report["t_spawn"] = t_spawn
    report["warm"] = out.warm
    if fork and spare is None and pool is not None and pool.server_errors:
        report["fork_server_error"] = pool.server_errors[-1][:500]  # why this phase ran cold
    return out, report


def _early_start_spec(spec: dict[str, Any], start: Path, abort: Path, timeout_s: float) -> dict:
    """``spec`` of a process started early: it waits after ``import torch`` for ``start`` or
    ``abort`` (at most ``timeout_s``; runner._wait_for_start)."""
    return dict(spec, start_path=str(start), abort_path=str(abort), start_timeout_s=timeout_s)


class _TimeOp:
    """The ``time`` op with its start-up outside the exclusive section: the process builds its
    model and inputs under the shared gate, says ``ready``; the parent takes the gate exclusive
    and creates ``go``; the process times and ends; the gate is released. A process that ends
    before ``ready`` never takes the gate; the gate waits do not count against the op's time
    limit.

    Started early (:meth:`start_early`, while the parent compares the verification's outputs),
    the process imports torch and then waits for ``start`` (or ``abort``, :meth:`cancel`) before
    it touches the device or the candidate's code; :meth:`run` writes ``start`` once the parent
    has entered the gate. That wait does not count against the time limit either."""

    def __init__(
        self,
        spec: dict[str, Any],
        root: Path,
        io: Path,
        name: str = "",
        spec_dir: Path | None = None,
        **kw: Any,
    ):
        sig = root / "signal"
        sig.mkdir(mode=0o755, exist_ok=True)
        pre = f"{name}_" if name else ""  # a second op of one candidate (the paired eager timer)
        self.go, self.ready = sig / f"{pre}go", io / f"{pre}ready"
        self.start, self.abort = sig / f"{pre}time_start", sig / f"{pre}time_abort"
        self.spec = dict(
            spec, ready_path=str(self.ready), go_path=str(self.go), go_timeout_s=GO_TIMEOUT_S
        )
        self.root, self.kw = root, kw
        self.spec_dir = spec_dir or root
        self.wait = {"total": 0.0, "since": None, "abort": False}
        self.pre_start_s = 0.0  # started early: seconds it waited for the start signal
        self.ran = False
        self.box: dict[str, Any] = {}
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def _clear(self) -> None:
        # whatever an earlier process of the candidate left there (all of them have ended)
        for f in (self.go, self.ready, self.start, self.abort):
            if f.is_dir() and not f.is_symlink():
                shutil.rmtree(f, ignore_errors=True)
            else:
                f.unlink(missing_ok=True)

    def _extra(self) -> float:
        if self.wait["abort"]:
            return -1e12  # the parent gave up: kill the process now
        since = self.wait["since"]
        return self.wait["total"] + (time.monotonic() - since if since is not None else 0.0)

    def _spawn(self, spec: dict[str, Any]) -> None:
        def target() -> None:
            try:
                self.box["res"] = _run_op(spec, self.spec_dir, extend=self._extra, **self.kw)
            except BaseException as e:  # noqa: BLE001 - re-raised in the parent thread
                self.box["exc"] = e
            finally:
                self.done.set()

        self.thread = threading.Thread(target=target, name="sandbox-time-op", daemon=True)
        self.thread.start()

    def start_early(self, start_timeout_s: float) -> None:
        """Start the process now; it waits after ``import torch`` for :meth:`run` or
        :meth:`cancel` (at most ``start_timeout_s``)."""
        self._clear()
        self.wait["since"] = time.monotonic()  # counted as a wait until run() says start
        self._spawn(_early_start_spec(self.spec, self.start, self.abort, start_timeout_s))

    def cancel(self) -> bool:
        """An early process whose timing is not needed is ended (killed at once: it has run
        no candidate code yet, and may still be importing torch); wait for it. False (nothing
        to do) after :meth:`run`, or when nothing was started."""
        if self.thread is None or self.ran:
            return False
        self.wait["abort"] = True
        with contextlib.suppress(OSError):
            self.abort.touch(mode=0o644)
        self.done.wait()
        self.thread.join()
        return True

    def go_and_wait(self, timing_overrides: dict[str, Any] | None = None) -> None:
        """Let a partner started early build and time now (the caller holds the exclusive
        section, the candidate's process has ended), to its end; ``timing_overrides`` (timing
        config fields, e.g. the CUDA-graph mode the candidate was really timed in) travel in
        its start signal."""
        self.ran = True
        self._stop_waiting()
        tmp = self.start.with_name(self.start.name + ".part")
        tmp.write_text(json.dumps(timing_overrides or {}))
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.start)
        self.go.touch()
        self.done.wait()

    def end(self) -> None:
        """End a partner that was not let go (it has run nothing yet), then wait for it."""
        if self.thread is None:
            return
        if not self.ran:
            self.cancel()
        self.done.wait()
        self.thread.join()

    def result(self) -> tuple[Outcome, dict[str, Any]] | None:
        """(outcome, report) of a process that timed and ended well; None otherwise."""
        res = self.box.get("res")
        if not self.ran or not res or res[0].returncode != 0 or not res[1].get("ok"):
            return None
        return res

    def _stop_waiting(self) -> None:
        if self.wait["since"] is not None:
            self.wait["total"] += time.monotonic() - self.wait["since"]
            self.wait["since"] = None

    def run(
        self, turn: _Turn, then: Any = None, partner: _TimeOp | None = None
    ) -> tuple[Outcome, dict[str, Any], float]:
        """Run (or let the early process go on) to the end: (outcome, report, seconds waited
        for the gate; the early wait for the start signal is :attr:`pre_start_s`). ``then()``
        runs inside the exclusive hold once the process has ended well (the re-check of the
        timed output: a second of judge there costs less than waiting, shared, behind another
        worker's whole exclusive hold, which took up to 87 s on the H200). A ``partner`` (the
        paired eager timer) is started early beside it (it imports torch and waits) and, once
        this process has ended well, builds and times in the same exclusive hold, in the device
        memory this one freed; otherwise it is ended untimed (its :meth:`result` says how it
        went)."""
        entered, self.ran = False, True
        try:
            with turn.shared("time_startup"):
                turn.enter()  # present from here until the process ends (it holds device memory)
                entered = True
                if partner is not None:
                    partner.start_early(start_timeout_s=GO_TIMEOUT_S)
                if self.thread is None:
                    self._clear()
                    self._spawn(self.spec)
                else:
                    since = self.wait["since"]
                    self.pre_start_s = time.monotonic() - since if since is not None else 0.0
                    self._stop_waiting()
                    self.start.touch(mode=0o644)
                while not self.done.is_set() and not self.ready.exists():
                    self.done.wait(0.002)
            if not self.done.is_set():
                self.wait["since"] = time.monotonic()
                try:
                    with turn.exclusive("time"):
                        self._stop_waiting()
                        self.go.touch()
                        self.done.wait()
                        res = self.box.get("res")
                        ok = bool(res and res[0].returncode == 0 and res[1].get("ok"))
                        if ok and partner is not None and not partner.done.is_set():
                            partner.go_and_wait(timed_as(res[1]))
                        if then is not None and ok:
                            then()
                finally:
                    self._stop_waiting()
        except BaseException:
            self.wait["abort"] = True
            raise
        finally:
            if partner is not None:
                partner.end()
            if self.thread is not None:
                self.done.wait()
                self.thread.join()
            if entered:
                turn.leave()
        if "exc" in self.box:
            raise self.box["exc"]
        out, rep = self.box["res"]
        return out, rep, self.wait["total"] - self.pre_start_s


def _early_verify(cfg: SandboxConfig) -> bool:
    """Whether the verification process may start while the reference runs: asked for, and a
    mount namespace hides the reference's outputs from it (``caps().network_ns``)."""
    return cfg.early_verify and caps().network_ns


class _Background:
    """``fn(*args)`` in a daemon thread; :meth:`join` returns its result or raises its error
    (``on_error()`` runs in the thread first)."""

    def __init__(self, name: str, fn: Any, *args: Any, on_error: Any = None):
        self.result: Any = None
        self.error: BaseException | None = None

        def target() -> None:
            try:
                self.result = fn(*args)
            except BaseException as e:  # noqa: BLE001 - re-raised by join()
                self.error = e
                if on_error is not None:
                    on_error()

        self.thread = threading.Thread(target=target, name=name, daemon=True)
        self.thread.start()

    def join(self) -> Any:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.result


class _EarlyVerify:
    """A verification process started while the reference runs (in a thread): it waits after
    ``import torch`` until :meth:`go` writes ``start`` (or :meth:`cancel` writes ``abort``)."""

    def __init__(self, shared: Path):
        self.start, self.abort = shared / "start", shared / "abort"
        self.bg: _Background | None = None
        self.t_run = self.t_go = 0.0

    def waited(self) -> float:
        """Seconds from :meth:`run` to :meth:`go` (so far): added to the process's time limit."""
        return (self.t_go or time.monotonic()) - self.t_run

    def run(self, fn: Any, *args: Any) -> None:
        self.t_run = time.monotonic()
        self.bg = _Background("early-verify", fn, *args)

    def go(self) -> tuple[Outcome, dict]:
        """Let the waiting process start; its outcome and report."""
        self.t_go = time.monotonic()
        self.start.touch(mode=0o644)
        assert self.bg is not None
        return self.bg.join()

    def cancel(self) -> None:
        """The reference failed: the waiting process exits; wait for it (its gate hold ends)."""
        if self.bg is None:
            return
        self.t_go = time.monotonic()
        with contextlib.suppress(OSError):
            self.abort.touch(mode=0o644)
        self.bg.thread.join()
