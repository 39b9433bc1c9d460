"""The references table of a KernelBench tree (issue 27): for every problem, its reference run
once, and its eager and ``torch.compile`` baselines through the profiler's own machinery.

    python kb_references.py run --root .gpu-data/kernelbench --levels 1,2,3 -o refs.jsonl --resume
    python kb_references.py run --tasks tasks.jsonl -o refs.jsonl --resume     # any Task JSONL
    python kb_references.py table refs.jsonl --env env.txt --command "..." > docs/kernelbench-references.md

Per problem (one JSON line, :class:`Row`), one process: the profiler's baseline worker, through
:func:`cuda_agent.profiler.baseline.baseline_for_task` (the function behind ``profiler baseline``:
its worker process, its protocol, its cache in ``$CUDA_AGENT_CACHE/baselines``, reused by the
sandbox for the same task and device), asked for its set-up figures (``report_setup``). In its
set-up the worker builds the model (seed 0) and its input pool (seed 1000: the first set is the
reference's input), runs the reference once on that first set, synchronised (``ref_s``, input and
output bytes; on CUDA the memory peak since before the model and the pool were built, so the
pool's other sets count), then ``torch.compile`` and its first call (``compile_s``; cold caches on
a first run), and says so in one ``setup`` line; then it times eager and compiled (``paired``).
A cache hit runs no worker: the row then has no set-up figures (None). ``--no-precompile`` leaves
``compile_s`` out of the rows (the worker compiles anyway: its baseline is eager and compiled);
``--compile-mode none``: no compile at all, eager only.

Several problems run at once (``--jobs``): their start-up, model building and compiles overlap,
but every *timed* section is exclusive. The profiler's worker is started through a launcher (this
script, ``_locked-worker``) that holds one ``flock`` (``--lock``) around each call of
``cuda_agent.profiler.timing.paired``, the entry of every timed section of the protocol
(``measure`` goes through it). The reference's one forward (``ref_s``) is set-up, not a timed
section of the protocol, and runs outside the lock. What may still overlap a timed section is
other problems' set-up on the device: model and input creation, the reference's forward and
``torch.compile``'s first call (incl. Triton's config benchmarking), plus their CPU load. That is
the compromise; ``--jobs 1`` is the strict protocol, one problem at a time. GPU memory is
budgeted: a problem waits (first come, first served) until its estimate (from its inputs and
parameters drawn on the ``meta`` device) fits beside the running ones.

Errors are classified: ``error_class`` ``problem`` (the reference raises in its set-up: loading,
building or its forward, ``ref_error``; ``torch.compile`` cannot compile it, ``compile_error``
with eager kept; the worker times out; out of memory with the device to itself) or ``infra`` (the
harness's own failure: out of memory or a kill while sharing the device, no space left, the
worker failing before torch imported, a module the environment lacks, the timing failing on a
reference whose set-up, forward included, ran). A worker that times out or dies in its set-up
without a message (before its ``setup`` line) is run once more without ``torch.compile``: if that
one succeeds, the compile was the culprit (``compile_error``, eager kept), else its row stands.
Out-of-memory and killed problems are run again at the end, alone. ``--resume`` skips every
problem with a row except infra errors (and the statuses given to ``--redo``).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import json
import math
import os
import re
import shlex
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from cuda_agent.records import Task
from cuda_agent.records.jsonl import RecordWriter, iter_lines, read_records

HERE = Path(__file__).resolve()
LOCK_ENV = "KB_REFS_TIMING_LOCK"
STATS_ENV = "KB_REFS_LOCK_STATS"
GiB = 1 << 30

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)


class Row(msgspec.Struct, kw_only=True):
    """One problem of the table."""

    task_id: str
    level: int | None
    problem: int | None
    name: str
    status: str  # ok | compile_error | ref_error | timeout | out_of_memory | infra_error
    error_class: str | None = None  # None | "problem" | "infra"
    error: str | None = None
    input_bytes: int | None = None
    output_bytes: int | None = None
    peak_bytes: int | None = None  # device memory peak of the worker's set-up, its forward incl.
    ref_s: float | None = None  # the reference's one forward, synchronised
    compile_s: float | None = None  # torch.compile + first call in the worker's set-up
    eager_ms: float | None = None  # baseline medians (profiler protocol)
    compile_ms: float | None = None
    eager_flags: list[str] = []
    compile_flags: list[str] = []
    baseline_cached: bool = False
    baseline_s: float | None = None  # baseline_for_task's wall time (incl. lock waits)
    timed_s: float | None = None  # seconds its worker held the timing lock
    lock_wait_s: float | None = None  # seconds its worker waited for the lock
    seconds: float = 0.0  # the whole problem (memory budget wait, estimate and worker)
    retried_alone: bool = False
    device: str = ""
    protocol: str = ""
    jobs: int = 1


# ---------------------------------------------------------------- error classes

_OOM = (
    "out of memory",
    "outofmemoryerror",
    "cublas_status_alloc_failed",
    "cannot allocate memory",
    "can't allocate memory",
    "memoryerror",
)
_DISK = ("no space left on device", "disk quota exceeded", "errno 28")


def infra_kind(message: str | None) -> str | None:
    """``"out_of_memory"``, ``"disk"``, ``"killed"`` or ``"environment"`` (a module missing) when
    ``message`` says so, else None."""
    m = (message or "").lower()
    if any(p in m for p in _OOM):
        return "out_of_memory"
    if any(p in m for p in _DISK):
        return "disk"
    if "signal 9" in m or "sigkill" in m or "killed" in m:
        return "killed"
    if "modulenotfounderror" in m:  # a module the environment lacks (KernelBench L3 48/49: einops)
        return "environment"
    return None


# ---------------------------------------------------------------- child processes


def _die_with_parent() -> None:
    """SIGKILL this process when the process that started it dies (a killed run leaves none)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(1)


