"""Eager and ``torch.compile`` baselines of a task, timed in a fresh subprocess, with a disk cache.

The cache key is (task hash (:func:`task_hash`: source and module mode), device name, torch
version, protocol version, compile mode, backend);
the cache lives in ``$CUDA_AGENT_CACHE/baselines`` (default ``~/.cache/cuda-agent/baselines``).
Failures (timeouts, crashes, compile errors) are returned as ``Baseline.error`` and not cached.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from cuda_agent.records import Baseline, Task, TimingStats, content_id

from .config import PROTOCOL_VERSION, TimingConfig
from .cpus import pin_to_other_cpus


def cache_root() -> Path:
    """``$CUDA_AGENT_CACHE`` or ``~/.cache/cuda-agent``."""
    env = os.environ.get("CUDA_AGENT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "cuda-agent"


def torch_version() -> str:
    """The installed torch version without importing torch."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "none"


def device_name(device: str = "cuda", *, visible: str | None = None) -> str:
    """Name of ``device`` without creating a CUDA context (NVML), e.g. ``NVIDIA H200``;
    ``visible``: the CUDA_VISIBLE_DEVICES it is seen through (default: this process's).

    CPU: the processor model from /proc/cpuinfo (or ``platform.processor()``).
    """
    if device.startswith("cuda"):
        idx = int(device.split(":")[1]) if ":" in device else 0
        from .nvml import device_name as nvml_name
        from .nvml import nvml_index

        name = nvml_name(nvml_index(idx, visible))
        if name is None:  # no NVML: torch says (and creates a context)
            import torch

            return torch.cuda.get_device_name(idx)
        return name
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "cpu:" + line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return "cpu:" + (platform.processor() or platform.machine())


@dataclass
class BaselineCache:
    """Baselines on disk, one JSON file per key."""

    root: Path | None = None

    @property
    def dir(self) -> Path:
        return (self.root or cache_root() / "baselines").expanduser()

    @staticmethod
    def key(
        task_hash: str,
        device_name: str,
        torch_version: str,
        compile_mode: str,
        backend: str,
        protocol: str = PROTOCOL_VERSION,
    ) -> str:
        return content_id(task_hash, device_name, torch_version, protocol, compile_mode, backend)

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    def get(self, key: str) -> Baseline | None:
        """The cached baseline, or None (a corrupt file counts as a miss)."""
        p = self.path(key)
        try:
            return msgspec.json.decode(p.read_bytes(), type=Baseline)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None

    def put(self, key: str, b: Baseline) -> None:
        """Store atomically (write a temp file, then rename)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        p = self.path(key)
        tmp = p.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(msgspec.json.encode(b))
        os.replace(tmp, p)


def task_hash(task: Task | str) -> str:
    """The task's identity for timing: the hash of its reference source, and of its module mode
    where that is not the default "eval" (a source alone is an eval-mode task)."""
    if isinstance(task, Task) and task.model_mode != "eval":
        return content_id(task.ref_code, f"model_mode={task.model_mode}")
    return content_id(task.ref_code if isinstance(task, Task) else task)


def model_mode(task: Task | str) -> str:
    """The module mode a task's models run in (a source alone: "eval")."""
    return task.model_mode if isinstance(task, Task) else "eval"


# ---------------------------------------------------------------- in-process helpers


def tensor_bytes(obj: Any) -> int:
    """Bytes of all tensors in a (nested) list/tuple/dict."""
    from cuda_agent.records.nested import tensor_leaves

    return sum(t.numel() * t.element_size() for t in tensor_leaves(obj))


