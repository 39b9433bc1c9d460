"""A/B of the timing protocol's sync after the input refresh (``ca-timing-2``) against
``ca-timing-1``'s unsynced rounds, in one process, the arms alternating per round: eager and
``torch.compile`` of the sandbox's fused GPU fixture task (``exp(clamp((x + y) * 0.5, -3, 3)) - 1``
on two NxN fp32 tensors), paired as the sandbox's baselines are.

    python packages/profiler/benchmarks/refresh_sync_ab.py OUT.json [ROUNDS=4] [N=8192] [CAP_S=3]

Progress goes to stderr, the summary (JSON) to stdout. Writes per arm and round each side's median, quartiles, minimum and sample count, the compiled
module's host-side call time (what an unsynced round can hide), and a summary per arm. Meant
for a CUDA GPU; ``DEVICE=cpu`` runs the same script on the CPU path (no refresh queue there: a
smoke check of the script, not of the protocol).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch

from cuda_agent.profiler import PROTOCOL_VERSION, TimingConfig, paired


class Fused(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.exp(torch.clamp((x + y) * 0.5, -3.0, 3.0)) - 1.0


def _side(xs: list[float]) -> dict:
    a = np.asarray(xs, dtype=float)
    q25, med, q75 = (float(v) for v in np.percentile(a, [25, 50, 75]))
    return {
        "median_ms": med,
        "q25_ms": q25,
        "q75_ms": q75,
        "iqr_ms": q75 - q25,
        "min_ms": float(a.min()),
        "n": int(a.size),
    }


def main() -> None:
    out = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
    cap = float(sys.argv[4]) if len(sys.argv) > 4 else 3.0
    dev = os.environ.get("DEVICE", "cuda")
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    eager = Fused().to(dev)
    compiled = torch.compile(eager)
    sets = [[torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)] for _ in range(2)]
    with torch.no_grad():
        for _ in range(3):
            compiled(*sets[0])
        sync()
        host = []
        for _ in range(50):  # one call's host time from an idle device (no sync inside)
            sync()
            t = time.perf_counter()
            compiled(*sets[0])
            host.append((time.perf_counter() - t) * 1e3)
        sync()
    res: dict = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "torch": torch.__version__,
        "protocol": PROTOCOL_VERSION,
        "n": n,
        "time_cap_s": cap,
        "compiled_call_host_ms": _side(host),
        "rounds": [],
    }
    cfg = TimingConfig(time_cap_s=cap, warmup_max_s=1.0)
    for r in range(rounds):
        for synced in (True, False) if r % 2 == 0 else (False, True):
            pr = paired(
                {"eager": eager, "compile": compiled},
                sets,
                device=dev,
                config=cfg.with_(sync_after_refresh=synced),
            )
            row = {"round": r, "sync_after_refresh": synced, "flags": pr.flags}
            row.update({k: _side(pr.samples[k]) for k in ("eager", "compile")})
            res["rounds"].append(row)
            c = row["compile"]
            print(
                f"round {r} sync={synced}: compile median {c['median_ms']:.4f} iqr {c['iqr_ms']:.4f}"
                f" min {c['min_ms']:.4f} n {c['n']}; eager median {row['eager']['median_ms']:.4f}",
                file=sys.stderr,
                flush=True,
            )
            with open(out, "w") as f:
                json.dump(res, f, indent=1)
    summary = {}
    for synced in (True, False):
        rows = [x for x in res["rounds"] if x["sync_after_refresh"] is synced]
        summary["synced (ca-timing-2)" if synced else "unsynced (ca-timing-1)"] = {
            side: {
                "median_of_medians_ms": float(np.median([x[side]["median_ms"] for x in rows])),
                "median_iqr_ms": float(np.median([x[side]["iqr_ms"] for x in rows])),
            }
            for side in ("eager", "compile")
        }
    res["summary"] = summary
    print(json.dumps(summary, indent=1))
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