@contextlib.contextmanager
def _lock(path: str | None, acc: dict[str, float] | None = None):
    if not path:
        yield
        return
    from cuda_agent.records.filelock import exclusive_lock

    t = time.monotonic()
    with exclusive_lock(path):
        t1 = time.monotonic()
        try:
            yield
        finally:
            if acc is not None:
                acc["waited_s"] = acc.get("waited_s", 0.0) + t1 - t
                acc["held_s"] = acc.get("held_s", 0.0) + time.monotonic() - t1
                acc["n"] = acc.get("n", 0) + 1


def locked_worker(argv: list[str]) -> None:
    """The profiler's worker (``-m cuda_agent.profiler.worker``) with every call of
    ``timing.paired`` held under ``$KB_REFS_TIMING_LOCK``; appends the seconds waited and held
    to ``$KB_REFS_LOCK_STATS`` as one JSON line keyed by the task hash."""
    if argv != ["-m", "cuda_agent.profiler.worker"]:
        raise SystemExit(f"_locked-worker runs the profiler worker only, not {argv}")
    _die_with_parent()
    import runpy

    from cuda_agent.profiler import timing
    from cuda_agent.profiler.baseline import task_hash

    data = sys.stdin.read()
    sys.stdin = io.StringIO(data)
    key = task_hash(json.loads(data).get("ref_code", ""))
    acc: dict[str, float] = {}
    inner = timing.paired
    path = os.environ.get(LOCK_ENV)

    @functools.wraps(inner)
    def paired(*a: Any, **kw: Any) -> Any:
        with _lock(path, acc):
            return inner(*a, **kw)

    timing.paired = paired
    try:
        runpy.run_module("cuda_agent.profiler.worker", run_name="__main__", alter_sys=True)
    finally:
        stats = os.environ.get(STATS_ENV)
        if stats:
            line = json.dumps({"task": key, "pid": os.getpid(), **acc}) + "\n"
            fd = os.open(stats, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, line.encode())
            os.close(fd)


# ---------------------------------------------------------------- scheduling


class MemBudget:
    """Device bytes shared by the running problems, granted first come first served; a request
    larger than the budget runs once nothing else holds any."""

    def __init__(self, cap: int | None):
        self.cap = cap
        self.used = 0
        self._queue: collections.deque[int] = collections.deque()
        self._ticket = 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, n: int):
        if self.cap is None:
            yield
            return
        with self._cond:
            me = self._ticket = self._ticket + 1
            self._queue.append(me)
            while self._queue[0] != me or (self.used and self.used + n > self.cap):
                self._cond.wait()
            self._queue.popleft()
            self.used += n
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self.used -= n
                self._cond.notify_all()


_ESTIMATE_LOCK = threading.Lock()


