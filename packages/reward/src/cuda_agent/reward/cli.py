"""``reward``: fill ``reward`` and ``reward_reason`` of EvalResult and Trajectory records."""

from __future__ import annotations

from typing import Annotated

import typer

from cuda_agent.records import EvalResult, Trajectory
from cuda_agent.records.cli_helpers import (
    InputArg,
    OnError,
    OnErrorOpt,
    OutputOpt,
    ResumeOpt,
    run_stream,
)

from .schemes import SCHEMES, RewardConfig, apply

app = typer.Typer(
    help="""Score evaluation results and trajectories with a reward scheme.

Examples:

  reward score < results.jsonl > rewarded.jsonl

  reward score --scheme log-speedup --no-ci trajectories.jsonl -o scored.jsonl --resume

Schemes: paper (-1/1/2/3, the CUDA Agent schedule), speedup (clipped speed-up vs compile),
log-speedup (1 + log2 speed-up vs compile, clipped).
""",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _main() -> None:
    """Reward functions for CUDA kernel RL."""


@app.command()
def score(
    input: InputArg = None,
    output: OutputOpt = None,
    resume: ResumeOpt = False,
    on_error: OnErrorOpt = OnError.stop,
    scheme: Annotated[str, typer.Option(help=f"One of: {', '.join(SCHEMES)}.")] = "paper",
    threshold: Annotated[float, typer.Option(help="Speed-up margin that counts as faster.")] = 0.05,
    ci: Annotated[
        bool,
        typer.Option("--ci/--no-ci", help="Decide on the speed-up CI's lower end when present."),
    ] = True,
    clip: Annotated[float, typer.Option(help="Upper clip of the speedup schemes.")] = 10.0,
) -> None:
    """Fill reward and reward_reason on each EvalResult / Trajectory record.

    Example: reward score < results.jsonl > rewarded.jsonl
    """
    if scheme not in SCHEMES:
        raise typer.BadParameter(f"unknown scheme {scheme!r}; one of {', '.join(SCHEMES)}")
    cfg = RewardConfig(scheme=scheme, threshold=threshold, use_ci=ci, clip=clip)
    run_stream(
        lambda rec: [apply(rec, cfg)],
        input=input,
        output=output,
        resume=resume,
        on_error=on_error,
        expect=(EvalResult, Trajectory),
        desc="reward score",
    )


if __name__ == "__main__":
    app()
