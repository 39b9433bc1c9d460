"""Speed-of-light: an informational roofline estimate of a program's time, and the output floor
(:func:`output_floor_ms`), the only bound that holds for every correct implementation and so
the only one a guard may reject by.

- Ceilings: a large device-to-device copy (bytes read + written per second), a large sum
  (bytes read per second), a large fill (bytes written per second), square matmuls in fp32,
  tf32, bf16 and fp16, and the L2 size; measured with the timing protocol and cached per device
  and torch.
- Roofline estimate (:func:`estimate`, ``SolEstimate.bound_ms``): ``max(flops / rate, bytes /
  bandwidth)`` from the reference's own work: FLOPs of ``torch.utils.flop_counter`` (matmul,
  conv, attention) at the fastest tensor-core rate of the inputs' dtype, and every input,
  parameter and output moved once. An algorithm that does less (``diag(A) @ B`` as a row
  scaling: no matmul, N of A's N*N entries) beats it, so it describes, it never rejects.
- Output floor (``SolEstimate.floor_ms``): every output byte is written within the timed call;
  the L2, flushed before the call, can still hold up to its size of them when the end event
  fires, and the rest reaches device memory at no more than the device's best bandwidth.
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
    write_gbps: float = 0.0  # a large fill: bytes written per second
    l2_bytes: int = 0  # as the driver reports it; 0: unknown
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

    def floor_gbps(self) -> float:
        """The best memory bandwidth known for the device, GB/s: the largest of the measured
        write, copy and read rates and the datasheet's (a pure write stream may beat a copy)."""
        ds = (datasheet_for(self.device) or {}).get("copy_gbps", 0.0)
        return max(self.write_gbps, self.copy_gbps, self.read_gbps, ds)

    def absorb_bytes(self) -> int:
        """Written bytes the cache can hold at the end of a timed call: the measured L2 size,
        else ``WRITE_ABSORB_BYTES``."""
        return self.l2_bytes if self.l2_bytes > 0 else WRITE_ABSORB_BYTES


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
    st = measure(lambda b: b.fill_(1.0), [[dst]], device=device, config=cfg)
    write_gbps = n * 4 / (st.median_ms * 1e-3) / 1e9
    l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 0)
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
        write_gbps=write_gbps,
        l2_bytes=l2,
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
    """The reference's work: its FLOPs (matmul/conv/attention) and the bytes it moves (inputs,
    parameters and outputs once each; ``output_bytes`` dense)."""

    flops: float
    bytes: int
    input_bytes: int
    param_bytes: int
    output_bytes: int
    dtype_class: str  # fp32 | bf16 | fp16 | fp64
    counted_on: str  # meta | cpu | cuda


class SolEstimate(msgspec.Struct, kw_only=True):
    """The roofline estimate of the reference's work (``bound_ms``, informational) and the
    output-write floor (``floor_ms``, a time no correct implementation beats)."""

    work: Work
    compute_ms: float
    memory_ms: float
    bound_ms: float  # roofline estimate: max(compute_ms, memory_ms)
    bound_by: str  # compute | memory
    rate_tflops: float
    copy_gbps: float
    floor_ms: float = 0.0  # output floor of the reference's dense output
    floor_gbps: float = 0.0
    absorb_bytes: int = 0

    def fraction(self, measured_ms: float) -> float:
        """Fraction of the roofline estimate reached: bound / measured (1.0 = at the estimate;
        above 1 is possible for an algorithm that does less work than the reference)."""
        return self.bound_ms / measured_ms if measured_ms > 0 else float("inf")

    def impossible(self, measured_ms: float, slack: float = 0.9) -> bool:
        """Whether ``measured_ms`` is below ``slack`` x the floor (no correct implementation)."""
        return measured_ms < slack * self.floor_ms


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

    from cuda_agent.records.nested import tensor_leaves

    from .program import Program

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
            ins = list(tensor_leaves(inputs))
            params = list(model.parameters()) + list(model.buffers())
            outs = list(tensor_leaves(out))
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
    """The roofline estimate of ``work`` under ``ceilings`` and the floor of its output."""
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
        floor_ms=output_floor_ms(work, ceilings),
        floor_gbps=ceilings.floor_gbps(),
        absorb_bytes=ceilings.absorb_bytes(),
    )


