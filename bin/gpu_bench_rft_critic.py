"""Helpers of bin/gpu-check-rft-critic.sh: build the benchmark model and data; summarise runs.

  python3 bin/gpu_bench_rft_critic.py setup DIR [--n 64 --turns 16 --lines 30]
  python3 bin/gpu_bench_rft_critic.py report OUT RUN_DIR...

The model is a random-weight Llama with the shape of SmolLM2-135M (hidden 576, 30 layers,
9 heads / 3 KV heads, MLP 1536, vocabulary 49152, tied embeddings; 135M parameters), written
with the byte-level tokenizer of ``make_tiny_model``. The data are synthetic multi-turn
trajectories (``cuda_agent.training.synthetic``) of about 10k tokens, 15% of them policy tokens.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def setup(d: Path, n: int, turns: int, lines: int, small: bool = False) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from cuda_agent.agent.models import load_tokenizer, make_tiny_model
    from cuda_agent.records import RecordWriter
    from cuda_agent.training.synthetic import synthetic_trajectories

    model_dir = make_tiny_model(d / "model", seed=0)
    tok = load_tokenizer(model_dir)
    if small:  # a dry run of the script on a CPU
        trajs = synthetic_trajectories(tok, n, turns=turns, tool_output_lines=lines)
        with RecordWriter(d / "data.jsonl", append=False) as w:
            w.write_all(trajs)
        (d / "setup.json").write_text(json.dumps({"small": True, "trajectories": n}))
        return
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=16384,
        rope_theta=100000.0,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(model_dir)
    n_params = sum(p.numel() for p in model.parameters())
    trajs = synthetic_trajectories(tok, n, turns=turns, tool_output_lines=lines)
    with RecordWriter(d / "data.jsonl", append=False) as w:
        w.write_all(trajs)
    lens = [len(t.token_ids) for t in trajs]
    info = {
        "params": n_params,
        "trajectories": n,
        "tokens": sum(lens),
        "policy_tokens": sum(sum(t.loss_mask) for t in trajs),
        "median_len": statistics.median(lens),
        "max_len": max(lens),
    }
    (d / "setup.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info), file=sys.stderr)


def report(out: Path, runs: list[Path]) -> None:
    rows = {}
    for r in runs:
        mf = r / "metrics.jsonl"
        if not mf.is_file():
            rows[r.name] = {"error": "no metrics"}
            continue
        m = [json.loads(x) for x in mf.read_text().splitlines() if x.strip()]
        if not m:
            rows[r.name] = {"error": "no steps logged"}
            continue
        steady = m[2:] if len(m) > 3 else m  # first steps include allocator and kernel warm-up
        rows[r.name] = {
            "steps": len(m),
            "tokens_per_step": statistics.median(x["tokens"] for x in steady),
            "tokens_per_s_median": statistics.median(x["tokens_per_s"] for x in steady),
            "tokens_per_s_min": min(x["tokens_per_s"] for x in steady),
            "tokens_per_s_max": max(x["tokens_per_s"] for x in steady),
            "step_s_median": statistics.median(x["step_s"] for x in steady),
            "peak_mem_gib": max(x.get("peak_mem_gib", 0.0) for x in m),
            "first_loss": m[0].get("loss", m[0].get("value_loss")),
            "last_loss": m[-1].get("loss", m[-1].get("value_loss")),
            "last_explained_variance": m[-1].get("explained_variance"),
        }
        mf_copy = out / f"{r.name}.metrics.jsonl"
        mf_copy.write_text(mf.read_text())
    (out / "report.json").write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "setup":
        import argparse

        ap = argparse.ArgumentParser()
        ap.add_argument("dir", type=Path)
        ap.add_argument("--n", type=int, default=64)
        ap.add_argument("--turns", type=int, default=16)
        ap.add_argument("--lines", type=int, default=30)
        ap.add_argument("--small", action="store_true", help="tiny model (CPU dry run)")
        a = ap.parse_args(sys.argv[2:])
        a.dir.mkdir(parents=True, exist_ok=True)
        setup(a.dir, a.n, a.turns, a.lines, a.small)
    elif cmd == "report":
        report(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])
    else:
        raise SystemExit(f"unknown command {cmd}")
