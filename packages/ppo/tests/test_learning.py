"""PPO end to end on the CPU with a tiny random-weight model and a verifiable reward."""

import json

import pytest

from cuda_agent.ppo.config import load_config
from cuda_agent.ppo.trainer import train


def test_reward_rises(tmp_path, ppo_cfg, target_reward):
    from cuda_agent.agent.models import load_tokenizer

    cfg = ppo_cfg(use_critic=False, steps=6, epochs=4, minibatches=2, actor_lr=1e-2)
    # the tokenizer of the tiny model is created by the first step; build it the same way here
    from cuda_agent.agent.models import make_tiny_model

    tiny = make_tiny_model(tmp_path / "run" / "tiny-actor", seed=cfg.train.seed)
    hist = train(cfg, reward_fn=target_reward(load_tokenizer(tiny)))
    r = [h["reward_mean"] for h in hist]
    assert len(r) == 6
    first, last = sum(r[:2]) / 2, sum(r[-2:]) / 2
    assert last > first + 0.2, r
    assert all("clipfrac" in h and "approx_kl" in h and "entropy" in h for h in hist)


def test_trainer_logprobs_are_the_rollouts_at_its_temperature(tmp_path, ppo_cfg, target_reward):
    """A rollout sampled at temperature 0.7: the trainer's recomputed log-probs are those of the
    distribution sampled (logits / 0.7), so the PPO ratio and TIS weight start at 1."""
    import msgspec

    from cuda_agent.agent.models import load_tokenizer, make_tiny_model

    cfg = ppo_cfg(use_critic=False, steps=1, epochs=1)
    cfg = msgspec.structs.replace(
        cfg, rollout=msgspec.structs.replace(cfg.rollout, temperature=0.7, max_new_tokens=12)
    )
    tiny = make_tiny_model(tmp_path / "run" / "tiny-actor", seed=cfg.train.seed)
    (h,) = train(cfg, reward_fn=target_reward(load_tokenizer(tiny)))
    # at temperature 1 the same tokens' log-probs differ by about 0.06 on this model
    assert h["rollout_logp_diff"] < 1e-3, h["rollout_logp_diff"]
    assert h["tis_capped_frac"] == 0.0


def test_critic_per_turn_resume_and_metrics(tmp_path, ppo_cfg, target_reward):
    from cuda_agent.agent.models import load_tokenizer, make_tiny_model

    cfg = ppo_cfg(steps=2, epochs=1, per_turn_samples=True, kl_coef=0.01)
    tiny = make_tiny_model(tmp_path / "run" / "tiny-actor", seed=cfg.train.seed)
    rf = target_reward(load_tokenizer(tiny))
    import msgspec

    cfg1 = msgspec.structs.replace(cfg, ppo=msgspec.structs.replace(cfg.ppo, steps=1))
    h1 = train(cfg1, reward_fn=rf)
    assert (tmp_path / "run" / "checkpoint-1" / "actor" / "config.json").exists()
    assert (tmp_path / "run" / "checkpoint-1" / "critic" / "value_head.safetensors").exists()
    h2 = train(cfg, resume=True, reward_fn=rf)  # continues at step 2 only
    assert len(h1) == 1 and len(h2) == 1
    for k in (
        "explained_variance",
        "value_loss",
        "kl",
        "tis_capped_frac",
        "ratio_max",
        "rollout_s",
        "train_s",
    ):
        assert k in h2[0], k
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    trajs = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    assert len(trajs) == 16  # 2 steps x 2 tasks x 4 samples


def test_actor_lr_warms_up_then_holds(tmp_path, ppo_cfg, target_reward):
    """``ppo.actor_lr_warmup_steps`` optimizer steps of linear warm-up, then the LR is flat."""
    from cuda_agent.agent.models import load_tokenizer, make_tiny_model

    cfg = ppo_cfg(
        use_critic=False, steps=3, epochs=1, minibatches=2, actor_lr=1e-3, actor_lr_warmup_steps=4
    )
    tiny = make_tiny_model(tmp_path / "run" / "tiny-actor", seed=cfg.train.seed)
    hist = train(cfg, reward_fn=target_reward(load_tokenizer(tiny)))
    # two optimizer steps per PPO step: the LR of the next step after 2, 4, 6 of them
    assert [round(h["actor_lr"], 9) for h in hist] == [7.5e-4, 1e-3, 1e-3]


