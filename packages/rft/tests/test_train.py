"""Policy-token SFT on a tiny random Llama: masking, loss, normalisation, checkpoints, resume, CLI."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from cuda_agent.agent.models import load_causal_lm
from cuda_agent.rft.sft import SFTObjective, masked_nll, mean_nll, policy_nll
from cuda_agent.training.data import collate, example_from_trajectory
from cuda_agent.training.metrics import read_metrics
from cuda_agent.training.trainer import TrainConfig, TrainError, train


def _cfg(out, **kw):
    base = dict(out=out, lr=3e-3, batch_tokens=1024, device="cpu", tensorboard=False)
    base.update(kw)
    return TrainConfig(**base)


def test_tokens_with_mask_zero_get_no_gradient(tiny_model, trajectories):
    torch.manual_seed(0)
    model = load_causal_lm(tiny_model, dtype=torch.float32)
    batch = collate([example_from_trajectory(t) for t in trajectories[:2]])
    mask = batch["loss_mask"] * batch["attention_mask"]
    logits = model(input_ids=batch["input_ids"]).logits
    logits.retain_grad()
    nll, n = masked_nll(logits, batch["input_ids"], mask)
    nll.backward()
    has_grad = logits.grad.abs().sum(-1) > 0
    # logits[t] predicts token t+1: gradient exactly where token t+1 is a policy token
    expected = torch.zeros_like(has_grad)
    expected[:, :-1] = mask[:, 1:].bool()
    assert torch.equal(has_grad, expected)
    assert int((~expected[:, :-1] & batch["attention_mask"][:, 1:].bool()).sum()) > 100
    ref = {k: p.grad.clone() for k, p in model.named_parameters()}
    # the trainer's path (LM head only on policy positions) gives the same loss and gradients
    model.zero_grad()
    nll2, n2 = policy_nll(model, batch)
    nll2.backward()
    assert n2 == n and torch.allclose(nll2, nll, rtol=1e-5)
    for k, p in model.named_parameters():
        assert torch.allclose(p.grad, ref[k], rtol=1e-4, atol=1e-7), k


def test_save_and_reload_gives_identical_outputs(tiny_model, trajectories, tmp_path):
    torch.manual_seed(1)
    model = load_causal_lm(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    SFTObjective().save(model, tmp_path / "m")
    again = load_causal_lm(tmp_path / "m", dtype=torch.float32)
    ids = collate([example_from_trajectory(trajectories[0])])["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, again(input_ids=ids).logits)


def test_loss_falls_with_checkpointing_and_accumulation(tiny_model, trajectories, tmp_path):
    exs = [example_from_trajectory(t) for t in trajectories]
    before = mean_nll(load_causal_lm(tiny_model, dtype=torch.float32), exs)
    res = train(
        SFTObjective(), tiny_model, exs, _cfg(tmp_path, max_steps=6, grad_accum=2, grad_ckpt=True)
    )
    after = mean_nll(load_causal_lm(tmp_path / "final", dtype=torch.float32), exs)
    assert after < before - 0.3, (before, after)
    m = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in m] == [1, 2, 3, 4, 5, 6] and res["step"] == 6
    assert m[-1]["loss"] < m[0]["loss"]
    assert all(r["tokens_per_s"] > 0 and r["policy_tokens"] > 0 for r in m)
    assert (tmp_path / "final" / "tokenizer.json").exists() is False  # no save_extra given


def test_loss_is_a_token_mean_over_the_whole_step(tiny_model, trajectories, tmp_path):
    """One big micro-batch, or six accumulated ones: the same update."""
    exs = [example_from_trajectory(t) for t in trajectories]
    one = _cfg(tmp_path / "one", max_steps=1, batch_tokens=10**6, grad_accum=1)
    six = _cfg(tmp_path / "six", max_steps=1, batch_tokens=1024, grad_accum=6)
    r1 = train(SFTObjective(), tiny_model, exs, one)
    r3 = train(SFTObjective(), tiny_model, exs, six)
    assert r1["loss"] == pytest.approx(r3["loss"], rel=1e-5)
    a = load_file(tmp_path / "one" / "final" / "model.safetensors")
    b = load_file(tmp_path / "six" / "final" / "model.safetensors")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k


def test_resume_continues_from_the_right_step(tiny_model, trajectories, tmp_path):
    exs = [example_from_trajectory(t) for t in trajectories]
    train(SFTObjective(), tiny_model, exs, _cfg(tmp_path / "a", max_steps=5))
    part = train(SFTObjective(), tiny_model, exs, _cfg(tmp_path / "b", max_steps=5, stop_after=2))
    assert part["stopped"] and part["step"] == 2
    assert (tmp_path / "b" / "checkpoint-2").is_dir() and not (tmp_path / "b" / "final").exists()
    with pytest.raises(TrainError, match="total_steps"):
        train(SFTObjective(), tiny_model, exs, _cfg(tmp_path / "b", max_steps=7, resume=True))
    rest = train(SFTObjective(), tiny_model, exs, _cfg(tmp_path / "b", max_steps=5, resume=True))
    assert rest["step"] == 5 and not rest["stopped"]
    ma = read_metrics(tmp_path / "a" / "metrics.jsonl")
    mb = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in mb] == [1, 2, 3, 4, 5]
    for x, y in zip(ma, mb, strict=True):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-6), x["step"]
        assert x["lr"] == pytest.approx(y["lr"], rel=1e-9)
    a = load_file(tmp_path / "a" / "final" / "model.safetensors")
    b = load_file(tmp_path / "b" / "final" / "model.safetensors")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-7), k


def test_cli_select_piped_into_train(tiny_model, data_file, tmp_path):
    out = tmp_path / "run"
    py = shlex.quote(sys.executable)
    cmd = (
        f"{py} -m cuda_agent.rft.cli select --dropped {tmp_path}/dropped.jsonl"
        f" < {data_file} | {py} -m cuda_agent.rft.cli train --model {tiny_model} --data -"
        f" --out {out} --max-steps 2 --lr 1e-3 --batch-tokens 2048 --device cpu --no-tensorboard"
    )
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, timeout=300)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert r.stdout == b""  # stdout carries records only; train writes none
    assert "rft select: kept 6/6" in err and "step 2/2" in err
    assert (out / "final" / "model.safetensors").is_file()
    assert (out / "final" / "tokenizer.json").is_file()  # the tokenizer travels with the model
    assert len(read_metrics(out / "metrics.jsonl")) == 2


def test_cli_train_reports_bad_options_clearly(tiny_model, data_file, tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cuda_agent.rft.cli",
            "train",
            "--model",
            str(tmp_path),
            "--data",
            str(data_file),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert (
        "not a Hugging Face checkpoint" in r.stderr.decode() or "config.json" in r.stderr.decode()
    )


@pytest.mark.gpu
def test_bf16_autocast_keeps_fp32_master_weights_on_gpu(tiny_model, trajectories, tmp_path):
    exs = [example_from_trajectory(t) for t in trajectories]
    res = train(
        SFTObjective(),
        tiny_model,
        exs,
        _cfg(tmp_path, device="cuda", precision="auto", max_steps=3, grad_ckpt=True),
    )
    assert res["peak_mem_gib"] > 0 and res["loss"] == res["loss"]
    saved = load_file(tmp_path / "final" / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in saved.values())
