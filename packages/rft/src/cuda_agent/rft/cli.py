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
    fail,
    log,
    parse_shard,
    run_stream,
)
from cuda_agent.records.jsonl import RecordWriter

from .select import SCHEMA_COUNTERS, TRUNCATION_STOP_REASONS, SelectConfig, SelectStats

app = typer.Typer(
    help="""Rejection fine-tuning (RFT) of the actor on its own good trajectories.

Examples:

  rft select --dropped dropped.jsonl < trajectories.jsonl > kept.jsonl

  rft train --model smollm2 --data kept.jsonl --out runs/rft

  deepspeed --num_gpus 8 -m cuda_agent.rft.cli train --model ckpt --data kept.jsonl \\
      --out runs/rft --deepspeed configs/ds_zero2.json
""",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _main() -> None:
    """Rejection fine-tuning."""


@app.command()
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
        run_stream(
            process,
            input=input,
            output=output,
            resume=resume,
            on_error=on_error,
            shard=parse_shard(shard),
            expect=(Trajectory,),
            desc="rft select",
        )
    finally:
        if drops is not None:
            drops.close()
        log(stats.summary())


def _train_options(
    *,
    out: Path,
    lr: float,
    epochs: float,
    max_steps: int | None,
    grad_accum: int,
    batch_tokens: int,
    warmup_steps: int,
    weight_decay: float,
    max_grad_norm: float,
    min_lr_ratio: float,
    precision: str,
    grad_ckpt: bool,
    deepspeed: Path | None,
    save_every: int,
    keep_checkpoints: int,
    seed: int,
    device: str,
    stop_after: int | None,
    resume: bool,
    tensorboard: bool,
    extra: dict | None = None,
):
    from .trainer import TrainConfig

    if deepspeed is not None and not Path(deepspeed).is_file():
        raise fail(f"--deepspeed {deepspeed}: no such file")
    return TrainConfig(
        out=out,
        lr=lr,
        epochs=epochs,
        max_steps=max_steps,
        grad_accum=grad_accum,
        batch_tokens=batch_tokens,
        warmup_steps=warmup_steps,
        weight_decay=weight_decay,
        max_grad_norm=max_grad_norm,
        min_lr_ratio=min_lr_ratio,
        precision=precision,
        grad_ckpt=grad_ckpt,
        deepspeed=deepspeed,
        save_every=save_every,
        keep_checkpoints=keep_checkpoints,
        seed=seed,
        device=device,
        stop_after=stop_after,
        resume=resume,
        tensorboard=tensorboard,
        extra=extra or {},
    )


# Options shared by every trainer CLI (rft train, critic pretrain, ppo).
ModelOpt = Annotated[
    str,
    typer.Option(help="Local Hugging Face checkpoint directory, or 'smollm2' (embedded default)."),
]
DataOpt = Annotated[
    Path, typer.Option(help="Trajectories JSONL ('-' = stdin, single process only).")
]
OutDirOpt = Annotated[Path, typer.Option(help="Run directory: checkpoints, final/, metrics.")]
LrOpt = Annotated[float, typer.Option(help="Peak learning rate (AdamW).")]
EpochsOpt = Annotated[float, typer.Option(help="Passes over the data (ignored with --max-steps).")]
MaxStepsOpt = Annotated[int | None, typer.Option(help="Optimizer steps (overrides --epochs).")]
GradAccumOpt = Annotated[int, typer.Option(help="Micro-batches per optimizer step and rank.")]
BatchTokensOpt = Annotated[
    int, typer.Option(help="Padded tokens per micro-batch (length-bucketed).")
]
MaxLenOpt = Annotated[int, typer.Option(help="Leave out trajectories longer than this.")]
WarmupOpt = Annotated[int, typer.Option(help="Linear warm-up steps before the cosine decay.")]
WdOpt = Annotated[float, typer.Option(help="AdamW weight decay (not on norms and biases).")]
ClipOpt = Annotated[float, typer.Option(help="Gradient-norm clip.")]
MinLrOpt = Annotated[float, typer.Option(help="Final learning rate as a fraction of --lr.")]
PrecisionOpt = Annotated[
    str, typer.Option(help="auto (bf16 autocast with fp32 master weights on GPU) | bf16 | fp32.")
]
GradCkptOpt = Annotated[
    bool, typer.Option("--grad-ckpt/--no-grad-ckpt", help="Gradient checkpointing.")
]
DeepSpeedOpt = Annotated[
    Path | None, typer.Option(help="DeepSpeed JSON (configs/ds_zero2.json, ds_zero3.json).")
]
SaveEveryOpt = Annotated[int, typer.Option(help="Checkpoint every N steps (0: at the end).")]
KeepOpt = Annotated[int, typer.Option(help="Checkpoints to keep.")]
SeedOpt = Annotated[int, typer.Option(help="Seed of the data order and initialisation.")]
DeviceOpt = Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N (torch backend).")]
StopAfterOpt = Annotated[
    int | None,
    typer.Option(help="Checkpoint and exit after N steps of this invocation (for job queues)."),
]
TrainResumeOpt = Annotated[
    bool, typer.Option("--resume", help="Continue from the newest checkpoint in --out.")
]
TbOpt = Annotated[bool, typer.Option("--tensorboard/--no-tensorboard", help="Also log to OUT/tb.")]


@app.command()
def train(
    model: ModelOpt,
    data: DataOpt,
    out: OutDirOpt,
    lr: LrOpt = 1e-5,
    epochs: EpochsOpt = 1.0,
    max_steps: MaxStepsOpt = None,
    grad_accum: GradAccumOpt = 1,
    batch_tokens: BatchTokensOpt = 16384,
    max_len: MaxLenOpt = 16384,
    warmup_steps: WarmupOpt = 0,
    weight_decay: WdOpt = 0.0,
    max_grad_norm: ClipOpt = 1.0,
    min_lr_ratio: MinLrOpt = 0.1,
    precision: PrecisionOpt = "auto",
    grad_ckpt: GradCkptOpt = False,
    deepspeed: DeepSpeedOpt = None,
    save_every: SaveEveryOpt = 0,
    keep_checkpoints: KeepOpt = 2,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    stop_after: StopAfterOpt = None,
    resume: TrainResumeOpt = False,
    tensorboard: TbOpt = True,
    local_rank: Annotated[int, typer.Option("--local_rank", hidden=True)] = -1,
) -> None:
    """Fine-tune on the policy tokens (loss_mask = 1) of selected trajectories.

    Example: rft select < trajectories.jsonl | rft train --model smollm2 --data - --out runs/rft
    """
    from .data import load_examples
    from .modeling import load_tokenizer, resolve_model_dir
    from .sft import SFTObjective
    from .trainer import TrainError
    from .trainer import train as run_train

    cfg = _train_options(**{k: v for k, v in locals().items() if k in _CFG_KEYS})
    try:
        resolve_model_dir(model)  # fail fast, before any heavy import
        examples = load_examples(None if str(data) == "-" else data, max_len=max_len)
        tok = load_tokenizer(model)
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


_CFG_KEYS = {
    "out",
    "lr",
    "epochs",
    "max_steps",
    "grad_accum",
    "batch_tokens",
    "warmup_steps",
    "weight_decay",
    "max_grad_norm",
    "min_lr_ratio",
    "precision",
    "grad_ckpt",
    "deepspeed",
    "save_every",
    "keep_checkpoints",
    "seed",
    "device",
    "stop_after",
    "resume",
    "tensorboard",
}


if __name__ == "__main__":
    app()
