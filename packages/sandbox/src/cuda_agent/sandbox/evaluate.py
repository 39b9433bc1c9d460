"""Evaluate one candidate: materialise, compile, verify against the reference, time.

Trust model (ARCHITECTURE.md): the parent (this module) draws a secret seed, has the reference's
outputs computed in a process of their own, starts the candidate in another confined process
that receives only the trial seeds, init inputs and the reference's state_dict, and compares
what comes back. Where a mount namespace hides the reference's outputs from it, the candidate's
process starts while the reference runs and waits, after ``import torch``, for the parent's
start signal (``early_verify``); it reads nothing of the reference's before that. Timing runs in
a fresh candidate process, started (``early_time``) while the parent compares the verification's
outputs and waiting after ``import torch`` for their verdict; the output of a call made after the
timed calls is re-checked.
Baselines come from the profiler (trusted process, cached).

The two halves are separate so a pool can overlap them: :func:`prepare` (CPU: static guards,
materialise, compile) and :func:`run_on_device` (reference, verify, time).

The module reads top to bottom: :func:`evaluate`, then :func:`prepare` and its steps, then
:func:`run_on_device`, the re-run alone, and ``_run_on_device``, whose body is the device half's
steps in order (reference, admission, verification and comparison, the verdict of the trials
and guards, baseline, timing, re-check, result), each a function below it; then the shape
check, the judge, and the helpers they share. How one runner op runs confined, the gate turn
and the processes started ahead of their stage (timing, verification) are :mod:`.phases`; what
the evaluator asks of the profiler (baselines, timing protocol, speed-of-light floor) is
:mod:`.profiling`.

Several device halves may share one device (``SandboxPool(workers_per_device=N)``). They meet at
the device's gate (``gate.DeviceGate``): the reference, the verification and the timing process's
start-up (import, build, input pool) hold it shared and may overlap other candidates' phases; the
timed section (``time`` op after its ``ready``/``go`` handshake), the baseline and the
speed-of-light ceilings measurements hold it exclusive, so nothing else runs on the device while
anything is timed. With several workers on a GPU each process's caching allocator is capped to a
share of the memory (``mem_fraction``); a task too large for that share gets a larger one, or
the device alone (``admission.device_share``).

Verdict safety: a neighbour can make an honest candidate fail (its out-of-memory or a GPU fault
that takes the device's memory, the host's OOM killer on the cpu backend), and a capped
allocator can refuse what an uncapped one gives. So a device half that ends in ``runtime_error``
or ``infra_error`` that looks like a memory failure (out of memory, an allocation refused, a
SIGKILL) while another candidate was present on the device (or under a memory cap) is
run once more, alone (exclusive gate, no other occupant present, no cap), and that second result
is the one returned; ``meta["rerun_alone"]`` says why and what the first run said. A
reference that succeeded is not recomputed (same secret trials and outputs;
``meta["reference_reused"]``). Only these two statuses are re-run: an incorrect output, a timeout or a guard finding cannot come from a
neighbour (separate processes and contexts; timeouts are generous and exclude gate waits).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from cuda_agent.profiler.cpus import install as install_timing_cpus
from cuda_agent.profiler.cpus import kept as kept_cpus
from cuda_agent.profiler.cpus import other_cpus
from cuda_agent.records import (
    Candidate,
    CompileDetail,
    CorrectnessDetail,
    EvalResult,
    GuardViolation,
    Status,
    TimingDetail,
    TimingStats,
    TrialDetail,
)

from . import admission
from .build import build_cache, build_workdir
from .config import SandboxConfig, resolve_backend
from .gate import DeviceGate, Occupant, device_gate, domain_of
from .isolation import Limits, Outcome, cap_text, caps, prepare_writable
from .phases import (
    GO_TIMEOUT_S,
    _Background,
    _early_start_spec,
    _early_verify,
    _EarlyVerify,
    _run_op,
    _TimeOp,
    _Turn,
)
from .profiling import (
    _baseline,
    _comparable_baseline,
    _known_baseline,
    _protocol,
    _ratio_ci,
    _speed_of_light_ms,
    _task_work,
    _timing_config,
    _wants_baseline,
)
from .toolchain import default_cache_dir, device_capability, flags_for, torch_arch_list
from .warm import shared_pool
from .workspace import SolutionError, materialise

LOG_TAIL = 8000
RERUN_STATUSES = (Status.RUNTIME_ERROR, Status.INFRA_ERROR)
# a kernelbench solution that may build an extension (its compile phase imports it)
_BUILDS_EXTENSION = re.compile(r"load_inline|cpp_extension|\bload\s*\(")

# what a neighbour (or the memory cap) can cause: running out of device or host memory, or the
# kernel's OOM killer (SIGKILL); an illegal address or an exception of the candidate's own is
# not re-run (separate CUDA contexts), which keeps hostile streams from costing twice
_MEMORY_FAILURE = re.compile(
    r"out of memory|OutOfMemory|MemoryError|memory over the limit|alloc|SIGKILL|signal 9",
    re.IGNORECASE,
)


@dataclass
class Prepared:
    """A candidate after the CPU half: its directories and, unless it already failed, a build."""

    candidate: Candidate
    config: SandboxConfig
    backend: str
    root: Path | None = None
    work: Path | None = None
    result: EvalResult | None = None  # set when the evaluation already ended (e.g. compile error)
    compile: CompileDetail | None = None
    guards: list[GuardViolation] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    t0: float = 0.0
    ref_state: Any = None  # the reference phase's products, reused by a re-run alone


@dataclass
class _RefState:
    """What the reference phase produced: the trials (secret seeds), the files the candidate
    and the judge get, and the sizes (its trusted report) admission control sizes phases by."""

    trials: list[dict[str, Any]]
    init_seed: int
    init_path: Path
    sd_path: Path
    hidden: list[Path]
    device_name: str
    isolation: dict[str, str]
    input_bytes: int = 0
    output_bytes: int = 0
    param_bytes: int = 0


def evaluate(
    candidate: Candidate,
    config: SandboxConfig | None = None,
    *,
    gpu: str | None = None,
    slot: int = 0,
) -> EvalResult:
    """Build, verify and time one candidate; always returns an ``EvalResult`` (failures of the
    candidate, and of the sandbox itself as ``infra_error``, are results)."""
    cfg = config or SandboxConfig()
    backend = resolve_backend(cfg.backend)
    install_timing_cpus(cfg.timing_cpus)
    _prewarm(candidate, cfg, backend, gpu)
    p = prepare(candidate, cfg, backend=backend)
    importing = None
    if p.result is None and backend == "cuda" and "torch" not in sys.modules:
        # the speed-of-light floor and the working-set count (cuda only) need torch in this
        # process: import it while the reference runs (a lone evaluation, e.g. an agent's
        # verify tool, otherwise waited for both imports one after the other); the outputs are
        # compared by the judge process
        importing = threading.Thread(
            target=importlib.import_module, args=("torch",), name="import-torch", daemon=True
        )
        importing.start()
    try:
        return run_on_device(p, gpu=gpu, slot=slot)
    finally:
        if importing is not None:
            importing.join()  # never left importing at interpreter exit


def _prewarm(candidate: Candidate, cfg: SandboxConfig, backend: str, gpu: str | None) -> None:
    """Start the fork servers this evaluation's phases will fork from, so that their import
    overlaps the static checks and the build instead of following them (a lone evaluation,
    e.g. an agent's verify tool, would otherwise wait for it at its first phase)."""
    src = candidate.solution.files.get("model_new.py", "")
    kb = candidate.solution.format == "kernelbench" and bool(_BUILDS_EXTENSION.search(src))
    prewarm_servers(cfg, backend, [gpu], compile_phase=kb)


def prewarm_servers(
    cfg: SandboxConfig, backend: str, gpus: list[str | None], *, compile_phase: bool = False
) -> None:
    """Start, without waiting, the fork servers of the device phases on ``gpus`` (None: the
    default device) and, with ``compile_phase``, of the kernelbench compile phase (no GPU);
    nothing when ``cfg.fork_server`` is off."""
    pool = shared_pool(0, True) if cfg.fork_server else None
    if pool is None:
        return
    here = Path(tempfile.gettempdir())  # per-evaluation directories are not part of the key
    for gpu in gpus:
        pool.prewarm(_candidate_env(here, gpu, backend, here))
    if compile_phase:
        env = _candidate_env(here, None, backend, here)
        pool.prewarm({**env, "CUDA_VISIBLE_DEVICES": ""})  # the compile phase's


def prepare(
    candidate: Candidate, config: SandboxConfig, *, backend: str | None = None, slot: int = 63
) -> Prepared:
    """The CPU half: static guard checks, a fresh directory, compilation. Never raises for a
    candidate's fault; infrastructure failures become ``infra_error`` results."""
    be = backend or resolve_backend(config.backend)
    p = Prepared(candidate=candidate, config=config, backend=be, t0=time.monotonic())
    try:
        _prepare(p, slot)
    except Exception as e:  # noqa: BLE001 - the evaluator's own failure
        import traceback

        p.result = _result(
            p,
            Status.INFRA_ERROR,
            f"sandbox error while preparing: {type(e).__name__}: {e}",
        )
        p.result.meta["traceback"] = traceback.format_exc()[-4000:]
    return p


def _prepare(p: Prepared, slot: int) -> None:
    """:func:`prepare`'s steps: static guards, a fresh directory with the solution in it, the
    build; the first that ends the evaluation sets ``p.result``."""
    if _static_guards_reject(p):
        return
    cache = _make_dirs(p)
    if p.result is not None:
        return
    if p.candidate.solution.format == "workdir":
        _build_workdir(p, cache)
    else:
        _compile_kernelbench(p, cache, slot)


def _static_guards_reject(p: Prepared) -> bool:
    """Run the static guards (unless the policy is off; stage ``static_guards``); True, with
    ``guard_violation`` as ``p.result``, when a finding rejects."""
    cfg = p.config
    t = time.monotonic()
    if cfg.guard_policy != "off":
        p.guards, p.meta["own_kernels"] = _static_guards(p.candidate, cfg.guard_policy)
    p.stages["static_guards"] = time.monotonic() - t
    if not any(g.severity == "reject" for g in p.guards):
        return False
    p.result = _result(
        p,
        Status.GUARD_VIOLATION,
        "; ".join(f"{g.code}: {g.message}" for g in p.guards if g.severity == "reject"),
    )
    return True


def _static_guards(c: Candidate, policy: str) -> tuple[list[GuardViolation], list[str]]:
    """Static findings and the kernel names of the candidate's sources (for the runtime guard)."""
    try:
        from cuda_agent.guards.static import analyze
    except ImportError:
        from cuda_agent.guards.api import static_checks

        return list(static_checks(c, policy, own_modules=("cuda_extension",))), _own_kernels(c)
    rep = analyze(c, policy, ("cuda_extension",))
    return list(rep.findings), sorted(set(getattr(rep, "kernels", []) or [])) or _own_kernels(c)


def _own_kernels(c: Candidate) -> list[str]:
    files = c.solution.files
    names: list[str] = []
    for name, text in files.items():
        if name.endswith((".cu", ".cuh", ".py")):
            names += re.findall(
                r"__global__\s+(?:void|[\w:<>]+)\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(",
                text,
            )
    return sorted(set(names))


def _make_dirs(p: Prepared) -> Path:
    """The evaluation's directory (``p.root``, with ``private/``) and the solution materialised
    in it (``p.work``; a bad solution: ``compile_error`` as ``p.result``); returns the cache
    directory, created."""
    c = p.candidate
    root = Path(tempfile.mkdtemp(prefix="sbx-", dir=p.config.tmp_root))
    os.chmod(root, 0o711)
    p.root = root
    (root / "private").mkdir(mode=0o700)
    cache = cache_root(p.config)
    cache.mkdir(parents=True, exist_ok=True)
    try:
        p.work = materialise(c.task, c.solution, root / "work", p.backend)
    except SolutionError as e:
        p.compile = CompileDetail(ok=False, log_tail=str(e))
        p.result = _result(p, Status.COMPILE_ERROR, f"solution files: {e}")
        return cache
    os.chmod(p.work, 0o755)
    return cache


def _build_workdir(p: Prepared, cache: Path) -> None:
    """Build a workdir solution (:func:`build.build_workdir`) into ``work/build``; stage
    ``compile``, ``meta["build"]``, ``compile_error`` on failure."""
    assert p.work is not None
    cfg = p.config
    t = time.monotonic()
    b = build_workdir(
        p.work,
        p.work / "build",
        backend=p.backend,
        cache=build_cache(cache),
        jobs=cfg.compile_jobs,
        timeout_s=cfg.compile_timeout_s,
        pch=cfg.pch,
        # compilers run as leased unprivileged uids (build.build_workdir)
        limits=_limits(cfg, cfg.compile_timeout_s, p.backend),
    )
    os.chmod(p.work / "build", 0o755)
    p.compile = CompileDetail(
        ok=b.ok, seconds=b.seconds, log_tail=cap_text(b.log, LOG_TAIL), cached=b.cached
    )
    p.meta["build"] = {
        "units": b.units,
        "pch": b.pch,
        "linker": flags_for(p.backend).linker,
        # who the compilers and the linker ran as (build.build_workdir)
        "compilers_as": b.compilers_as or "none ran (all cached)",
        **(
            {"link_s": round(b.link_seconds, 3), "link_stubs": b.link_stubs}
            if b.link_seconds
            else {}
        ),
    }
    p.stages["compile"] = time.monotonic() - t
    if not b.ok:
        msg = (
            f"compile time limit ({cfg.compile_timeout_s:.0f}s) exceeded"
            if b.timed_out
            else "compilation failed"
        )
        p.result = _result(p, Status.COMPILE_ERROR, msg)


def _compile_kernelbench(p: Prepared, cache: Path, slot: int) -> None:
    """Import a kernelbench solution's ``model_new.py`` in a GPU-less confined process: its
    ``load_inline`` builds run into the solution's content-keyed cache, where the verify and
    timing processes find them. A module that builds no extension (pure Python, Triton) has
    nothing to compile here. Stage ``compile``, ``meta["build"]``, ``p.compile``, and the
    result when it failed (:func:`_kernelbench_compile_verdict`)."""
    assert p.root is not None and p.work is not None
    cfg, c, root = p.config, p.candidate, p.root
    t = time.monotonic()
    src = c.solution.files.get("model_new.py", "")
    if not _BUILDS_EXTENSION.search(src):
        p.compile = CompileDetail(
            ok=True, seconds=0.0, log_tail="no extension to build", cached=True
        )
        p.stages["compile"] = time.monotonic() - t
        return
    kb_cache, triton = _extension_caches(cache, c.solution.id)
    tmp = root / "tmp_compile"
    prepare_writable(tmp, slot, _limits(cfg, 1, p.backend))
    env = _candidate_env(tmp, None, p.backend, triton)
    env["CUDA_VISIBLE_DEVICES"] = ""
    spec = {
        "op": "compile",
        "ref_path": str(p.work / "model.py"),
        "workdir": str(p.work),
        "format": "kernelbench",
        "kb_cache": str(kb_cache),
        "report": str(tmp / "compile.report.json"),
    }
    out, rep = _run_op(
        spec,
        root,
        cwd=p.work,
        env=env,
        limits=_limits(cfg, cfg.compile_timeout_s, p.backend),
        slot=slot,
        writable=[tmp, kb_cache, triton],
        warm=cfg.warm_spares(),
        fork=cfg.fork_server,
    )
    p.stages["compile"] = time.monotonic() - t
    _record_phases(p, "compile", rep)
    builds = rep.get("builds", [])
    p.meta["build"] = {
        "kernelbench": [{k: v for k, v in b.items() if k != "error"} for b in builds]
    }
    _kernelbench_compile_verdict(p, out, rep, builds)


def _kernelbench_compile_verdict(
    p: Prepared, out: Outcome, rep: dict[str, Any], builds: list[dict[str, Any]]
) -> None:
    """``p.compile`` from the compile process's outcome and report, and ``p.result`` when it
    failed: ``compile_error`` (time limit, a failed build), ``runtime_error`` (the import died
    without a report), ``infra_error`` (an error of the op itself)."""
    cfg = p.config
    failed = [b for b in builds if b.get("error")]
    cached = bool(builds) and all(b.get("hit") for b in builds)
    if out.timed_out:
        p.compile = CompileDetail(
            ok=False, seconds=out.seconds, log_tail=cap_text(out.stderr, LOG_TAIL)
        )
        p.result = _result(
            p, Status.COMPILE_ERROR, f"compile time limit ({cfg.compile_timeout_s:.0f}s) exceeded"
        )
    elif failed:
        log = "\n".join(b["error"] for b in failed)
        p.compile = CompileDetail(ok=False, seconds=out.seconds, log_tail=cap_text(log, LOG_TAIL))
        p.result = _result(p, Status.COMPILE_ERROR, "load_inline build failed")
    elif not rep and out.returncode != 0:
        p.compile = CompileDetail(
            ok=False, seconds=out.seconds, log_tail=cap_text(out.stderr, LOG_TAIL)
        )
        p.result = _result(p, Status.RUNTIME_ERROR, f"importing model_new.py: {out.describe()}")
    elif not rep.get("ok", True):
        # the op catches the candidate's own import errors; what escapes it is ours (e.g. a
        # build cache the unprivileged user cannot write): never a silent "compiled"
        err = rep.get("error") or {}
        p.compile = CompileDetail(
            ok=False,
            seconds=out.seconds,
            log_tail=cap_text(str(err.get("traceback", "")), LOG_TAIL),
        )
        p.result = _result(
            p,
            Status.INFRA_ERROR,
            f"sandbox error in the compile process: {err.get('type')}: {err.get('message', '')}"[
                :2000
            ],
        )
    else:
        note = (
            ""
            if rep.get("import_ok", True)
            else f"import deferred to verification: {rep.get('import_error', '')}"
        )
        p.compile = CompileDetail(
            ok=True, seconds=out.seconds, log_tail=cap_text(note, LOG_TAIL), cached=cached
        )


def run_on_device(
    p: Prepared,
    *,
    gpu: str | None = None,
    slot: int = 0,
    gate: DeviceGate | None = None,
    mem_fraction: float | None = None,
) -> EvalResult:
    """The device half: reference outputs, verification, timing. Cleans the directories.

    ``gate``: the device's gate (default: this process's gate of the device, ``device_gate``);
    ``mem_fraction``: cap of each process's CUDA caching allocator (several workers per GPU).
    A ``runtime_error``/``infra_error`` that looks like a memory failure, met while sharing the
    device (or under a cap), is re-run alone once (see the module docstring); ``meta["rerun_alone"]`` says so.
    With ``config.shape_check`` a result ``ok`` is then verified at resized instances of the task
    (:func:`_shape_check`)."""
    r = _device_halves(p, gpu=gpu, slot=slot, gate=gate, mem_fraction=mem_fraction)
    if r.status is Status.OK and p.config.shape_check:
        r = _shape_check(p, r, gpu=gpu, slot=slot, gate=gate, mem_fraction=mem_fraction)
    return r


def _device_halves(
    p: Prepared,
    *,
    gpu: str | None,
    slot: int,
    gate: DeviceGate | None,
    mem_fraction: float | None,
) -> EvalResult:
    """:func:`run_on_device` without the shape check: the device half, re-run alone when a
    memory failure met while sharing calls for it; removes ``p``'s directories."""
    try:
        if p.result is not None:
            return p.result
        p.meta["queued_s"] = round(time.monotonic() - p.t0 - sum(p.stages.values()), 3)
        g = gate or device_gate(_domain(p.backend, gpu))
        share = _device_share(p, mem_fraction, gpu)
        name = f"{p.candidate.task.name} {p.candidate.solution.id[:12]}"
        if share.alone:
            # it would fail under any share and be re-run alone: run it alone at once
            occ = Occupant(name)
            t = time.monotonic()
            with g.exclusive(occ, "alone", alone=True):
                p.stages["alone_wait"] = time.monotonic() - t
                r = _device_half(p, gpu, slot, _Turn(g, occ, held=True), None)
            r.meta["ran_alone"] = f"{share.why} {g.name}"
            return r
        snapshot = (list(p.guards), dict(p.stages), dict(p.meta))
        occ = Occupant(name)
        t_first = time.monotonic()
        with _large_share(p, share, gpu):
            r = _device_half(p, gpu, slot, _Turn(g, occ), share.fraction)
        t_first = time.monotonic() - t_first
        if share.large:
            r.meta["large_share"] = share.why
        if (
            r.status in RERUN_STATUSES
            and p.config.rerun_alone
            and (occ.overlapped or share.fraction is not None)
            and _memory_failure(r)
        ):
            why = (
                f"{r.status.value} while another candidate was on {g.name}"
                if occ.overlapped
                else f"{r.status.value} under a memory cap of {share.fraction:.2f} of the GPU"
            )
            first = {
                "why": why,
                "status": r.status.value,
                "message": r.message[:500],
                "seconds": round(r.seconds, 3),
                "stages_s": r.meta.get("stages_s"),
                "overlapped": occ.overlapped,
                "device_phases": r.meta.get("device_phases"),
            }
            p.guards, p.stages, p.meta = list(snapshot[0]), dict(snapshot[1]), dict(snapshot[2])
            p.stages["first_run"] = t_first
            _reset_device_dirs(p, keep_reference=p.ref_state is not None)
            occ2 = Occupant(name)
            t = time.monotonic()
            with g.exclusive(occ2, "rerun_alone", alone=True):
                p.stages["rerun_wait"] = time.monotonic() - t
                r = _device_half(p, gpu, slot, _Turn(g, occ2, held=True), None)
            r.meta["rerun_alone"] = first
        return r
    except Exception as e:  # noqa: BLE001 - the evaluator's own failure
        import traceback

        r = _result(p, Status.INFRA_ERROR, f"sandbox error: {type(e).__name__}: {e}")
        r.meta["traceback"] = traceback.format_exc()[-4000:]
        return r
    finally:
        if p.root is not None and not p.config.keep_dirs:
            shutil.rmtree(p.root, ignore_errors=True)


def _device_share(p: Prepared, mem_fraction: float | None, gpu: str | None) -> admission.Share:
    """How the task's working set (inputs, outputs, weights) uses its GPU next to the other
    workers' candidates (``admission.device_share``); unknown: the even share, as before (a
    memory failure is re-run alone). The working set goes into ``meta.working_set_mb``."""
    if p.backend != "cuda" or mem_fraction is None:
        return admission.Share(mem_fraction)
    w = _task_work(p.candidate)
    if w is None:
        return admission.Share(mem_fraction)
    total = admission.gpu_total(_gpu_index(p.backend, gpu))
    ws = w.input_bytes + w.output_bytes + w.param_bytes
    p.meta["working_set_mb"] = round(ws / 2**20, 1)  # beside meta.peak_memory_mb
    return admission.device_share(ws, mem_fraction, total)


@contextlib.contextmanager
def _large_share(p: Prepared, share: admission.Share, gpu: str | None) -> Iterator[None]:
    """Hold a large share in ``admission.LARGE_SHARES`` for the block (the wait is the stage
    ``share_wait``); nothing to hold for an even share."""
    if not share.large or share.fraction is None:
        yield
        return
    with admission.LARGE_SHARES.hold(f"gpu:{_gpu_index(p.backend, gpu)}", share.fraction) as w:
        p.stages["share_wait"] = w
        yield


def _memory_failure(r: EvalResult) -> bool:
    text = r.message + ("\n" + r.correctness.message if r.correctness else "")
    return bool(_MEMORY_FAILURE.search(text))


def _device_half(
    p: Prepared, gpu: str | None, slot: int, turn: _Turn, mem_fraction: float | None
) -> EvalResult:
    """One run of the device half; the result's meta says how it shared the device."""
    early: list[_TimeOp] = []  # a timing process started early, whatever the verdict became
    try:
        r = _run_on_device(p, gpu, slot, turn, mem_fraction, early)
    except Exception as e:  # noqa: BLE001 - the evaluator's own failure
        import traceback

        r = _result(p, Status.INFRA_ERROR, f"sandbox error: {type(e).__name__}: {e}")
        r.meta["traceback"] = traceback.format_exc()[-4000:]
    finally:
        cancelled = [op.cancel() for op in early]
    if any(cancelled):
        r.meta["time_cancelled_early"] = True  # started early, not needed: it exited unused
    r.meta["overlapped"] = turn.occ.overlapped
    r.meta["device_phases"] = list(turn.occ.phases)
    if turn.occ.waited_s:
        r.meta["gate_wait_s"] = {k: round(v, 3) for k, v in turn.occ.waited_s.items()}
    if mem_fraction is not None:
        r.meta["mem_fraction"] = round(mem_fraction, 4)
    return r


def _reset_device_dirs(p: Prepared, *, keep_reference: bool) -> None:
    """Empty what the candidate's processes wrote (and, unless ``keep_reference``, what the
    reference wrote), so a re-run starts as the first run did."""
    assert p.root is not None
    for name in ("io", "tmp", "signal"):
        shutil.rmtree(p.root / name, ignore_errors=True)
    if keep_reference:
        return
    shutil.rmtree(p.root / "shared", ignore_errors=True)
    private = p.root / "private"
    for f in private.iterdir() if private.exists() else []:
        if f.is_dir():
            shutil.rmtree(f, ignore_errors=True)
        else:
            f.unlink(missing_ok=True)


def _run_on_device(
    p: Prepared,
    gpu: str | None,
    slot: int,
    turn: _Turn,
    mem_fraction: float | None,
    early_time: list[_TimeOp],
) -> EvalResult:
    """One run of the device half, as its steps: reference -> admission -> verification and
    comparison -> verdict from the trials and guards -> baseline -> timing -> re-check ->
    result. A timing process started early is appended to ``early_time`` (the caller ends it
    when it was not needed)."""
    cfg = p.config
    d = _device_run(p, gpu, slot, turn, mem_fraction)
    early = _EarlyVerify(d.root / "shared") if p.ref_state is None and _early_verify(cfg) else None
    # 1. reference (or the first run's), the verification process started alongside if early
    rs = _reference(d, early)
    if isinstance(rs, EvalResult):
        return rs
    # 2. candidate verification, a confined process receiving only seeds, init inputs, weights,
    # its outputs compared by the judge as they appear
    room = _admit(d, rs, early)
    if isinstance(room, EvalResult):
        return room
    try:
        v = _verify_and_compare(d, rs, early)
    finally:
        room.__exit__(None, None, None)
    if (r := _comparison_failed(p, v, early)) is not None:
        return r
    # the baseline decides whether the candidate is graph-timed, so it is known before timing;
    # only a cached one is read this early (a failing candidate measures none)
    base = _known_baseline(p.candidate, cfg, p.backend, gpu)
    _start_timing_early(d, rs, v, base, early_time)
    chk = _correctness(p, rs, v)
    if (r := _verification_failed(p, v, chk.corr)) is not None:
        return r
    if (r := _trials_verdict(p, chk)) is not None:
        return r
    if not cfg.timing:
        return _result(p, Status.OK, "correct (timing skipped)", correctness=chk.corr)
    # 3. timing in a fresh process, then the re-check of a call made after the timed ones
    base = _baseline_for_timing(d, base)
    recheck = _Recheck(d, rs)
    tm = _time(d, rs, base, early_time, recheck)
    if (r := _timing_failed(p, tm, chk.corr)) is not None:
        return r
    verdict = _recheck_verdict(d, recheck, chk.corr)
    if isinstance(verdict, EvalResult):
        return verdict
    timing, speed_e, speed_c = _timing_detail(p, tm.rep, base, tm.eager)
    return _timed_result(d, verdict, chk.corr, timing, speed_e, speed_c)


@dataclass
class _DeviceRun:
    """What every step of one device run shares: the candidate's directories, environment and
    caches, and how each process that runs the candidate's code is confined."""

    p: Prepared
    gpu: str | None
    slot: int
    turn: _Turn
    mem_fraction: float | None
    device: str  # "cuda" or "cpu", as the runner's ops name it
    root: Path
    work: Path
    io: Path
    env: dict[str, str]
    kb_cache: Path
    writable: list[Path]  # all a candidate's process may write

    def cand_spec(
        self, trials: list, init_seed: int, init_path: Path, sd_path: Path
    ) -> dict[str, Any]:
        """The verification's spec (``candidate`` op): it receives only the trials' seeds, the
        init inputs and the reference's weights."""
        p, work = self.p, self.work
        return {
            "op": "candidate",
            "ref_path": str(work / "model.py"),
            "workdir": str(work),
            "module_dir": str(work / "build") if p.candidate.solution.format == "workdir" else None,
            "format": p.candidate.solution.format,
            "kb_cache": str(self.kb_cache),
            "device": self.device,
            "backend": p.backend,
            "model_mode": p.candidate.task.model_mode,
            "init_seed": init_seed,
            "init_path": str(init_path),
            "sd_path": str(sd_path),
            "trials": trials,
            "io_dir": str(self.io),
            "guard_policy": p.config.guard_policy,
            "own_kernels": p.meta.get("own_kernels") or [],
            "report": str(self.io / "candidate.report.json"),
            "mem_fraction": self.mem_fraction,
            "judge_failed_path": str(self.root / "shared" / "judge.failed"),
        }

    def ref_spec(self, rs: _RefState) -> dict[str, Any]:
        """:meth:`cand_spec` for the reference's products ``rs``."""
        return self.cand_spec(rs.trials, rs.init_seed, rs.init_path, rs.sd_path)

    def confined(self, timeout_s: float, hidden: list[Path]) -> dict[str, Any]:
        """:func:`_run_op`'s keywords for a process that runs the candidate's code."""
        cfg = self.p.config
        return dict(
            cwd=self.work,
            env=self.env,
            limits=_limits(cfg, timeout_s, self.p.backend),
            slot=self.slot,
            writable=self.writable,
            hidden=hidden,
            warm=cfg.warm_spares(),
            fork=cfg.fork_server,
        )

    def verify(
        self, spec: dict, hidden: list[Path], extend: Any = None
    ) -> tuple[Outcome, dict[str, Any]]:
        """Run the verification process ``spec`` to its end under the shared gate."""
        with self.turn.shared("verify"):
            return _run_op(
                spec,
                self.root,
                extend=extend,
                **self.confined(self.p.config.verify_timeout_s, hidden),
            )

    def judge(self, rs: _RefState, name: str, files: list[tuple[str, int]]) -> _Judge:
        """A judge of the candidate's output ``files`` (file, trial), in the reference's private
        directory."""
        private = str(self.root / "private")
        env = dict(self.env, HOME=private, TMPDIR=private)
        return _Judge(self.p, name, files, rs, env, self.slot, self.device, self.mem_fraction)

    def time_op(self, rs: _RefState, base: Any) -> _TimeOp:
        """The timing process, its protocol decided with the baseline ``base`` (None: unknown)."""
        cfg = self.p.config
        tspec = dict(
            self.ref_spec(rs),
            op="time",
            report=str(self.io / "time.report.json"),
            timing_config=_timing_config(cfg, self.p.backend, base),
            timing_sets=cfg.timing_sets,
            timing_cpus=list(kept_cpus()),
        )
        return _TimeOp(tspec, self.root, self.io, **self.confined(cfg.time_timeout_s, rs.hidden))

    def eager_time_op(self, rs: _RefState, base: Any) -> _TimeOp:
        """The paired eager timer (``SandboxConfig.paired_eager``): the reference's program timed
        with the candidate's protocol (without the kernel-trace cross-check, which is the
        candidate's) on the same input sets, by a trusted process in the reference's private
        directory, as the judge runs."""
        p, cfg = self.p, self.p.config
        private = self.root / "private"
        spec = {
            "op": "time_eager",
            "ref_path": str(self.work / "model.py"),
            "device": self.device,
            "model_mode": p.candidate.task.model_mode,
            "init_seed": rs.init_seed,
            "init_path": str(rs.init_path),
            "sd_path": str(rs.sd_path),
            "trials": rs.trials,
            "timing_sets": cfg.timing_sets,
            "timing_config": dict(_timing_config(cfg, p.backend, base), trace_check=False),
            "timing_cpus": list(kept_cpus()),
            "report": str(private / "time_eager.report.json"),
            "mem_fraction": self.mem_fraction,
        }
        return _TimeOp(
            spec,
            self.root,
            private,
            name="eager",
            spec_dir=private,
            cwd=self.work,
            env=dict(self.env, HOME=str(private), TMPDIR=str(private)),
            limits=_limits(cfg, cfg.time_timeout_s, p.backend, drop_user=False),
            slot=self.slot,
            writable=[private],
            warm=cfg.warm_spares(),
            fork=cfg.fork_server,
        )


def _device_run(
    p: Prepared, gpu: str | None, slot: int, turn: _Turn, mem_fraction: float | None
) -> _DeviceRun:
    """The run's surroundings: ``io`` and ``tmp`` made writable by the slot's uid, the
    solution's extension caches, the candidate's environment."""
    assert p.root is not None and p.work is not None
    cache = cache_root(p.config)
    io, tmp = p.root / "io", p.root / "tmp"
    lim_c = _limits(p.config, 1, p.backend)
    prepare_writable(io, slot, lim_c)
    prepare_writable(tmp, slot, lim_c)
    kb_cache, triton = _extension_caches(cache, p.candidate.solution.id)
    return _DeviceRun(
        p=p,
        gpu=gpu,
        slot=slot,
        turn=turn,
        mem_fraction=mem_fraction,
        device="cuda" if p.backend == "cuda" else "cpu",
        root=p.root,
        work=p.work,
        io=io,
        env=_candidate_env(tmp, gpu, p.backend, triton),
        kb_cache=kb_cache,
        writable=[io, tmp, kb_cache, triton],
    )


def _reference(d: _DeviceRun, early: _EarlyVerify | None) -> _RefState | EvalResult:
    """The reference's products: computed now (:func:`_compute_reference`) or, on a re-run
    alone, the first run's (``meta["reference_reused"]``); or the result when it failed.
    Sets ``meta`` ``device`` and ``isolation``."""
    p = d.p
    rs = p.ref_state
    if rs is None:
        got = _compute_reference(d, early)
        if isinstance(got, EvalResult):
            return got
        rs = p.ref_state = got
    else:
        p.meta["reference_reused"] = True  # a re-run alone: same secret trials, same outputs
    p.meta["device"] = rs.device_name
    p.meta["isolation"] = rs.isolation
    return rs


def _compute_reference(d: _DeviceRun, early: _EarlyVerify | None) -> _RefState | EvalResult:
    """:func:`_reference_phase`; with ``early``, the verification process starts inside the
    reference's hold, waiting for its start signal, and is cancelled if the reference fails
    or raises."""
    cfg = d.p.config
    on_start = None
    if early is not None:

        def on_start(trials: list, init_seed: int, init_path: Path, sd_path: Path) -> None:
            # the reference's outputs are covered by a mount in this process's view (the
            # condition of an early start), so it may start before they exist
            spec = _early_start_spec(
                d.cand_spec(trials, init_seed, init_path, sd_path),
                early.start,
                early.abort,
                cfg.reference_timeout_s + 30.0,
            )
            # its time limit counts from the start signal (the wait is the reference's)
            early.run(d.verify, spec, [d.root / "private"], early.waited)

    n_trials = max(5, cfg.trials)
    try:
        got = _reference_phase(
            d.p, d.env, d.slot, d.turn, d.mem_fraction, d.device, n_trials, on_start=on_start
        )
    except BaseException:
        if early is not None:
            early.cancel()
        raise
    if isinstance(got, EvalResult) and early is not None:
        early.cancel()
    return got


def _reference_phase(
    p: Prepared,
    env: dict[str, str],
    slot: int,
    turn: _Turn,
    mem_fraction: float | None,
    device: str,
    n_trials: int,
    on_start: Any = None,
) -> _RefState | EvalResult:
    """Draw the secret trials and have the reference compute its outputs (shared gate).
    ``on_start(trials, init_seed, init_path, sd_path)`` is called inside the reference's hold,
    just before its process starts (the early verification start)."""
    cfg = p.config
    assert p.root is not None and p.work is not None
    root, work = p.root, p.work
    private = root / "private"
    secret = secrets.randbits(62)
    from .runner import variant_schedule

    # the numerics stress trials (off by default) after the plain ones: timing and the
    # re-check draw from the first trials only
    trials = [
        {"seed": (secret + 7919 * (i + 1)) % (1 << 62), "variant": v}
        for i, v in enumerate(variant_schedule(n_trials) + list(cfg.stress_trials))
    ]
    init_seed = (secret ^ 0x5DEECE66D) % (1 << 62)
    shared = root / "shared"
    shared.mkdir(mode=0o755, exist_ok=True)
    init_path, sd_path = shared / "init_inputs.pt", shared / "state_dict.pt"
    # 1. reference, in its own process (trusted code, same user, no network)
    ref_env = dict(env, HOME=str(private), TMPDIR=str(private))
    spec = {
        "op": "reference",
        "ref_path": str(work / "model.py"),
        "device": device,
        "model_mode": p.candidate.task.model_mode,
        "init_seed": init_seed,
        "trials": trials,
        "init_path": str(init_path),
        "sd_path": str(sd_path),
        "report": str(private / "reference.report.json"),
        "mem_fraction": mem_fraction,
    }
    with turn.shared("reference"):
        if on_start is not None:
            on_start(trials, init_seed, init_path, sd_path)
        t = time.monotonic()
        out, rep = _run_op(
            spec,
            private,
            cwd=work,
            env=ref_env,
            limits=_limits(cfg, cfg.reference_timeout_s, p.backend, drop_user=False),
            slot=slot,
            writable=[private, shared],
            warm=cfg.warm_spares(),
            fork=cfg.fork_server,
        )
    p.stages["reference"] = time.monotonic() - t
    _record_phases(p, "reference", rep)
    p.meta["isolation"] = out.isolation
    if not rep.get("ok"):
        return _result(p, Status.INFRA_ERROR, "reference failed: " + _error_text(out, rep))
    p.meta["device"] = rep.get("device_name", device)
    for f in (init_path, sd_path):
        os.chmod(f, 0o644)
    # no reference output is kept (the judge recomputes them); the reference's and the judge's
    # files are covered by an empty mount in the candidate's view where namespaces allow
    hidden = [private] if caps().network_ns else []
    return _RefState(
        trials=trials,
        init_seed=init_seed,
        init_path=init_path,
        sd_path=sd_path,
        hidden=hidden,
        input_bytes=int(rep.get("input_bytes") or 0),
        output_bytes=int(rep.get("output_bytes") or 0),
        param_bytes=int(rep.get("param_bytes") or 0),
        device_name=rep.get("device_name", device),
        isolation=out.isolation,
    )


def _admit(d: _DeviceRun, rs: _RefState, early: _EarlyVerify | None) -> Any:
    """The verification's reservation (``admission``: device memory, host memory, disk),
    entered (stage ``admission_wait``); the caller exits it. When there is no room: the
    ``infra_error`` result, ``early`` cancelled."""
    p = d.p
    need = admission.verification_need(rs.input_bytes, rs.output_bytes, rs.param_bytes, p.backend)
    try:
        room = admission.reserve(
            need,
            gpu=_gpu_index(p.backend, d.gpu),
            disk_at=d.io,
            timeout_s=p.config.admission_timeout_s,
        )
        waited = room.__enter__()
    except admission.NoRoom as e:
        if early is not None:
            early.cancel()
        return _result(p, Status.INFRA_ERROR, f"sandbox out of resources (verification): {e}")
    p.stages["admission_wait"] = waited
    return room


class _Verified(NamedTuple):
    """The verification process's and the judge's outcomes and reports."""

    out: Outcome
    rep: dict[str, Any]
    jout: Outcome
    jrep: dict[str, Any]
    t_wall: float  # wall-clock time the ``verify`` stage started


def _verify_and_compare(d: _DeviceRun, rs: _RefState, early: _EarlyVerify | None) -> _Verified:
    """The candidate's verification process (``early``'s, let go, when one waits) and the judge
    comparing its outputs as they appear; stages ``verify`` (the candidate's process) and
    ``compare`` (the judge's work after it ended)."""
    p = d.p
    t, t_wall = time.monotonic(), time.time()
    verdicts = d.judge(rs, "judge", [(f"out_{i}.pt", i) for i in range(len(rs.trials))])
    verdicts.start()
    try:
        if early is not None:  # started by the reference phase, waiting, warm
            out, rep = early.go()  # the stage counts from here
            p.meta["verify_started_early"] = True
        else:
            out, rep = d.verify(d.ref_spec(rs), rs.hidden)
    finally:
        verdicts.candidate_done()
    p.stages["verify"] = time.monotonic() - t
    t_compare = time.monotonic()
    jout, jrep = verdicts.join()
    # the judge's work after the candidate's process ended (the rest overlapped it)
    p.stages["compare"] = time.monotonic() - t_compare
    return _Verified(out, rep, jout, jrep, t_wall)


def _comparison_failed(p: Prepared, v: _Verified, early: _EarlyVerify | None) -> EvalResult | None:
    """Records where the verification's and the judge's time went; the ``infra_error`` result
    when the judge failed, else None."""
    _record_phases(p, "verify", v.rep, stage_t0=v.t_wall if early is not None else None)
    _record_phases(p, "judge", v.jrep, life_s=p.stages["verify"] + p.stages["compare"])
    p.meta["isolation"] = v.out.isolation
    if not v.jrep.get("ok"):
        return _result(p, Status.INFRA_ERROR, "comparison failed: " + _error_text(v.jout, v.jrep))
    return None


def _start_timing_early(
    d: _DeviceRun, rs: _RefState, v: _Verified, base: Any, early_time: list[_TimeOp]
) -> None:
    """Start the timing process now, appended to ``early_time``, when it is asked for early, the
    verification process ended well and the baseline that decides its protocol is known (or
    none is wanted)."""
    cfg = d.p.config
    if (
        cfg.timing
        and cfg.early_time
        and v.out.returncode == 0
        and v.rep.get("ok")
        and (base is not None or not _wants_baseline(cfg))
    ):
        # the timing process imports torch while the outputs are compared (3 s on the H200)
        early_time.append(d.time_op(rs, base))
        early_time[0].start_early(start_timeout_s=cfg.verify_timeout_s + 600.0)


class _Checked(NamedTuple):
    """The verification's correctness detail, its trials, and the stress trials' meta."""

    corr: CorrectnessDetail
    details: list[TrialDetail]
    stress: dict[str, Any] | None


def _correctness(p: Prepared, rs: _RefState, v: _Verified) -> _Checked:
    """The judge's per-trial verdicts as the correctness detail (passed only when every trial
    passed and the candidate's process ended well); adds the judge's and the process's guard
    findings to ``p.guards``, and ``meta`` ``stress_trials`` and ``state_dict``."""
    cfg, trials, rep, jrep = p.config, rs.trials, v.rep, v.jrep
    details = [
        TrialDetail(
            variant=tr["variant"],
            passed=bool(tv.get("passed")),
            max_abs_err=tv.get("max_abs_err"),
            max_rel_err=tv.get("max_rel_err"),
            rel_norm_err=tv.get("rel_norm_err"),
            message=str(tv.get("message") or "")[:500],
        )
        for tr, tv in zip(trials, jrep.get("trials") or [], strict=False)
    ]
    p.guards.extend(_parse_guards(jrep.get("guards")))
    stress = _stress_meta(trials, jrep.get("trials") or [])
    if stress is not None:
        p.meta["stress_trials"] = stress
    passed = (
        len(details) == len(trials)
        and all(t.passed for t in details)
        and rep.get("ok") is True
        and v.out.returncode == 0
    )
    corr = CorrectnessDetail(
        passed=passed, atol=cfg.atol, rtol=cfg.rtol, trials=details, seconds=p.stages["verify"]
    )
    if rep.get("state_dict"):
        p.meta["state_dict"] = rep["state_dict"]
    p.guards.extend(_parse_guards(rep.get("guards")))
    return _Checked(corr, details, stress)


def _stress_meta(trials: list[dict[str, Any]], verdicts: list[dict[str, Any]]) -> dict | None:
    """``meta.stress_trials``: the stress variants run, the ones the candidate failed and the
    ones skipped because the reference itself is unstable under them; None without any."""
    from .runner import is_stress

    idx = [i for i, t in enumerate(trials) if is_stress(t)]
    if not idx:
        return None
    meta: dict[str, Any] = {
        "variants": [trials[i]["variant"] for i in idx],
        "failed": [],
        "reference_unstable": [],
    }
    for i in idx:
        v = verdicts[i] if i < len(verdicts) else {"passed": False, "message": "no verdict"}
        row = {"trial": i, "variant": trials[i]["variant"]}
        if v.get("skipped"):
            meta["reference_unstable"].append({**row, "reason": v.get("reference_unstable")})
        elif not v.get("passed"):
            meta["failed"].append({**row, "message": str(v.get("message") or "")[:500]})
    return meta


def _verification_failed(p: Prepared, v: _Verified, corr: CorrectnessDetail) -> EvalResult | None:
    """The result when the verification process timed out (``timeout``) or failed
    (``infra_error`` when the failure is the sandbox's, else ``runtime_error``); None when it
    ended well."""
    out, rep, cfg = v.out, v.rep, p.config
    if out.timed_out:
        corr.message = f"verification exceeded {cfg.verify_timeout_s:.0f}s"
        return _result(
            p,
            Status.TIMEOUT,
            corr.message + f" (at {rep.get('stage', 'start')})" if rep else corr.message,
            correctness=corr,
        )
    if out.returncode == 0 and rep.get("ok"):
        return None
    corr.message = _error_text(out, rep)
    if failed_in_setup(rep):
        return _setup_failure(p, "verification", corr.message, corr)
    if ran_out_in_probe(rep, corr.message):
        return _result(
            p,
            Status.INFRA_ERROR,
            "out of device memory in the guards' probe (the evaluator's re-runs after every "
            "trial passed through the candidate): " + corr.message.splitlines()[0][:400],
            correctness=corr,
        )
    return _result(
        p,
        Status.RUNTIME_ERROR,
        f"candidate failed ({out.describe()}): " + corr.message.splitlines()[0][:500]
        if corr.message
        else out.describe(),
        correctness=corr,
    )


def _trials_verdict(p: Prepared, chk: _Checked) -> EvalResult | None:
    """``guard_violation`` when a finding rejects, ``incorrect`` when a trial failed (named by
    the first failing trial; a stress trial's failure said so); None when all is correct."""
    corr, details, stress = chk
    rejects = [g for g in p.guards if g.severity == "reject"]
    if rejects:
        return _result(
            p,
            Status.GUARD_VIOLATION,
            "; ".join(f"{g.code}: {g.message}" for g in rejects)[:2000],
            correctness=corr,
        )
    if corr.passed:
        return None
    first = next((t for t in details if not t.passed), None)
    corr.message = first.message if first else "incorrect"
    at = details.index(first) if first else -1
    if first is not None and stress is not None and first.variant in stress["variants"]:
        # a plain trial's failure is reported first: this one failed only under stress
        corr.message = f"stress trial {first.variant} (trial {at}): {corr.message}"
        return _result(p, Status.INCORRECT, corr.message, correctness=corr)
    return _result(
        p,
        Status.INCORRECT,
        f"trial {at if first else '?'} ({first.variant if first else ''}): {corr.message}",
        correctness=corr,
    )


def _baseline_for_timing(d: _DeviceRun, base: Any) -> Any:
    """``base``, or, when baselines are wanted and none is known yet, the task's baseline
    measured (or read) now (stage ``baseline``)."""
    p = d.p
    if base is None and _wants_baseline(p.config):
        t = time.monotonic()
        base = _baseline(p.candidate, p.config, p.backend, d.gpu, d.turn)
        p.stages["baseline"] = time.monotonic() - t
    return base


class _Recheck:
    """The re-check: the judge on the output of a call the timing process made after its timed
    calls. Called once, inside the timed hold or after it; :attr:`result` is the judge's
    (outcome, report) once it ran, :attr:`seconds` its time."""

    def __init__(self, d: _DeviceRun, rs: _RefState):
        self.d, self.rs = d, rs
        self.result: tuple[Outcome, dict[str, Any]] | None = None
        self.seconds = 0.0

    def __call__(self) -> None:
        t = time.monotonic()
        j = self.d.judge(self.rs, "recheck", [("timed_out.pt", 0)])
        j.candidate_done()  # the timing process has ended: its file is there or never
        self.result = j.run()
        self.seconds = time.monotonic() - t


class _Timed(NamedTuple):
    """The timing process's outcome and report, the seconds it waited for the gate, and the
    paired eager timer's report when it timed (None otherwise)."""

    out: Outcome
    rep: dict[str, Any]
    waited: float
    eager: dict[str, Any] | None = None


def _pairs_eager(p: Prepared) -> bool:
    """Whether the eager program is timed again beside this candidate (``paired_eager``; unset:
    on the cuda backend only)."""
    on = p.config.paired_eager if p.config.paired_eager is not None else p.backend == "cuda"
    return on and p.config.baselines


def _time(
    d: _DeviceRun, rs: _RefState, base: Any, early_time: list[_TimeOp], recheck: _Recheck
) -> _Timed:
    """Run the timing process (the one started early, if any) to its end, ``recheck`` inside
    its exclusive hold when it ended well, the paired eager timer (if asked) in the same hold
    right after it; stages ``time`` (from the start signal when early; neither the gate waits
    nor the re-check nor the eager timing) and ``time_wait``, and the timing's ``meta``."""
    p = d.p
    t, t_wall = time.monotonic(), time.time()
    timer = early_time[0] if early_time else d.time_op(rs, base)
    eager = d.eager_time_op(rs, base) if _pairs_eager(p) else None
    out, rep, waited = timer.run(d.turn, then=recheck, partner=eager)
    eager_res = eager.result() if eager is not None else None
    eager_s = float(eager_res[1].get("timing_s") or 0.0) if eager_res else 0.0
    p.stages["time"] = time.monotonic() - t - waited - recheck.seconds - eager_s
    p.stages["time_wait"] = waited
    if eager is not None:
        p.stages["time_eager"] = eager_s
        p.meta["eager_paired"] = (
            "paired" if eager_res else f"the eager timer did not time: {_eager_failure(eager)}"
        )
    _record_phases(p, "time", rep, stage_t0=t_wall if early_time else None, gate_wait=waited)
    if kept_cpus():  # where the timing ran (profiler.cpus): the kept cores, the rest elsewhere
        p.meta["cpus"] = {
            "kept": list(kept_cpus()),
            "timed": rep.get("timed_cpus"),
            "time_process": rep.get("cpus"),
        }
    if early_time:
        p.meta["time_started_early"] = round(timer.pre_start_s, 3)  # seconds it waited warm
    if isinstance(rep.get("timed_wall"), list):
        p.meta["timed_wall"] = [round(float(x), 6) for x in rep["timed_wall"][:2]]
    return _Timed(out, rep, waited, eager_res[1] if eager_res else None)


def _eager_failure(eager: _TimeOp) -> str:
    """What the paired eager timer's process said when it did not time (for ``meta``)."""
    if "exc" in eager.box:
        return str(eager.box["exc"])[:300]
    if not eager.ran:
        return "the candidate's timing did not end well"
    res = eager.box.get("res")
    return _error_text(res[0], res[1])[:300] if res else "no result"


def _timing_failed(p: Prepared, tm: _Timed, corr: CorrectnessDetail) -> EvalResult | None:
    """The result when the timing process timed out, waited too long for the device (the
    parent's own measure) or failed; None when it ended well."""
    out, rep = tm.out, tm.rep
    if out.timed_out:
        return _result(
            p, Status.TIMEOUT, f"timing exceeded {p.config.time_timeout_s:.0f}s", correctness=corr
        )
    if tm.waited >= GO_TIMEOUT_S - 1.0:  # the parent's own measure: a candidate cannot claim it
        return _result(
            p,
            Status.INFRA_ERROR,
            "the timing process waited too long for the device: " + _error_text(out, rep)[:500],
            correctness=corr,
        )
    if out.returncode == 0 and rep.get("ok"):
        return None
    if failed_in_setup(rep):
        return _setup_failure(p, "timing", _error_text(out, rep), corr)
    return _result(
        p,
        Status.RUNTIME_ERROR,
        "candidate failed while timed: " + _error_text(out, rep).splitlines()[0][:500],
        correctness=corr,
    )


def _recheck_verdict(
    d: _DeviceRun, recheck: _Recheck, corr: CorrectnessDetail
) -> dict[str, Any] | EvalResult:
    """The re-check's verdict on the timed output (run now, shared, unless the timed hold ran
    it; stage ``recheck``), or the result when it failed (``infra_error``) or found the output
    wrong (``incorrect``)."""
    p = d.p
    if recheck.result is None:
        with d.turn.shared("recheck"):
            recheck()
    assert recheck.result is not None
    jout, jrep = recheck.result
    p.stages["recheck"] = recheck.seconds
    if not jrep.get("ok"):
        return _result(p, Status.INFRA_ERROR, "re-check failed: " + _error_text(jout, jrep))
    v = (jrep.get("trials") or [{"passed": False, "message": "no verdict"}])[0]
    if not v.get("passed"):
        corr.passed = False
        corr.message = "output after the timed calls is wrong: " + str(v.get("message"))[:500]
        return _result(p, Status.INCORRECT, corr.message, correctness=corr)
    return v


def _stats(rep: dict[str, Any]) -> TimingStats:
    """The ``TimingStats`` of a timing process's report."""
    return TimingStats(
        **{k: val for k, val in rep["stats"].items() if k in TimingStats.__struct_fields__}
    )


def _timing_detail(
    p: Prepared, rep: dict[str, Any], base: Any, eager_rep: dict[str, Any] | None = None
) -> tuple[TimingDetail, float | None, float | None]:
    """The timing detail of the timing process's report and, with baselines, the speed-ups
    over eager and compiled (None where unknown), compared as the candidate was timed. With
    the paired eager timer's report, eager is its time when it was timed the way the candidate
    was (CUDA graph replays or not), else the cached baseline's."""
    cand_stats = _stats(rep)
    timing = TimingDetail(
        protocol_version=_protocol(),
        candidate=cand_stats,
        flags=list(rep["stats"].get("flags", []) or []),
        seconds=p.stages["time"],
    )
    speed_e = speed_c = None
    if p.config.baselines:
        b = base
        if b is not None:
            timing.eager, timing.compile = _comparable_baseline(b, cand_stats)
            if b.error:
                timing.flags.append(f"baseline: {b.error[:200]}")
        paired = _paired_eager_stats(p, eager_rep, cand_stats, timing.eager)
        if paired is not None:
            timing.eager = paired
        if timing.eager and cand_stats.median_ms > 0:
            speed_e = timing.eager.median_ms / cand_stats.median_ms
            timing.speedup_vs_eager_ci = _ratio_ci(timing.eager, cand_stats)
        if b is not None and timing.compile and cand_stats.median_ms > 0:
            speed_c = timing.compile.median_ms / cand_stats.median_ms
            timing.speedup_vs_compile_ci = _ratio_ci(timing.compile, cand_stats)
            p.meta["baseline_compile_mode"] = b.compile_mode  # what speed_c compares with
    return timing, speed_e, speed_c


def _paired_eager_stats(
    p: Prepared, eager_rep: dict[str, Any] | None, cand: TimingStats, cached: Any
) -> TimingStats | None:
    """The paired eager timer's stats when they compare with the candidate's (both CUDA graph
    replays, or neither); ``meta.eager_paired`` says why not otherwise, ``meta.eager_cached_ms``
    keeps the cached baseline's figure beside the paired one."""
    if eager_rep is None:
        return None
    from cuda_agent.profiler.timing import F_GRAPH

    stats = _stats(eager_rep)
    if (F_GRAPH in stats.flags) != (F_GRAPH in cand.flags):
        p.meta["eager_paired"] = "not comparable: one side was timed by CUDA graph replays"
        return None
    if cached is not None:
        p.meta["eager_cached_ms"] = round(cached.median_ms, 6)
    return stats


def _timed_result(
    d: _DeviceRun,
    v: dict[str, Any],
    corr: CorrectnessDetail,
    timing: TimingDetail,
    speed_e: float | None,
    speed_c: float | None,
) -> EvalResult:
    """``ok`` ("correct and timed"), or ``guard_violation`` when the timing guards (speed of
    light, roofline) reject the timing; ``v`` is the re-check's verdict."""
    from cuda_agent.guards.api import timing_checks

    p, cfg, c = d.p, d.p.config, d.p.candidate
    # the judge measured the output's real storage on the file it compared (a value the
    # candidate's process reports itself would let it lower its own floor)
    stored = v.get("storage_bytes")
    bound, roofline = (
        _speed_of_light_ms(c, p.backend, d.gpu, d.turn, stored if isinstance(stored, int) else None)
        if cfg.guard_policy != "off"
        else (None, None)
    )
    if bound is not None:
        p.meta["speed_of_light_ms"] = round(bound, 6)  # the output floor
    if roofline is not None:
        p.meta["roofline_ms"] = round(roofline, 6)
    tg = (
        list(timing_checks(timing, bound, estimate_ms=roofline))
        if cfg.guard_policy != "off"
        else []
    )
    p.guards.extend(tg)
    if any(g.severity == "reject" for g in tg):
        return _result(
            p,
            Status.GUARD_VIOLATION,
            "; ".join(f"{g.code}: {g.message}" for g in tg if g.severity == "reject"),
            correctness=corr,
            timing=timing,
            speedup_vs_eager=speed_e,
            speedup_vs_compile=speed_c,
        )
    return _result(
        p,
        Status.OK,
        "correct and timed",
        correctness=corr,
        timing=timing,
        speedup_vs_eager=speed_e,
        speedup_vs_compile=speed_c,
    )


def _shape_check(
    p: Prepared,
    r: EvalResult,
    *,
    gpu: str | None,
    slot: int,
    gate: DeviceGate | None,
    mem_fraction: float | None,
) -> EvalResult:
    """Verify the candidate of ``r`` (``ok``) again at each of ``config.shape_factors``: the task
    resized as ``guards resize-task`` does (every size smaller), the same solution, prepared
    again (its build is found in the content-keyed cache) and run on the device without timing
    or stress trials. A failure there (``incorrect``, ``runtime_error``, ``timeout``,
    ``compile_error``) makes ``r`` ``incorrect`` with the ``G-SHAPE-GENERALISATION`` flag (a guard
    reject there: ``guard_violation``); a task without a resizable size, or whose reference fails
    at the new sizes, is skipped; another ``infra_error`` there is the result's.
    ``meta["shape_check"]`` says what ran. Never raises."""
    import msgspec

    from cuda_agent.guards.checks import Findings
    from cuda_agent.guards.shapes import resize_plan, resized_candidate

    cfg, c = p.config, p.candidate
    t0 = time.monotonic()
    sub = cfg.with_(shape_check=False, timing=False, baselines=False, stress_trials=())
    instances: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"instances": instances}

    def done(res: EvalResult, **kw: Any) -> EvalResult:
        meta["seconds"] = round(time.monotonic() - t0, 3)
        m = dict(res.meta)
        m["shape_check"] = meta
        m["stages_s"] = dict(m.get("stages_s") or {}, shape_check=meta["seconds"])
        return msgspec.structs.replace(res, meta=m, seconds=res.seconds + meta["seconds"], **kw)

    try:
        for f in cfg.shape_factors:
            plan = resize_plan(c.task.ref_code, f)
            if not plan:
                meta["skipped"] = (
                    "no module-level size constant (>= 8) that get_inputs uses and the model's "
                    "constructor does not: the task cannot be resized"
                )
                return done(r)
            sizes = _sizes_text(plan)
            if any(b >= a for a, b in plan.values()):  # never larger than the task's own
                meta["skipped"] = f"factor {f:g} would not shrink every size ({sizes})"
                return done(r)
            rc = resized_candidate(c, f)
            if rc is None:
                meta["skipped"] = "the task cannot be resized"
                return done(r)
            p2 = prepare(rc, sub, backend=p.backend, slot=slot)
            r2 = _device_halves(p2, gpu=gpu, slot=slot, gate=gate, mem_fraction=mem_fraction)
            inst: dict[str, Any] = {
                "factor": f,
                "task_id": rc.task.id,
                "sizes": {k: [a, b] for k, (a, b) in plan.items()},
                "status": r2.status.value,
                "build_cached": bool(r2.compile is not None and r2.compile.cached),
                "seconds": round(r2.seconds, 3),
            }
            instances.append(inst)
            if r2.status is Status.OK:
                continue
            inst["message"] = r2.message[:500]
            if r2.status is Status.INFRA_ERROR and r2.message.startswith("reference failed"):
                meta["skipped"] = f"the reference fails at resized sizes ({sizes})"
                return done(r)
            what = f"shape check: {r2.status.value} at resized sizes ({sizes}): {r2.message}"
            if r2.status is Status.INFRA_ERROR:  # no verdict: the sandbox failed there
                meta["error"] = what[:2000]
                return done(r, status=Status.INFRA_ERROR, message=what[:2000])
            meta["passed"] = False
            if r2.status is Status.GUARD_VIOLATION:
                rejects = [
                    msgspec.structs.replace(g, message=f"at resized sizes ({sizes}): {g.message}")
                    for g in r2.guards
                    if g.severity == "reject"
                ]
                return done(
                    r, status=Status.GUARD_VIOLATION, message=what[:2000], guards=r.guards + rejects
                )
            fs = Findings(cfg.guard_policy)
            fs.add(
                "G-SHAPE-GENERALISATION",
                f"{r2.status.value} at resized sizes ({sizes}), factor {f:g}",
                r2.message,
            )
            corr = r.correctness
            if corr is not None:
                corr = msgspec.structs.replace(corr, passed=False, message=what[:500])
            return done(
                r,
                status=Status.INCORRECT,
                message=what[:2000],
                guards=r.guards + fs.items,
                correctness=corr,
            )
        meta["passed"] = True
        return done(r)
    except Exception as e:  # noqa: BLE001 - the evaluator's own failure
        import traceback

        meta["error"] = traceback.format_exc()[-4000:]
        return done(
            r,
            status=Status.INFRA_ERROR,
            message=f"sandbox error in the shape check: {type(e).__name__}: {e}",
        )


