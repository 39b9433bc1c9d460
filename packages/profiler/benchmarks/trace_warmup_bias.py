"""Does a CUDA kernel trace started and stopped before timing (CUPTI set up, then idle) change
what the timing protocol measures afterwards? One fresh process per arm, arms rotating:
``cold`` times first (the trace only at the protocol's end, as before); ``warm`` starts and stops
one trace first; ``warm_teardown`` the same with ``TEARDOWN_CUPTI=1`` (kineto detaches CUPTI when
a trace stops; pytorch/kineto#1264 made that the default for CUDA 12.6+, pytorch/pytorch#146604
reports a 10-20% slowdown after profiling without it). Programs: a launch-bound one (1M-element elementwise) and the gpu_fused
fixture's eager model (two 8192x8192 inputs).

    python packages/profiler/benchmarks/trace_warmup_bias.py [ROUNDS]

Prints one JSON line per process and a summary (medians in ms, warm/cold ratios). Needs a GPU."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, sys
import torch
from cuda_agent.profiler import TimingConfig, measure, warm_kernel_trace
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
warm_s = warm_kernel_trace() if sys.argv[1].startswith("warm") else None
cfg = TimingConfig(trace_check=False, cuda_graph="off", time_cap_s=6.0)
small = [[torch.randn(1 << 20, device="cuda")] for _ in range(2)]
big = [[torch.randn(8192, 8192, device="cuda"), torch.randn(8192, 8192, device="cuda")] for _ in range(2)]
f_small = lambda x: torch.relu(x * 1.5 + 0.25)
f_big = lambda x, y: torch.exp(torch.clamp((x + y) * 0.5, -3.0, 3.0)) - 1.0
with torch.no_grad():
    s = measure(f_small, small, device="cuda", config=cfg)
    b = measure(f_big, big, device="cuda", config=cfg)
print(json.dumps({"arm": sys.argv[1], "warm_s": warm_s, "small_ms": s.median_ms, "big_ms": b.median_ms,
                  "small_flags": s.flags, "big_flags": b.flags}))
"""


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    rows = []
    arms = ["cold", "warm", "warm_teardown"]
    for i in range(rounds):
        for arm in arms[i % 3 :] + arms[: i % 3]:
            env = dict(os.environ)
            env.pop("TEARDOWN_CUPTI", None)
            if arm == "warm_teardown":
                env["TEARDOWN_CUPTI"] = "1"
            t = time.perf_counter()
            p = subprocess.run(
                [sys.executable, "-c", CHILD, arm],
                capture_output=True,
                text=True,
                timeout=300,
                env=env,
            )
            line = (p.stdout.strip().splitlines() or ["{}"])[-1]
            row = json.loads(line) if p.returncode == 0 else {"arm": arm, "error": p.stderr[-800:]}
            row["process_s"] = round(time.perf_counter() - t, 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    out: dict[str, object] = {}
    for k in ("small_ms", "big_ms"):
        med = {
            a: statistics.median(r[k] for r in rows if r.get("arm") == a and k in r) for a in arms
        }
        out[k] = {
            **{a: round(v, 5) for a, v in med.items()},
            **{f"{a}/cold": round(med[a] / med["cold"], 4) for a in arms[1:]},
        }
    print(json.dumps({"summary": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
