"""Paired A/B of the candidate's side of one trial's output hand-over for a multi-GB output on
the GPU (KernelBench L1/19-24 at today's sizes: 4096 x 393216 fp32, 6.4 GB): ``before``, the
output copied to pageable host memory (``.to("cpu")``) and ``torch.save``d; ``after`` (what the
runner does), the copy into a page-locked buffer reused across trials
(``runner._HostStaging``), then the same ``torch.save``. Both without the zip's CRC-32; each
file is loaded back (memory-mapped, as the judge does) and compared with the output, outside
the timing. Same process, same tensor, alternating order, median of ROUNDS.

    python packages/sandbox/benchmarks/output_staging_ab.py [ROUNDS] [GB]   (default 5 6.4)

Prints one JSON line: medians in seconds per saved output and the after/before ratio."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from paired import paired_medians, print_ab

from cuda_agent.sandbox import runner


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    gb = float(sys.argv[2]) if len(sys.argv) > 2 else 6.4
    if not torch.cuda.is_available():
        raise SystemExit("output_staging_ab needs a CUDA GPU")
    n = int(gb * 1e9 / 4)
    x = torch.randn(n, device="cuda")
    d = Path(tempfile.mkdtemp(prefix="staging-ab-"))
    torch.serialization.set_crc32_options(False)
    path = d / "out_0.pt"

    def before() -> None:
        torch.save(x.to("cpu"), path)

    def after() -> None:
        runner._save_output(x, path)

    def check_and_clean() -> None:
        back = torch.load(path, weights_only=True, mmap=True)
        assert back.shape == x.shape and torch.equal(back[:: 1 << 20].cuda(), x[:: 1 << 20])
        path.unlink()

    med = paired_medians({"before": before, "after": after}, rounds, after_each=check_and_clean)
    d.rmdir()
    print_ab(med, gb=gb, rounds=rounds, device=torch.cuda.get_device_name())
    return 0


if __name__ == "__main__":
    sys.exit(main())
