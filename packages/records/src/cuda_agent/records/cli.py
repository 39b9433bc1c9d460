"""``records``: validate, inspect and summarise JSONL record streams."""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from typing import Annotated

import typer

from .cli_helpers import InputArg, OnError, OnErrorOpt, fail, log, run_stream
from .jsonl import DecodeError, RecordWriter, read_records
from .types import KINDS, EvalResult, Trajectory

app = typer.Typer(
    help="""Validate, inspect and summarise cuda-agent JSONL record streams.

Examples:

  records validate tasks.jsonl --kind task

  cat results.jsonl | records stats

  records head -n 3 trajectories.jsonl | records validate --kind trajectory
""",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

KindOpt = Annotated[
    str | None,
    typer.Option("--kind", help=f"Require this record kind ({', '.join(KINDS)})."),
]


def _kind_type(kind: str | None):
    if kind is None:
        return None
    if kind not in KINDS:
        raise typer.BadParameter(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    return (KINDS[kind],)


@app.command()
def validate(
    input: InputArg = None, kind: KindOpt = None, on_error: OnErrorOpt = OnError.stop
) -> None:
    """Check every line decodes as a record (of --kind); print counts by kind and status to stderr.

    Example: records validate results.jsonl --kind eval_result
    """
    counts: Counter[str] = Counter()
    statuses: Counter[str] = Counter()

    def count(rec):
        counts[rec.__struct_config__.tag] += 1
        if isinstance(rec, EvalResult):
            statuses[str(rec.status)] += 1
        return ()

    stats = run_stream(
        count, input=input, on_error=on_error, expect=_kind_type(kind), key=lambda r: "", quiet=True
    )
    log(f"{stats.read} lines, {sum(counts.values())} valid, {stats.bad_lines} malformed")
    for k, v in sorted(counts.items()):
        log(f"  {k}: {v}")
    for k, v in sorted(statuses.items()):
        log(f"  status {k}: {v}")
    if stats.bad_lines:
        raise typer.Exit(2)


@app.command()
def head(
    input: InputArg = None,
    n: Annotated[int, typer.Option("-n", help="Number of records.")] = 10,
) -> None:
    """Write the first N valid records (a malformed line before them stops with exit 2).

    Example: records head -n 3 tasks.jsonl
    """
    w = RecordWriter(None)
    for _, rec in read_records(input):
        if w.count >= n:
            break
        if isinstance(rec, DecodeError):
            raise fail(str(rec))
        w.write(rec)


@app.command()
def sample(
    input: InputArg = None,
    n: Annotated[int, typer.Option("-n", help="Number of records.")] = 10,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
) -> None:
    """Write N records drawn uniformly (reservoir sampling, one pass, input order kept).

    Example: records sample -n 100 --seed 1 tasks.jsonl > subset.jsonl
    """
    rng = random.Random(seed)
    reservoir: list[tuple[int, object]] = []
    for seen, (lineno, rec) in enumerate(read_records(input), start=1):
        if isinstance(rec, DecodeError):
            raise fail(str(rec))
        if len(reservoir) < n:
            reservoir.append((lineno, rec))
        else:
            j = rng.randrange(seen)
            if j < n:
                reservoir[j] = (lineno, rec)
    w = RecordWriter(None)
    for _, rec in sorted(reservoir, key=lambda x: x[0]):
        w.write(rec)


@app.command()
def stats(input: InputArg = None, on_error: OnErrorOpt = OnError.stop) -> None:
    """Print counts by kind, the status histogram and the reward histogram as JSON on stdout.

    Example: records stats results.jsonl
    """
    kinds: Counter[str] = Counter()
    status: Counter[str] = Counter()
    rewards: Counter[str] = Counter()
    speedups: list[float] = []

    def visit(rec):
        kinds[rec.__struct_config__.tag] += 1
        res = rec.eval_result if isinstance(rec, Trajectory) else rec
        if isinstance(res, EvalResult):
            status[str(res.status)] += 1
            if res.speedup_vs_eager is not None:
                speedups.append(res.speedup_vs_eager)
        reward = getattr(rec, "reward", None)
        if reward is not None:
            rewards[f"{reward:g}"] += 1
        return ()

    st = run_stream(visit, input=input, on_error=on_error, key=lambda r: "", quiet=True)
    out = {
        "lines": st.read,
        "malformed": st.bad_lines,
        "kinds": dict(sorted(kinds.items())),
        "status": dict(sorted(status.items())),
        "reward": dict(sorted(rewards.items(), key=lambda kv: float(kv[0]))),
    }
    if speedups:
        import math

        out["geomean_speedup_vs_eager"] = math.exp(
            sum(math.log(s) for s in speedups) / len(speedups)
        )
    sys.stdout.write(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    app()
