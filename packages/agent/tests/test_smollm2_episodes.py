"""The embedded default policy end to end: SmolLM2-135M-Instruct runs two short real episodes in
the real sandbox (cpu backend) and writes valid trajectories. Its kernels are expected to fail;
the plumbing is what is tested."""

import subprocess
import sys

import pytest

from cuda_agent.records import RecordWriter, Task, Trajectory, load_records

REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return []
"""


@pytest.mark.slow
def test_smollm2_two_episodes(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    with RecordWriter(tasks) as w:
        w.write(Task.make("ReLU", REF, level=1))
    out = tmp_path / "traj.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "cuda_agent.agent.cli",
        "rollout",
        "--policy",
        "smollm2",
        "--tasks",
        str(tasks),
        "--samples",
        "2",
        "--max-turns",
        "2",
        "--max-new-tokens",
        "48",
        "--max-context",
        "8192",
        "--backend",
        "cpu",
        "--no-skill",
        "--seed",
        "0",
        "--workdir",
        str(tmp_path / "ws"),
        "-o",
        str(out),
    ]
    p = subprocess.run(cmd, capture_output=True, timeout=1500)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    trajs = load_records(out, Trajectory)
    assert len(trajs) == 2 and len({t.id for t in trajs}) == 2
    for t in trajs:
        assert t.stop_reason in ("max_turns", "submit", "no_tool_call", "context_overflow")
        assert 1 <= t.counters["turns"] <= 2
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs) > 0
        assert sum(t.loss_mask) == t.counters["policy_tokens"]
        assert all(lp <= 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m)
        assert t.reward is not None and t.reward_reason
    # the rerun with --resume does nothing
    p = subprocess.run([*cmd, "--resume"], capture_output=True, timeout=600)
    assert p.returncode == 0 and b"2 already done" in p.stderr
    assert len(load_records(out, Trajectory)) == 2
