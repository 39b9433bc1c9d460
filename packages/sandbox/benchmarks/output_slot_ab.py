"""Paired A/B of the candidate's output hand-over across trials: ``before``, each trial's output
``torch.save``d to a new file that the judge deletes once read; ``after`` (what the runner
does), each output written over the file the judge handed back (``runner.FREE_SLOT``), so the
page cache keeps its pages. TRIALS outputs per round (a verification's 5), on the GPU when
there is one (through the runner's page-locked staging), else from host memory; every file is
loaded back (memory-mapped, as the judge does) and checked, outside the timing. Alternating
order, median of ROUNDS.

    python packages/sandbox/benchmarks/output_slot_ab.py [ROUNDS] [GB] [TRIALS]   (default 5 2 5)

Prints one JSON line: medians in seconds per round of TRIALS outputs and the after/before ratio."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from paired import paired_medians, print_ab

from cuda_agent.sandbox import runner


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    gb = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    trials = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(int(gb * 1e9 / 4), device=device)
    probe = x[:: 1 << 20].cpu()
    d = Path(tempfile.mkdtemp(prefix="slot-ab-"))
    slot = d / runner.FREE_SLOT

    def check(f: Path) -> None:
        back = torch.load(f, weights_only=True, mmap=True)
        assert back.shape == x.shape and torch.equal(back[:: 1 << 20], probe)

    def before() -> None:
        for i in range(trials):
            f = d / f"out_{i}.pt"
            runner._save_output(x, f)
            check(f)
            runner._hand_back(f, slot, keep=False)

    def after() -> None:
        for i in range(trials):
            f = d / f"out_{i}.pt"
            runner._save_output(x, f)
            check(f)
            runner._hand_back(f, slot, keep=i < trials - 1)

    med = paired_medians({"before": before, "after": after}, rounds)
    d.rmdir()
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print_ab(med, gb=gb, trials=trials, rounds=rounds, device=name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
