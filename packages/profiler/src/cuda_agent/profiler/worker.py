"""Subprocess entry: ``python -m cuda_agent.profiler.worker`` reads one JSON request on stdin and
prints JSON lines on stdout as results become available (so a timeout keeps partial results).

Requests (one JSON line on stdin): ``{"op": "baseline", "ref_code", "device", "compile_mode",
"config", "seed", "handshake", "report_setup"}``. With ``handshake`` the worker sets up (model,
inputs, ``torch.compile`` and its first call), prints ``{"stage": "ready"}`` and times only after
the parent writes ``go`` (the parent takes the device's exclusive hold in between).
Lines: ``{"stage": "info"|"setup"|"eager"|"paired"|"nograph"|"error", ...}``. A baseline replayed
from CUDA graphs is timed once more without them (``nograph``): the figure a candidate whose graph
does not replay its work (default-stream kernels, ``cuda_graph_inert``) is compared with.

With ``report_setup`` (optional, default off) the set-up also runs the model once eagerly on the
pool's first input set (synchronised, before ``torch.compile``) and, once the model is compiled
(before the kernel tracer's set-up and ``ready``), prints ``{"stage": "setup", "input_bytes",
"output_bytes", "peak_bytes", "ref_s", "compile_s"}``: bytes of that input set and of its output;
on CUDA ``torch.cuda.max_memory_allocated`` after that forward (peak statistics reset before the
model and the input pool are built, so the pool's other sets count), else None; the forward's
seconds; the seconds of ``torch.compile`` plus its first call (synchronised; None without a compile
mode or when it failed: its ``error`` line comes first). A reference whose set-up raises (loading,
building, that forward) prints the ``error`` line and no ``setup`` line. Without the key the
worker does neither.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any

import msgspec

from .cpus import enter_timed


def _emit(d: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(d) + "\n")
    sys.stdout.flush()


def _baseline(req: dict[str, Any]) -> int:
    import torch

    from .baseline import device_name, load_reference, make_input_pool, tensor_bytes
    from .config import TimingConfig
    from .timing import F_GRAPH, measure, paired, warm_kernel_trace

    device = req.get("device", "cuda")
    cfg = TimingConfig.from_dict(req.get("config") or {})
    seed = int(req.get("seed", 0))
    _emit(
        {
            "stage": "info",
            "device_name": device_name(device),
            "torch_version": str(torch.__version__),
        }
    )
    report = bool(req.get("report_setup"))
    cuda = device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    if report and cuda:
        torch.cuda.reset_peak_memory_stats(device)
    ref = load_reference(req["ref_code"])
    model = ref.make_model(device=device, seed=seed, mode=req.get("model_mode", "eval"))
    pool = make_input_pool(ref, device, seed=seed + 1000)
    setup: dict[str, Any] = {}
    if report:
        # the reference's one forward (not a timed section: it is set-up, like compile's first call)
        sync()
        t = time.perf_counter()
        with torch.no_grad():
            out = model(*pool[0])
        sync()
        setup = {
            "stage": "setup",
            "input_bytes": tensor_bytes(pool[0]),
            "output_bytes": tensor_bytes(out),
            "peak_bytes": int(torch.cuda.max_memory_allocated(device)) if cuda else None,
            "ref_s": time.perf_counter() - t,
            "compile_s": None,
        }
        del out
    mode = req.get("compile_mode")
    compiled = None
    if mode is not None:
        # compiled (and its first call run) before any timing: with the handshake, outside the
        # device's exclusive hold (10-30 s of mostly CPU work per task)
        try:
            t = time.perf_counter()
            compiled = torch.compile(model, mode=None if mode == "default" else mode)
            with torch.no_grad():
                compiled(*pool[0])
            if report:
                sync()
                setup["compile_s"] = time.perf_counter() - t
        except Exception as e:  # noqa: BLE001 - reported, eager is kept
            compiled = None
            msg = f"torch.compile failed: {type(e).__name__}: {e}"[:2000]
            _emit({"stage": "error", "message": msg})
    if report:
        _emit(setup)
    if cfg.trace_check and cuda:
        warm_kernel_trace()  # the tracer's seconds of set-up, before (outside) the exclusive hold
    if req.get("handshake"):
        _emit({"stage": "ready"})
        if sys.stdin.readline().strip() != "go":
            return 0  # the parent gave up before the timing
        # the exclusive section is held: time on the cores kept for it (cpus.py)
        enter_timed()
    eager = measure(model, pool, device=device, config=cfg)
    _emit({"stage": "eager", "stats": msgspec.to_builtins(eager)})
    if compiled is None:
        if F_GRAPH in eager.flags:
            plain = measure(model, pool, device=device, config=cfg.with_(cuda_graph="off"))
            _emit({"stage": "nograph", "eager": msgspec.to_builtins(plain)})
        return 0
    res = paired({"eager": model, "compile": compiled}, pool, device=device, config=cfg)
    _emit(
        {
            "stage": "paired",
            "eager": msgspec.to_builtins(res.stats["eager"]),
            "compile": msgspec.to_builtins(res.stats["compile"]),
            "speedup_ci": list(res.speedup_ci("eager", "compile")),
            "flags": res.flags,
        }
    )
    if res.cuda_graph:
        plain = paired(
            {"eager": model, "compile": compiled},
            pool,
            device=device,
            config=cfg.with_(cuda_graph="off"),
        )
        _emit(
            {
                "stage": "nograph",
                "eager": msgspec.to_builtins(plain.stats["eager"]),
                "compile": msgspec.to_builtins(plain.stats["compile"]),
            }
        )
    return 0


def main() -> int:
    req = json.loads(sys.stdin.readline())  # one line: with a handshake, "go" follows
    op = req.get("op")
    try:
        if op == "baseline":
            return _baseline(req)
        _emit({"stage": "error", "message": f"unknown op {op!r}"})
        return 2
    except Exception as e:  # noqa: BLE001 - the parent gets the message, the log gets the trace
        traceback.print_exc()
        _emit({"stage": "error", "message": f"{type(e).__name__}: {e}"[:2000]})
        return 1


if __name__ == "__main__":
    sys.exit(main())