def make_input_pool(
    program: Any,
    device: str,
    *,
    seed: int = 0,
    max_sets: int = 3,
    budget_bytes: int | None = None,
) -> list[list[Any]]:
    """Up to ``max_sets`` input sets of ``program`` (seeds ``seed``, ``seed+1``, ...) within a budget.

    The budget defaults to a quarter of free device memory (CUDA) or 1 GiB (CPU); at least one set
    is always returned.
    """
    first = program.make_inputs(device=device, seed=seed)
    nb = max(tensor_bytes(first), 1)
    if budget_bytes is None:
        if device.startswith("cuda"):
            import torch

            free, _ = torch.cuda.mem_get_info(torch.device(device))
            budget_bytes = free // 4
        else:
            budget_bytes = 1 << 30
    k = int(max(1, min(max_sets, budget_bytes // nb)))
    return [first] + [program.make_inputs(device=device, seed=seed + i) for i in range(1, k)]


def time_program(
    ref_source: str,
    *,
    device: str = "cuda",
    new_source: str | None = None,
    compile_mode: str | None = None,
    eager: bool = True,
    config: TimingConfig | None = None,
    seed: int = 0,
    max_sets: int = 3,
    model_mode: str = "eval",
):
    """Time a KernelBench-format program in this process: eager ``Model``, optionally its
    ``torch.compile`` (``compile_mode``) and a ``ModelNew`` from ``new_source``, interleaved.

    Returns the :class:`~cuda_agent.profiler.timing.PairedResult` with sides named ``eager``,
    ``compile`` and ``new``. Models are built with the same init seed, in module mode
    ``model_mode``; compile is triggered once before timing, so compilation time is never in a
    sample.
    """
    import torch

    from .timing import paired

    ref = load_reference(ref_source)
    fns: dict[str, Any] = {}
    model = ref.make_model(device=device, seed=seed, mode=model_mode)
    pool = make_input_pool(ref, device, seed=seed + 1000, max_sets=max_sets)
    if eager:
        fns["eager"] = model
    if compile_mode is not None:
        compiled = torch.compile(model, mode=None if compile_mode == "default" else compile_mode)
        with torch.no_grad():
            compiled(*pool[0])
        fns["compile"] = compiled
    if new_source is not None:
        new = load_solution(new_source)
        fns["new"] = new.make_model(
            device=device, seed=seed, init_inputs=ref.init_inputs(), mode=model_mode
        )
    if not fns:
        raise ValueError("nothing to time: eager=False and no compile_mode or new_source")
    return paired(fns, pool, device=device, config=config)


def unique_name(prefix: str, source: str) -> str:
    """A module name unique to ``source``.

    torch.compile keys its automatic-dynamic-shape state by (filename, first line, function name);
    two programs loaded under the same name would share it, and the second would be compiled with
    dynamic shapes (slower kernels). The name (and so the filename) carries the source's hash.
    """
    return f"{prefix}_{content_id(source, length=12)}"


def load_reference(source: str):
    """The reference ``Model`` program of ``source`` under a per-source module name."""
    from .program import Program

    return Program.from_source(source, name=unique_name("kb_reference", source))


def load_solution(source: str, cls_name: str = "ModelNew"):
    """A solution module as a :class:`Program` whose class is ``ModelNew`` (needs no get_inputs)."""
    from .program import Program, ProgramError, check_contract, load_module

    missing = check_contract(source, (cls_name,))
    if missing:
        raise ProgramError(f"missing {cls_name}")
    mod = load_module(source, unique_name("kb_solution", source))
    return Program(module=mod, model_cls=getattr(mod, cls_name))


# ---------------------------------------------------------------- subprocess baseline


def _stats(d: dict[str, Any] | None) -> TimingStats | None:
    return None if d is None else msgspec.convert(d, TimingStats)


def run_worker(
    request: dict[str, Any],
    *,
    timeout_s: float,
    python: str | None = None,
    setup: Callable[[], Any] | None = None,
    hold: Callable[[], Any] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], str | None, str]:
    """Run ``python -m cuda_agent.profiler.worker`` on ``request`` in a new process group.

    With ``hold`` (a context-manager factory, e.g. the device's exclusive gate) the worker does
    its set-up inside ``setup()`` (if given), says ``ready``, and times inside ``hold()``; the
    set-up (``torch.compile`` above all) then stays out of the hold. Returns (JSON lines it
    printed, error or None, stderr tail). On timeout the whole group is killed and the lines
    printed so far are kept. ``env``: the worker's environment (default: this process's).
    """
    import tempfile
    import threading

    handshake = hold is not None
    cmd = [python or sys.executable, "-m", "cuda_agent.profiler.worker"]
    lines: list[dict[str, Any]] = []
    ready = threading.Event()
    said_ready: list[bool] = []  # a "ready" line was read (not only the end of the output)
    err: str | None = None
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryFile() as errf:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errf,
            start_new_session=True,
            env=env,
        )
        pin_to_other_cpus(proc.pid, env)

        def read() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode(errors="replace").strip()
                if line.startswith("{"):
                    with contextlib.suppress(json.JSONDecodeError):
                        d = json.loads(line)
                        if d.get("stage") == "ready":
                            said_ready.append(True)
                            ready.set()
                        else:
                            lines.append(d)
            ready.set()  # ended (or closed its output) without saying ready

        reader = threading.Thread(target=read, name="profiler-worker-out", daemon=True)
        reader.start()
        assert proc.stdin is not None
        try:
            proc.stdin.write((json.dumps(dict(request, handshake=handshake)) + "\n").encode())
            proc.stdin.flush()
            if handshake:
                with setup() if setup is not None else contextlib.nullcontext():
                    ready.wait(max(0.0, deadline - time.monotonic()))
                if said_ready and proc.poll() is None:
                    with hold():
                        proc.stdin.write(b"go\n")
                        proc.stdin.close()
                        _wait(proc, deadline)
            else:
                proc.stdin.close()
            _wait(proc, deadline)
        except subprocess.TimeoutExpired:
            err = f"timeout after {timeout_s:.0f}s"
        except BrokenPipeError:
            pass  # it died first: its exit status says how
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            reader.join(timeout=10)
        errf.seek(0)
        tail = errf.read().decode(errors="replace")[-4000:]
    if err is None and proc.returncode != 0:
        sig = -proc.returncode if proc.returncode < 0 else None
        err = f"worker exited with {'signal ' + str(sig) if sig else proc.returncode}"
        last = [ln for ln in tail.strip().splitlines() if ln.strip()]
        if last:
            err += f": {last[-1][:500]}"
    return lines, err, tail


def _wait(proc: subprocess.Popen, deadline: float) -> None:
    """Wait for ``proc`` until ``deadline`` (monotonic); TimeoutExpired after it."""
    proc.wait(timeout=max(0.0, deadline - time.monotonic()))


def cached_baseline(
    task: Task | str,
    *,
    device: str = "cuda",
    compile_mode: str | None = "default",
    cache: BaselineCache | None = None,
    env: dict[str, str] | None = None,
) -> Baseline | None:
    """The cached baseline :func:`baseline_for_task` would return for these arguments, or None;
    never measures."""
    backend = "cuda" if device.startswith("cuda") else "cpu"
    dname = device_name(device, visible=(env or {}).get("CUDA_VISIBLE_DEVICES"))
    cache = cache if cache is not None else BaselineCache()
    return _cache_lookup(cache, task_hash(task), dname, torch_version(), compile_mode, backend)


def _cache_lookup(
    cache: BaselineCache,
    thash: str,
    dname: str,
    tver: str,
    compile_mode: str | None,
    backend: str,
) -> Baseline | None:
    """The cached baseline of this key; for an eager-only request (``compile_mode`` None) also a
    default-mode entry's, whose eager figures are the same measurement of the same program."""
    hit = cache.get(BaselineCache.key(thash, dname, tver, compile_mode or "none", backend))
    if hit is None and compile_mode is None:
        full = cache.get(BaselineCache.key(thash, dname, tver, "default", backend))
        if full is not None and full.eager is not None:
            hit = full
    return hit


def baseline_for_task(
    task: Task | str,
    *,
    device: str = "cuda",
    compile_mode: str | None = "default",
    timeout_s: float = 600.0,
    config: TimingConfig | None = None,
    cache: BaselineCache | None = None,
    recompute: bool = False,
    seed: int = 0,
    setup: Callable[[], Any] | None = None,
    hold: Callable[[], Any] | None = None,
    env: dict[str, str] | None = None,
    report_setup: bool = False,
    on_line: Callable[[dict[str, Any]], Any] | None = None,
) -> Baseline:
    """Eager (and ``torch.compile`` unless ``compile_mode`` is None) times of a task's reference.
    ``setup``/``hold``: context-manager factories around the worker's set-up and its timing
    (:func:`run_worker`), e.g. a device gate held shared, then exclusive. ``env``: the worker's
    environment, whose CUDA_VISIBLE_DEVICES also names the device of the cache key.
    ``report_setup``: ask the worker for its ``setup`` line (the reference's one forward, its
    bytes, the compile's seconds: :mod:`cuda_agent.profiler.worker`); ``on_line``: called with
    each JSON line the worker printed, in order, once it ended (never on a cache hit: no worker
    runs). Neither changes the result or its cache key.

    Runs in a fresh subprocess with a timeout (compile can hang or crash): the model is
    compiled and called once, then eager is measured, then eager and compiled interleaved; if
    compile fails, the eager result is kept and ``error`` says what happened. Successful results are cached unless
    ``cache`` is given as ``BaselineCache(root=Path("/dev/null"))``-like or ``recompute``.
    """
    ref = task.ref_code if isinstance(task, Task) else task
    backend = "cuda" if device.startswith("cuda") else "cpu"
    dname = device_name(device, visible=(env or {}).get("CUDA_VISIBLE_DEVICES"))
    tver = torch_version()
    mode = compile_mode or "none"
    cache = cache if cache is not None else BaselineCache()
    key = BaselineCache.key(task_hash(task), dname, tver, mode, backend)
    if not recompute:
        hit = _cache_lookup(cache, task_hash(task), dname, tver, compile_mode, backend)
        if hit is not None:
            return hit
    request = {
        "op": "baseline",
        "ref_code": ref,
        "device": device,
        "compile_mode": compile_mode,
        "model_mode": model_mode(task),
        "config": (config or TimingConfig()).to_dict(),
        "seed": seed,
    }
    if report_setup:
        request["report_setup"] = True
    t0 = time.monotonic()
    lines, err, tail = run_worker(request, timeout_s=timeout_s, setup=setup, hold=hold, env=env)
    if on_line is not None:
        for d in lines:
            on_line(d)
    eager = compiled = eager_plain = compile_plain = None
    wname, wver = dname, tver
    for d in lines:
        if d.get("stage") == "info":
            wname, wver = d.get("device_name", wname), d.get("torch_version", wver)
        elif d.get("stage") == "eager":
            eager = _stats(d["stats"])
        elif d.get("stage") == "paired":
            eager = _stats(d["eager"]) or eager
            compiled = _stats(d.get("compile"))
        elif d.get("stage") == "nograph":
            eager_plain = _stats(d.get("eager"))
            compile_plain = _stats(d.get("compile"))
        elif d.get("stage") == "error":
            err = d.get("message") or err
    if err is None and compile_mode is not None and compiled is None:
        err = "worker printed no compile result"
    if eager is None and err is None:
        err = "worker printed no result: " + tail[-500:]
    b = Baseline(
        device=wname,
        torch_version=wver,
        protocol_version=PROTOCOL_VERSION,
        eager=eager,
        compile=compiled,
        eager_nograph=eager_plain,
        compile_nograph=compile_plain,
        compile_mode=mode,
        backend=backend,
        error=err,
    )
    if err is None:
        cache.put(key, b)
    del t0
    return b
