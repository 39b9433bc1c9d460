"""Why is the first generation of a fresh process slow on the GPU? A probe for one device call.

On the H200 a PPO step's generation took 100 s, then 30 s, then 7 s for the same work
(docs/lab/history/benchmarks-ppo.md); on the CPU every call costs the same. This script repeats the same
lock-step batched generation (``HFPolicy.generate``, the tiny random-weight model, contexts as long
as an episode's SKILL.md prompt) several times in one process and records, per call: wall time,
CUDA-synchronised time, torch.compile activity (dynamo counters), the cache class transformers
chose, allocator statistics (cudaMalloc retries, reserved bytes) and, for the first and the last
call, the top operators of a ``torch.profiler`` trace. Run it once per setting (a fresh process
each: the effect is per process). The suspected cause: torch's cuDNN attention backend builds a
plan per new shape for masked (left-padded) batches; the model loader now turns it off
(``avoid_cudnn_attention``), ``--cudnn-sdpa on`` turns it back on for the comparison.

    python packages/agent/benchmarks/gen_probe.py OUT_DIR [--device cuda] [--dtype bf16|fp32]
        [--cudnn-sdpa off|on] [--calls 4] [--batch 8] [--context 7500] [--new 512]

Writes OUT_DIR/gen_probe-DTYPE-cudnnSETTING.json and prints a one-line summary per call.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any


def _dynamo_counters() -> dict[str, int]:
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    return {f"{k}.{kk}": int(v) for k, d in counters.items() for kk, v in d.items()}


def _alloc_stats(device: str) -> dict[str, Any]:
    import torch

    if not device.startswith("cuda"):
        return {}
    s = torch.cuda.memory_stats()
    return {
        "num_alloc_retries": s.get("num_alloc_retries", 0),
        "num_device_alloc": s.get("num_device_alloc", 0),
        "num_device_free": s.get("num_device_free", 0),
        "reserved_gib": round(s.get("reserved_bytes.all.current", 0) / 2**30, 3),
    }


def _top_ops(prof: Any, n: int = 12) -> list[dict[str, Any]]:
    rows = []
    for e in sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:n]:
        rows.append(
            {
                "op": e.key[:80],
                "calls": e.count,
                "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 2),
                "self_device_ms": round(getattr(e, "self_device_time_total", 0) / 1e3, 2),
            }
        )
    return rows


def probe(
    out: Path,
    device: str,
    calls: int,
    batch: int,
    context: int,
    new: int,
    dtype_name: str = "bf16",
    cudnn_sdpa: str = "off",
) -> dict:
    """Run the probe; returns (and writes) the record."""
    import torch

    from cuda_agent.agent.models import load_causal_lm, load_tokenizer, make_tiny_model
    from cuda_agent.agent.policy import HFPolicy

    out.mkdir(parents=True, exist_ok=True)
    d = make_tiny_model(out / "tiny-model")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    model, tok = load_causal_lm(d, device=device, dtype=dtype), load_tokenizer(d)
    if cudnn_sdpa == "on":  # what torch does by default (the loader turned it off)
        torch.backends.cuda.enable_cudnn_sdp(True)
    policy = HFPolicy(model.eval(), tok, temperature=1.0, seed=0)
    rng = random.Random(0)
    vocab = len(tok) - 1
    rec: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "dtype": dtype_name,
        "cudnn_sdpa": torch.backends.cuda.cudnn_sdp_enabled(),
        "batch": batch,
        "context": context,
        "new_tokens": new,
        "calls": [],
    }
    try:
        import transformers

        rec["transformers"] = transformers.__version__
        rec["generation_config"] = {
            k: str(v)
            for k, v in model.generation_config.to_dict().items()
            if "cache" in k or "compile" in k
        }
    except Exception:  # noqa: BLE001 - informational only
        pass
    orig_generate = model.generate
    seen: dict[str, Any] = {}

    def spy(*a: Any, **kw: Any) -> Any:
        r = orig_generate(*a, **kw)
        pkv = getattr(r, "past_key_values", None)
        seen["cache"] = type(pkv).__name__ if pkv is not None else None
        seen["compileable"] = getattr(pkv, "is_compileable", None)
        return r

    model.generate = spy  # type: ignore[method-assign]
    for variant in (f"{dtype_name}-cudnn{cudnn_sdpa}",):
        for i in range(calls):
            ctx = [[rng.randrange(5, vocab) for _ in range(context + 37 * j)] for j in range(batch)]
            profile = i in (0, calls - 1)
            c0 = _dynamo_counters()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            if profile:
                from torch.profiler import ProfilerActivity
                from torch.profiler import profile as tprof

                acts = [ProfilerActivity.CPU]
                if device.startswith("cuda"):
                    acts.append(ProfilerActivity.CUDA)
                with tprof(activities=acts) as prof:
                    gens = policy.generate(ctx, new)
            else:
                gens = policy.generate(ctx, new)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            wall = time.perf_counter() - t
            c1 = _dynamo_counters()
            row = {
                "variant": variant,
                "call": i,
                "seconds": round(wall, 3),
                "tokens": sum(len(g.token_ids) for g in gens),
                "dynamo_delta": {k: v - c0.get(k, 0) for k, v in c1.items() if v != c0.get(k, 0)},
                "cache": seen.get("cache"),
                "compileable": seen.get("compileable"),
                **_alloc_stats(device),
            }
            if profile:
                row["top_ops"] = _top_ops(prof)
            rec["calls"].append(row)
            print(
                f"{variant} call {i}: {wall:.2f}s, {row['tokens']} tokens, cache {row['cache']}, "
                f"dynamo {row['dynamo_delta'] or '-'}",
                flush=True,
            )
    (out / f"gen_probe-{dtype_name}-cudnn{cudnn_sdpa}.json").write_text(json.dumps(rec, indent=1))
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--cudnn-sdpa", default="off", choices=["off", "on"])
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=7500)
    ap.add_argument("--new", type=int, default=512)
    a = ap.parse_args()
    probe(a.out, a.device, a.calls, a.batch, a.context, a.new, a.dtype, a.cudnn_sdpa)


if __name__ == "__main__":
    main()
