"""Shared pieces of the PPO tests: a tiny-model config on the cpu sandbox and a dense reward."""

import pytest

from cuda_agent.ppo.config import PPOConfig
from cuda_agent.records import RecordWriter, Task

REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
"""


def _tasks(path):
    with RecordWriter(path) as w:
        for i in range(3):
            w.write(Task.make(f"ReLU_{i}", REF + f"# {i}\n"))
    return path


def _cfg(tmp_path, **ppo):
    from cuda_agent.ppo.config import DataCfg, ModelCfg, PPOCfg, RolloutCfg, SandboxCfg, TrainCfg

    return PPOConfig(
        model=ModelCfg(tiny=True),
        data=DataCfg(
            tasks=str(_tasks(tmp_path / "tasks.jsonl")), tasks_per_step=2, samples_per_task=4
        ),
        rollout=RolloutCfg(
            mode="single-turn", max_new_tokens=6, temperature=1.0, include_skill=False
        ),
        sandbox=SandboxCfg(backend="cpu"),
        ppo=PPOCfg(**{"steps": 6, "epochs": 2, "actor_lr": 3e-3, "critic_lr": 3e-3, **ppo}),
        train=TrainCfg(out=str(tmp_path / "run"), device="cpu", tensorboard=False, save_every=100),
    )


def _target_reward(tok):
    """The fraction of generated tokens (end-of-turn excluded) from the first quarter of the
    vocabulary: about 0.25 for a random model, 1.0 at best; dense enough to learn in a few steps."""
    cut = len(tok) // 4
    eot = tok.convert_tokens_to_ids("<|im_end|>")

    def reward(t):
        ids = [x for x, m in zip(t.token_ids, t.loss_mask, strict=True) if m and x != eot]
        return sum(1 for x in ids if x < cut) / max(len(ids), 1)

    return reward


@pytest.fixture
def ppo_cfg(tmp_path):
    """``ppo_cfg(**ppo_overrides) -> PPOConfig`` in ``tmp_path`` (tiny model, cpu sandbox)."""
    return lambda **ppo: _cfg(tmp_path, **ppo)


@pytest.fixture
def target_reward():
    """``target_reward(tokenizer) -> reward_fn`` (see ``_target_reward``)."""
    return _target_reward
