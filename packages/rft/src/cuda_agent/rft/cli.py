"""``rft``: select good agent trajectories and fine-tune the policy on its own tokens."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from cuda_agent.records import Trajectory
from cuda_agent.records.cli_helpers import (
    InputArg,
    OnError,
    OnErrorOpt,
    OutputOpt,
    ResumeOpt,
    ShardOpt,
    StreamFlags,
    bundle_options,
    fail,
    log,
)
from cuda_agent.records.jsonl import RecordWriter
from cuda_agent.training.train_options import (
    DataOpt,
    LocalRankOpt,
    ModelOpt,
    OutDirOpt,
    train_config,
    training_command,
)

from .select import SCHEMA_COUNTERS, TRUNCATION_STOP_REASONS, SelectConfig, SelectStats

app = typer.Typer(
    help="""Rejection fine-tuning (RFT) of the actor on its own good trajectories.

Examples:

  rft select --dropped dropped.jsonl < trajectories.jsonl > kept.jsonl

  rft train --model smollm2 --data kept.jsonl --out runs/rft

  deepspeed --num_gpus 8 --module cuda_agent.rft.cli train --model ckpt \\
      --data kept.jsonl --out runs/rft --deepspeed configs/ds_zero2.json
""",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _main(local_rank: LocalRankOpt = -1) -> None:
    """Rejection fine-tuning."""


@app.command()
@bundle_options("stream", StreamFlags)
def select(
    input: InputArg = None,
    output: OutputOpt = None,
    resume: ResumeOpt = False,
    on_error: OnErrorOpt = OnError.stop,
    shard: ShardOpt = None,
    dropped: Annotated[
        Path | None,
        typer.Option("--dropped", help="Append one line per dropped trajectory (id, reason)."),
    ] = None,
    min_reward: Annotated[float, typer.Option(help="Keep reward > this.")] = 0.0,
    max_same_call: Annotated[
        int, typer.Option(help="Drop when one identical tool call occurs more often than this.")
    ] = 3,
    max_same_write: Annotated[
        int,
        typer.Option(help="Drop when the same content is written to a path more often than this."),
    ] = 2,
    max_schema_violations: Annotated[
        int, typer.Option(help=f"Drop above this many of: {', '.join(SCHEMA_COUNTERS)}.")
    ] = 0,
    max_truncated_turns: Annotated[
        int, typer.Option(help="Drop above this many turns cut by the per-turn token limit.")
    ] = 0,
    truncation: Annotated[
        list[str] | None,
        typer.Option(
            "--truncation-stop-reason",
            help=f"Stop reasons that mean truncation (default: {', '.join(TRUNCATION_STOP_REASONS)}).",
        ),
    ] = None,
    *,
    stream: StreamFlags,
) -> None:
    """Keep trajectories worth imitating; count every drop by reason on stderr.

    Example: rft select --dropped dropped.jsonl < trajectories.jsonl > kept.jsonl
    """
    cfg = SelectConfig(
        min_reward=min_reward,
        max_same_call=max_same_call,
        max_same_write=max_same_write,
        max_schema_violations=max_schema_violations,
        max_truncated_turns=max_truncated_turns,
        truncation_stop_reasons=tuple(truncation) if truncation else TRUNCATION_STOP_REASONS,
    )
    import msgspec

    from .select import Drop, drop_reason

    stats = SelectStats()
    already: set[str] = set()
    if resume and dropped is not None and dropped.exists():
        # drops of an interrupted run are done too (they are not in -o FILE)
        from cuda_agent.records.jsonl import iter_lines, repair_tail

        repair_tail(dropped)
        for _, line in iter_lines(dropped):
            try:
                already.add(msgspec.json.decode(line, type=Drop).id)
            except msgspec.DecodeError:
                continue
    drops = RecordWriter(dropped, append=True) if dropped is not None else None

    def process(t: Trajectory):
        if t.id in already:
            return []
        why = drop_reason(t, cfg)
        if why is None:
            stats.kept += 1
            return [t]
        stats.dropped[why[0]] += 1
        if drops is not None:
            drops.write(
                Drop(id=t.id, task_id=t.task.id, reason=why[0], detail=why[1], reward=t.reward)
            )
        return []

    try:
        stream.run(process, expect=(Trajectory,), desc="rft select")
    finally:
        if drops is not None:
            drops.close()
        log(stats.summary())


@app.command()
@training_command
def train(model: ModelOpt, data: DataOpt, out: OutDirOpt, opts: dict) -> None:
    """Fine-tune on the policy tokens (loss_mask = 1) of selected trajectories.

    Example: rft select < trajectories.jsonl | rft train --model smollm2 --data - --out runs/rft
    """
    from cuda_agent.agent.models import load_tokenizer, resolve_model
    from cuda_agent.training.data import load_examples
    from cuda_agent.training.trainer import TrainError
    from cuda_agent.training.trainer import train as run_train

    from .sft import SFTObjective

    cfg = train_config(out, opts)
    try:
        resolve_model(model)  # fail fast, before any heavy import
        examples = load_examples(None if str(data) == "-" else data, max_len=opts["max_len"])
        tok = load_tokenizer(model, required=False)
        result = run_train(
            SFTObjective(),
            model,
            examples,
            cfg,
            save_extra=(lambda d: tok.save_pretrained(d)) if tok is not None else None,
        )
    except (TrainError, ValueError) as e:
        raise fail(f"rft train: {e}") from None
    if os.environ.get("RANK", "0") == "0":
        (out / "summary.json").write_text(json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    app()