def _sizes_text(plan: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{k} {a}->{b}" for k, (a, b) in plan.items())


class _Judge:
    """The trusted comparison (runner op ``judge``) in a thread: it recomputes each trial's
    reference output on the device and compares the candidate's output file as it appears.
    :meth:`candidate_done` tells it the candidate's process has ended (a file missing then is
    missing for good); if the judge fails, ``shared/judge.failed`` tells a waiting candidate."""

    def __init__(
        self,
        p: Prepared,
        name: str,
        files: list[tuple[str, int]],
        rs: _RefState,
        env: dict[str, str],
        slot: int,
        device: str,
        mem_fraction: float | None,
    ):
        assert p.root is not None and p.work is not None
        cfg = p.config
        private, shared = p.root / "private", p.root / "shared"
        self.done = shared / f"{name}.done"
        self.failed = shared / "judge.failed"
        for f in (self.done, self.failed):
            f.unlink(missing_ok=True)
        self.spec = {
            "op": "judge",
            "ref_path": str(p.work / "model.py"),
            "device": device,
            "model_mode": p.candidate.task.model_mode,
            "init_seed": rs.init_seed,
            "init_path": str(rs.init_path),
            "sd_path": str(rs.sd_path),
            "trials": rs.trials,
            "io_dir": str(p.root / "io"),
            "outputs": [{"file": f, "trial": i} for f, i in files],
            "done_path": str(self.done),
            "tol": {"atol": cfg.atol, "rtol": cfg.rtol, "norm_tol": cfg.norm_tol},
            "guard_policy": cfg.guard_policy,
            "report": str(private / f"{name}.report.json"),
            "mem_fraction": mem_fraction,
            "wait_s": cfg.verify_timeout_s + 60.0,
        }
        self.kw = dict(
            cwd=p.work,
            env=env,
            limits=_limits(
                cfg, cfg.verify_timeout_s + cfg.reference_timeout_s, p.backend, drop_user=False
            ),
            slot=slot,
            writable=[private, p.root / "io"],
            warm=cfg.warm_spares(),
            fork=cfg.fork_server,
        )
        self.private = private
        self.bg: _Background | None = None

    def run(self) -> tuple[Outcome, dict[str, Any]]:
        """Run the judge to its end here; its outcome and report (``ok`` False on failure)."""
        out, rep = _run_op(self.spec, self.private, **self.kw)
        if out.returncode != 0 or not rep.get("ok"):
            rep["ok"] = False
            self._failed()
        return out, rep

    def _failed(self) -> None:
        with contextlib.suppress(OSError):
            self.failed.touch(mode=0o644)

    def start(self) -> None:
        self.bg = _Background("judge", self.run, on_error=self._failed)

    def candidate_done(self) -> None:
        self.done.touch(mode=0o644)

    def join(self) -> tuple[Outcome, dict[str, Any]]:
        assert self.bg is not None
        return self.bg.join()


def cache_root(config: SandboxConfig) -> Path:
    """The cache directory; when candidates run under another uid it is reachable by it (the
    default moves to the system temporary directory; a ``cache_dir`` that is not raises
    ``ValueError`` saying which parent blocks it)."""
    drop = config.drop_user and caps().drop_user
    if config.cache_dir:
        d = Path(config.cache_dir)
        if drop and (blocker := unreachable_parent(d)) is not None:
            raise ValueError(
                f"cache directory {d} is not reachable by the unprivileged user candidates run "
                f"as: {blocker} has mode {blocker.stat().st_mode & 0o777:o} (needs o+x); "
                f"use a directory whose parents are all world-executable, or chmod o+x {blocker}"
            )
        return d
    d = default_cache_dir()
    if drop and unreachable_parent(d) is not None:
        d = Path(tempfile.gettempdir()) / "cuda-agent-sandbox-cache"
    return d


def unreachable_parent(p: Path) -> Path | None:
    """The first existing directory on ``p``'s path (``p`` included) that other users cannot
    traverse (no o+x), or None when a process of another uid can reach ``p``."""
    p = p.resolve()
    for parent in [p, *p.parents]:
        if parent.exists() and not (parent.stat().st_mode & 0o001):
            return parent
    return None


def _shared_dir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(p, 0o1777)
    return p


def _extension_caches(cache: Path, solution_id: str) -> tuple[Path, Path]:
    """The KernelBench extension and Triton caches a candidate's processes may write: one pair
    per solution (content id). Those builds run inside the candidate's own process, so what is
    there is the candidate's word; a namespace per solution keeps one candidate from leaving a
    module under another's key, while every phase of a solution, and every re-evaluation of the
    same solution, still builds once."""
    return (
        _shared_dir(cache / "kb_ext" / solution_id),
        _shared_dir(cache / "triton" / solution_id),
    )


def _result(p: Prepared, status: Status, message: str = "", **kw: Any) -> EvalResult:
    c = p.candidate
    meta = dict(p.meta)
    meta["stages_s"] = {k: round(v, 3) for k, v in p.stages.items()}
    # the settings that decide a verdict, on every result (reports print them)
    meta.setdefault("guard_policy", p.config.guard_policy)
    meta.setdefault("atol", p.config.atol)
    meta.setdefault("rtol", p.config.rtol)
    return EvalResult(
        task_id=c.task.id,
        solution_id=c.solution.id,
        backend=p.backend,  # type: ignore[arg-type]
        device=kw.pop("device", meta.get("device", "")) or p.backend,
        status=status,
        message=message,
        compile=p.compile,
        guards=list(p.guards),
        seconds=time.monotonic() - p.t0,
        meta=meta,
        **kw,
    )


def _candidate_env(tmp: Path, gpu: str | None, backend: str, triton: Path) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(tmp),
        "TMPDIR": str(tmp),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONHASHSEED": "0",
        "TORCH_EXTENSIONS_DIR": str(tmp / "torch_extensions"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
        "TRITON_CACHE_DIR": str(triton),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(min(8, os.cpu_count() or 1))),
    }
    for k in (
        "PYTHONPATH",
        "LD_LIBRARY_PATH",
        "CUDA_HOME",
        "CUDA_PATH",
        "LANG",
        "LC_ALL",
        "CUDA_AGENT_ARCH",
    ):
        if k in os.environ:
            env[k] = os.environ[k]
    if backend == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = (
            gpu if gpu is not None else os.environ.get("CUDA_VISIBLE_DEVICES", "0")
        )
        cap = device_capability()
        if cap:
            env["TORCH_CUDA_ARCH_LIST"] = torch_arch_list(cap)
        env["MAX_JOBS"] = str(max(2, min(16, os.cpu_count() or 2)))
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _limits(
    config: SandboxConfig, timeout_s: float, backend: str, *, drop_user: bool = True
) -> Limits:
    """The limits of one phase process. ``drop_user=False`` is the trusted side (reference and
    judge, under the sandbox's own uid): no file-size cap, since the reference's weights file
    is as large as the problem's parameters (8.7 GB for KernelBench L3/2 at today's sizes) and
    disk is the admission ledger's to check."""
    return Limits(
        cpus=other_cpus(),  # the cores kept for timed sections are left to them
        timeout_s=timeout_s,
        nproc=config.nproc,
        fsize_mb=config.fsize_mb if drop_user else None,
        address_space_mb=config.host_mem_mb + 4096 if backend == "cpu" else None,
        rss_mb=config.host_mem_mb,
        no_network=config.no_network,
        drop_user=config.drop_user and drop_user,
    )