def estimate_bytes(task: Task) -> int | None:
    """Device bytes a problem's baseline may hold: four times its inputs plus twice its
    parameters plus 2 GiB (input pool of up to 3 sets, outputs, compile workspace, context),
    from its inputs and model drawn on the ``meta`` device; None when that fails."""
    try:
        import torch

        from cuda_agent.profiler.baseline import load_reference, tensor_bytes

        prog = load_reference(task.ref_code)
        inputs = tensor_bytes(prog.make_inputs(device="meta"))
        model = prog.make_model(device="meta")
        params = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        del torch
        return 4 * inputs + 2 * params + 2 * GiB
    except Exception:  # noqa: BLE001 - unknown: the default share
        return None


def estimate_bytes_locked(task: Task) -> int | None:
    """:func:`estimate_bytes`, one thread at a time (programs load into this process)."""
    with _ESTIMATE_LOCK:
        return estimate_bytes(task)


def gpu_total_bytes(device: str) -> int | None:
    """Total memory of ``device`` (NVML, else torch), None on cpu."""
    if not device.startswith("cuda"):
        return None
    from cuda_agent.profiler.nvml import memory_bytes, nvml_index

    idx = int(device.split(":")[1]) if ":" in device else 0
    total = memory_bytes(nvml_index(idx), "total")
    if total is None:  # no NVML: torch says (and creates a context)
        import torch

        total = int(torch.cuda.get_device_properties(idx).total_memory)
    return total


# ---------------------------------------------------------------- one problem


class Runner:
    """Everything one run shares: settings, the lock, the memory budget, the stats file."""

    def __init__(self, **kw: Any):
        self.__dict__.update(kw)

    def row(self, task: Task, **kw: Any) -> Row:
        return Row(
            task_id=task.id,
            level=task.level,
            problem=task.problem_id,
            name=task.name,
            device=self.device_label,
            protocol=self.protocol,
            jobs=self.jobs,
            **kw,
        )

    def lock_stats(self, key: str) -> dict[str, float]:
        found: dict[str, float] = {}
        with contextlib.suppress(OSError):
            for ln in Path(self.stats_path).read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    d = json.loads(ln)
                    if d.get("task") == key:
                        found = d
        return found

    def one(self, task: Task, alone: bool, eager_only: bool = False) -> Row:
        """The row of ``task``: one baseline worker (``eager_only``: without ``torch.compile``)."""
        from cuda_agent.profiler.baseline import baseline_for_task, cached_baseline, task_hash

        t0 = time.monotonic()
        mode = None if eager_only else self.compile_mode
        est = estimate_bytes_locked(task) or self.default_share
        seen: dict[str, dict[str, Any]] = {}  # the worker's first line of each stage

        def on_line(d: dict[str, Any]) -> None:
            seen.setdefault(str(d.get("stage")), d)

        with self.budget.hold(0 if alone else est):
            cached = cached_baseline(task, device=self.device, compile_mode=mode)
            tb = time.monotonic()
            b = baseline_for_task(
                task,
                device=self.device,
                compile_mode=mode,
                timeout_s=self.timeout,
                config=self.timing,
                recompute=self.recompute,
                report_setup=True,
                on_line=on_line,
            )
            baseline_s = time.monotonic() - tb
        setup = seen.get("setup", {})
        fields: dict[str, Any] = {
            k: setup.get(k) for k in ("input_bytes", "output_bytes", "peak_bytes", "ref_s")
        }
        fields["compile_s"] = setup.get("compile_s") if self.precompile else None
        fields["retried_alone"] = alone
        fields["baseline_s"] = baseline_s
        fields["baseline_cached"] = cached is not None and not self.recompute
        ls = {} if fields["baseline_cached"] else self.lock_stats(task_hash(task))
        fields["timed_s"] = ls.get("held_s")
        fields["lock_wait_s"] = ls.get("waited_s")
        if b.eager is not None:
            fields["eager_ms"] = b.eager.median_ms
            fields["eager_flags"] = list(b.eager.flags)
        if b.compile is not None:
            fields["compile_ms"] = b.compile.median_ms
            fields["compile_flags"] = list(b.compile.flags)
        secs = time.monotonic() - t0

        def row(status: str, error_class: str | None = None, error: str | None = None) -> Row:
            return self.row(
                task, status=status, error_class=error_class, error=error, seconds=secs, **fields
            )

        if b.error is None:  # measured now, or a cache hit (no worker ran: no set-up figures)
            return row("ok")
        # an error line replaces the timeout in b.error (torch.compile failed, then the timing
        # hung): a worker that ran for its whole timeout timed out
        timed_out = b.error.startswith("timeout") or baseline_s >= self.timeout
        kind = infra_kind(b.error)
        if "info" not in seen and kind is None and not timed_out:
            kind = "harness"  # the worker died before torch imported (its first line)
        if kind == "out_of_memory" and alone:
            return row("out_of_memory", "problem", b.error)
        if kind is not None:
            return row("infra_error", "infra", f"{kind}: {b.error}")
        if "setup" not in seen and "error" not in seen and mode is not None:
            # timed out or died in its set-up without a message: in the reference (loading,
            # building, its forward) or in torch.compile? A worker without the compile tells.
            r = self.one(task, alone, eager_only=True)
            secs = time.monotonic() - t0
            if r.status != "ok":  # the reference's own failure
                return msgspec.structs.replace(r, seconds=secs)
            note = f"torch.compile failed (in the worker's set-up): {b.error}"[:2000]
            return msgspec.structs.replace(
                r, status="compile_error", error_class="problem", error=note, seconds=secs
            )
        if "setup" not in seen:  # the reference raised (loading, building, its forward) or hung
            return row("timeout" if timed_out else "ref_error", "problem", b.error)
        if b.eager is not None and b.error.startswith("torch.compile failed"):
            return row("compile_error", "problem", b.error)
        if timed_out:
            return row("timeout", "problem", b.error)
        # the reference's set-up (its forward incl.) ran in the worker: a failing timing is the
        # harness's
        return row("infra_error", "infra", f"timing: {b.error}")


