"""Synthetic agent trajectories, token-exact, for tests and throughput benchmarks.

They have the shape the agent writes: a ChatML conversation (system, task, then turns of an
assistant message with a tool call and the tool's output), token ids of the whole conversation,
``loss_mask`` = 1 exactly on the assistant's tokens (its text and closing ``<|im_end|>``), rollout
log-probs on those tokens, ``tool_calls`` with results, a reward and a stop reason.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from cuda_agent.records import Message, Solution, Task, ToolCall, Trajectory, content_id

_REF = """import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * {k}

def get_inputs():
    return [torch.randn(1024, {n})]

def get_init_inputs():
    return []
"""

_KERNEL = """__global__ void k{i}(const float* x, float* y, int n) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaxf(x[i], 0.f) * {k}f;
}}
"""


def _chatml(tokenizer: Any, role: str, content: str) -> tuple[list[int], list[int]]:
    """Token ids of one ChatML message and its mask (1 on what an assistant generates)."""
    head = tokenizer.encode(f"<|im_start|>{role}\n", add_special_tokens=False)
    body = tokenizer.encode(content + "<|im_end|>", add_special_tokens=False)
    tail = tokenizer.encode("\n", add_special_tokens=False)
    policy = 1 if role == "assistant" else 0
    return head + body + tail, [0] * len(head) + [policy] * len(body) + [0] * len(tail)


def synthetic_trajectory(
    tokenizer: Any,
    index: int,
    *,
    turns: int = 3,
    tool_output_lines: int = 12,
    reward: float | None = None,
    seed: int = 0,
) -> Trajectory:
    """One realistic trajectory; deterministic in ``(index, seed)``."""
    rng = random.Random(seed * 7919 + index)
    k = rng.randint(2, 9)
    n = rng.choice([256, 512, 1024, 4096])
    task = Task.make(f"relu_scale_{k}_{n}", _REF.format(k=k, n=n), source="user")
    messages = [
        Message(role="system", content="You write fast CUDA kernels with the tools you have."),
        Message(role="user", content="Optimise this model:\n" + task.ref_code),
    ]
    calls: list[ToolCall] = []
    for turn in range(turns):
        if turn % 3 == 0:
            name, args = (
                "Write",
                {"path": f"kernels/k{turn}.cu", "content": _KERNEL.format(i=turn, k=k)},
            )
            result = "wrote " + args["path"]
        elif turn % 3 == 1:
            name, args = "Bash", {"command": "bash utils/compile.sh && python3 utils/verify.py"}
            lines = [
                f"[{i:03d}] nvcc -O3 -arch=sm_90 kernels/k{turn}.cu ok"
                for i in range(tool_output_lines)
            ]
            result = "\n".join(lines) + "\nverification passed: max_abs_err=0.0"
        else:
            name, args = "Bash", {"command": "python3 utils/profile.py"}
            lines = [
                f"trial {i}: {rng.uniform(0.01, 0.05):.4f} ms" for i in range(tool_output_lines)
            ]
            result = "\n".join(lines) + f"\nspeedup vs eager {rng.uniform(0.8, 3):.2f}x"
        thought = rng.choice(
            [
                "I will write a fused kernel first.",
                "Now compile and verify it.",
                "Let me profile the kernel against the baseline.",
                "The kernel is correct; check its speed.",
            ]
        )
        call_text = json.dumps({"name": name, "arguments": args})
        messages.append(
            Message(role="assistant", content=f"{thought}\n<tool_call>{call_text}</tool_call>")
        )
        messages.append(Message(role="tool", content=result, name=name))
        calls.append(ToolCall(turn=turn, name=name, arguments=args, result=result))
    messages.append(Message(role="assistant", content="Done: the kernel is faster. Submitting."))
    ids: list[int] = []
    mask: list[int] = []
    for m in messages:
        i, mk = _chatml(tokenizer, m.role, m.content)
        ids += i
        mask += mk
    logprobs = [round(-rng.uniform(0.0, 3.0), 4) if mk else 0.0 for mk in mask]
    if reward is None:
        reward = rng.choice([-1.0, 1.0, 2.0, 3.0])
    files = {f"kernels/k{c.turn}.cu": c.arguments["content"] for c in calls if c.name == "Write"}
    return Trajectory(
        id=content_id(task.id, str(index), str(seed)),
        task=task,
        messages=messages,
        token_ids=ids,
        loss_mask=mask,
        logprobs=logprobs,
        tool_calls=calls,
        solution=Solution.make("workdir", files, origin="synthetic") if files else None,
        reward=reward,
        reward_reason="synthetic",
        stop_reason="submit",
        counters={"turns": turns, "tool_calls": len(calls)},
    )


def synthetic_trajectories(tokenizer: Any, n: int, **kw: Any) -> list[Trajectory]:
    """``n`` trajectories from :func:`synthetic_trajectory` (indices 0..n-1)."""
    return [synthetic_trajectory(tokenizer, i, **kw) for i in range(n)]


def tiny_training_setup(root: Path, n: int = 6, **kw: Any) -> tuple[Path, list[Trajectory], Path]:
    """A tiny random-weight Llama under ``root/model`` and ``n`` synthetic trajectories of its
    tokenizer (``kw`` as :func:`synthetic_trajectory`), also written to ``root/trajectories.jsonl``:
    ``(model_dir, trajectories, data_path)``. What the trainer tests share."""
    from cuda_agent.agent.models import load_tokenizer, make_tiny_model
    from cuda_agent.records import RecordWriter

    model = make_tiny_model(root / "model", hidden_size=32, num_layers=2, num_heads=2, seed=0)
    trajs = synthetic_trajectories(load_tokenizer(model), n, **kw)
    path = root / "trajectories.jsonl"
    with RecordWriter(path, append=False) as w:
        w.write_all(trajs)
    return model, trajs, path
