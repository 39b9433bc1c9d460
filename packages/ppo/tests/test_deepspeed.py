"""PPO on the DeepSpeed backend (ZeRO-2 and ZeRO-3, one rank): learning signal flows, metrics are
finite, a resumed run reproduces the next step. Runs on a GPU, or on DeepSpeed's CPU accelerator
(gloo) where no GPU exists; skipped when deepspeed is not installed (`uv sync --extra deepspeed`)."""

import json
import math
from pathlib import Path

import msgspec
import pytest

pytest.importorskip("deepspeed")

from cuda_agent.ppo.trainer import train  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_stage_steps_and_resume(tmp_path, monkeypatch, stage, ppo_cfg, target_reward):
    import torch

    from cuda_agent.agent.models import load_tokenizer, make_tiny_model

    if not torch.cuda.is_available():
        monkeypatch.setenv("CUDA_AGENT_DEEPSPEED_CPU", "1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = ppo_cfg(steps=2, epochs=1, minibatches=2)

    def at(run, steps):
        return msgspec.structs.replace(
            base,
            ppo=msgspec.structs.replace(base.ppo, steps=steps),
            train=msgspec.structs.replace(
                base.train,
                out=str(tmp_path / run),
                device=device,
                deepspeed=str(ROOT / "configs" / f"ds_zero{stage}.json"),
                save_every=1,
            ),
        )

    for run in ("straight", "split"):
        tiny = make_tiny_model(tmp_path / run / "tiny-actor", seed=0)
    rf = target_reward(load_tokenizer(tiny))
    h = train(at("straight", 2), reward_fn=rf)
    assert len(h) == 2
    for m in h:
        for k in ("policy_loss", "value_loss", "actor_grad_norm", "critic_grad_norm", "entropy"):
            assert math.isfinite(m[k]), (k, m[k])
    assert h[0]["actor_grad_norm"] > 0
    ck = tmp_path / "straight" / "checkpoint-2"
    assert (ck / "actor" / "config.json").exists() and (ck / "actor-optim" / "deepspeed").is_dir()
    state = json.loads((ck / "ppo_state.json").read_text())
    assert state["backend"] == "deepspeed"

    train(at("split", 1), reward_fn=rf)
    h2 = train(at("split", 2), resume=True, reward_fn=rf)
    assert h2[0]["reward_mean"] == pytest.approx(h[1]["reward_mean"])
    tol = 1e-5 if device == "cpu" else 2e-2  # bf16 kernels on the GPU are not bitwise stable
    for k in ("policy_loss", "value_loss", "entropy"):
        assert h2[0][k] == pytest.approx(h[1][k], rel=tol, abs=tol), k
