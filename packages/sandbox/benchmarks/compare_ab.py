"""Paired A/B of the output comparison's fp32 fast path: with and without the two isfinite()
passes it used to start with (same process, same tensors, alternating, median of ROUNDS).

    python packages/sandbox/benchmarks/compare_ab.py [ROUNDS] [ROWS]      (default 7, 8192)

Prints one JSON line: medians in seconds and their ratio, for a ROWSxROWS fp32 output whose
candidate differs by 1e-4 noise (the common passing case)."""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from cuda_agent.sandbox.compare import Tolerance, compare


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    g = torch.Generator().manual_seed(0)
    r = torch.randn(rows, rows, generator=g)
    c = r + 1e-4 * torch.randn(rows, rows, generator=g)
    tol = Tolerance(1e-2, 1e-2, 1e-2)

    def before() -> bool:  # what the fast path did first until this change
        ok = bool(torch.isfinite(r).all()) and bool(torch.isfinite(c).all())
        return ok and compare(r, c, tol).passed

    def after() -> bool:
        return compare(r, c, tol).passed

    times: dict[str, list[float]] = {"before": [], "after": []}
    for i in range(rounds):
        for name, fn in (("before", before), ("after", after))[:: 1 if i % 2 == 0 else -1]:
            t = time.perf_counter()
            assert fn()
            times[name].append(time.perf_counter() - t)
    med = {k: round(statistics.median(v), 3) for k, v in times.items()}
    print(
        json.dumps(
            {
                "rows": rows,
                "rounds": rounds,
                "threads": torch.get_num_threads(),
                "median_s": med,
                "after/before": round(med["after"] / med["before"], 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
