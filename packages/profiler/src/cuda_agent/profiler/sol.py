"""Speed-of-light: a roofline estimate of a program's time from its FLOPs, its bytes and the
device's measured ceilings, and the output floor (:func:`output_floor_ms`), the only bound
that holds for every correct implementation and so the only one a guard may reject by.

- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over one forward of the reference (matmul,
  conv, attention; elementwise work is not counted, so elementwise programs are memory bound).
- Minimum bytes: every input, parameter and buffer read once, every output written once.
- Ceilings: a large device-to-device copy (bytes read + written per second), a large sum
  (bytes read per second) and square matmuls in
  fp32, tf32, bf16 and fp16, measured with the timing protocol and cached per device and torch.
- Bound: ``max(flops / rate, bytes / bandwidth)``. The rate is the fastest tensor-core rate a
  candidate could legitimately use for the inputs' dtype (tf32 for fp32 programs, whose usual
  tolerances admit tf32; bf16 for half types), so the bound is a floor, not a target.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec

from .baseline import cache_root, device_name, torch_version
from .config import PROTOCOL_VERSION, TimingConfig

#: Dense (no sparsity) datasheet figures, for comparison only. TFLOP/s and GB/s.
DATASHEETS: dict[str, dict[str, float]] = {
    "H200": {"copy_gbps": 4800.0, "fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "H100 80GB HBM3": {
        "copy_gbps": 3350.0,
        "fp32": 67.0,
        "tf32": 494.7,
        "bf16": 989.4,
        "fp16": 989.4,
    },
}


class Ceilings(msgspec.Struct, kw_only=True):
    """Measured device ceilings: copy bandwidth (read+write GB/s) and matmul TFLOP/s by dtype."""

    device: str
    torch_version: str
    protocol_version: str
    copy_gbps: float  # the memory bound uses max(copy_gbps, read_gbps)
    matmul_tflops: dict[str, float]
    read_gbps: float = 0.0  # a large sum reduction: bytes read per second
    copy_bytes: int = 0
    matmul_n: int = 0
    measured_at: str = ""
    seconds: float = 0.0

    def rate_for(self, dtype_class: str) -> float:
        """TFLOP/s used for a program whose floating inputs are ``dtype_class``."""
        r = self.matmul_tflops
        if dtype_class in ("bf16", "fp16"):
            return max(r.get("bf16", 0.0), r.get("fp16", 0.0)) or max(r.values())
        if dtype_class == "fp64":
            return r.get("fp64", r.get("fp32", max(r.values())))
        return r.get("tf32", r.get("fp32", max(r.values())))


def datasheet_for(name: str) -> dict[str, float] | None:
    """Datasheet figures for a device name like ``NVIDIA H200`` (None when unknown)."""
    for k, v in DATASHEETS.items():
        if k in name:
            return v
    return None


def measure_ceilings(
    device: str = "cuda", *, copy_bytes: int = 4 << 30, matmul_n: int = 8192, quick: bool = False
) -> Ceilings:
    """Measure copy bandwidth and matmul rates on ``device`` (CUDA) with the timing protocol."""
    import torch

    from .timing import measure

    if quick:
        copy_bytes, matmul_n = min(copy_bytes, 256 << 20), min(matmul_n, 2048)
    # clocks ramp up from idle: warm up for half a second before each ceiling
    cfg = TimingConfig(time_cap_s=3.0, warmup_ms=500.0, fresh_values=False, trace_check=False)
    t0 = time.monotonic()
    dev = torch.device(device)
    n = copy_bytes // 4
    src = torch.randn(n, device=dev)
    dst = torch.empty_like(src)
    st = measure(lambda a, b: b.copy_(a), [[src, dst]], device=device, config=cfg)
    copy_gbps = 2 * n * 4 / (st.median_ms * 1e-3) / 1e9
    st = measure(torch.sum, [[src]], device=device, config=cfg)
    read_gbps = n * 4 / (st.median_ms * 1e-3) / 1e9
    del src, dst
    rates: dict[str, float] = {}
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for name, dtype, tf32 in (
            ("fp32", torch.float32, False),
            ("tf32", torch.float32, True),
            ("bf16", torch.bfloat16, False),
            ("fp16", torch.float16, False),
        ):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a = torch.randn(matmul_n, matmul_n, device=dev, dtype=dtype)
            b = torch.randn(matmul_n, matmul_n, device=dev, dtype=dtype)
            st = measure(torch.matmul, [[a, b]], device=device, config=cfg)
            rates[name] = 2 * matmul_n**3 / (st.median_ms * 1e-3) / 1e12
            del a, b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    return Ceilings(
        device=device_name(device),
        torch_version=str(torch.__version__),
        protocol_version=PROTOCOL_VERSION,
        copy_gbps=copy_gbps,
        read_gbps=read_gbps,
        matmul_tflops=rates,
        copy_bytes=copy_bytes,
        matmul_n=matmul_n,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        seconds=time.monotonic() - t0,
    )


def _ceilings_path(device: str) -> Path:
    from cuda_agent.records import content_id

    key = content_id(device_name(device), torch_version(), PROTOCOL_VERSION)
    return cache_root() / "ceilings" / f"{key}.json"


def cached_ceilings(device: str = "cuda") -> Ceilings | None:
    """The cached ceilings of ``device``, or None; never measures (no CUDA context needed)."""
    try:
        return msgspec.json.decode(_ceilings_path(device).read_bytes(), type=Ceilings)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def get_ceilings(device: str = "cuda", *, recompute: bool = False) -> Ceilings:
    """Cached ceilings of ``device`` (``$CUDA_AGENT_CACHE/ceilings``); measured once if missing."""
    if not recompute:
        c = cached_ceilings(device)
        if c is not None:
            return c
    path = _ceilings_path(device)
    c = measure_ceilings(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.encode(c))
    tmp.replace(path)
    return c


class Work(msgspec.Struct, kw_only=True):
    """What a program must do at least: FLOPs (matmul/conv/attention) and bytes moved."""

    flops: float
    bytes: int
    input_bytes: int
    param_bytes: int
    output_bytes: int
    dtype_class: str  # fp32 | bf16 | fp16 | fp64
    counted_on: str  # meta | cpu | cuda


class SolEstimate(msgspec.Struct, kw_only=True):
    """Lower-bound time of a program on a device and which resource bounds it."""

    work: Work
    compute_ms: float
    memory_ms: float
    bound_ms: float
    bound_by: str  # compute | memory
    rate_tflops: float
    copy_gbps: float

    def fraction(self, measured_ms: float) -> float:
        """Fraction of speed-of-light reached: bound / measured (1.0 = at the bound)."""
        return self.bound_ms / measured_ms if measured_ms > 0 else float("inf")

    def impossible(self, measured_ms: float, slack: float = 0.9) -> bool:
        """Whether ``measured_ms`` is below ``slack`` x the bound (physically implausible)."""
        return measured_ms < slack * self.bound_ms


def _dtype_class(tensors: list[Any]) -> str:
    import torch

    seen = {t.dtype for t in tensors if t.is_floating_point()}
    if torch.float64 in seen:
        return "fp64"
    if torch.float32 in seen:
        return "fp32"
    if torch.bfloat16 in seen:
        return "bf16"
    if torch.float16 in seen:
        return "fp16"
    return "fp32"


def count_work(ref_source: str, *, device: str = "meta", seed: int = 0) -> Work:
    """FLOPs and minimum bytes of one forward of ``ref_source``'s ``Model``.

    Counts on the ``meta`` device first (no memory, no compute); falls back to ``device`` if
    given one that is not meta and meta tracing fails (``device="meta"`` means no fallback).
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from .program import Program
    from .timing import _iter_tensors

    prog = Program.from_source(ref_source, name="kb_sol")
    last: Exception | None = None
    for dev in ["meta"] + ([device] if device != "meta" else []):
        try:
            model = prog.make_model(device=dev, seed=seed)
            with torch.device(dev):
                inputs = list(prog.module.get_inputs())
            inputs = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in inputs]
            fc = FlopCounterMode(display=False)
            with torch.no_grad(), fc:
                out = model(*inputs)
            ins = list(_iter_tensors(inputs))
            params = list(model.parameters()) + list(model.buffers())
            outs = list(_iter_tensors(out))
            nb = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
            ib, pb, ob = nb(ins), nb(params), nb(outs)
            return Work(
                flops=float(fc.get_total_flops()),
                bytes=ib + pb + ob,
                input_bytes=ib,
                param_bytes=pb,
                output_bytes=ob,
                dtype_class=_dtype_class(ins + params),
                counted_on=dev,
            )
        except Exception as e:  # noqa: BLE001 - try the next device
            last = e
    raise RuntimeError(f"could not count work: {type(last).__name__}: {last}")


