"""The command-line options every trainer shares (``rft train``, ``critic pretrain``), declared
once: :func:`training_command` adds them to a typer command, which receives them as ``opts``."""

import functools
import inspect
import typing
from pathlib import Path
from typing import Annotated, Any

import typer

from cuda_agent.records.cli_helpers import fail

ModelOpt = Annotated[
    str,
    typer.Option(help="Local Hugging Face checkpoint directory, or 'smollm2' (embedded default)."),
]
DataOpt = Annotated[
    Path, typer.Option(help="Trajectories JSONL ('-' = stdin, single process only).")
]
OutDirOpt = Annotated[Path, typer.Option(help="Run directory: checkpoints, final/, metrics.")]
# The DeepSpeed launcher (``deepspeed --num_gpus N --module cuda_agent.X.cli CMD ...``) puts
# ``--local_rank=N`` right after the module, before the command (unless ``--no_local_rank``): the
# CLIs' callbacks take it and ignore it (so do the trainer commands, should it come after the
# command). LOCAL_RANK in the environment, which every launcher sets, is what the trainers read.
LocalRankOpt = Annotated[
    int, typer.Option("--local_rank", hidden=True, help="Ignored (LOCAL_RANK is read).")
]

# (name, annotated type, default) of the options shared by every trainer, in --help order
TRAIN_OPTIONS: list[tuple[str, Any, Any]] = [
    ("lr", Annotated[float, typer.Option(help="Peak learning rate (AdamW).")], 1e-5),
    (
        "epochs",
        Annotated[float, typer.Option(help="Passes over the data (ignored with --max-steps).")],
        1.0,
    ),
    (
        "max_steps",
        Annotated[int | None, typer.Option(help="Optimizer steps (overrides --epochs).")],
        None,
    ),
    (
        "grad_accum",
        Annotated[int, typer.Option(help="Micro-batches per optimizer step and rank.")],
        1,
    ),
    (
        "batch_tokens",
        Annotated[int, typer.Option(help="Padded tokens per micro-batch (length-bucketed).")],
        16384,
    ),
    (
        "max_len",
        Annotated[int, typer.Option(help="Leave out trajectories longer than this.")],
        16384,
    ),
    (
        "warmup_steps",
        Annotated[int, typer.Option(help="Linear warm-up steps before the cosine decay.")],
        0,
    ),
    (
        "weight_decay",
        Annotated[float, typer.Option(help="AdamW weight decay (not on norms and biases).")],
        0.0,
    ),
    ("max_grad_norm", Annotated[float, typer.Option(help="Gradient-norm clip.")], 1.0),
    (
        "min_lr_ratio",
        Annotated[float, typer.Option(help="Final learning rate as a fraction of --lr.")],
        0.1,
    ),
    (
        "precision",
        Annotated[
            str,
            typer.Option(
                help="auto (bf16 autocast with fp32 master weights on GPU) | bf16 | fp32."
            ),
        ],
        "auto",
    ),
    (
        "grad_ckpt",
        Annotated[bool, typer.Option("--grad-ckpt/--no-grad-ckpt", help="Gradient checkpointing.")],
        False,
    ),
    (
        "deepspeed",
        Annotated[
            Path | None,
            typer.Option(help="DeepSpeed JSON (configs/ds_zero2.json, ds_zero3.json)."),
        ],
        None,
    ),
    (
        "save_every",
        Annotated[int, typer.Option(help="Checkpoint every N steps (0: at the end).")],
        0,
    ),
    ("keep_checkpoints", Annotated[int, typer.Option(help="Checkpoints to keep.")], 2),
    ("seed", Annotated[int, typer.Option(help="Seed of the data order and initialisation.")], 0),
    (
        "device",
        Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N (torch backend).")],
        "auto",
    ),
    (
        "stop_after",
        Annotated[
            int | None,
            typer.Option(
                help="Checkpoint and exit after N steps of this invocation (for job queues)."
            ),
        ],
        None,
    ),
    (
        "resume",
        Annotated[
            bool, typer.Option("--resume", help="Continue from the newest checkpoint in --out.")
        ],
        False,
    ),
    (
        "tensorboard",
        Annotated[bool, typer.Option("--tensorboard/--no-tensorboard", help="Also log to OUT/tb.")],
        True,
    ),
    # the DeepSpeed launcher passes --local_rank; the rank comes from the environment
    ("local_rank", LocalRankOpt, -1),
]
_NAMES = [n for n, _, _ in TRAIN_OPTIONS]


def training_command(fn: Any) -> Any:
    """``fn(<own options>, opts: dict)`` as a typer command that also takes every option of
    :data:`TRAIN_OPTIONS` (after its own); ``opts`` maps their names to the values given."""
    hints = typing.get_type_hints(fn, include_extras=True)
    own = [
        p.replace(annotation=hints.get(p.name, p.annotation))
        for p in inspect.signature(fn).parameters.values()
        if p.name != "opts"
    ]
    shared = [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=t, default=d)
        for n, t, d in TRAIN_OPTIONS
    ]

    @functools.wraps(fn)
    def command(**kw: Any) -> Any:
        opts = {n: kw.pop(n) for n in _NAMES}
        return fn(**kw, opts=opts)

    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + shared
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    del command.__wrapped__  # typer must read the signature above, not fn's
    return command


def train_config(out: Path, opts: dict[str, Any], extra: dict[str, Any] | None = None) -> Any:
    """The :class:`~cuda_agent.training.trainer.TrainConfig` of a trainer command's options."""
    from .trainer import TrainConfig

    deepspeed = opts["deepspeed"]
    if deepspeed is not None and not Path(deepspeed).is_file():
        raise fail(f"--deepspeed {deepspeed}: no such file")
    skip = {"max_len", "local_rank"}
    return TrainConfig(
        out=out, extra=extra or {}, **{k: v for k, v in opts.items() if k not in skip}
    )
