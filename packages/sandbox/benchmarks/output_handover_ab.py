"""Paired A/B of one trial's output hand-over: the reference's and the candidate's processes
each ``torch.save`` an output, the trusted parent loads both and compares them. ``before``: the
zip's CRC-32 computed, files read into memory; ``after`` (what the sandbox does): no CRC-32,
files memory-mapped. Same process, same tensors, alternating order, median of ROUNDS.

    python packages/sandbox/benchmarks/output_handover_ab.py [ROUNDS] [ROWS]   (default 5 8192)

Prints one JSON line: medians in seconds for a ROWSxROWS fp32 output (save both, load both,
compare) and the after/before ratio."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from paired import paired_medians, print_ab

from cuda_agent.sandbox.compare import Tolerance, compare


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    g = torch.Generator().manual_seed(0)
    r = torch.randn(rows, rows, generator=g)
    c = r + 1e-4 * torch.randn(rows, rows, generator=g)
    d = Path(tempfile.mkdtemp(prefix="handover-ab-"))
    tol = Tolerance(1e-2, 1e-2, 2e-2)

    def handover(fast: bool) -> tuple:
        torch.serialization.set_crc32_options(not fast)
        torch.save(r, d / "ref.pt")
        torch.save(c, d / "out.pt")
        a = torch.load(d / "ref.pt", weights_only=True, mmap=fast)
        b = torch.load(d / "out.pt", weights_only=True, mmap=fast)
        assert compare(a, b, tol).passed
        return a, b  # released after the timing, as before

    def clean() -> None:
        for f in d.iterdir():
            f.unlink()

    med = paired_medians(
        {"before": lambda: handover(False), "after": lambda: handover(True)},
        rounds,
        after_each=clean,
    )
    torch.serialization.set_crc32_options(True)
    d.rmdir()
    print_ab(med, rows=rows, rounds=rounds, threads=torch.get_num_threads())
    return 0


if __name__ == "__main__":
    sys.exit(main())
