"""``guards`` CLI: fast static verdicts on candidate streams, the check table, resized tasks."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated

import typer

from cuda_agent.records.cli_helpers import (
    InputArg,
    OnError,
    OnErrorOpt,
    OutputOpt,
    ResumeOpt,
    ShardOpt,
    StreamFlags,
    bundle_options,
)

app = typer.Typer(
    help="""Anti-reward-hacking guards: static verdicts, the check registry, resized tasks.

Examples:

  guards check --policy strict < candidates.jsonl > verdicts.jsonl

  guards list --markdown
""",
    no_args_is_help=True,
    add_completion=False,
)

PolicyOpt = Annotated[
    str, typer.Option("--policy", help="strict (CUDA-Agent rules) | kernelbench | off.")
]


@app.command()
@bundle_options("stream", StreamFlags)
def check(
    input: InputArg = None,
    output: OutputOpt = None,
    resume: ResumeOpt = False,
    on_error: OnErrorOpt = OnError.stop,
    shard: ShardOpt = None,
    policy: PolicyOpt = "strict",
    backend: Annotated[
        str, typer.Option(help="Backend recorded in the results: cuda | cpu.")
    ] = "cuda",
    *,
    stream: StreamFlags,
) -> None:
    """Static verdict per candidate (no compile, no GPU): one eval_result per candidate line,
    status guard_violation when a check rejects, else ok (meaning: passed the static guards only;
    meta.stage == "static").

    Example: guards check candidates.jsonl --policy strict > verdicts.jsonl
    """
    from cuda_agent.records import Candidate, EvalResult, Status

    from .checks import check_policy
    from .static import analyze

    try:
        check_policy(policy)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if backend not in ("cuda", "cpu"):
        raise typer.BadParameter("--backend must be cuda or cpu")

    def process(cand: Candidate):  # noqa: ANN202
        t0 = time.perf_counter()
        rep = analyze(cand, policy)
        rejects = [f for f in rep.findings if f.severity == "reject"]
        flags = len(rep.findings) - len(rejects)
        if rejects:
            codes = sorted({f.code for f in rejects})
            msg = f"static guards: {len(rejects)} reject ({', '.join(codes)}), {flags} flag"
        else:
            msg = f"static guards: no reject, {flags} flag"
        yield EvalResult(
            task_id=cand.task.id,
            solution_id=cand.solution.id,
            backend=backend,  # type: ignore[arg-type]
            device="static",
            status=Status.GUARD_VIOLATION if rejects else Status.OK,
            message=msg,
            guards=rep.findings,
            seconds=time.perf_counter() - t0,
            meta={
                "stage": "static",
                "policy": policy,
                "kernels": rep.kernels,
                "preprocessed": rep.preprocessed,
            },
        )

    stream.run(process, expect=(Candidate,), desc="guards check")


@app.command("list")
def list_checks(
    markdown: Annotated[bool, typer.Option(help="A Markdown table instead of JSON lines.")] = False,
) -> None:
    """Every check: code, description, stages, severity under strict and kernelbench.

    Example: guards list --markdown
    """
    from .checks import CHECKS

    if markdown:
        print("| code | what it checks | catches | stage | strict | kernelbench |")
        print("| --- | --- | --- | --- | --- | --- |")
    for c in CHECKS.values():
        if markdown:
            print(
                f"| `{c.code}` | {c.description} | {c.catches} | {', '.join(c.stages)} | "
                f"{c.strict or '-'} | {c.kernelbench or '-'} |"
            )
        else:
            print(
                json.dumps(
                    {
                        "code": c.code,
                        "description": c.description,
                        "catches": c.catches,
                        "stages": list(c.stages),
                        "strict": c.strict,
                        "kernelbench": c.kernelbench,
                    }
                )
            )


@app.command("resize-task")
@bundle_options("stream", StreamFlags)
def resize_task(
    input: InputArg = None,
    output: OutputOpt = None,
    on_error: OnErrorOpt = OnError.stop,
    factor: Annotated[float, typer.Option(help="Scale of the input size constants.")] = 0.75,
    *,
    stream: StreamFlags,
) -> None:
    """Tasks with their input size constants scaled (shape-generalisation variants); tasks with
    nothing to resize are skipped (counted on stderr). The new task's meta.resized_from is the
    original id.

    Example: guards resize-task tasks.jsonl --factor 0.75 > tasks_resized.jsonl
    """
    from cuda_agent.records import Task

    from .shapes import resize_task_source

    skipped = 0

    def process(task: Task):  # noqa: ANN202
        nonlocal skipped
        new = resize_task_source(task.ref_code, factor)
        if new is None:
            skipped += 1
            return
        meta = dict(task.meta, resized_from=task.id, resize_factor=factor)
        yield Task.make(
            f"{task.name}@x{factor:g}",
            new,
            source=task.source,
            level=task.level,
            problem_id=task.problem_id,
            ops=task.ops,
            meta=meta,
        )

    stream.run(process, expect=(Task,), desc="guards resize-task")
    if skipped:
        print(f"{skipped} task(s) had no size constant to change", file=sys.stderr)


if __name__ == "__main__":
    app()
