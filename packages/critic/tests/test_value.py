"""The value model and value pretraining on a tiny random Llama."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from cuda_agent.critic.gae import gae, terminal_rewards
from cuda_agent.critic.model import HEAD_FILE, ValueModel
from cuda_agent.critic.pretrain import ValueObjective, evaluate, policy_mask, value_loss
from cuda_agent.training.data import collate, example_from_trajectory
from cuda_agent.training.metrics import read_metrics
from cuda_agent.training.trainer import TrainConfig, train


def test_value_head_is_fp32_and_values_line_up_with_tokens(tiny_model, trajectories):
    model = ValueModel.from_pretrained(tiny_model, dtype=torch.bfloat16)
    assert model.value_head.weight.dtype == torch.float32
    batch = collate([example_from_trajectory(t) for t in trajectories[:2]])
    with torch.no_grad():
        v = model(batch["input_ids"])
        h = model.backbone(input_ids=batch["input_ids"]).last_hidden_state.float()
        direct = model.value_head(h).squeeze(-1)
    assert v.dtype == torch.float32 and v.shape == batch["input_ids"].shape
    assert torch.all(v[:, 0] == 0)
    # V(s_t) is read from the hidden state of position t - 1
    assert torch.allclose(v[:, 1:], direct[:, :-1])


def test_tokens_with_mask_zero_get_no_gradient(tiny_model, trajectories):
    model = ValueModel.from_pretrained(tiny_model)
    batch = collate([example_from_trajectory(t) for t in trajectories[:3]])
    seen = {}

    def keep(_m, _i, out):
        out.retain_grad()
        seen["v"] = out

    model.register_forward_hook(keep)
    loss, _ = value_loss(model, batch, gamma=1.0, lam=0.9)
    loss.backward()
    g = seen["v"].grad
    mask = policy_mask(batch).bool()
    assert torch.all(g[~mask] == 0)
    assert torch.all(g[mask] != 0)
    assert int((~mask & batch["attention_mask"].bool()).sum()) > 100  # tool outputs are there


def test_value_loss_is_the_per_trajectory_token_mean(tiny_model, trajectories):
    model = ValueModel.from_pretrained(tiny_model)
    exs = [example_from_trajectory(t) for t in trajectories[:3]]
    batch = collate(exs)
    with torch.no_grad():
        loss, sums = value_loss(model, batch)
        v = model(batch["input_ids"])
    mask = policy_mask(batch)
    by_hand = 0.0
    for b, e in enumerate(exs):
        pol = [t for t in range(1, len(e)) if e.loss_mask[t]]
        by_hand += 0.5 * sum((float(v[b, t]) - e.reward) ** 2 for t in pol) / len(pol)
    assert float(loss) == pytest.approx(by_hand, rel=1e-5)
    _, ret = gae(v, terminal_rewards(mask, batch["rewards"]), mask)
    assert torch.allclose(ret[mask.bool()], batch["rewards"][:, None].expand_as(ret)[mask.bool()])
    assert sums["n_tok"] == float(mask.sum())


def test_save_and_reload_gives_identical_values(tiny_model, trajectories, tmp_path):
    model = ValueModel.from_pretrained(tiny_model, seed=3)
    with torch.no_grad():
        model.value_head.bias.fill_(0.25)
    model.save_pretrained(tmp_path / "critic")
    assert (tmp_path / "critic" / HEAD_FILE).is_file()
    again = ValueModel.from_pretrained(tmp_path / "critic")
    ids = collate([example_from_trajectory(trajectories[0])])["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(ids), again(ids))
    # from the actor, the head is fresh (seeded), not the saved one
    fresh = ValueModel.from_pretrained(tiny_model, seed=3)
    assert float(fresh.value_head.bias.detach()) == 0.0


def test_value_pretraining_fits_the_targets(tiny_model, trajectories, tmp_path):
    exs = [example_from_trajectory(t) for t in trajectories]
    assert len({e.reward for e in exs}) > 1
    before = evaluate(ValueModel.from_pretrained(tiny_model), exs)
    cfg = TrainConfig(
        out=tmp_path, lr=1e-2, max_steps=8, batch_tokens=4096, device="cpu", tensorboard=False
    )
    train(ValueObjective(1.0, 1.0), tiny_model, exs, cfg)
    after = evaluate(ValueModel.from_pretrained(tmp_path / "final"), exs)
    assert after["value_loss"] < 0.5 * before["value_loss"], (before, after)
    assert after["explained_variance"] > before["explained_variance"]
    m = read_metrics(tmp_path / "metrics.jsonl")
    assert len(m) == 8 and {"value_loss", "explained_variance"} <= set(m[0])


def test_cli_pretrain_end_to_end(tiny_model, data_file, tmp_path):
    out = tmp_path / "critic"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cuda_agent.critic.cli",
            "pretrain",
            "--model",
            str(tiny_model),
            "--data",
            str(data_file),
            "--out",
            str(out),
            "--max-steps",
            "3",
            "--lambda",
            "0.95",
            "--lr",
            "1e-3",
            "--batch-tokens",
            "2048",
            "--device",
            "cpu",
            "--save-every",
            "2",
            "--no-tensorboard",
        ],
        capture_output=True,
        timeout=300,
    )
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert r.stdout == b""
    assert "step 3/3" in err and "explained_variance" in err
    assert (out / "final" / HEAD_FILE).is_file() and (out / "final" / "config.json").is_file()
    assert (out / "checkpoint-2").is_dir() and (out / "checkpoint-3").is_dir()
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["step"] == 3 and state["config"]["extra"] == {"gamma": 1.0, "lambda": 0.95}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 3 and "value_loss" in summary
