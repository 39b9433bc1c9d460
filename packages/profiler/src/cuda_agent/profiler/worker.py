"""Subprocess entry: ``python -m cuda_agent.profiler.worker`` reads one JSON request on stdin and
prints JSON lines on stdout as results become available (so a timeout keeps partial results).

Requests (one JSON line on stdin): ``{"op": "baseline", "ref_code", "device", "compile_mode",
"config", "seed", "handshake"}``. With ``handshake`` the worker sets up (model, inputs,
``torch.compile`` and its first call), prints ``{"stage": "ready"}`` and times only after the
parent writes ``go`` (the parent takes the device's exclusive hold in between).
Lines: ``{"stage": "info"|"eager"|"paired"|"nograph"|"error", ...}``. A baseline replayed from
CUDA graphs is timed once more without them (``nograph``): the figure a candidate whose graph
does not replay its work (default-stream kernels, ``cuda_graph_inert``) is compared with.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

import msgspec


def _emit(d: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(d) + "\n")
    sys.stdout.flush()


def _baseline(req: dict[str, Any]) -> int:
    import torch

    from .baseline import device_name, load_reference, make_input_pool
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
    ref = load_reference(req["ref_code"])
    model = ref.make_model(device=device, seed=seed)
    pool = make_input_pool(ref, device, seed=seed + 1000)
    mode = req.get("compile_mode")
    compiled = None
    if mode is not None:
        # compiled (and its first call run) before any timing: with the handshake, outside the
        # device's exclusive hold (10-30 s of mostly CPU work per task)
        try:
            compiled = torch.compile(model, mode=None if mode == "default" else mode)
            with torch.no_grad():
                compiled(*pool[0])
        except Exception as e:  # noqa: BLE001 - reported, eager is kept
            compiled = None
            msg = f"torch.compile failed: {type(e).__name__}: {e}"[:2000]
            _emit({"stage": "error", "message": msg})
    if cfg.trace_check and device.startswith("cuda"):
        warm_kernel_trace()  # the tracer's seconds of set-up, before (outside) the exclusive hold
    if req.get("handshake"):
        _emit({"stage": "ready"})
        if sys.stdin.readline().strip() != "go":
            return 0  # the parent gave up before the timing
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