def _record_phases(
    p: Prepared,
    stage: str,
    rep: dict[str, Any],
    stage_t0: float | None = None,
    gate_wait: float = 0.0,
    life_s: float | None = None,
) -> None:
    """Keep where one op's wall time went in ``meta["phases_s"][stage]``: the phases the process
    reported, its start-up, and ``other`` (exit, polling, what no phase names), so that the
    phases plus ``other`` are the process's life: ``before_stage`` + the stage + ``gate_wait``.
    ``before_stage`` is kept for a process started early (``stage_t0``: the wall-clock time the
    stage's clock started, at its start signal): from its spawn to then (start-up, ``import
    torch`` and its ``wait_*`` phase, or part of them). ``gate_wait``: seconds the parent left
    out of the stage while the process waited for the device (the timing stage). ``life_s``:
    the seconds the op's process ran, for an op that is no stage of its own (the judge, which
    spans verification and the comparison's tail). The process's peak memory goes into
    ``meta["peak_memory_mb"][stage]``. Informational only."""
    if rep.get("warm"):
        p.meta.setdefault("warm_phases", []).append(stage)
    if rep.get("fork_server_error"):
        p.meta["fork_server_error"] = rep["fork_server_error"]
    if isinstance(rep.get("peak_memory_mb"), dict):
        p.meta.setdefault("peak_memory_mb", {})[stage] = rep["peak_memory_mb"]
    phases = rep.get("phases_s")
    total = life_s if life_s is not None else p.stages.get(stage)
    if not isinstance(phases, dict) or total is None:
        return
    d = {str(k): round(float(v), 3) for k, v in phases.items() if isinstance(v, (int, float))}
    if isinstance(rep.get("startup_s"), (int, float)):
        d["startup"] = round(float(rep["startup_s"]), 3)
    named = sum(d.values())
    before = 0.0
    if stage_t0 is not None and isinstance(rep.get("t_spawn"), (int, float)):
        before = max(0.0, stage_t0 - float(rep["t_spawn"]))
        d["before_stage"] = round(before, 3)
    d["other"] = round(total + before + gate_wait - named, 3)
    p.meta.setdefault("phases_s", {})[stage] = d


