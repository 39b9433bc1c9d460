"""The kernel tasks as a verifiers environment, scored by the sandbox through verifiers' own
``Task.score``: answers given as files (or the test fixture's ReLU kernel and a prose answer).

    uv sync --extra verifiers
    uv run python packages/adapters/examples/verifiers_env.py --backend cpu
    # your tasks and a model's answer (fenced blocks naming model_new.py and kernels/*)
    uv run python packages/adapters/examples/verifiers_env.py --tasks tasks.jsonl --answer a.md
    # evaluation by a running `kernel-service serve` (token in $CUDA_AGENT_SERVICE_TOKEN)
    uv run python packages/adapters/examples/verifiers_env.py --service http://127.0.0.1:8470

Prints the environment, the first task's prompt, and each answer's reward, verdict and reason.
A rollout with a model needs verifiers' harness and a chat-completions endpoint (README).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import verifiers.v1 as vf
from verifiers.v1.trace import TraceTask

from cuda_agent.adapters.verifiers import load_environment
from cuda_agent.records import Task

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "relu"


def fixture_answer() -> str:
    """The ReLU fixture's solution as a single-turn answer (one fenced block per file)."""
    files = {"model_new.py": (FIX / "model_new.py").read_text()}
    files |= {f"kernels/{p.name}": p.read_text() for p in sorted((FIX / "kernels").iterdir())}
    return "\n".join(
        f"```{'python' if p.endswith('.py') else 'cpp'} {p}\n{t}```" for p, t in files.items()
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", help="tasks JSONL (default: the ReLU fixture task)")
    ap.add_argument("--answer", action="append", help="a file holding an answer (repeatable)")
    ap.add_argument("--backend", default="auto", help="cuda | cpu | auto")
    ap.add_argument("--service", default="", help="a kernel-service URL (default: a local pool)")
    ap.add_argument("--no-skill", action="store_true", help="a one-line system prompt")
    a = ap.parse_args()
    tasks = a.tasks or [Task.make("relu", (FIX / "model.py").read_text())]
    env = load_environment(
        tasks, backend=a.backend, service_url=a.service, include_skill=not a.no_skill
    )
    task = next(iter(env.taskset))
    print(f"{type(env).__name__} over {type(env.taskset).__name__}: task {task.data.name}")
    print(task.data.prompt[:400], "...\n")
    texts = [Path(p).read_text() for p in a.answer or []] or [fixture_answer(), "only prose"]
    traces = [
        vf.Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key),
            agent=vf.AgentInfo(config=vf.AgentConfig()),
            nodes=[
                vf.MessageNode(message=vf.UserMessage(content=task.data.prompt)),
                vf.MessageNode(parent=0, message=vf.AssistantMessage(content=t), sampled=True),
            ],
        )
        for t in texts
    ]

    async def score_all() -> None:
        await asyncio.gather(*(task.score(t) for t in traces))

    asyncio.run(score_all())
    for i, t in enumerate(traces):
        k = t.info["kernel"]
        print(
            f"answer {i}: reward {t.rewards['kernel_reward'].score:+.0f}  {k['status']}: {k['reason']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