def estimate(work: Work, ceilings: Ceilings) -> SolEstimate:
    """Lower-bound time of ``work`` under ``ceilings``."""
    rate = ceilings.rate_for(work.dtype_class)
    compute_ms = work.flops / (rate * 1e12) * 1e3 if rate > 0 else 0.0
    bw = max(ceilings.copy_gbps, ceilings.read_gbps)
    memory_ms = work.bytes / (bw * 1e9) * 1e3 if bw > 0 else 0.0
    return SolEstimate(
        work=work,
        compute_ms=compute_ms,
        memory_ms=memory_ms,
        bound_ms=max(compute_ms, memory_ms),
        bound_by="compute" if compute_ms >= memory_ms else "memory",
        rate_tflops=rate,
        copy_gbps=bw,
    )


#: Written bytes a cache can absorb within a timed call (the protocol flushes L2 before each
#: call, but writes can land in it): more than any current GPU's L2 (H100/H200: 50 MB).
WRITE_ABSORB_BYTES = 128 << 20


def output_floor_ms(
    work: Work, ceilings: Ceilings, *, output_storage_bytes: int | None = None
) -> float:
    """A time no correct implementation can beat, the only bound that may reject: every output
    byte must be written, and bytes beyond what the cache can absorb (``WRITE_ABSORB_BYTES``)
    must reach device memory at no more than its best measured bandwidth:

        floor_ms = max(0, output_bytes - WRITE_ABSORB_BYTES) / max(copy_gbps, read_gbps)

    ``output_bytes`` is the reference output's dense size, or the candidate output's real
    storage when that is smaller (a broadcast view writes fewer bytes). Nothing else enters:
    a correct kernel need not do the reference's FLOPs nor read every input byte (diag(A) @ B
    needs only N of A's N*N values), so FLOPs and input bytes belong to :func:`estimate`, the
    roofline, which is an estimate, never a floor."""
    out = work.output_bytes
    if output_storage_bytes is not None:
        out = min(out, output_storage_bytes)
    bw = max(ceilings.copy_gbps, ceilings.read_gbps)
    written = max(0, out - WRITE_ABSORB_BYTES)
    return written / (bw * 1e9) * 1e3 if bw > 0 else 0.0


F_BELOW_SOL = "below_speed_of_light"


def check_time(
    ref_source: str, measured_ms: float, ceilings: Ceilings, slack: float = 0.9
) -> tuple[SolEstimate, list[str]]:
    """The bound of ``ref_source`` and ``["below_speed_of_light"]`` when ``measured_ms`` is
    under ``slack`` x the bound (a time no correct implementation can reach)."""
    e = estimate(count_work(ref_source), ceilings)
    return e, [F_BELOW_SOL] if e.impossible(measured_ms, slack) else []
