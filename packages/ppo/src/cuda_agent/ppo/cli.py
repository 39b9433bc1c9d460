"""``ppo``: single-turn warm-up and multi-turn agentic PPO."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cuda_agent.records.cli_helpers import fail
from cuda_agent.training.train_options import LocalRankOpt

app = typer.Typer(
    help="""PPO for CUDA kernel agents (the CUDA Agent recipe's RL stages).

Examples:

  ppo train --config configs/tiny-cpu.toml --set ppo.steps=2 \\
      --set 'data.tasks="runs/demo/data/tasks.jsonl"' \\
      --set 'train.out="runs/ppo"'

  torchrun --nproc_per_node=8 -m cuda_agent.ppo.cli train --config C ...

  deepspeed --num_gpus 8 --module cuda_agent.ppo.cli train --config C ...

RUN in the configs' data.tasks and train.out is not expanded (bin/train_all.sh
sets both): give them with --set. The DeepSpeed launcher's --local_rank is
accepted and ignored (LOCAL_RANK is read).

Metrics: OUT/metrics.jsonl (and TensorBoard in OUT/tb); episodes: OUT/trajectories.jsonl;
checkpoints: OUT/checkpoint-N/{actor,critic}.
""",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _main(local_rank: LocalRankOpt = -1) -> None:
    """PPO for CUDA kernel agents."""


@app.command()
def train(
    config: Annotated[Path, typer.Option("--config", help="TOML config (see configs/).")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a key: section.key=value (TOML value). Repeatable."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the latest checkpoint.")
    ] = False,
) -> None:
    """Run PPO steps as configured; metrics and checkpoints go to train.out.

    Example: ppo train --config configs/tiny-cpu.toml --set ppo.steps=2
    --set 'data.tasks="runs/demo/data/tasks.jsonl"' --set 'train.out="runs/ppo"'
    """
    from .config import ConfigError, load_config
    from .trainer import PPOError
    from .trainer import train as run

    try:
        cfg = load_config(config, set_ or [])
    except ConfigError as e:
        raise fail(str(e)) from None
    try:
        run(cfg, resume=resume)
    except (PPOError, FileNotFoundError) as e:
        raise fail(f"ppo: {e}", 1) from None


@app.command("check-config")
def check_config(
    config: Annotated[Path, typer.Option("--config", help="TOML config.")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="section.key=value")] = None,
) -> None:
    """Validate a config and print it with every default filled in (JSON on stdout).

    Example: ppo check-config --config configs/paper-8xh100.toml
    """
    import json

    import msgspec

    from .config import ConfigError, load_config

    try:
        cfg = load_config(config, set_ or [])
    except ConfigError as e:
        raise fail(str(e)) from None
    print(json.dumps(msgspec.to_builtins(cfg), indent=2))


@app.command("config-env")
def config_env(
    config: Annotated[Path, typer.Option("--config", help="TOML config.")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="section.key=value")] = None,
) -> None:
    """Print the validated config as shell exports (CA_SECTION_KEY=value), for bin/ scripts.

    Example: eval "$(ppo config-env --config configs/tiny-cpu.toml)"; echo $CA_PPO_STEPS
    """
    from .config import ConfigError, load_config, shell_env

    try:
        cfg = load_config(config, set_ or [])
    except ConfigError as e:
        raise fail(str(e)) from None
    print(shell_env(cfg), end="")


if __name__ == "__main__":
    app()