# ---------------------------------------------------------------- run


def load_tasks(
    root: Path | None, tasks_file: Path | None, levels: str, problems: str | None
) -> list[Task]:
    """The problems of a KernelBench tree (``kernelbench-eval tasks``' reader) or a Task JSONL."""
    from cuda_agent.kernelbench_eval.tree import ProblemIssue, iter_problems, parse_ranges

    lv, pr = parse_ranges(levels), parse_ranges(problems)
    if root is not None:
        out = []
        for t in iter_problems(root, lv, pr):
            if isinstance(t, ProblemIssue):
                print(f"kb-refs: skipped {t.path}: {t.message}", file=sys.stderr)
            else:
                out.append(t)
        return out
    assert tasks_file is not None
    out = []
    for _, rec in read_records(tasks_file, Task):
        if not isinstance(rec, Task):
            raise typer.BadParameter(f"{tasks_file}: {rec}")
        if (lv is None or rec.level in lv) and (pr is None or rec.problem_id in pr):
            out.append(rec)
    return out


def read_rows(path: Path) -> list[Row]:
    """The whole rows of ``path`` in file order (a cut last line and bad lines are skipped)."""
    rows = []
    if not path.exists():
        return rows
    for _, line in iter_lines(path):
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            rows.append(msgspec.json.decode(line, type=Row))
    return rows


def latest(rows: list[Row]) -> dict[str, Row]:
    """The last row of each task (a resumed run appends)."""
    return {r.task_id: r for r in rows}


def latest_per_problem(rows: list[Row]) -> list[Row]:
    """The last row of each problem (level, problem, name), in file order: a problem whose task
    changed (e.g. its ``model_mode``) and was run again is counted once, by its newer row."""
    return list({(r.level, r.problem, r.name): r for r in rows}.values())


def pending(tasks: list[Task], rows: list[Row], redo: set[str]) -> list[Task]:
    """The tasks ``--resume`` runs: those without a row, or whose last row is an infra error or
    has a status in ``redo``."""
    done = {k for k, r in latest(rows).items() if r.error_class != "infra" and r.status not in redo}
    return [t for t in tasks if t.id not in done]


