"""``sandbox``: evaluate candidate kernels in isolation; create agent workspaces; run agent tools.

stdout carries records only (``eval``) or the command's own output (``exec``); logs go to stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from cuda_agent.records.cli_helpers import (
    ClaimOpt,
    InputArg,
    OnError,
    OnErrorOpt,
    OutputOpt,
    ResumeOpt,
    ShardOpt,
    bundle_options,
    fail,
    log,
)

from .config import SandboxConfig
from .stream import (
    CompileJobsOpt,
    CpuWorkersOpt,
    EvalStreamFlags,
    GpusOpt,
    InOrderOpt,
    PairedEagerOpt,
    RayOpt,
    RayWorkersOpt,
    TimingCpusOpt,
    WindowOpt,
    WorkersPerGpuOpt,
)

app = typer.Typer(
    help="""Build, verify and time candidate CUDA kernels in isolated processes; agent workspaces.

Examples:

  sandbox eval candidates.jsonl -o results.jsonl --resume --gpus all

  sandbox eval --backend cpu --no-timing < candidates.jsonl > results.jsonl

  sandbox workspace tasks.jsonl ws/ && sandbox exec ws/ -- python utils/compile.py
""",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _main() -> None:
    """sandbox: the evaluation environment of cuda-agent."""


# -- the options of `sandbox eval` alone (those of the stream and the pool are in .stream) --

UnitJobsOpt = Annotated[int, typer.Option("--unit-jobs", help="Compiler processes per candidate.")]
StressTrialsOpt = Annotated[
    bool,
    typer.Option(
        "--stress-trials/--no-stress-trials",
        help="Numerics stress trials too (the robust setting): one trial each of nan_inf, "
        "denormal, near_max and offset inputs, after the plain ones (off: the paper's).",
    ),
]
ShapeCheckOpt = Annotated[
    bool,
    typer.Option(
        "--shape-check/--no-shape-check",
        help="Verify a correct candidate again at a resized instance of its task (sizes "
        "scaled by 0.75 as `guards resize-task` does; a failure there: incorrect, "
        "G-SHAPE-GENERALISATION). With --stress-trials: the robust setting. Off by default.",
    ),
]
TimingOpt = Annotated[bool, typer.Option("--timing/--no-timing", help="Time correct candidates.")]
BaselinesOpt = Annotated[
    bool,
    typer.Option("--baselines/--no-baselines", help="Eager/compile baselines and speed-ups."),
]
BaselineCompileModeOpt = Annotated[
    str,
    typer.Option(
        "--baseline-compile-mode",
        help="torch.compile mode of the compile baseline: default | max-autotune | "
        "max-autotune-no-cudagraphs | reduce-overhead (what speedup_vs_compile compares with).",
    ),
]
GuardPolicyOpt = Annotated[str, typer.Option("--guard-policy", help="strict | kernelbench | off")]
HostMemMbOpt = Annotated[
    int, typer.Option("--host-mem-mb", help="Host memory limit of a candidate.")
]
PchOpt = Annotated[
    bool | None,
    typer.Option(
        "--pch/--no-pch",
        help="Precompile the bindings' torch headers (default: always on the cuda backend;"
        " on the cpu backend once the cache has compiled 3 bindings without it,"
        " $CUDA_AGENT_PCH_AFTER).",
    ),
]
CacheDirOpt = Annotated[Path | None, typer.Option("--cache-dir", help="Object/extension cache.")]
KeepDirsOpt = Annotated[
    bool, typer.Option("--keep-dirs", help="Keep each evaluation's directory (debugging).")
]
MaxProcsOpt = Annotated[
    int, typer.Option("--max-procs", help="Processes+threads a candidate may have.")
]
RerunAloneOpt = Annotated[
    bool,
    typer.Option(
        "--rerun-alone/--no-rerun-alone",
        help="Re-run, alone on the device, a memory failure met while sharing it.",
    ),
]
TimingConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--timing-config", help='Profiler TimingConfig fields as JSON, e.g. {"time_cap_s": 3}.'
    ),
]
EarlyStartOpt = Annotated[
    bool,
    typer.Option(
        "--early-start/--no-early-start",
        help="Start the verification process while the reference runs and the timing "
        "process while the outputs are compared (each waits after import torch).",
    ),
]
WarmProcessesOpt = Annotated[
    int | None,
    typer.Option(
        "--warm-processes",
        min=0,
        help="With --no-fork-server: runner processes kept started ahead, per environment, "
        "that have already imported torch (0: every phase starts cold; default: 3 on hosts "
        "with 8 cores or more, else 0).",
    ),
]
ForkServerOpt = Annotated[
    bool,
    typer.Option(
        "--fork-server/--no-fork-server",
        help="Fork every phase's process from one per environment that imported torch "
        "once (off: --warm-processes decides).",
    ),
]


@app.command("eval")
@bundle_options("stream", EvalStreamFlags)
def eval_cmd(
    input: InputArg = None,
    output: OutputOpt = None,
    resume: ResumeOpt = False,
    on_error: OnErrorOpt = OnError.stop,
    shard: ShardOpt = None,
    claim: ClaimOpt = None,
    gpus: GpusOpt = None,
    compile_jobs: CompileJobsOpt = None,
    unit_jobs: UnitJobsOpt = 4,
    backend: Annotated[str, typer.Option("--backend", help="cuda | cpu | auto")] = "auto",
    trials: Annotated[int, typer.Option("--trials", help="Correctness trials (>= 5).")] = 5,
    atol: Annotated[float, typer.Option("--atol")] = 1e-2,
    rtol: Annotated[float, typer.Option("--rtol")] = 1e-2,
    norm_tol: Annotated[float, typer.Option("--norm-tol", help="Max relative error norm.")] = 2e-2,
    stress_trials: StressTrialsOpt = False,
    shape_check: ShapeCheckOpt = False,
    timing: TimingOpt = True,
    baselines: BaselinesOpt = True,
    baseline_compile_mode: BaselineCompileModeOpt = "default",
    paired_eager: PairedEagerOpt = None,
    timing_cpus: TimingCpusOpt = "auto",
    guard_policy: GuardPolicyOpt = "strict",
    compile_timeout: Annotated[float, typer.Option("--compile-timeout", help="Seconds.")] = 300.0,
    verify_timeout: Annotated[float, typer.Option("--verify-timeout", help="Seconds.")] = 300.0,
    time_timeout: Annotated[float, typer.Option("--time-timeout", help="Seconds.")] = 600.0,
    host_mem_mb: HostMemMbOpt = 32768,
    pch: PchOpt = None,
    cache_dir: CacheDirOpt = None,
    keep_dirs: KeepDirsOpt = False,
    max_procs: MaxProcsOpt = 512,
    cpu_workers: CpuWorkersOpt = 1,
    workers_per_gpu: WorkersPerGpuOpt = 2,
    window: WindowOpt = None,
    in_order: InOrderOpt = False,
    rerun_alone: RerunAloneOpt = True,
    timing_config: TimingConfigOpt = None,
    early_start: EarlyStartOpt = True,
    warm_processes: WarmProcessesOpt = None,
    fork_server: ForkServerOpt = True,
    ray_address: RayOpt = None,
    ray_workers: RayWorkersOpt = None,
    *,
    stream: EvalStreamFlags,
) -> None:
    """Evaluate candidates: ``sandbox eval < candidates.jsonl > results.jsonl``.

    Each candidate record yields one eval_result record, written as it is done (`--in-order`: in input order). Example:

        sandbox eval cands.jsonl -o results.jsonl --resume --gpus all --compile-jobs 4
    """
    from .stream import evaluate_stream, sandbox_config

    _backend_opt(backend)
    stream.check()
    # here, option by option: bin/config_docs.py reads which option sets which field from it
    cfg = sandbox_config(
        backend=backend,
        trials=max(5, trials),
        atol=atol,
        rtol=rtol,
        norm_tol=norm_tol,
        stress_trials=stress_trials,
        shape_check=shape_check,
        timing=timing,
        baselines=baselines,
        guard_policy=guard_policy,
        compile_timeout_s=compile_timeout,
        verify_timeout_s=verify_timeout,
        time_timeout_s=time_timeout,
        host_mem_mb=host_mem_mb,
        pch=pch,
        compile_jobs=unit_jobs,
        cache_dir=str(cache_dir) if cache_dir else None,
        keep_dirs=keep_dirs,
        nproc=max_procs,
        timing_config=_json_opt(timing_config),
        workers_per_gpu=workers_per_gpu,
        rerun_alone=rerun_alone,
        early_verify=early_start,
        early_time=early_start,
        warm_processes=warm_processes,
        fork_server=fork_server,
        baseline_compile_mode=baseline_compile_mode,
        paired_eager=paired_eager,
        timing_cpus=timing_cpus,
    )
    _cache_opt(cfg)
    evaluate_stream(cfg, stream, desc="sandbox eval")


@app.command("workspace")
def workspace_cmd(
    task_jsonl: Annotated[Path, typer.Argument(help="JSONL with task (or candidate) records.")],
    out_dir: Annotated[
        Path, typer.Argument(help="Directory to create (must not exist or be empty).")
    ],
    task_id: Annotated[
        str | None, typer.Option("--task-id", help="Which task (default: the first).")
    ] = None,
    backend: Annotated[str, typer.Option("--backend", help="cuda | cpu | auto")] = "auto",
    guard_policy: Annotated[
        str,
        typer.Option(
            "--guard-policy",
            help="strict | kernelbench | off: the rules its SKILL.md states and its tools verify.",
        ),
    ] = "strict",
) -> None:
    """Create an agent workspace for one task.

    sandbox workspace tasks.jsonl ws/ --backend cuda && cd ws && python utils/compile.py
    """
    from cuda_agent.records import Candidate, Task
    from cuda_agent.records.jsonl import DecodeError, read_records

    from .config import resolve_backend
    from .workspace import create_workspace

    chosen = None
    for n, rec in read_records(task_jsonl):
        if isinstance(rec, DecodeError):
            raise fail(f"{task_jsonl}: line {n}: {rec.message}")
        t = rec if isinstance(rec, Task) else rec.task if isinstance(rec, Candidate) else None
        if t is not None and (task_id is None or t.id == task_id or t.name == task_id):
            chosen = t
            break
    if chosen is None:
        raise fail(f"no task {'with id ' + task_id if task_id else ''} in {task_jsonl}")
    be = resolve_backend(_backend_opt(backend))
    try:
        d = create_workspace(chosen, out_dir, backend=be, guard_policy=guard_policy)
    except (FileExistsError, ValueError) as e:
        raise fail(str(e)) from None
    log(f"workspace for task {chosen.name} ({chosen.id}, backend {be}) in {d}")
    if be == "cuda":  # what its tools read under `sandbox exec` but never build there
        from .execute import prepare_trusted_cache

        log(prepare_trusted_cache(be))
    print(str(d))


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_cmd(
    ctx: typer.Context,
    workspace: Annotated[Path, typer.Argument(help="Workspace directory (the command's cwd).")],
    timeout: Annotated[float, typer.Option("--timeout", help="Wall-clock limit, seconds.")] = 300.0,
    max_output: Annotated[
        int, typer.Option("--max-output", help="Bytes of output kept (head and tail).")
    ] = 30000,
    network: Annotated[
        bool, typer.Option("--network/--no-network", help="Allow network access.")
    ] = False,
) -> None:
    """Run a command for an agent tool: ``sandbox exec WS -- python utils/compile.py``.

    Own session and process group (all killed at the limit), no network, limits on processes and
    file size; stdout and stderr are each cut to --max-output bytes, head and tail kept.
    """
    from .execute import exec_command

    cmd = list(ctx.args)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise fail("no command given (sandbox exec WS -- CMD ...)")
    out = exec_command(workspace, cmd, timeout=timeout, max_output=max_output, network=network)
    sys.stdout.write(out.stdout)
    sys.stdout.flush()
    sys.stderr.write(out.stderr)
    if out.killed_for or (out.returncode or 0) < 0:
        sys.stderr.write(f"\n[sandbox exec: {out.describe()}]\n")
    raise typer.Exit(
        124
        if out.timed_out
        else (out.returncode if out.returncode is not None else 137)
        if (out.returncode or 0) >= 0
        else 128 + (out.signal or 9)
    )


def _json_opt(text: str | None) -> dict | None:
    import json

    if not text:
        return None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"--timing-config is not JSON: {e}") from None
    if not isinstance(d, dict):
        raise typer.BadParameter("--timing-config must be a JSON object")
    from cuda_agent.profiler.config import TimingConfig

    bad = TimingConfig.unknown_keys(d)
    if bad:
        raise typer.BadParameter(f"--timing-config: unknown key(s) {', '.join(bad)}")
    return d


def _cache_opt(cfg: SandboxConfig) -> None:
    """A cache the sandbox's user cannot reach would fail every candidate: say so once, as a
    usage error of --cache-dir."""
    from .evaluate import cache_root

    try:
        cache_root(cfg)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--cache-dir") from None


def _backend_opt(value: str, allowed: tuple[str, ...] = ("cuda", "cpu", "auto")) -> str:
    """``value`` of a --backend option, or a usage error naming what is allowed."""
    if value not in allowed:
        raise typer.BadParameter(
            f"{value!r}: expected {', '.join(allowed)}", param_hint="--backend"
        )
    return value


@app.command("caps")
def caps_cmd() -> None:
    """Print what isolation this machine allows (uid drop, network namespace, pids cgroup) and
    whether a fork server starts here (``fork_server``: "ok", or why phases will start cold)."""
    import json
    import os
    import tempfile

    from .forkserver import start_server
    from .isolation import caps

    with tempfile.TemporaryDirectory(prefix="sandbox-caps-") as d:
        env = {k: v for k in ("PATH", "PYTHONPATH") if (v := os.environ.get(k)) is not None}
        srv = start_server(["json"], env, d, timeout=60)
        fork = "ok" if srv.ready else srv.error
        srv.close()
    print(json.dumps({**caps().__dict__, "fork_server": fork}, indent=1))


@app.command("flags")
def flags_cmd(
    backend: Annotated[str, typer.Option("--backend", help="cpu or cuda.")] = "cpu",
) -> None:
    """Print the compile and link flags of BACKEND and the tool versions in their cache key (JSON):
    two builds share cached objects only when these match, e.g. ``sandbox flags`` against
    ``sandbox exec WS -- sandbox flags`` when an agent's compile misses the evaluation's cache."""
    import dataclasses
    import json

    from .toolchain import cxx, flags_for, nvcc, tool_version

    f = flags_for(_backend_opt(backend, ("cpu", "cuda")))
    tools = {
        "cxx": tool_version(cxx()),
        "nvcc": tool_version(nvcc() or "") if backend == "cuda" else "",
    }
    extra: dict[str, object] = {}
    if backend == "cuda":
        from .build import SPLIT_ENV, split_enabled

        # whether .cu files compile as nvcc's steps in two chains (part of their objects' keys)
        extra["nvcc_split"] = "on" if split_enabled() else f"off ({SPLIT_ENV}=0)"
    print(json.dumps({**dataclasses.asdict(f), "tool_versions": tools, **extra}, indent=1))


if __name__ == "__main__":
    app()
