"""``kernelbench-eval``: KernelBench tasks, solution import, evaluation and the paper's report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from cuda_agent.records import Candidate, EvalResult, RecordWriter, Task, Trajectory
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
    run_stream,
)
from cuda_agent.records.jsonl import DecodeError, load_records
from cuda_agent.sandbox.stream import (
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
    help="""Evaluate solutions on a KernelBench checkout and report the CUDA Agent paper's table.

Example (a KernelBench clone in ~/KernelBench, solutions in ./my_kernels):

  kernelbench-eval tasks --root ~/KernelBench --levels 1,2 > tasks.jsonl

  kernelbench-eval solutions --dir my_kernels < tasks.jsonl > candidates.jsonl

  kernelbench-eval run --backend cuda --gpus all -o results.jsonl --resume < candidates.jsonl

  kernelbench-eval report --tasks tasks.jsonl --out-dir report/ < results.jsonl
""",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def tasks(
    root: Annotated[Path, typer.Option(help="KernelBench clone (or its KernelBench/ folder).")],
    levels: Annotated[str, typer.Option(help="Levels, e.g. 1,2,3.")] = "1,2,3",
    problems: Annotated[str | None, typer.Option(help="Problem ids, e.g. 1-20,40.")] = None,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 2 when any problem file breaks the contract.")
    ] = False,
    model_mode: Annotated[
        Literal["kernelbench", "train", "eval"],
        typer.Option(
            "--model-mode",
            help="Task.model_mode: KernelBench's semantics (train mode where BatchNorm's batch "
            "statistics matter, eval elsewhere and where train mode is random), or one mode for all.",
        ),
    ] = "kernelbench",
) -> None:
    """Read KernelBench/level{N}/{id}_{Name}.py files into Task records on stdout.

    Example: kernelbench-eval tasks --root ~/KernelBench --levels 1 --problems 1-10 > tasks.jsonl
    """
    from .tree import ProblemIssue, TreeError, iter_problems, parse_ranges

    try:
        lv = parse_ranges(levels)
        pr = parse_ranges(problems)
        items = list(iter_problems(root, lv, pr, model_mode=model_mode))
    except (TreeError, ValueError) as e:
        raise fail(str(e)) from None
    issues = [i for i in items if isinstance(i, ProblemIssue)]
    w = RecordWriter(None)
    for t in items:
        if isinstance(t, Task):
            w.write(t)
    for i in issues:
        log(f"{i.path}: {i.message}")
    log(f"tasks: {w.count} problems, {len(issues)} files skipped for breaking the contract")
    if strict and issues:
        raise typer.Exit(2)


@app.command()
def solutions(
    input: InputArg = None,
    dir: Annotated[Path | None, typer.Option("--dir", help="Folder of solutions.")] = None,
    jsonl: Annotated[
        Path | None, typer.Option("--jsonl", help="JSONL of solution entries.")
    ] = None,
    on_error: OnErrorOpt = OnError.stop,
) -> None:
    """Pair solutions with the tasks read on stdin; write Candidate records.

    --dir accepts level_1_problem_19_sample_0_kernel.py files, level1/19_ReLU.py files, and
    level1/19_ReLU/ CUDA-Agent workdirs (model_new.py + kernels/). --jsonl accepts lines
    {"level": 1, "problem_id": 19, "code": "..."} or {..., "files": {"model_new.py": ...}}.
    Tasks with no solution are listed on stderr; they count as failures in the report.

    Example: kernelbench-eval solutions --dir runs/kernels < tasks.jsonl > candidates.jsonl
    """
    from .solutions import import_solutions, scan_dir, scan_jsonl

    if (dir is None) == (jsonl is None):
        raise fail("give exactly one of --dir or --jsonl")
    task_list: list[Task] = []
    run_stream(
        lambda t: task_list.append(t) or (),
        input=input,
        on_error=on_error,
        expect=(Task,),
        key=lambda r: "",
        quiet=True,
    )
    try:
        found, bad = scan_dir(dir) if dir is not None else scan_jsonl(jsonl)
    except DecodeError as e:
        raise fail(f"{jsonl}: {e}") from None
    rep = import_solutions(task_list, found)
    w = RecordWriter(None)
    for c in rep.candidates:
        w.write(c)
    for b in bad:
        log(f"unreadable: {b}")
    for o in rep.orphans:
        log(f"no such task in the input: {o}")
    if rep.missing:
        names = ", ".join(f"L{t.level}/{t.problem_id}" for t in rep.missing[:20])
        more = "" if len(rep.missing) <= 20 else f" (+{len(rep.missing) - 20} more)"
        log(f"{len(rep.missing)} tasks have no solution (count as failures): {names}{more}")
    log(f"solutions: {len(rep.candidates)} candidates for {len(task_list)} tasks")


@app.command()
@bundle_options("stream", EvalStreamFlags)
def run(
    input: InputArg = None,
    output: OutputOpt = None,
    resume: ResumeOpt = False,
    on_error: OnErrorOpt = OnError.stop,
    shard: ShardOpt = None,
    claim: ClaimOpt = None,
    backend: Annotated[str, typer.Option(help="cuda | cpu | auto")] = "auto",
    gpus: GpusOpt = None,
    workers_per_gpu: WorkersPerGpuOpt = 2,
    compile_jobs: CompileJobsOpt = None,
    cpu_workers: CpuWorkersOpt = 1,
    window: WindowOpt = None,
    in_order: InOrderOpt = False,
    guard_policy: Annotated[str, typer.Option(help="strict | kernelbench | off")] = "kernelbench",
    atol: Annotated[float, typer.Option(help="Absolute tolerance.")] = 1e-2,
    rtol: Annotated[float, typer.Option(help="Relative tolerance.")] = 1e-2,
    stress_trials: Annotated[
        bool,
        typer.Option(
            "--stress-trials/--no-stress-trials",
            help="Numerics stress trials too (the robust setting): nan_inf, denormal, near_max "
            "and offset inputs, one trial each (off: the paper's protocol).",
        ),
    ] = False,
    shape_check: Annotated[
        bool,
        typer.Option(
            "--shape-check/--no-shape-check",
            help="Verify a correct solution again at a resized instance of its problem (sizes "
            "scaled by 0.75; a failure there: incorrect, G-SHAPE-GENERALISATION; `report` shows "
            "the passes at resized shapes). With --stress-trials: the robust setting.",
        ),
    ] = False,
    timing: Annotated[
        bool, typer.Option("--timing/--no-timing", help="Time candidates and baselines.")
    ] = True,
    timing_config: Annotated[
        str | None,
        typer.Option(
            help="Profiler timing settings as JSON, e.g. '{\"time_cap_s\": 3.0}' (default: the "
            "protocol's)."
        ),
    ] = None,
    compile_baseline: Annotated[
        bool,
        typer.Option(
            "--compile-baseline/--no-compile-baseline",
            help="Also time torch.compile per task (cuda; 10-30 s of CPU and GPU per new task, "
            "cached): --no-compile-baseline reports speed-ups vs eager only.",
        ),
    ] = True,
    baseline_compile_mode: Annotated[
        str,
        typer.Option(
            help="torch.compile mode of that baseline: default | max-autotune | "
            "max-autotune-no-cudagraphs | reduce-overhead (what speedup_vs_compile compares with)."
        ),
    ] = "default",
    paired_eager: PairedEagerOpt = None,
    ray_address: RayOpt = None,
    ray_workers: RayWorkersOpt = None,
    timing_cpus: TimingCpusOpt = "auto",
    *,
    stream: EvalStreamFlags,
) -> None:
    """Evaluate Candidate records (from `solutions`) in the sandbox; write EvalResult records
    carrying level, problem id, name and the guard policy (what `report` needs), each as it is
    done (`--in-order`: in input order).

    Candidates go through one sandbox pool concurrently, as in `sandbox eval`: --compile-jobs
    compile on the CPU ahead of the devices, --workers-per-gpu per GPU overlap their correctness
    phases (timing holds the GPU alone), at most --window in flight. Killed and run again with
    `-o FILE --resume`, only the candidates without a line in FILE are evaluated.

    The default guard policy is `kernelbench` (PyTorch allowed in ModelNew, but a custom kernel
    must do real work), the rule of KernelBench's own leaderboard; use `strict` for the CUDA
    Agent rules. Example:
    kernelbench-eval run --backend cuda --gpus all -o results.jsonl --resume < candidates.jsonl
    """
    from cuda_agent.sandbox.stream import evaluate_stream, sandbox_config

    try:
        tcfg = json.loads(timing_config) if timing_config else None
    except json.JSONDecodeError as e:
        raise fail(f"--timing-config: not JSON: {e}") from None
    if tcfg is not None and not isinstance(tcfg, dict):
        raise fail("--timing-config: a JSON object expected")
    if tcfg:
        from cuda_agent.profiler.config import TimingConfig

        bad = TimingConfig.unknown_keys(tcfg)
        if bad:
            raise fail(f"--timing-config: unknown key(s) {', '.join(bad)}")
    stream.check()
    cfg = sandbox_config(
        backend=backend,
        guard_policy=guard_policy,
        atol=atol,
        rtol=rtol,
        stress_trials=stress_trials,
        shape_check=shape_check,
        timing=timing,
        baselines=timing,
        timing_config=tcfg,
        workers_per_gpu=workers_per_gpu,
        compile_baseline=None if compile_baseline else False,
        baseline_compile_mode=baseline_compile_mode,
        paired_eager=paired_eager,
        timing_cpus=timing_cpus,
    )

    evaluate_stream(
        cfg,
        stream,
        finish=lambda c, r: with_run_meta(c, r, guard_policy),
        desc="kernelbench-eval run",
    )


def with_run_meta(c: Candidate, r: EvalResult, guard_policy: str) -> EvalResult:
    """``r`` as `run` writes it: the candidate's meta merged over the result's, plus the task's
    name, the guard policy and its level and problem id (what `report` reads). Shared with the
    throughput benchmark's ``service`` runner, whose results must match `run`'s line for line."""
    import msgspec

    meta = {**r.meta, **c.meta, "name": c.task.name, "guard_policy": guard_policy}
    if c.task.level is not None:
        meta.setdefault("level", c.task.level)
        meta.setdefault("problem_id", c.task.problem_id)
    return msgspec.structs.replace(r, meta=meta)


@app.command()
def report(
    input: InputArg = None,
    tasks_file: Annotated[
        Path | None,
        typer.Option("--tasks", help="The tasks evaluated (problems without a result = failures)."),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out-dir", help="Write report.json, report.md, speedup.png here."),
    ] = None,
    threshold: Annotated[float, typer.Option(help="Margin for '>5% faster'.")] = 0.05,
    compile_mode: Annotated[
        str,
        typer.Option(
            help="With results of several compile baselines (`run --baseline-compile-mode`): "
            "the mode whose results make the main table; every mode gets its compile columns."
        ),
    ] = "default",
    on_error: OnErrorOpt = OnError.stop,
) -> None:
    """Summarise EvalResult records (or agent Trajectory records) per level and overall; JSON on
    stdout.

    Without --tasks, the level and problem id come from each result's meta (set by `run`).
    Results of runs against different torch.compile baselines (each result's
    ``meta.baseline_compile_mode``) can be given together: the main table is ``--compile-mode``'s,
    and a table of speed-ups vs each mode's compile baseline follows (``by_compile_mode``).

    Example: kernelbench-eval report --tasks tasks.jsonl --out-dir report/ < results.jsonl
    """
    from . import metrics as M
    from .report import markdown, plot

    results: list[EvalResult] = []

    def take(r):
        if isinstance(r, Trajectory):  # an agent's episode: its final evaluation
            if r.eval_result is not None:
                results.append(r.eval_result)
        else:
            results.append(r)
        return ()

    run_stream(
        take,
        input=input,
        on_error=on_error,
        expect=(EvalResult, Trajectory),
        key=lambda r: "",
        quiet=True,
    )
    if tasks_file is not None:
        try:
            task_list = load_records(tasks_file, Task)
        except DecodeError as e:
            raise fail(f"{tasks_file}: {e}") from None
    else:
        task_list = tasks_from_results(results)
    if not task_list:
        raise fail(
            "no problems to report (give --tasks, or results carrying level/problem_id meta)"
        )
    by_mode: dict[str, list[EvalResult]] = {}
    for r in results:
        by_mode.setdefault(M.compile_mode_of(r), []).append(r)
    if len(by_mode) > 1:
        if compile_mode not in by_mode:
            raise fail(f"--compile-mode {compile_mode}: the results' modes are {sorted(by_mode)}")
        results = by_mode[compile_mode]
    outs = M.outcomes(task_list, results)
    rows = M.compute_metrics(outs, threshold)
    mode_rows = {
        m: M.compute_metrics(M.outcomes(task_list, rs), threshold)
        for m, rs in sorted(by_mode.items(), key=lambda kv: (kv[0] != compile_mode, kv[0]))
    }
    guards = sorted({str(r.meta.get("guard_policy", "?")) for r in results}) or ["?"]
    tols = sorted(
        {f"{r.correctness.atol:g}/{r.correctness.rtol:g}" for r in results if r.correctness}
    )
    # results that ended before the device phase carry only the backend name ("cuda")
    names = {r.device for r in results}
    devices = sorted({d for d in names if d not in ("cuda", "cpu")} or names) or ["?"]
    settings = {
        "threshold": f"{threshold:.0%}",
        "guard policy": ",".join(guards),
        "atol/rtol": ",".join(tols) or "?",
        "device": ",".join(devices),
        "results": len(results),
    }
    if any(isinstance(r.meta.get("shape_check"), dict) for r in results):
        settings["shape check"] = "on"
    if any(r.speedup_vs_compile is not None for r in results):  # a compile baseline was timed
        settings["compile baseline"] = compile_mode if len(by_mode) > 1 else next(iter(by_mode))
    doc = {
        "settings": settings,
        "levels": [r.as_dict() for r in rows],
        "problems": [o.__dict__ for o in outs],
        "definitions": M.__doc__,
    }
    if len(by_mode) > 1:
        doc["by_compile_mode"] = {m: [r.as_dict() for r in rs] for m, rs in mode_rows.items()}
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
        (out_dir / "report.md").write_text(
            markdown(rows, settings, mode_rows if len(by_mode) > 1 else None)
        )
        plot(outs, out_dir / "speedup.png")
        log(f"report written to {out_dir}/ (report.json, report.md, speedup.png)")


def tasks_from_results(results: list[EvalResult]) -> list[Task]:
    """Minimal tasks rebuilt from result meta (level, problem_id, name)."""
    seen: dict[str, Task] = {}
    for r in results:
        m = r.meta
        if "level" in m and "problem_id" in m and r.task_id not in seen:
            seen[r.task_id] = Task(
                id=r.task_id,
                name=str(m.get("name", r.task_id)),
                ref_code="",
                source="kernelbench",
                level=int(m["level"]),
                problem_id=int(m["problem_id"]),
            )
    return list(seen.values())


if __name__ == "__main__":
    app()
