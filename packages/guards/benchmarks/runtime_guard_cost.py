"""Where a guarded verification's time goes, per trial, on the GPU: the same model (four eager
passes over two 8192x8192 fp32 inputs) called bare, under ``RuntimeGuard.watch`` without and with
the CUDA kernel trace, with ``after_call``, and ``probe`` once; the guard's own stage timings.

    python packages/guards/benchmarks/runtime_guard_cost.py [TRIALS]

Prints one JSON line (seconds). Needs a GPU."""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from cuda_agent.guards.api import RuntimeGuard


class Fused(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.exp(torch.clamp((x + y) * 0.5, -3.0, 3.0)) - 1.0


def main() -> int:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    model = Fused()
    gen = torch.Generator(device="cuda").manual_seed(0)
    ins = [
        [torch.randn(8192, 8192, device="cuda", generator=gen) for _ in range(2)]
        for _ in range(trials)
    ]
    torch.cuda.synchronize()
    res: dict[str, object] = {"trials": trials, "torch": torch.__version__}

    def timed(fn) -> float:
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    with torch.no_grad():
        res["bare_s"] = [round(timed(lambda i=i: model(*i)), 4) for i in ins]
        for trace in (False, True):
            g = RuntimeGuard(
                "strict", backend="cuda", own_kernels=["fused_kernel"], trace_kernels=trace
            )
            g.install()
            per: dict[str, list[float]] = {"watch": [], "after_call": []}
            out = None
            for i in ins:
                t = time.perf_counter()
                with g.watch(i):
                    out = model(*i)
                    torch.cuda.synchronize()
                per["watch"].append(round(time.perf_counter() - t, 4))
                per["after_call"].append(
                    round(timed(lambda i=i, o=out, g=g: g.after_call(i, o)), 4)
                )
            probe = round(timed(lambda g=g, o=out: g.probe(model, ins[-1], o)), 3)
            tag = "trace" if trace else "no_trace"
            res[tag] = {
                **per,
                "watch_total": round(sum(per["watch"]), 3),
                "after_call_total": round(sum(per["after_call"]), 3),
                "probe_s": probe,
                "guard_timings": {k: round(v, 3) for k, v in g.timings.items()},
                "findings": sorted({f.code for f in g.finish()}),
            }
    res["bare_median_s"] = round(statistics.median(res["bare_s"]), 4)  # type: ignore[arg-type]
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
