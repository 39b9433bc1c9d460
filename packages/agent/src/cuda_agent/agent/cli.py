"""``agent``: run episodes (rollout) and read them back (replay)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from cuda_agent.records import RecordWriter, Task, Trajectory
from cuda_agent.records.cli_helpers import (
    OnError,
    OnErrorOpt,
    OutputOpt,
    ResumeOpt,
    fail,
    log,
    run_stream,
)
from cuda_agent.records.jsonl import done_keys

app = typer.Typer(
    help="""Run the CUDA agent on tasks and inspect its episodes.

Examples:

  agent rollout --policy smollm2 --tasks tasks.jsonl --samples 2 -o trajectories.jsonl --resume

  agent rollout --policy openai:http://localhost:8000/v1#Qwen/Qwen3-8B --tasks tasks.jsonl > t.jsonl

  agent rollout --policy 'server:http://127.0.0.1:8000#smollm2' --tasks tasks.jsonl > t.jsonl

  agent replay trajectories.jsonl | less

Policies: smollm2 (the embedded SmolLM2-135M-Instruct), hf:DIR (any local checkpoint),
vllm:DIR (in-process vLLM: needs vLLM importable and a GPU), server:URL#MODEL[@TOKENIZER_DIR]
(token ids and log-probs from an inference server: vLLM, SGLang or python -m
cuda_agent.agent.serve), openai:URL#MODEL, scripted:FILE (a JSON list of assistant turns, for
tests and demos).
""",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def make_policy(
    spec: str, *, device: str, temperature: float, seed: int | None, max_new_tokens: int
) -> Any:
    """A policy object from a ``--policy`` spec (see the CLI help)."""
    from .policy import HFPolicy, ScriptedPolicy

    kind, _, rest = spec.partition(":")
    if kind == "openai":
        from .openai_policy import OpenAIPolicy

        return OpenAIPolicy.from_spec(rest, temperature=temperature, max_tokens=max_new_tokens)
    if kind == "server":
        from .server_policy import ServerPolicy

        return ServerPolicy.from_spec(rest, temperature=temperature, seed=seed)
    if kind == "vllm":
        from .vllm_policy import VLLMPolicy

        return VLLMPolicy.load(rest, temperature=temperature, seed=seed)
    if kind == "scripted":
        from .models import load_tokenizer

        path, _, model = rest.partition("@")
        turns = json.loads(Path(path).read_text())
        if not (isinstance(turns, list) and all(isinstance(t, str) for t in turns)):
            raise typer.BadParameter(f"{path}: a scripted policy is a JSON list of strings")
        return ScriptedPolicy(
            load_tokenizer(model or "smollm2"), turns, name=f"scripted:{Path(path).name}"
        )
    model = rest if kind == "hf" else spec
    return HFPolicy.load(model, device=device, temperature=temperature, seed=seed)


@app.command()
def rollout(
    tasks: Annotated[Path, typer.Option("--tasks", help="Task records (JSONL; '-' for stdin).")],
    policy: Annotated[
        str,
        typer.Option(
            help="smollm2 | hf:DIR | vllm:DIR | server:URL#MODEL[@TOKENIZER_DIR] | "
            "openai:URL#MODEL | scripted:FILE[@TOKENIZER_DIR]"
        ),
    ] = "smollm2",
    samples: Annotated[int, typer.Option(help="Episodes per task.")] = 1,
    concurrency: Annotated[
        int, typer.Option(help="Episodes run together (one batched generation per turn).")
    ] = 4,
    tool_workers: Annotated[
        int,
        typer.Option(help="Tool calls of different episodes run in parallel (1: one at a time)."),
    ] = 8,
    mode: Annotated[str, typer.Option(help="multi-turn | single-turn")] = "multi-turn",
    max_turns: Annotated[int, typer.Option(help="Turn limit of an episode.")] = 200,
    max_new_tokens: Annotated[int, typer.Option(help="Token limit of one turn.")] = 4096,
    max_context: Annotated[int, typer.Option(help="Context budget in tokens.")] = 131072,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0 = greedy).")] = 1.0,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
    device: Annotated[str, typer.Option(help="Device of an hf policy.")] = "cpu",
    backend: Annotated[str, typer.Option(help="Sandbox backend: cuda | cpu | auto.")] = "auto",
    workdir: Annotated[Path, typer.Option(help="Where episode workspaces are created.")] = Path(
        "runs/agent-workspaces"
    ),
    no_eval: Annotated[bool, typer.Option("--no-eval", help="Skip the final evaluation.")] = False,
    no_skill: Annotated[
        bool, typer.Option("--no-skill", help="Leave SKILL.md out of the prompt (ablation).")
    ] = False,
    output: OutputOpt = None,
    resume: ResumeOpt = False,
    on_error: OnErrorOpt = OnError.stop,
) -> None:
    """Run episodes of a policy on tasks; write one Trajectory record per episode.

    An episode whose model request, tool or evaluation raised is written too, with the failure in
    meta.error; the exit status is then 3 (0: no episode failed; 2: bad options or input).

    Example: agent rollout --policy smollm2 --tasks tasks.jsonl --samples 2 -o traj.jsonl --resume
    """
    from cuda_agent.sandbox.config import SandboxConfig

    from .env import SandboxEnv
    from .episode import EpisodeConfig, EpisodeRunner, episode_error, trajectory_id

    if mode not in ("multi-turn", "single-turn"):
        raise typer.BadParameter("--mode must be multi-turn or single-turn")
    if resume and output is None:
        raise fail("--resume needs -o FILE")
    task_list: list[Task] = []
    run_stream(
        lambda t: task_list.append(t) or (),
        input=None if str(tasks) == "-" else tasks,
        on_error=on_error,
        expect=(Task,),
        key=lambda r: "",
        quiet=True,
    )
    jobs = [(t, s) for t in task_list for s in range(samples)]
    done = done_keys(output) if resume and output is not None else set()
    kind, _, rest = policy.partition(":")
    if done and kind not in (
        "openai",
        "vllm",
        "server",
        "scripted",
    ):  # an hf model: its name is known
        from .policy import HFPolicy

        name = HFPolicy.name_for(rest if kind == "hf" else policy)
        if all(trajectory_id(t, name, s, mode) in done for t, s in jobs):
            log(f"rollout: {len(jobs)} episodes ({len(jobs)} already done), policy {name}")
            return
    from .server_policy import ServerError

    try:
        pol = make_policy(
            policy, device=device, temperature=temperature, seed=seed, max_new_tokens=max_new_tokens
        )
    except (ValueError, OSError, ServerError) as e:
        raise fail(f"--policy {policy}: {e}") from None
    todo = [(t, s) for t, s in jobs if trajectory_id(t, pol.name, s, mode) not in done]
    log(f"rollout: {len(jobs)} episodes ({len(jobs) - len(todo)} already done), policy {pol.name}")
    env = SandboxEnv(SandboxConfig(backend=backend))
    cfg = EpisodeConfig(
        mode=mode,
        max_turns=max_turns,
        max_new_tokens=max_new_tokens,
        max_context_tokens=max_context,
        evaluate=not no_eval,
        include_skill=not no_skill,
        tool_workers=max(1, tool_workers),
    )
    runner = EpisodeRunner(pol, env, cfg, workdir)
    failed = 0
    with env, RecordWriter(output) as w:
        for k in range(0, len(todo), max(1, concurrency)):
            chunk = todo[k : k + max(1, concurrency)]
            for traj in runner.run(chunk):
                w.write(traj)
                err = episode_error(traj)
                line = (
                    f"  {traj.task.name} #{traj.meta['sample']}: {traj.stop_reason}, "
                    f"{traj.counters.get('turns', 0)} turns, reward {traj.reward:+g}"
                )
                if err is not None:
                    failed += 1
                    line += f", FAILED ({err['stage']}): {err['type']}: {err['message'][:200]}"
                log(line)
    log(f"rollout: {w.count} trajectories written, {failed} failed")
    if failed:
        raise typer.Exit(3)


def render(t: Trajectory, width: int = 100) -> str:
    """A readable transcript of one trajectory."""
    bar = "=" * width
    lines = [
        bar,
        f"trajectory {t.id}  task {t.task.name} ({t.task.id})  policy {t.meta.get('policy', '?')}",
    ]
    lines.append(
        f"stop: {t.stop_reason}  reward: {t.reward}  ({t.reward_reason})  tokens: {len(t.token_ids)}"
        f" (policy {sum(t.loss_mask)})"
    )
    lines.append("counters: " + ", ".join(f"{k}={v}" for k, v in sorted(t.counters.items())))
    err = t.meta.get("error")
    if isinstance(err, dict):
        lines.append(
            f"FAILED ({err.get('stage')}): {err.get('type')}: {str(err.get('message'))[:500]}"
        )
    if t.eval_result is not None:
        r = t.eval_result
        lines.append(f"eval: {r.status} {r.message[:200]}  speed-up vs eager {r.speedup_vs_eager}")
    lines.append(bar)
    for i, m in enumerate(t.messages):
        content = (
            m.content
            if m.role != "system"
            else m.content[:300] + ("..." if len(m.content) > 300 else "")
        )
        lines.append(f"--- [{i}] {m.role}" + (f" ({m.tool_call_id})" if m.tool_call_id else ""))
        lines.append(content)
    return "\n".join(lines) + "\n"


@app.command()
def replay(
    input: Annotated[
        Path | None, typer.Argument(help="Trajectories (JSONL); stdin when omitted.")
    ] = None,
    on_error: OnErrorOpt = OnError.stop,
) -> None:
    """Print readable transcripts of trajectories (text, not records, on stdout).

    Example: agent replay trajectories.jsonl | less
    """
    run_stream(
        lambda t: sys.stdout.write(render(t)) and (),
        input=input,
        on_error=on_error,
        expect=(Trajectory,),
        key=lambda r: "",
        quiet=True,
    )


if __name__ == "__main__":
    app()