def _error_text(out: Outcome, report: dict[str, Any]) -> str:
    err = report.get("error") or {}
    if err:
        msg = f"{err.get('type')}: {err.get('message')}"
        tb = err.get("traceback", "")
        return cap_text(msg + ("\n" + tb if tb else ""), LOG_TAIL)
    return cap_text(f"{out.describe()}\n{out.stderr.strip()}", LOG_TAIL)


def failed_in_setup(report: dict[str, Any]) -> bool:
    """True when a candidate-side process (verify, time) failed in the sandbox's own set-up,
    before it imported the candidate's module: its report exists, says not ok, and has no
    ``stage`` yet (the runner sets ``stage`` to ``load`` just before that import). Such a
    failure is ours (or the machine's), not the candidate's."""
    return bool(report) and report.get("ok") is False and "stage" not in report


def ran_out_in_probe(report: dict[str, Any], error: str) -> bool:
    """True when the candidate's verification process ran out of memory inside the guards'
    probe (stage ``guard probe``: the guard's own re-runs, a poisoned allocator holding blocks
    of the output's and inputs' sizes): every trial had passed through the process, the memory
    was the evaluator's, so the failure is ours (``infra_error``), never the candidate's. Like
    :func:`failed_in_setup` this reads the report the candidate's process wrote: a candidate
    can at most turn its own failure into an ``infra_error`` (no reward), never into a pass."""
    return report.get("stage") == "guard probe" and bool(_MEMORY_FAILURE.search(error))


def _setup_failure(p: Prepared, phase: str, error: str, corr: Any) -> EvalResult:
    """The verdict for a ``phase`` process that :func:`failed_in_setup`: ``infra_error``."""
    return _result(
        p,
        Status.INFRA_ERROR,
        f"sandbox error before the candidate's code ran ({phase}): " + error.splitlines()[0][:500],
        correctness=corr,
    )


def _parse_guards(raw: Any) -> list[GuardViolation]:
    """Findings the candidate's process reported (malformed entries are dropped)."""
    import msgspec

    out: list[GuardViolation] = []
    for g in raw if isinstance(raw, list) else []:
        try:
            out.append(msgspec.convert(g, GuardViolation))
        except (msgspec.ValidationError, TypeError):
            continue
    return out


def _gpu_index(backend: str, gpu: str | None) -> str | None:
    """The GPU a cuda evaluation runs on, as NVML numbers it (None on cpu)."""
    if backend != "cuda":
        return None
    if gpu is None:
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    return gpu


def _domain(backend: str, gpu: str | None) -> str:
    return domain_of(backend, _gpu_index(backend, gpu) if backend == "cuda" else gpu)
