"""What the first CUDA kernel trace (torch.profiler with CUDA activity) costs in a fresh process,
step by step, and whether starting one before the CUDA context exists moves that cost.

    python packages/guards/benchmarks/kernel_trace_start.py [before_context]

Prints one JSON line (seconds). Needs a GPU."""

from __future__ import annotations

import json
import sys
import time

T: dict[str, float] = {}


def step(name: str, fn) -> object:
    t = time.perf_counter()
    r = fn()
    T[name] = round(time.perf_counter() - t, 4)
    return r


def trace_once(tag: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    p = profile(activities=[ProfilerActivity.CUDA])
    step(f"{tag}_enter", p.__enter__)
    if torch.cuda.is_initialized():
        torch.empty(1, device="cuda").fill_(0.0)
        torch.cuda.synchronize()
    step(f"{tag}_exit", lambda: p.__exit__(None, None, None))


def main() -> int:
    if sys.argv[1:] not in ([], ["before_context"]):
        raise SystemExit(f"usage: {sys.argv[0]} [before_context] (got {sys.argv[1:]})")
    before = sys.argv[1:] == ["before_context"]
    step("import_torch", lambda: __import__("torch"))
    import torch

    step("import_profiler", lambda: __import__("torch.profiler"))
    if before:
        trace_once("pre_context")
    step("init_context", lambda: (torch.empty(1, device="cuda"), torch.cuda.synchronize()))
    trace_once("first")
    trace_once("second")
    T["before_context"] = before
    print(json.dumps(T))
    return 0


if __name__ == "__main__":
    sys.exit(main())
