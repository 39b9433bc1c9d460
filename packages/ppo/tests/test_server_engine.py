"""PPO with ``rollout.engine = "server"``: two steps of the tiny model whose rollouts come from
the reference server (a real HTTP server in a subprocess), reloaded from disk after the update."""

import msgspec
import pytest
import torch

from cuda_agent.agent.models import load_causal_lm, load_tokenizer, make_tiny_model
from cuda_agent.agent.serve import launch
from cuda_agent.agent.server_policy import ServerClient
from cuda_agent.ppo.config import ConfigError, load_config
from cuda_agent.ppo.trainer import PPOError, train
from cuda_agent.records import Trajectory, load_records


def policy_logprobs(model, t):
    """The model's log-probs (temperature 1) of ``t``'s policy tokens, one forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([t.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[i - 1, t.token_ids[i]]) for i, m in enumerate(t.loss_mask) if m]


def max_diff(a, b):
    assert len(a) == len(b) > 0
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_two_steps_roll_out_from_the_reloaded_server(tmp_path, ppo_cfg, target_reward):
    cfg = ppo_cfg(steps=2, epochs=1)
    run = tmp_path / "run"
    tiny = make_tiny_model(run / "tiny-actor", seed=cfg.train.seed)  # what the trainer uses
    with launch(tiny, log=tmp_path / "server.log", served_model_name="actor") as srv:
        cfg = msgspec.structs.replace(
            cfg,
            rollout=msgspec.structs.replace(cfg.rollout, engine="server", server_url=srv.url),
            train=msgspec.structs.replace(cfg.train, save_every=1, keep_checkpoints=2),
        )
        hist = train(cfg, reward_fn=target_reward(load_tokenizer(tiny)))
        info = ServerClient(srv.url).model_info()
    assert len(hist) == 2 and all(h["server_reload_s"] > 0 for h in hist)
    # told to load before step 1 and after the update of step 1 (not after the last update)
    wdir = run / "server-weights"
    assert info["reloads"] == 2 and info["model_path"] == str((wdir / "step-1").resolve())
    assert sorted(p.name for p in wdir.iterdir()) == ["step-1"]
    trajs = load_records(run / "trajectories.jsonl", Trajectory)
    by_step = {s: [t for t in trajs if t.meta["ppo_step"] == s] for s in (1, 2)}
    assert len(by_step[1]) == len(by_step[2]) == 8
    assert all(t.meta["policy"] == "ppo-actor" and t.meta["token_exact"] for t in trajs)
    m0 = load_causal_lm(tiny, dtype=torch.float32).eval()
    m1 = load_causal_lm(run / "checkpoint-1" / "actor", dtype=torch.float32).eval()
    for t in by_step[1]:  # the initial weights
        pol = [lp for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m]
        assert max_diff(pol, policy_logprobs(m0, t)) < 1e-4
    moved = 0.0
    for t in by_step[2]:  # the weights after update 1, as checkpoint-1 saved them
        pol = [lp for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m]
        assert max_diff(pol, policy_logprobs(m1, t)) < 1e-4
        moved = max(moved, max_diff(pol, policy_logprobs(m0, t)))
    assert moved > 1e-2  # and not the initial weights


def test_server_engine_config_and_a_dead_server(tmp_path, ppo_cfg, target_reward):
    p = tmp_path / "c.toml"
    p.write_text('[rollout]\nengine = "server"\n')
    with pytest.raises(ConfigError, match="needs rollout.server_url"):
        load_config(p)
    p.write_text('[rollout]\nengine = "vllm"\n')
    with pytest.raises(ConfigError):
        load_config(p)
    cfg = ppo_cfg(steps=1)
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    cfg = msgspec.structs.replace(
        cfg,
        rollout=msgspec.structs.replace(
            cfg.rollout, engine="server", server_url=dead, server_retries=1
        ),
    )
    with pytest.raises(PPOError, match="rollout server weights .*no answer after 2 tries"):
        train(cfg, reward_fn=lambda t: 0.0)
