"""H200 speed-of-light roofline estimates (datasheet ceilings, meta-device work counts) of task
sets, reported as "floors".

Usage: python sol_sizes.py NAME=FILE.jsonl [NAME=FILE.jsonl ...]   (prints JSON on stdout)
A size comparison without a GPU: max(FLOPs / TF32 rate, bytes / HBM bandwidth) of the reference's
own work, which bounds its way of computing (eager included), not every implementation: a better
algorithm beats it (``profiler.sol.output_floor_ms`` is the floor that holds for all).
"""

from __future__ import annotations

import json
import sys

from cuda_agent.profiler.sol import DATASHEETS, Ceilings, count_work, estimate
from cuda_agent.records.jsonl import load_records
from cuda_agent.records.types import Task

EDGES = (0.001, 0.01, 0.1, 1.0, 10.0)


def main() -> None:
    ds = DATASHEETS["H200"]
    ceil = Ceilings(
        device="H200 (datasheet)",
        torch_version="",
        protocol_version="",
        copy_gbps=ds["copy_gbps"],
        matmul_tflops={k: v for k, v in ds.items() if k != "copy_gbps"},
    )
    out = {}
    for arg in sys.argv[1:]:
        name, path = arg.split("=", 1)
        floors, failed = [], 0
        for t in load_records(path):
            if not isinstance(t, Task):
                continue
            try:
                floors.append(estimate(count_work(t.ref_code, device="meta"), ceil).bound_ms)
            except Exception:  # noqa: BLE001 - counted
                failed += 1
        floors.sort()
        hist = {}
        for f in floors:
            lo = max([e for e in EDGES if f >= e], default=0.0)
            hist[f">={lo:g}ms"] = hist.get(f">={lo:g}ms", 0) + 1
        n = len(floors)
        out[name] = {
            "tasks": n,
            "not_countable": failed,
            "median_floor_ms": floors[n // 2] if n else None,
            "p10_floor_ms": floors[n // 10] if n else None,
            "p90_floor_ms": floors[9 * n // 10] if n else None,
            "hist": dict(sorted(hist.items(), key=lambda kv: float(kv[0][2:-2]))),
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
