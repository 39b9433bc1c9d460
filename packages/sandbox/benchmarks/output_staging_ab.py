"""Paired A/B of the candidate's side of one trial's output hand-over for a multi-GB output on
the GPU (KernelBench L1/19-24 at today's sizes: 4096 x 393216 fp32, 6.4 GB): ``before``, the
output copied to pageable host memory (``.to("cpu")``) and ``torch.save``d; ``after`` (what the
runner does), the copy into a page-locked buffer reused across trials
(``runner._HostStaging``), then the same ``torch.save``. Both without the zip's CRC-32; each
file is loaded back (memory-mapped, as the judge does) and compared with the output, outside
the timing. Same process, same tensor, alternating order, median of ROUNDS. Where /dev/shm (a
RAM-backed file system) has room, also ``after_shm``: the page-locked copy saved there, and the
judge's side (``torch.load`` memory-mapped, then ``.to("cuda")``) from each place.

    python packages/sandbox/benchmarks/output_staging_ab.py [ROUNDS] [GB]   (default 5 6.4)

Prints one JSON line: medians in seconds per saved output and the after/before ratio."""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
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
    shm = Path("/dev/shm")
    shm_path = None
    if shm.is_dir() and shutil.disk_usage(shm).free > 2.5 * n * 4:
        shm_path = Path(tempfile.mkdtemp(prefix="staging-ab-", dir=shm)) / "out_0.pt"

    def before() -> None:
        torch.save(x.to("cpu"), path)

    def after() -> None:
        runner._save_output(x, path)

    def after_shm() -> None:
        runner._save_output(x, shm_path)

    def check_and_clean() -> None:
        for f in (path, shm_path):
            if f is not None and f.exists():
                back = torch.load(f, weights_only=True, mmap=True)
                assert back.shape == x.shape and torch.equal(back[:: 1 << 20].cuda(), x[:: 1 << 20])
                f.unlink()

    fns = {"before": before, "after": after} | ({"after_shm": after_shm} if shm_path else {})
    med = paired_medians(fns, rounds, after_each=check_and_clean)
    load_s = {}
    for name, f in (("tmp", path), ("shm", shm_path)):
        if f is None:
            continue
        runner._save_output(x, f)
        ts = []
        for _ in range(3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            y = torch.load(f, weights_only=True, mmap=True).to("cuda")
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
            assert torch.equal(y[:: 1 << 20], x[:: 1 << 20])
            del y
        load_s[name] = round(statistics.median(ts), 3)
        f.unlink()
    d.rmdir()
    if shm_path is not None:
        shm_path.parent.rmdir()
    print_ab(med, gb=gb, rounds=rounds, device=torch.cuda.get_device_name(), judge_load_s=load_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
