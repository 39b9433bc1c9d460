"""A fork server per environment: runner launchers forked from a process that imported torch once.

A warm launcher (:func:`isolation.start_warm`) is a fresh interpreter that imports the runner and
torch ahead of its job: the import (about 3 s of CPU) is moved off the phase's clock, not saved.
A :class:`ForkServer` (``jail.py --zygote``) imports them once and forks a launcher per job
(tens of milliseconds); the forked launcher is then exactly a warm one: it reads its job, confines
itself (namespaces, read-only file system, limits, uid drop) and runs the runner in a fresh child.
The server has seen nothing of any job but its run mark; nothing of a candidate's runs in it.

The forked launcher is not this process's child: :class:`ForkedProcess` stands in for its
``Popen`` (pid, standard streams, ``poll``/``wait``/``kill``), its exit status read from a pipe
the server writes when it reaps it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

from .isolation import JAIL, RUN_MARK, WarmProcess, stop_session


def _returncode(status: int) -> int:
    """A wait status as ``Popen.returncode`` has it (a signal death negative)."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


class ForkedProcess:
    """``Popen``'s part that :func:`isolation.run_confined` uses, for a launcher the fork server
    started: ``pid``, ``stdin``/``stdout``/``stderr``, ``poll``, ``wait``, ``kill``."""

    # its ``wait(timeout)`` blocks on the status pipe (no pidfd needed to wait without polling)
    waits_on_pipe = True

    def __init__(self, pid: int, stdin: int, stdout: int, stderr: int, status: int) -> None:
        self.pid = pid
        # buffered, as ``Popen``'s: a buffered write hands over the whole job however the pipe
        # splits it
        self.stdin = open(stdin, "wb")  # noqa: SIM115 - closed by the caller
        self.stdout = open(stdout, "rb")  # noqa: SIM115
        self.stderr = open(stderr, "rb")  # noqa: SIM115
        self.returncode: int | None = None
        self._status: int | None = status
        self._buf = b""
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None
        self._lock = threading.Lock()

    def _read_status(self, timeout: float | None) -> None:
        with self._lock:
            if self.returncode is not None or self._status is None:
                return
            p = select.poll()
            p.register(self._status, select.POLLIN)
            if not p.poll(None if timeout is None else max(0.0, timeout) * 1000):
                return
            data = os.read(self._status, 64)
            self._buf += data
            if data and not self._buf.endswith(b"\n"):
                return
            # no status with the pipe closed: the server died, and the launcher with it
            status = int(self._buf) if self._buf.strip() else signal.SIGKILL
            self.returncode = _returncode(status)
            self._release()

    def _release(self) -> None:
        for fd in (self._status, self._pidfd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._status = self._pidfd = None

    def poll(self) -> int | None:
        self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read_status(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired([JAIL, "--zygote"], timeout or 0)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL it unless it has been reaped (through its pidfd where the kernel has them: a
        pid reused after the reap is never hit)."""
        if self.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)

    def __del__(self) -> None:
        self._release()


class ForkServer:
    """One ``jail.py --zygote`` process that imported ``modules`` under ``env``; thread-safe.
    It dies with the thread that started it (``PR_SET_PDEATHSIG``): start it from a long-lived
    one."""

    def __init__(
        self,
        modules: Sequence[str],
        env: dict[str, str],
        cwd: str | os.PathLike[str],
        log: str | os.PathLike[str] | None = None,
    ) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self._lock = threading.Lock()
        self.error = ""
        err = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    JAIL,
                    "--zygote",
                    ",".join(modules),
                    str(theirs.fileno()),
                    RUN_MARK,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=str(cwd),
                # its own mark: a sweep for any run's mark never finds the server
                env={**env, RUN_MARK: uuid.uuid4().hex},
                start_new_session=True,
                close_fds=True,
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
            if log:
                err.close()  # type: ignore[union-attr]
        self.ready = False

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the import; False (``error`` says why) if it failed
        or did not finish."""
        reply = self._recv(timeout)
        if reply is None:
            self.error = self.error or f"not ready after {timeout:.0f} s"
            self.close()
            return False
        if "ready" not in reply:
            self.error = str(reply.get("error", reply))
            self.close()
            return False
        self.ready = True
        return True

    def _recv(self, timeout: float) -> dict | None:
        p = select.poll()
        p.register(self._sock, select.POLLIN)
        if not p.poll(timeout * 1000):
            return None
        with contextlib.suppress(OSError, ValueError):
            data = self._sock.recv(4096)
            if data:
                return json.loads(data)
        self.error = f"the fork server ended (exit status {self.proc.poll()})"
        return None

    def alive(self) -> bool:
        return self.ready and self.proc.poll() is None

    def spawn(self, timeout: float = 30.0) -> WarmProcess | None:
        """A launcher forked for one job (see :class:`WarmProcess`), or None (``error`` says
        why; a server that did not answer is closed)."""
        if not self.alive():
            self.error = self.error or "the fork server is not running"
            return None
        mark = uuid.uuid4().hex
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        status_r, status_w = os.pipe()
        theirs = [stdin_r, stdout_w, stderr_w, status_w]
        ours = [stdin_w, stdout_r, stderr_r, status_r]
        reply: dict | None = None
        try:
            with self._lock:
                socket.send_fds(self._sock, [json.dumps({"mark": mark}).encode()], theirs)
                reply = self._recv(timeout)
        except OSError as e:
            self.error = f"the fork server could not be asked: {e}"
        finally:
            for fd in theirs:
                os.close(fd)
        if reply is None or not isinstance(reply.get("pid"), int):
            for fd in ours:
                os.close(fd)
            if reply is None:  # no answer: the server is gone or stuck
                self.close()
            else:  # it refused this one (e.g. out of processes) and serves on
                self.error = str(reply.get("error", reply))
            return None
        proc = ForkedProcess(reply["pid"], stdin_w, stdout_r, stderr_r, status_r)
        return WarmProcess(proc=proc, mark=mark)  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop the server (its launchers die with it)."""
        self.ready = False
        with contextlib.suppress(OSError):
            self._sock.close()
        stop_session(self.proc)


def start_server(
    modules: Sequence[str], env: dict[str, str], cwd: str | os.PathLike[str], timeout: float = 300.0
) -> ForkServer:
    """A :class:`ForkServer` that has finished its import; ``ready`` False and ``error`` set
    when it could not (the caller starts its runs cold)."""
    log = Path(cwd) / f"forkserver-{uuid.uuid4().hex[:8]}.log"
    srv = ForkServer(modules, env, cwd, log)
    if not srv.wait_ready(timeout):
        with contextlib.suppress(OSError):
            srv.error += ": " + log.read_text(errors="replace")[-2000:]
    return srv
