"""Run :func:`~cuda_agent.opsynth.probe.run_probe` for one task in a fresh process.

Two isolation modes, same guarantees (a fresh process per task, a wall-clock timeout enforced
with SIGKILL, an address-space limit, the task's stdout/stderr kept away from the record
stream, a crash reported as a result):

- ``fork`` (default): a long-lived *zygote* process imports torch once and forks one child per
  task. Import cost (seconds) is paid once, but every task still starts from a clean, untouched
  interpreter state (the zygote itself never runs a task or initialises CUDA).
- ``spawn``: a new ``python -m cuda_agent.opsynth.isolate --one`` per task (slower; nothing is
  shared at all).

Protocol (both modes): one JSON request per line on the server's stdin
``{"source", "config", "timeout_s", "mem_gb"}`` -> one JSON result per line on its stdout.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

_ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _vm_bytes() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _limit_memory(mem_gb: float | None) -> None:
    """Cap the address space at what is mapped now plus ``mem_gb`` GiB (Linux)."""
    if not mem_gb:
        return
    import resource

    limit = _vm_bytes() + int(mem_gb * (1 << 30))
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _limit_gpu_memory(mem_gb: float | None) -> None:
    """Cap the caching allocator of this process at ``mem_gb`` GiB of the current GPU."""
    if not mem_gb:
        return
    import torch

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, mem_gb * (1 << 30) / total))


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the parent process dies (no orphaned tasks or zygotes)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _handle(req: dict[str, Any]) -> dict[str, Any]:
    from .probe import ProbeConfig, run_probe

    cfg = ProbeConfig(**req.get("config", {}))
    if cfg.device == "cpu":
        import torch

        torch.set_num_threads(int(req.get("threads", 1)))
        _limit_memory(req.get("mem_gb"))
    else:
        # CUDA reserves far more address space than it uses: an RLIMIT_AS cap breaks its
        # initialisation. On a GPU, mem_gb caps the task's share of device memory instead.
        _limit_gpu_memory(req.get("mem_gb"))
    if req.get("_alarm"):  # spawn mode: the task's wall clock starts after the imports;
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # SIGALRM's default action ends us
        signal.alarm(max(1, int(math.ceil(float(req.get("timeout_s", 120))))))
    try:
        return run_probe(req["source"], cfg)
    except MemoryError:
        return {"ok": False, "reason": "out_of_memory", "detail": "MemoryError in the task"}


def _tail(path: str, n: int = 1500) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - n))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _fork_one(req: dict[str, Any]) -> dict[str, Any]:
    """Zygote side: fork a child for ``req``, enforce the timeout, collect its result."""
    timeout = float(req.get("timeout_s", 120))
    r, w = os.pipe()
    log_fd, log_path = tempfile.mkstemp(prefix="opsynth-task-", suffix=".log")
    os.close(log_fd)
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(r)
            os.setpgid(0, 0)
            _die_with_parent()
            fd = os.open(log_path, os.O_WRONLY)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            res = _handle(req)
            data = json.dumps(res, default=str).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(w, view) :]
        except BaseException:  # noqa: BLE001 - a child must never return into the zygote
            code = 3
        finally:
            os._exit(code)
    os.close(w)
    chunks: list[bytes] = []
    timed_out = False
    while True:
        left = timeout - (time.monotonic() - t0)
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([r], [], [], min(left, 1.0))
        if ready:
            b = os.read(r, 1 << 16)
            if not b:
                break
            chunks.append(b)
    if timed_out:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            os.kill(pid, signal.SIGKILL)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    secs = round(time.monotonic() - t0, 3)
    tail = _tail(log_path)
    os.unlink(log_path)
    if timed_out:
        return {
            "ok": False,
            "reason": "timeout",
            "detail": f"killed after {timeout:.0f} s",
            "seconds": secs,
        }
    try:
        res = json.loads(b"".join(chunks))
    except ValueError:
        if os.WIFSIGNALED(status):
            why = f"killed by signal {os.WTERMSIG(status)}"
        else:
            why = f"exit code {os.WEXITSTATUS(status)}"
        return {
            "ok": False,
            "reason": "crash",
            "detail": f"{why}; output tail: {tail[-800:]}",
            "seconds": secs,
        }
    res["seconds"] = secs
    return res


_WARM_MODULES = ("torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.codegen.wrapper")


def _cuda_driver_mapped() -> bool:
    try:
        with open("/proc/self/maps") as fh:
            return any("libcuda.so" in line for line in fh)
    except OSError:
        return False


def _warm_compile() -> bool:
    """Import torch.compile's machinery once in the zygote (seconds saved per task), but only
    if a throw-away fork shows the imports leave the CUDA driver unloaded: a zygote that had
    initialised CUDA would hand every child a broken CUDA state."""
    import importlib

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for m in _WARM_MODULES:
                importlib.import_module(m)
            code = 2 if _cuda_driver_mapped() else 0
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        return False
    for m in _WARM_MODULES:
        importlib.import_module(m)
    return True


def _serve() -> int:
    """Zygote main loop: import torch and the probe once, then fork per request."""
    _die_with_parent()
    import torch  # noqa: F401 - imported once, shared copy-on-write by every child

    from cuda_agent.profiler import program  # noqa: F401

    from . import probe  # noqa: F401

    warm = _warm_compile() if "--warm-compile" in sys.argv else None
    print(json.dumps({"ready": True, "warm_compile": warm}), flush=True)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            res = _fork_one(json.loads(line))
        except Exception as e:  # noqa: BLE001
            res = {"ok": False, "reason": "infra_error", "detail": f"{type(e).__name__}: {e}"}
        print(json.dumps(res, default=str), flush=True)
    return 0


def _one() -> int:
    req = json.loads(sys.stdin.read())
    req["_alarm"] = True
    real_stdout = os.dup(1)
    os.dup2(2, 1)  # the task's prints go to stderr
    res = _handle(req)
    os.write(real_stdout, (json.dumps(res, default=str) + "\n").encode())
    return 0


class Isolator:
    """Runs probes in fresh processes; ``fork`` keeps one zygote alive between calls."""

    def __init__(
        self,
        mode: str = "fork",
        python: str | None = None,
        threads: int = 1,
        warm_compile: bool = False,
    ):
        if mode not in ("fork", "spawn"):
            raise ValueError(f"isolation mode must be fork or spawn, got {mode!r}")
        self.mode = mode
        self.python = python or sys.executable
        self.threads = threads
        self.warm_compile = warm_compile
        self._zygote: subprocess.Popen[str] | None = None
        self.warm: bool | None = None  # whether the zygote pre-imported torch.compile's modules

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(_ENV)
        env["OMP_NUM_THREADS"] = str(self.threads)
        return env

    def _start(self) -> subprocess.Popen[str]:
        cmd = [self.python, "-m", "cuda_agent.opsynth.isolate", "--serve"]
        if self.warm_compile:
            cmd.append("--warm-compile")
        p = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=self._env(),
        )
        assert p.stdout is not None
        first = p.stdout.readline()
        if not first:
            raise RuntimeError("opsynth zygote exited during start-up")
        self.warm = json.loads(first).get("warm_compile")
        return p

    def run(
        self, source: str, config: dict[str, Any], timeout_s: float, mem_gb: float | None
    ) -> dict[str, Any]:
        """The probe result of ``source``; timeouts and crashes come back as results."""
        req = {
            "source": source,
            "config": config,
            "timeout_s": timeout_s,
            "mem_gb": mem_gb,
            "threads": self.threads,
        }
        if self.mode == "spawn":
            return self._spawn(req)
        for attempt in range(2):
            if self._zygote is None or self._zygote.poll() is not None:
                self._zygote = self._start()
            z = self._zygote
            assert z.stdin is not None and z.stdout is not None
            try:
                z.stdin.write(json.dumps(req) + "\n")
                z.stdin.flush()
                line = z.stdout.readline()
            except (BrokenPipeError, OSError):
                line = ""
            if line:
                return json.loads(line)
            self.close()  # the zygote died: start a new one and retry once
            if attempt:
                break
        return {"ok": False, "reason": "infra_error", "detail": "zygote died twice"}

    def _spawn(self, req: dict[str, Any]) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            p = subprocess.run(
                [self.python, "-m", "cuda_agent.opsynth.isolate", "--one"],
                input=json.dumps(req),
                capture_output=True,
                text=True,
                timeout=req["timeout_s"] + 60,  # + interpreter and torch start-up
                env=self._env(),
            )
        except subprocess.TimeoutExpired:
            return {
                "ok": False,
                "reason": "timeout",
                "detail": f"killed after {req['timeout_s']:.0f} s",
            }
        secs = round(time.monotonic() - t0, 3)
        if p.returncode == -signal.SIGALRM:
            return {
                "ok": False,
                "reason": "timeout",
                "detail": f"killed after {req['timeout_s']:.0f} s",
                "seconds": secs,
            }
        lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
        if p.returncode != 0 or not lines:
            why = (
                f"exit code {p.returncode}"
                if p.returncode >= 0
                else f"killed by signal {-p.returncode}"
            )
            return {
                "ok": False,
                "reason": "crash",
                "detail": f"{why}; {p.stderr[-800:]}",
                "seconds": secs,
            }
        res = json.loads(lines[-1])
        res["seconds"] = secs
        return res

    def close(self) -> None:
        z, self._zygote = self._zygote, None
        if z is not None:
            try:
                if z.stdin:
                    z.stdin.close()
                z.wait(timeout=10)
            except Exception:  # noqa: BLE001
                z.kill()
                z.wait()

    def __enter__(self) -> Isolator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    if "--serve" in sys.argv:
        sys.exit(_serve())
    if "--one" in sys.argv:
        sys.exit(_one())
    print("usage: python -m cuda_agent.opsynth.isolate --serve|--one", file=sys.stderr)
    sys.exit(2)
