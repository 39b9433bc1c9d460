"""Run :func:`~cuda_agent.opsynth.probe.run_probe` for one task in a fresh, confined process.

A task's program is code opsynth did not write itself as often as not (an LLM's composition, an
Ops-6K row): it runs under the sandbox's confinement
(:func:`cuda_agent.sandbox.isolation.run_confined`), the one every candidate of the sandbox runs
under. Per task: a fresh process in a session of its own, its own pid, mount and network
namespaces (no network), the file system read-only but the worker's own directory, an
unprivileged uid where the host allows it (one leased for the :class:`Isolator`'s life, so its
compile caches carry over from task to task), a process count limit, and a wall-clock deadline
after which the whole tree is SIGKILLed; the task's prints are kept away from the result, and a
timeout or a crash comes back as a result. What was in force is :attr:`Isolator.isolation`.
Besides, the child caps its own memory (:func:`_handle`: on cpu an address-space limit, on cuda
its share of the GPU's memory).

Two modes, same guarantees:

- ``fork`` (default): a sandbox fork server (:mod:`cuda_agent.sandbox.forkserver`) imports torch
  and the probe once; each task is a launcher forked from it, confined, that runs :func:`main`
  in its own process. Import cost (seconds) is paid once; the server never runs a task or
  initialises CUDA.
- ``spawn``: a new ``python -m cuda_agent.opsynth.isolate`` per task (slower; nothing shared).

The task's deadline starts when its child has imported what it needs (the child says so with a
file), so a cold start's imports are not the task's time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cuda_agent.sandbox.forkserver import ForkServer, start_server
from cuda_agent.sandbox.gate import host_lock
from cuda_agent.sandbox.isolation import (
    Limits,
    Outcome,
    prepare_writable,
    run_confined,
    sandbox_uid,
)

_ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
_MODULE = "cuda_agent.opsynth.isolate"
_IMPORTS = ("torch", "cuda_agent.profiler.program", "cuda_agent.opsynth.probe")
_WARM_MODULES = ("torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.codegen.wrapper")
IMPORT_ALLOWANCE_S = (
    60.0  # the most a child's start-up (interpreter, torch) may add to its deadline
)


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
    try:
        return run_probe(req["source"], cfg)
    except MemoryError:
        return {"ok": False, "reason": "out_of_memory", "detail": "MemoryError in the task"}


def main(argv: list[str]) -> int:
    """The confined child: ``REQUEST STARTED``: read the request file REQUEST (``{"source",
    "config", "mem_gb", "threads"}``), create STARTED once the imports are done, run the probe
    and write its result as the last line of stdout (the task's own prints go to stderr)."""
    request, started = argv
    for m in _IMPORTS:
        __import__(m)
    Path(started).touch()
    req = json.loads(Path(request).read_text())
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    res = _handle(req)
    os.write(real_stdout, ("\n" + json.dumps(res, default=str) + "\n").encode())
    return 0


def _failed(reason: str, detail: str, seconds: float) -> dict[str, Any]:
    return {"ok": False, "reason": reason, "detail": detail, "seconds": round(seconds, 3)}


def _result(out: Outcome, timeout_s: float) -> dict[str, Any]:
    """The probe's result from a confined run: the last line of its stdout, or a timeout or
    crash result saying why there is none."""
    if out.timed_out:
        return _failed("timeout", f"killed after {timeout_s:.0f} s", out.seconds)
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    try:
        res = json.loads(lines[-1]) if out.returncode == 0 and lines else None
    except ValueError:
        res = None
    if not isinstance(res, dict):
        return _failed("crash", f"{out.describe()}; output tail: {out.stderr[-800:]}", out.seconds)
    res["seconds"] = round(out.seconds, 3)
    return res


class Isolator:
    """Runs probes in fresh confined processes (see the module docstring); ``fork`` keeps one
    fork server alive between calls. One caller at a time."""

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
        self.limits = Limits(rss_mb=None)  # memory: the child's own caps (see _handle)
        self._server: ForkServer | None = None
        self._stack = contextlib.ExitStack()
        self._root: Path | None = None
        self._uid: int | None = None
        self._n = itertools.count()
        self._gates: set[str] = set()
        # whether the fork server pre-imported torch.compile's modules
        self.warm: bool | None = None
        self.isolation: dict[str, str] = {}  # what confined the last task (Outcome.isolation)
        self.server_error = ""  # why no fork server started (fork mode then starts tasks cold)

    def _workdir(self) -> Path:
        """The worker's own directory (home, temp dir, compile caches, requests), writable by
        its confined processes; made on first use with the uid they run as."""
        if self._root is None:
            self._uid = self._stack.enter_context(sandbox_uid(self.limits))
            root = Path(tempfile.mkdtemp(prefix="opsynth-isolate-"))
            self._stack.callback(shutil.rmtree, root, ignore_errors=True)
            prepare_writable(root, limits=self.limits, uid=self._uid)
            self._root = root
        return self._root

    def _env(self) -> dict[str, str]:
        root = str(self._workdir())
        env = dict(os.environ)
        env.update(_ENV)
        env["OMP_NUM_THREADS"] = str(self.threads)
        env.update(HOME=root, TMPDIR=root, PYTHONDONTWRITEBYTECODE="1")
        env["TORCHINDUCTOR_CACHE_DIR"] = f"{root}/inductor"
        env["TRITON_CACHE_DIR"] = f"{root}/triton"
        return env

    def _launcher(self) -> Any:
        """A warm launcher forked from the fork server (started, or restarted once, as
        needed), or None: the task starts cold (and every later one, once a server could not
        start: ``server_error`` says why)."""
        for _ in range(2):
            if self.server_error:
                return None
            if self._server is None or not self._server.alive():
                self._start_server()
            if self._server is None:
                return None
            warm = self._server.spawn()
            if warm is not None:
                return warm
            self._close_server()
        return None

    def _start_server(self) -> None:
        self._close_server()
        tries = [True, False] if self.warm_compile else [False]
        for warm_compile in tries:  # a compile import that touched CUDA: serve without it
            modules = [_MODULE, *_IMPORTS, *(_WARM_MODULES if warm_compile else ())]
            srv = start_server(modules, self._env(), self._workdir())
            if srv.ready:
                self._server = srv
                self.warm = warm_compile if self.warm_compile else None
                return
        self.server_error = srv.error

    def _prepare_gate(self, device: str) -> None:
        """Create the lock files of ``device``'s gate, which the child holds while it times but
        cannot create on its read-only file system."""
        from .probe import timing_domain

        domain = timing_domain(device)
        if domain not in self._gates:
            lock = host_lock(domain)
            if lock is not None:
                lock.create()
            self._gates.add(domain)

    def run(
        self, source: str, config: dict[str, Any], timeout_s: float, mem_gb: float | None
    ) -> dict[str, Any]:
        """The probe result of ``source``; timeouts and crashes come back as results."""
        root = self._workdir()
        self._prepare_gate(str(config.get("device", "cpu")))
        n = next(self._n)
        request, started = root / f"request-{n}.json", root / f"started-{n}"
        req = {"source": source, "config": config, "mem_gb": mem_gb, "threads": self.threads}
        request.write_text(json.dumps(req))
        request.chmod(0o644)
        warm = self._launcher() if self.mode == "fork" else None
        python = sys.executable if warm is not None else self.python
        t0 = time.time()

        def start_up() -> float:  # the child's imports are not the task's time
            t = started.stat().st_mtime if started.exists() else time.time()
            return min(IMPORT_ALLOWANCE_S, max(0.0, t - t0))

        try:
            out = run_confined(
                [python, "-m", _MODULE, str(request), str(started)],
                cwd=root,
                env=self._env(),
                limits=dataclasses.replace(self.limits, timeout_s=timeout_s),
                writable=[root],
                extend=start_up,
                uid=self._uid,
                warm=warm,
            )
        finally:
            for f in (request, started):
                f.unlink(missing_ok=True)
        self.isolation = out.isolation
        return _result(out, timeout_s)

    def _close_server(self) -> None:
        srv, self._server = self._server, None
        if srv is not None:
            srv.close()

    def close(self) -> None:
        """Stop the fork server and remove the worker's directory (its uid lease ends)."""
        self._close_server()
        self._stack.close()
        self._stack = contextlib.ExitStack()
        self._root = None
        self._gates.clear()

    def __enter__(self) -> Isolator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
