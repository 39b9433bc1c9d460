"""Target process of ``profiler ncu``: build a KernelBench program, warm it up, then run one
forward call inside a profiling window (``--mode ncu``: cudaProfilerStart/Stop for Nsight
Compute; ``--mode torch``: torch.profiler, printing a ProfileReport JSON line on stdout).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="cuda_agent.profiler.ncu_target")
    ap.add_argument("ref", type=Path)
    ap.add_argument("--new", type=Path, default=None)
    ap.add_argument("--mode", choices=("ncu", "torch"), default="ncu")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--model-mode", choices=("eval", "train"), default="eval")
    a = ap.parse_args(argv)

    import msgspec
    import torch

    from .baseline import load_reference, load_solution
    from .ncu import KernelSummary, ProfileReport

    ref = load_reference(a.ref.read_text())
    if a.new is not None:
        prog = load_solution(a.new.read_text())
        model = prog.make_model(device=a.device, init_inputs=ref.init_inputs(), mode=a.model_mode)
    else:
        model = ref.make_model(device=a.device, mode=a.model_mode)
    inputs = ref.make_inputs(device=a.device, seed=1)
    cuda = a.device.startswith("cuda")
    with torch.no_grad():
        for _ in range(a.warmup):
            model(*inputs)
        if cuda:
            torch.cuda.synchronize()
        if a.mode == "ncu":
            torch.cuda.profiler.start()
            model(*inputs)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            return 0
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            model(*inputs)
            if cuda:
                torch.cuda.synchronize()
    per: dict[str, list[float]] = {}
    if cuda:
        for e in prof.events():
            if e.device_type != DeviceType.CPU and not e.is_async:
                per.setdefault(e.name, []).append(float(e.time_range.elapsed_us()))
    else:
        for e in prof.key_averages():
            if e.self_cpu_time_total > 0 and e.key.startswith("aten::"):
                per.setdefault(e.key, []).append(float(e.self_cpu_time_total))
    kernels = [KernelSummary(name=k, duration_us=sum(v)) for k, v in per.items()]
    kernels.sort(key=lambda k: -(k.duration_us or 0))
    rep = ProfileReport(
        tool="torch.profiler",
        program=str(a.new or a.ref),
        kernels=kernels,
        total_us=sum(k.duration_us or 0 for k in kernels),
        note="" if cuda else "CPU ops (self time)",
    )
    sys.stdout.write(msgspec.json.encode(rep).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
