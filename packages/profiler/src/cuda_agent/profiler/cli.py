"""``profiler``: time programs, fill task baselines, per-kernel summaries, device ceilings.

stdout carries records/JSON only; progress and human tables go to stderr.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import typer

from cuda_agent.records import log
from cuda_agent.records.cli_helpers import (
    ClaimOpt,
    InputArg,
    OnErrorOpt,
    OutputOpt,
    ResumeOpt,
    ShardOpt,
    StreamFlags,
    bundle_options,
    fail,
    run_stream,
)

app = typer.Typer(
    help="""GPU timing the reward can trust: L2-flushed, interleaved, adaptive; baselines;
speed-of-light; Nsight Compute summaries.

Examples:

  profiler time tests/fixtures/KernelBench/level1/1_ReLU.py --device cuda

  profiler baseline --device cuda < tasks.jsonl > tasks_with_baselines.jsonl

  profiler ceilings --device cuda
""",
    no_args_is_help=True,
    add_completion=False,
)

DeviceOpt = Annotated[str, typer.Option("--device", help="cuda, cuda:N or cpu.")]
TimeCapOpt = Annotated[float, typer.Option("--time-cap", help="Seconds of sampling per program.")]
RseOpt = Annotated[
    float, typer.Option("--target-rse", help="Stop when rel. std. error of the median <= this.")
]
WarmupOpt = Annotated[float, typer.Option("--warmup-ms", help="Minimum warm-up time (ms).")]


class GraphMode(StrEnum):
    auto = "auto"
    on = "on"
    off = "off"


def _config(time_cap: float, target_rse: float, warmup_ms: float, graph: GraphMode, flush: bool):
    from .config import TimingConfig

    return TimingConfig(
        time_cap_s=time_cap,
        target_rse=target_rse,
        warmup_ms=warmup_ms,
        cuda_graph=graph.value,
        flush_l2=flush,
    )


def _out(obj: object) -> None:
    sys.stdout.write(msgspec.json.encode(obj).decode() + "\n")
    sys.stdout.flush()


def _default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        return "cpu"


@app.callback()
def _main() -> None:
    """profiler."""


def _detail_from(res, names: list[str]):
    from cuda_agent.records import TimingDetail

    from .config import PROTOCOL_VERSION

    st = res.stats
    d = TimingDetail(
        protocol_version=PROTOCOL_VERSION,
        candidate=st.get("new"),
        eager=st.get("eager"),
        compile=st.get("compile"),
        flags=res.flags,
        seconds=res.seconds,
    )
    if "new" in st and "eager" in st:
        d.speedup_vs_eager_ci = res.speedup_ci("eager", "new")
    if "new" in st and "compile" in st:
        d.speedup_vs_compile_ci = res.speedup_ci("compile", "new")
    return d


def _table(res) -> None:
    for name, s in res.stats.items():
        log(
            f"{name:8s} median {s.median_ms:.4f} ms  IQR {s.iqr_ms:.4f}  "
            f"CI95 [{s.ci95_low_ms:.4f}, {s.ci95_high_ms:.4f}]  n={s.n}  discarded={s.discarded}"
        )
    names = list(res.stats)
    for other in names[1:]:
        lo, hi = res.speedup_ci(names[0], other)
        log(
            f"speed-up of {other} over {names[0]}: {res.speedup(names[0], other):.3f}x "
            f"[{lo:.3f}, {hi:.3f}]"
        )
    if res.flags:
        log("flags: " + ", ".join(res.flags))


@app.command("time")
def time_cmd(
    path: Annotated[Path, typer.Argument(help="KernelBench-format .py, or Candidate JSONL ('-').")],
    new: Annotated[Path | None, typer.Option("--new", help="A ModelNew source to time.")] = None,
    compile_mode: Annotated[
        str | None,
        typer.Option("--compile", help="Also time torch.compile with this mode (default, ...)."),
    ] = None,
    device: DeviceOpt = "",
    time_cap: TimeCapOpt = 10.0,
    target_rse: RseOpt = 0.005,
    warmup_ms: WarmupOpt = 200.0,
    cuda_graph: Annotated[
        GraphMode,
        typer.Option(
            "--cuda-graph", help="Replay calls from a CUDA graph: auto (short programs), on, off."
        ),
    ] = GraphMode.auto,
    flush: Annotated[bool, typer.Option("--flush/--no-flush", help="Flush L2 per call.")] = True,
    sol: Annotated[
        bool,
        typer.Option("--sol", help="Add the speed-of-light check (CUDA; measures ceilings once)."),
    ] = False,
    output: OutputOpt = None,
    resume: ResumeOpt = False,
    on_error: OnErrorOpt = "stop",  # type: ignore[assignment]
) -> None:
    """Time a program (eager, optional compile, optional ModelNew) interleaved; print TimingDetail.

    With a Candidate JSONL, each kernelbench-format candidate is timed against its task's eager
    reference and an EvalResult (timing only, correctness NOT checked) is written per candidate.
    """
    from .baseline import time_program

    device = device or _default_device()
    cfg = _config(time_cap, target_rse, warmup_ms, cuda_graph, flush)
    if str(path) == "-" or path.suffix == ".jsonl":
        _time_candidates(path, device, cfg, compile_mode, output, resume, on_error)
        return
    if not path.exists():
        raise fail(f"no such file: {path}")
    res = time_program(
        path.read_text(),
        device=device,
        new_source=new.read_text() if new else None,
        compile_mode=compile_mode,
        config=cfg,
    )
    _table(res)
    detail = _detail_from(res, list(res.stats))
    if sol and device.startswith("cuda"):
        from .sol import check_time, get_ceilings

        side = "new" if "new" in res.stats else "eager"
        e, fl = check_time(path.read_text(), res.stats[side].median_ms, get_ceilings(device))
        log(
            f"speed-of-light: output floor {e.floor_ms:.4f} ms, roofline {e.bound_ms:.4f} ms "
            f"({e.bound_by}), {side} reaches {100 * e.fraction(res.stats[side].median_ms):.1f}%"
        )
        detail.flags = sorted(set(detail.flags) | set(fl))
    _out(detail)


def _time_candidates(path, device, cfg, compile_mode, output, resume, on_error) -> None:
    from cuda_agent.records import Candidate, EvalResult, Status

    from .baseline import time_program

    def process(c: Candidate):
        if c.solution.format != "kernelbench":
            raise ValueError("workdir solutions must be built first: use `sandbox eval`")
        src = next((t for t in c.solution.files.values() if "class ModelNew" in t), None)
        if src is None:
            raise ValueError("solution has no file defining ModelNew")
        res = time_program(
            c.task.ref_code,
            device=device,
            new_source=src,
            compile_mode=compile_mode,
            config=cfg,
            model_mode=c.task.model_mode,
        )
        d = _detail_from(res, list(res.stats))
        yield EvalResult(
            task_id=c.task.id,
            solution_id=c.solution.id,
            backend="cuda" if device.startswith("cuda") else "cpu",
            device=device,
            status=Status.OK,
            message="timing only; correctness not checked",
            timing=d,
            speedup_vs_eager=res.speedup("eager", "new"),
            speedup_vs_compile=res.speedup("compile", "new") if compile_mode else None,
            seconds=res.seconds,
            meta={"timing_only": True},
        )

    run_stream(
        process,
        input=None if str(path) == "-" else path,
        output=output,
        resume=resume,
        on_error=on_error,
        expect=(Candidate,),
        desc="candidates",
    )


class CompileMode(StrEnum):
    default = "default"
    max_autotune = "max-autotune"
    reduce_overhead = "reduce-overhead"
    none = "none"


@app.command("baseline")
@bundle_options("stream", StreamFlags)
def baseline_cmd(
    input: InputArg = None,
    output: OutputOpt = None,
    resume: ResumeOpt = False,
    on_error: OnErrorOpt = "stop",  # type: ignore[assignment]
    shard: ShardOpt = None,
    claim: ClaimOpt = None,
    device: DeviceOpt = "",
    compile_mode: Annotated[
        CompileMode, typer.Option("--compile-mode", help="torch.compile mode, or none.")
    ] = CompileMode.default,
    recompute: Annotated[bool, typer.Option("--recompute", help="Ignore the cache.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per task.")] = 600.0,
    time_cap: TimeCapOpt = 10.0,
    target_rse: RseOpt = 0.005,
    warmup_ms: WarmupOpt = 200.0,
    keep_existing: Annotated[
        bool, typer.Option("--keep-existing", help="Leave tasks that already have a baseline.")
    ] = False,
    *,
    stream: StreamFlags,
) -> None:
    """Fill ``Task.baseline`` (eager and torch.compile) for each task; one subprocess per task.

    Cached by (task hash, GPU, torch, protocol, compile mode) in $CUDA_AGENT_CACHE/baselines.
    One process per GPU sharing ``--claim DIR`` splits a stream by who is free, not by hash.
    """
    from cuda_agent.records import Task

    from .baseline import baseline_for_task

    device = device or _default_device()
    cfg = _config(time_cap, target_rse, warmup_ms, GraphMode.auto, True)
    mode = None if compile_mode is CompileMode.none else compile_mode.value

    def process(t: Task):
        if keep_existing and t.baseline is not None:
            yield t
            return
        b = baseline_for_task(
            t, device=device, compile_mode=mode, timeout_s=timeout, config=cfg, recompute=recompute
        )
        eag = f"{b.eager.median_ms:.4f} ms" if b.eager else "-"
        com = f"{b.compile.median_ms:.4f} ms" if b.compile else "-"
        log(f"{t.name}: eager {eag}, compile {com}" + (f" ({b.error})" if b.error else ""))
        t.baseline = b
        yield t

    stream.run(process, expect=(Task,), desc="tasks")


@app.command("ncu")
def ncu_cmd(
    path: Annotated[Path, typer.Argument(help="KernelBench-format reference .py")],
    new: Annotated[Path | None, typer.Option("--new", help="Profile this ModelNew.")] = None,
    device: DeviceOpt = "",
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of text.")] = False,
    use_ncu: Annotated[bool, typer.Option("--ncu/--no-ncu", help="Try Nsight Compute.")] = True,
    raw_csv: Annotated[Path | None, typer.Option("--raw-csv", help="Save ncu's CSV.")] = None,
    from_csv: Annotated[
        Path | None, typer.Option("--from-csv", help="Summarise a saved ncu CSV instead.")
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds for the profiled run.")
    ] = 300.0,
    max_kernels: Annotated[
        int,
        typer.Option("--max-kernels", help="Kernels listed in the text summary, longest first."),
    ] = 15,
    model_mode: Annotated[
        Literal["eval", "train"],
        typer.Option("--model-mode", help="Module mode of the profiled model (Task.model_mode)."),
    ] = "eval",
) -> None:
    """Per-kernel summary of one forward call (ncu --clock-control none; torch.profiler fallback)."""
    from .ncu import parse_ncu_csv, profile_program, summary_text

    if from_csv is not None:
        rep = parse_ncu_csv(from_csv.read_text(), program=str(path))
    else:
        if not path.exists():
            raise fail(f"no such file: {path}")
        rep = profile_program(
            path,
            new=new,
            device=device or _default_device(),
            timeout_s=timeout,
            use_ncu=use_ncu,
            raw_csv_out=raw_csv,
            model_mode=model_mode,
        )
    if as_json:
        _out(rep)
    else:
        sys.stdout.write(summary_text(rep, max_kernels=max_kernels) + "\n")


@app.command("ceilings")
def ceilings_cmd(
    device: DeviceOpt = "cuda",
    recompute: Annotated[
        bool, typer.Option("--recompute", help="Measure again instead of reading the cache.")
    ] = False,
) -> None:
    """Measured copy bandwidth and matmul TFLOP/s (cached), next to the datasheet on stderr."""
    from .sol import datasheet_for, get_ceilings

    if not device.startswith("cuda"):
        raise fail("ceilings are measured on a CUDA device")
    c = get_ceilings(device, recompute=recompute)
    ds = datasheet_for(c.device) or {}
    log(f"{c.device} (torch {c.torch_version})")
    log(f"  copy    {c.copy_gbps:8.0f} GB/s   datasheet {ds.get('copy_gbps', float('nan')):.0f}")
    log(f"  read    {c.read_gbps:8.0f} GB/s")
    for k, v in c.matmul_tflops.items():
        log(f"  {k:6s} {v:8.1f} TFLOP/s datasheet {ds.get(k, float('nan')):.1f} (dense)")
    _out(c)


@app.command("sol")
def sol_cmd(
    path: Annotated[Path, typer.Argument(help="KernelBench-format reference .py")],
    measured_ms: Annotated[
        float | None, typer.Option("--measured-ms", help="A measured time to compare.")
    ] = None,
    device: DeviceOpt = "cuda",
    copy_gbps: Annotated[
        float | None, typer.Option("--copy-gbps", help="Use this bandwidth instead of measuring.")
    ] = None,
    tflops: Annotated[
        float | None, typer.Option("--tflops", help="Use this matmul rate instead of measuring.")
    ] = None,
) -> None:
    """Speed-of-light of a program: FLOPs, bytes, roofline estimate and fraction reached, and the
    output floor (``below_bound``: a measured time under 0.9x the floor)."""
    from .sol import Ceilings, count_work, estimate, get_ceilings

    if copy_gbps is not None and tflops is not None:
        c = Ceilings(
            device="given",
            torch_version="",
            protocol_version="",
            copy_gbps=copy_gbps,
            matmul_tflops={"fp32": tflops, "tf32": tflops, "bf16": tflops, "fp16": tflops},
        )
    else:
        c = get_ceilings(device)
    e = estimate(count_work(path.read_text()), c)
    out = msgspec.to_builtins(e)
    if measured_ms is not None:
        out["measured_ms"] = measured_ms
        out["fraction"] = e.fraction(measured_ms)
        out["below_bound"] = e.impossible(measured_ms)
    log(
        f"{path.name}: {e.work.flops / 1e9:.1f} GFLOP, {e.work.bytes / 1e9:.3f} GB -> "
        f"roofline {e.bound_ms:.4f} ms ({e.bound_by}), output floor {e.floor_ms:.4f} ms"
    )
    _out(out)


if __name__ == "__main__":
    app()