def test_config_validation(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[ppo]\nsteps = 3\n[rollout]\nmode = "single-turn"\n')
    cfg = load_config(p, ["ppo.eps_high=0.3", 'train.out="x"'])
    assert cfg.ppo.steps == 3 and cfg.ppo.eps_high == 0.3 and cfg.train.out == "x"
    assert cfg.ppo.eps_low == 0.2 and cfg.rollout.mode == "single-turn"
    from cuda_agent.ppo.config import ConfigError

    p.write_text("[ppo]\nstepz = 3\n")
    with pytest.raises(ConfigError, match="stepz"):
        load_config(p)
    p.write_text('[rollout]\nmode = "three-turn"\n')
    with pytest.raises(ConfigError):
        load_config(p)
    p.write_text("[ppo]\nactor_lr_warmup_steps = -1\n")
    with pytest.raises(ConfigError, match="actor_lr_warmup_steps"):
        load_config(p)


def test_resume_reproduces_the_next_step(tmp_path, ppo_cfg, target_reward):
    """Two steps in one run == one step, stop, resume for the second (same metrics)."""
    import msgspec

    from cuda_agent.agent.models import load_tokenizer, make_tiny_model

    base = ppo_cfg(steps=2, epochs=1, minibatches=2)

    def cfg_at(run):
        return msgspec.structs.replace(
            base, train=msgspec.structs.replace(base.train, out=str(tmp_path / run), save_every=1)
        )

    straight = cfg_at("straight")
    tiny = make_tiny_model(tmp_path / "straight" / "tiny-actor", seed=straight.train.seed)
    make_tiny_model(tmp_path / "split" / "tiny-actor", seed=straight.train.seed)
    rf = target_reward(load_tokenizer(tiny))
    h = train(straight, reward_fn=rf)
    split = cfg_at("split")
    one = msgspec.structs.replace(split, ppo=msgspec.structs.replace(split.ppo, steps=1))
    h1 = train(one, reward_fn=rf)
    h2 = train(split, resume=True, reward_fn=rf)
    assert h1[0]["reward_mean"] == h[0]["reward_mean"]
    for k in ("reward_mean", "policy_loss", "value_loss", "clipfrac", "approx_kl", "entropy"):
        assert h2[0][k] == pytest.approx(h[1][k], rel=1e-5, abs=1e-7), k


def test_an_episode_the_harness_failed_is_left_out_of_the_update(tmp_path, ppo_cfg, target_reward):
    """An episode cut short by an error of the harness (a model request, tool or workspace that
    raised: ``stop_reason == "error"``) says nothing about the policy: the update with it in the
    batch is the update without it, and the step counts it in ``error_excluded``."""
    import shutil

    import msgspec

    from cuda_agent.agent.models import load_tokenizer, make_tiny_model
    from cuda_agent.records import Trajectory
    from cuda_agent.records.jsonl import read_records

    cfg = ppo_cfg(use_critic=False, steps=1, epochs=1)
    run = tmp_path / "run"
    tiny = make_tiny_model(run / "tiny-actor", seed=cfg.train.seed)
    train(cfg, reward_fn=target_reward(load_tokenizer(tiny)))
    batch = [r for _, r in read_records(run / "trajectories.jsonl")]
    assert batch and all(isinstance(t, Trajectory) for t in batch)
    bad = msgspec.structs.replace(
        batch[0],
        stop_reason="error",
        reward=5.0,  # far from every honest reward: it would move the update if it were used
        meta={**batch[0].meta, "error": {"stage": "policy", "type": "URLError", "message": "x"}},
    )

    def replay(name, trajs):
        out = tmp_path / name
        out.mkdir()
        shutil.copytree(run / "tiny-actor", out / "tiny-actor")
        c = msgspec.structs.replace(cfg, train=msgspec.structs.replace(cfg.train, out=str(out)))
        hist = train(c, rollout_fn=lambda s: [msgspec.structs.replace(t) for t in trajs])
        import torch
        from safetensors.torch import load_file

        return hist[0], load_file(str(next((out / "final").glob("*.safetensors")))), torch

    m_clean, w_clean, torch = replay("clean", batch)
    m_bad, w_bad, _ = replay("with-error", [*batch, bad])
    assert m_bad["error_excluded"] == 1.0 and m_clean["error_excluded"] == 0.0
    assert m_bad["episodes"] == m_clean["episodes"]
    for k, v in w_clean.items():
        assert torch.equal(v, w_bad[k]), k


def test_critic_free_baselines_step_and_task():
    from cuda_agent.ppo.trainer import critic_free_baselines
    from cuda_agent.records import Task, Trajectory

    a, b = Task.make("A", "# a"), Task.make("B", "# b")
    trajs = [
        Trajectory(id=f"{t.name}{i}", task=t, reward=r)
        for i, (t, r) in enumerate([(a, 1.0), (a, -1.0), (b, -1.0), (b, -1.0)])
    ]
    assert critic_free_baselines(trajs, "step", -0.5) == [-0.5] * 4
    # GRPO-style groups: A's samples centre on 0, B's (all alike) get baseline = reward
    assert critic_free_baselines(trajs, "task", -0.5) == [0.0, 0.0, -1.0, -1.0]


def test_reward_rises_with_per_task_baselines(tmp_path, ppo_cfg, target_reward):
    from cuda_agent.agent.models import load_tokenizer, make_tiny_model

    cfg = ppo_cfg(
        use_critic=False,
        critic_free_baseline="task",
        steps=6,
        epochs=4,
        minibatches=2,
        actor_lr=1e-2,
    )
    tiny = make_tiny_model(tmp_path / "run" / "tiny-actor", seed=cfg.train.seed)
    r = [h["reward_mean"] for h in train(cfg, reward_fn=target_reward(load_tokenizer(tiny)))]
    assert sum(r[-2:]) / 2 > sum(r[:2]) / 2 + 0.2, r