@app.command()
def run(
    output: Annotated[Path, typer.Option("-o", "--output", help="Rows JSONL (appended).")],
    root: Annotated[Path | None, typer.Option(help="KernelBench tree.")] = None,
    tasks: Annotated[Path | None, typer.Option(help="Task JSONL instead of a tree.")] = None,
    levels: Annotated[str, typer.Option(help="Levels, e.g. 1,2,3.")] = "1,2,3",
    problems: Annotated[str | None, typer.Option(help="Problem ids, e.g. 1-10,40.")] = None,
    limit: Annotated[int | None, typer.Option(help="At most this many problems to run.")] = None,
    resume: Annotated[bool, typer.Option(help="Skip problems with a row (not infra).")] = False,
    redo: Annotated[str, typer.Option(help="With --resume, redo rows of these statuses.")] = "",
    jobs: Annotated[int, typer.Option(min=1, help="Problems at once.")] = 6,
    device: Annotated[str, typer.Option(help="cuda, cuda:N or cpu.")] = "cuda",
    compile_mode: Annotated[str, typer.Option(help="torch.compile mode or none.")] = "default",
    precompile: Annotated[
        bool, typer.Option(help="Record compile_s (torch.compile + first call in the worker).")
    ] = True,
    timeout: Annotated[float, typer.Option(help="Seconds per worker (set-up and timing).")] = 600.0,
    time_cap: Annotated[float | None, typer.Option(help="Protocol time_cap_s.")] = None,
    warmup_ms: Annotated[float | None, typer.Option(help="Protocol warmup_ms.")] = None,
    target_rse: Annotated[float | None, typer.Option(help="Protocol target_rse.")] = None,
    trace_check: Annotated[
        bool, typer.Option(help="The protocol's kernel-trace cross-check (CUPTI set-up).")
    ] = True,
    recompute: Annotated[bool, typer.Option(help="Ignore the baseline cache.")] = False,
    lock: Annotated[Path | None, typer.Option(help="The timing lock file.")] = None,
    mem_fraction: Annotated[float, typer.Option(help="Share of GPU memory to budget.")] = 0.85,
    compile_threads: Annotated[
        int | None, typer.Option(help="TORCHINDUCTOR_COMPILE_THREADS per process.")
    ] = None,
    deadline_s: Annotated[float | None, typer.Option(help="Start no problem after this.")] = None,
    timing_cpus: Annotated[
        str, typer.Option(help="Cores kept for the timed sections: auto, off, N or a,b.")
    ] = "auto",
) -> None:
    """Run the baseline worker (reference forward, eager and compiled) of every problem; one Row
    per line in -o."""
    from cuda_agent.profiler import baseline as B
    from cuda_agent.profiler.config import PROTOCOL_VERSION, TimingConfig
    from cuda_agent.profiler.cpus import install as install_timing_cpus

    if (root is None) == (tasks is None):
        raise typer.BadParameter("give exactly one of --root or --tasks")
    t_start = time.monotonic()
    todo = load_tasks(root, tasks, levels, problems)
    total = len(todo)
    redo_set = {s.strip() for s in redo.split(",") if s.strip()}
    if resume:
        todo = pending(todo, read_rows(output), redo_set)
    elif output.exists() and output.stat().st_size:
        raise typer.BadParameter(f"{output} exists: give --resume or another -o")
    if limit is not None:
        todo = todo[:limit]
    over = {}
    for k, v in (("time_cap_s", time_cap), ("warmup_ms", warmup_ms), ("target_rse", target_rse)):
        if v is not None:
            over[k] = v
    if not trace_check:
        over["trace_check"] = False
    timing = TimingConfig().with_(**over)
    try:  # the workers time on kept cores while the others set up beside them (profiler.cpus)
        kept = install_timing_cpus(timing_cpus)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    cuda = device.startswith("cuda")
    ncpu = os.cpu_count() or 2
    os.environ.setdefault(
        "TORCHINDUCTOR_COMPILE_THREADS", str(compile_threads or max(1, (ncpu - 2) // jobs))
    )
    workdir = Path(tempfile.mkdtemp(prefix="kb-refs-"))
    lock_path = str(lock or workdir / "timing.lock")
    stats_path = str(workdir / "lock_stats.jsonl")
    os.environ[LOCK_ENV] = lock_path
    os.environ[STATS_ENV] = stats_path
    launcher = workdir / "python-locked-worker"
    launcher.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(HERE))} _locked-worker "$@"\n'
    )
    launcher.chmod(0o755)
    # baseline_for_task starts `python -m cuda_agent.profiler.worker`: the same module, through
    # the launcher that holds the timing lock around its timed sections
    B.run_worker = functools.partial(B.run_worker, python=str(launcher))
    total_mem = gpu_total_bytes(device) if cuda else None
    budget = MemBudget(int(total_mem * mem_fraction) if total_mem else None)
    label = B.device_name(device)
    runner = Runner(
        device=device,
        device_label=label,
        protocol=PROTOCOL_VERSION,
        jobs=jobs,
        compile_mode=None if compile_mode == "none" else compile_mode,
        precompile=precompile,
        timeout=timeout,
        timing=timing,
        recompute=recompute,
        lock=lock_path,
        stats_path=stats_path,
        budget=budget,
        default_share=max(8 * GiB, (total_mem or 0) // max(jobs, 1) // 2),
    )
    log = functools.partial(print, file=sys.stderr, flush=True)
    log(
        f"kb-refs: {len(todo)} to run of {total} problems ({total - len(todo)} done), "
        f"{jobs} at once on {label}; compile threads {os.environ['TORCHINDUCTOR_COMPILE_THREADS']}, "
        f"memory budget {budget.cap / GiB if budget.cap else 0:.0f} GiB; timing {over or 'protocol defaults'}; "
        f"cores kept for the timed sections: {','.join(map(str, kept)) or 'none'}"
    )
    writer = RecordWriter(output)
    wlock = threading.Lock()
    counts: collections.Counter[str] = collections.Counter()
    retry: list[Task] = []
    n_done = 0

    def record(task: Task, r: Row, final: bool) -> None:
        nonlocal n_done
        with wlock:
            if (
                not final
                and r.error_class == "infra"
                and r.error
                and (r.error.startswith(("out_of_memory", "killed")))
            ):
                retry.append(task)
                log(
                    f"[kb-refs {time.monotonic() - t_start:.0f}s] L{task.level}/{task.problem_id} "
                    f"{task.name}: {r.error[:160]} (run again alone at the end)"
                )
                return
            writer.write(r)
            n_done += 1
            counts[r.status] += 1
            e = f"{r.eager_ms:.4f}" if r.eager_ms is not None else "-"
            c = f"{r.compile_ms:.4f}" if r.compile_ms is not None else "-"
            log(
                f"[kb-refs {time.monotonic() - t_start:.0f}s] {n_done}/{len(todo)} "
                f"L{r.level}/{r.problem} {r.name}: {r.status} eager {e} ms compile {c} ms "
                f"(compile {_s(r.compile_s)}, timed {_s(r.timed_s)}, {r.seconds:.1f}s)"
                + (f" {r.error[:200]}" if r.error else "")
                + f" | {dict(counts)}"
            )

    def job(task: Task, alone: bool = False) -> None:
        if deadline_s is not None and time.monotonic() - t_start > deadline_s:
            return
        try:
            r = runner.one(task, alone)
        except Exception as e:  # noqa: BLE001 - the harness's own failure, for this problem only
            r = runner.row(
                task,
                status="infra_error",
                error_class="infra",
                error=f"harness: {type(e).__name__}: {e}"[:2000],
            )
        record(task, r, final=alone)

    with ThreadPoolExecutor(max_workers=jobs) as ex:
        for f in [ex.submit(job, t) for t in todo]:
            f.result()
    for t in list(retry):
        job(t, alone=True)
    writer.close()
    log(f"kb-refs: {n_done} rows in {time.monotonic() - t_start:.0f}s: {dict(counts)}")


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}s"