def _distinct_elements(t: Any) -> tuple[int, bool]:
    """(a lower bound on the distinct elements ``t`` addresses, whether they fill its span)."""
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride(), strict=True) if sz > 1 and st)
    reach = 0  # the largest offset the smaller strides reach
    for st, sz in dims:
        if st <= reach:  # dimensions overlap: each one alone still addresses distinct elements
            return max(sz for _, sz in dims), False
        reach += (sz - 1) * st
    n = 1
    for _, sz in dims:
        n *= sz
    return n, n == reach + 1


def storage_bytes(outputs: Any) -> int:
    """A lower bound on the bytes of memory ``outputs`` (tensors in lists, tuples, dicts)
    occupy: a broadcast (stride-0) dimension counts once and memory shared between outputs
    counts once, so an expanded view of a small tensor occupies the small tensor's bytes."""
    from cuda_agent.records.nested import tensor_leaves

    spans: dict[str, list[tuple[int, int]]] = {}  # dense views: [start, end) byte intervals
    gapped: dict[str, int] = {}  # other views: the largest of their distinct bytes
    for t in tensor_leaves(outputs):
        if t.numel() == 0:
            continue
        n, dense = _distinct_elements(t)
        nbytes, dev = n * t.element_size(), str(t.device)
        start = t.data_ptr() if t.device.type != "meta" else 0
        if dense and start:
            spans.setdefault(dev, []).append((start, start + nbytes))
        else:  # meta (no addresses) or a view with gaps: it may overlap any other output
            gapped[dev] = max(gapped.get(dev, 0), nbytes)
    total = 0
    for dev in spans.keys() | gapped.keys():
        union, end = 0, 0
        for a, b in sorted(spans.get(dev, [])):
            union += max(0, b - max(a, end))
            end = max(end, b)
        total += max(union, gapped.get(dev, 0))
    return total


#: Written bytes a cache can absorb within a timed call when the ceilings record no L2 size
#: (the protocol flushes L2 before each call, but writes can land in it): more than any current
#: GPU's L2 (H100/H200: 50 MiB).
WRITE_ABSORB_BYTES = 128 << 20


def output_floor_ms(
    work: Work, ceilings: Ceilings, *, output_storage_bytes: int | None = None
) -> float:
    """A time no correct implementation can beat, the only bound that may reject: every output
    byte must be written, and bytes beyond what the cache can absorb must reach device memory
    at no more than its best bandwidth:

        floor_ms = max(0, output_bytes - absorb_bytes) / floor_gbps

    ``absorb_bytes``: the measured L2 size (``WRITE_ABSORB_BYTES`` when not recorded);
    ``floor_gbps``: the largest of the measured write, copy and read bandwidths and the
    datasheet's. ``output_bytes`` is the reference output's dense size, or the candidate
    output's real storage when that is smaller (``storage_bytes(outputs)``: a broadcast
    view writes fewer bytes). Nothing else enters: a correct kernel need not do the reference's
    FLOPs nor read every input byte (diag(A) @ B needs only N of A's N*N values), so FLOPs and
    input bytes belong to :func:`estimate`, the roofline, which is an estimate, never a floor."""
    out = work.output_bytes
    if output_storage_bytes is not None:
        out = min(out, output_storage_bytes)
    bw = ceilings.floor_gbps()
    written = max(0, out - ceilings.absorb_bytes())
    return written / (bw * 1e9) * 1e3 if bw > 0 else 0.0


F_BELOW_SOL = "below_speed_of_light"


def check_time(
    ref_source: str, measured_ms: float, ceilings: Ceilings, slack: float = 0.9
) -> tuple[SolEstimate, list[str]]:
    """The estimate of ``ref_source`` and ``["below_speed_of_light"]`` when ``measured_ms`` is
    under ``slack`` x its floor (a time no correct implementation can reach)."""
    e = estimate(count_work(ref_source), ceilings)
    return e, [F_BELOW_SOL] if e.impossible(measured_ms, slack) else []
