"""Paired A/B of how the trusted parent reads trial outputs: ``torch.load`` into memory vs
memory-mapped (``mmap=True``), each followed by the comparison (same process, same files,
alternating order, median of ROUNDS).

    python packages/sandbox/benchmarks/output_load_ab.py [ROUNDS] [ROWS]   (default 5 8192)

Prints one JSON line: medians in seconds (load of a reference and a candidate output of ROWSxROWS
fp32, plus their comparison) and the mmap/plain ratio."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from cuda_agent.sandbox.compare import Tolerance, compare


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    g = torch.Generator().manual_seed(0)
    r = torch.randn(rows, rows, generator=g)
    c = r + 1e-4 * torch.randn(rows, rows, generator=g)
    d = Path(tempfile.mkdtemp(prefix="load-ab-"))
    torch.save(r, d / "ref.pt")
    torch.save(c, d / "out.pt")
    del r, c
    tol = Tolerance(1e-2, 1e-2, 2e-2)
    times: dict[str, list[float]] = {"plain": [], "mmap": []}
    for i in range(rounds):
        for name in ("plain", "mmap")[:: 1 if i % 2 == 0 else -1]:
            t = time.perf_counter()
            a = torch.load(d / "ref.pt", weights_only=True, mmap=name == "mmap")
            b = torch.load(d / "out.pt", weights_only=True, mmap=name == "mmap")
            assert compare(a, b, tol).passed
            times[name].append(time.perf_counter() - t)
            del a, b
    for f in d.iterdir():
        f.unlink()
    d.rmdir()
    med = {k: round(statistics.median(v), 3) for k, v in times.items()}
    print(
        json.dumps(
            {
                "rows": rows,
                "rounds": rounds,
                "threads": torch.get_num_threads(),
                "median_s": med,
                "mmap/plain": round(med["mmap"] / med["plain"], 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