# ---------------------------------------------------------------- the table


def _mb(x: int | None) -> str:
    return "-" if x is None else f"{x / 1e6:.1f}"


def _f(x: float | None, fmt: str = "{:.4f}") -> str:
    return "-" if x is None else fmt.format(x)


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


_QUIET = {"cuda_graph"}  # marked beside the eager time instead


def _flags(r: Row) -> list[str]:
    """The protocol's findings on either side, once each (``time_cap``, ``warmup_unstable``...)."""
    return sorted((set(r.eager_flags) | set(r.compile_flags)) - _QUIET)


def render(rows: list[Row], env: list[str], command: str, title: str) -> str:
    """The Markdown document: run header, summary per level, errors, one line per problem."""
    date = env[0] if env else "(date: fill in)"
    commit = next((x.split()[1] for x in env if x.startswith("commit ")), "(commit: fill in)")
    gpu = next((x for x in env if "H200" in x or "NVIDIA" in x), None) or (
        sorted({r.device for r in rows})[0] if rows else "(GPU: fill in)"
    )
    by = sorted(latest_per_problem(rows), key=lambda r: (r.level or 0, r.problem or 0, r.name))
    out = [
        f"# {title}",
        "",
        f"{date}; GPU: {gpu}; commit `{commit}`; command: `{command or '(fill in)'}`.",
        f"Protocol {by[0].protocol if by else '?'}; {by[0].jobs if by else '?'} problems at once "
        "(timed sections exclusive: packages/kernelbench-eval/benchmarks/kb_references.py).",
        "",
        "`eager ms` / `compile ms`: the profiler's baseline medians (`profiler baseline`, paired, "
        "L2 flushed); `ref s`: the reference's one forward; `compile s`: `torch.compile` and its "
        "first call (cold caches on a first run); `s`: the problem's wall time in this run (its "
        "baseline worker, set-up included; problems overlapped).",
        "",
        "| level | problems | ok | compile_error | problem errors | infra errors | geomean eager/compile "
        "| eager ms (median) | timed s (sum) | compile s (sum) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    levels = sorted({r.level for r in by}, key=lambda x: x or 0)
    for lv in [*levels, "all"]:
        rs = by if lv == "all" else [r for r in by if r.level == lv]
        sp = [r.eager_ms / r.compile_ms for r in rs if r.eager_ms and r.compile_ms]
        eg = [r.eager_ms for r in rs if r.eager_ms is not None]
        out.append(
            f"| {lv} | {len(rs)} | {sum(r.status == 'ok' for r in rs)} | "
            f"{sum(r.status == 'compile_error' for r in rs)} | "
            f"{sum(r.error_class == 'problem' for r in rs)} | "
            f"{sum(r.error_class == 'infra' for r in rs)} | "
            f"{_f(_geomean(sp), '{:.2f}x')} | {_f(statistics.median(eg) if eg else None)} | "
            f"{sum(r.timed_s or 0 for r in rs):.0f} | {sum(r.compile_s or 0 for r in rs):.0f} |"
        )
    fl = collections.Counter(f for r in by for f in _flags(r))
    if fl:
        out += [
            "",
            "Protocol flags (problems): "
            + ", ".join(f"`{k}` {v}" for k, v in fl.most_common())
            + " (`warmup_unstable`, `time_cap`: the timing did not settle; compare with "
            "`--jobs 1` on those problems).",
        ]
    errs = [r for r in by if r.error]
    if errs:
        out += [
            "",
            "## Errors",
            "",
            "| problem | status | class | message |",
            "| --- | --- | --- | --- |",
        ]
        for r in errs:
            msg = re.sub(r"\s+", " ", r.error or "")[:240].replace("|", "\\|")
            out.append(
                f"| L{r.level}/{r.problem} {r.name} | {r.status} | {r.error_class} | {msg} |"
            )
    for lv in levels:
        out += [
            "",
            f"## Level {lv}",
            "",
            "| id | name | input MB | output MB | ref s | eager ms | compile ms | eager/compile "
            "| compile s | s | status | flags |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
        ]
        for r in (r for r in by if r.level == lv):
            sp = r.eager_ms / r.compile_ms if r.eager_ms and r.compile_ms else None
            graph = " (graph)" if "cuda_graph" in r.eager_flags else ""
            out.append(
                f"| {r.problem} | {r.name} | {_mb(r.input_bytes)} | {_mb(r.output_bytes)} | "
                f"{_f(r.ref_s, '{:.3f}')} | {_f(r.eager_ms)}{graph} | {_f(r.compile_ms)} | "
                f"{_f(sp, '{:.2f}')} | {_f(r.compile_s, '{:.1f}')} | {r.seconds:.1f} | {r.status} "
                f"| {' '.join(_flags(r))} |"
            )
    return "\n".join(out) + "\n"


@app.command()
def table(
    rows: Annotated[list[Path], typer.Argument(help="Rows JSONL file(s) of `run`.")],
    env: Annotated[Path | None, typer.Option(help="The run's env.txt (date, commit, GPU).")] = None,
    command: Annotated[str, typer.Option(help="The command that made the rows.")] = "",
    title: Annotated[
        str, typer.Option()
    ] = "KernelBench references: eager and torch.compile baselines",
) -> None:
    """Print the Markdown table of the rows (the last row of each problem counts)."""
    allrows = [r for p in rows for r in read_rows(p)]
    lines = env.read_text().splitlines() if env and env.exists() else []
    sys.stdout.write(render(allrows, lines, command, title))


if __name__ == "__main__":
    if sys.argv[1:2] == ["_locked-worker"]:
        locked_worker(sys.argv[2:])
    else:
        app()
