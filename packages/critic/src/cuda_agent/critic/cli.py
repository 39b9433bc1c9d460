"""``critic``: value pretraining of the critic on sampled trajectories."""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer

from cuda_agent.records.cli_helpers import fail
from cuda_agent.training.train_options import (
    DataOpt,
    LocalRankOpt,
    ModelOpt,
    OutDirOpt,
    train_config,
    training_command,
)

app = typer.Typer(
    help="""Critic initialisation by value pretraining on GAE targets.

Examples:

  critic pretrain --model runs/rft/final --data trajectories.jsonl \\
      --out runs/critic

  deepspeed --num_gpus 8 --module cuda_agent.critic.cli pretrain \\
      --model runs/rft/final --data trajectories.jsonl --out runs/critic \\
      --deepspeed configs/ds_zero2.json
""",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _main(local_rank: LocalRankOpt = -1) -> None:
    """Value model and value pretraining."""


@app.command()
@training_command
def pretrain(
    model: ModelOpt,
    data: DataOpt,
    out: OutDirOpt,
    opts: dict,
    gamma: Annotated[float, typer.Option(help="GAE discount per policy token.")] = 1.0,
    lam: Annotated[float, typer.Option("--lambda", help="GAE lambda.")] = 1.0,
) -> None:
    """Regress V(s_t) on GAE targets over the policy tokens of rewarded trajectories.

    --model is the actor (a fresh fp32 value head is added) or a critic directory.
    Example: critic pretrain --model runs/rft/final --data trajectories.jsonl --out runs/critic
    """
    from cuda_agent.agent.models import resolve_model
    from cuda_agent.training.data import load_examples
    from cuda_agent.training.trainer import TrainError
    from cuda_agent.training.trainer import train as run_train

    from .pretrain import ValueObjective

    if not (0.0 <= lam <= 1.0 and 0.0 <= gamma <= 1.0):
        raise fail("--gamma and --lambda must lie in [0, 1]")
    cfg = train_config(out, opts, extra={"gamma": gamma, "lambda": lam})
    try:
        resolve_model(model)  # fail fast, before any heavy import
        examples = load_examples(
            None if str(data) == "-" else data, max_len=opts["max_len"], need_reward=True
        )
        result = run_train(ValueObjective(gamma, lam, opts["seed"]), model, examples, cfg)
    except (TrainError, ValueError) as e:
        raise fail(f"critic pretrain: {e}") from None
    if os.environ.get("RANK", "0") == "0":
        (out / "summary.json").write_text(json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    app()
