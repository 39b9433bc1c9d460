"""The kernel environment as an OpenRLHF multi-turn agent: pass this file to
``openrlhf.cli.train_ppo_ray --train.agent_func_path`` (it defines ``AgentExecutor``), settings in
``CUDA_AGENT_OPENRLHF_*`` variables (README).

Run directly, it writes the prompt dataset, or runs one episode through OpenRLHF's own
``MultiTurnAgentExecutor`` with scripted actions (list the workspace, write the ReLU fixture's
solution, Submit) instead of vLLM::

    python packages/adapters/examples/openrlhf_agent.py dataset --tasks tasks.jsonl --out d.jsonl
    CUDA_AGENT_OPENRLHF_BACKEND=cpu python packages/adapters/examples/openrlhf_agent.py demo

``demo`` prints each step's tool results and the episode's reward (1.0: the fixture kernel is
correct on the cpu backend). It needs openrlhf importable (``pip install --no-deps openrlhf
pylatexenc`` is enough for its agent module).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

from cuda_agent.adapters.openrlhf import AgentExecutor, AgentInstance, ScriptedEngine, write_dataset
from cuda_agent.records import Task

__all__ = ["AgentExecutor", "AgentInstance"]

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "relu"


def call(name: str, **arguments: str) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def demo(backend: str) -> int:
    from cuda_agent.adapters.openrlhf import dataset_rows
    from cuda_agent.adapters.trl import task_to_column
    from cuda_agent.agent.models import load_tokenizer, make_tiny_model

    os.environ.setdefault("CUDA_AGENT_OPENRLHF_BACKEND", backend)
    os.environ.setdefault("CUDA_AGENT_OPENRLHF_TIMING", "0")
    task = Task.make("relu", (FIX / "model.py").read_text())
    tok = load_tokenizer(str(make_tiny_model(Path(tempfile.mkdtemp()) / "tiny")))
    row = dataset_rows([task], backend=backend, include_skill=False)[0]
    prompt = tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    files = {"model_new.py": (FIX / "model_new.py").read_text()}
    files |= {f"kernels/{p.name}": p.read_text() for p in sorted((FIX / "kernels").iterdir())}
    actions = [call("Bash", command="ls -R")]
    actions += [call("Write", path=p, content=t) for p, t in files.items()]
    actions.append(call("Submit", summary="relu in a C++ kernel"))
    engine = ScriptedEngine(tok, actions)
    params = SimpleNamespace(max_tokens=None, logprobs=None)
    out = asyncio.run(
        AgentExecutor().execute(prompt, task_to_column(task), params, 32768, tok, engine)
    )
    print(f"{len(out['action_ranges'])} actions, {len(out['observation_tokens'])} tokens")
    print(f"reward {out['reward']}, score {out['scores']}, logs {out['extra_logs']}")
    return 0 if out["reward"] > 0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dataset", help="write the prompt/label JSONL for --data.prompt_dataset")
    d.add_argument("--tasks", required=True, help="tasks JSONL")
    d.add_argument("--out", required=True)
    d.add_argument("--backend", default="cuda", help="the evaluator's backend: cuda | cpu")
    d.add_argument("--service", action="store_true", help="tools of a service workspace")
    d.add_argument("--no-skill", action="store_true", help="a one-line system prompt")
    m = sub.add_parser("demo", help="one scripted episode through OpenRLHF's executor")
    m.add_argument("--backend", default="cpu")
    a = ap.parse_args()
    if a.cmd == "demo":
        return demo(a.backend)
    path = write_dataset(
        a.tasks, a.out, backend=a.backend, service=a.service, include_skill=not a.no_skill
    )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
