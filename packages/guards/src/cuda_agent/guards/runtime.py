"""Dynamic checks inside the candidate's process (authoritative where static checks are advisory).

``RuntimeGuard`` wraps each verification call: a ``TorchDispatchMode`` records every ATen op the
forward dispatches (C++ extensions included), a profile hook records calls into the candidate's own
extension modules, and on CUDA ``torch.profiler`` records the kernels that ran and their streams.
After the call it checks inputs (unchanged), outputs (plain, materialised, not aliasing inputs,
not changing after the call returned), threads, and the identity of timing and harness functions.
:meth:`RuntimeGuard.probe` re-runs the model on a poisoned allocator, unobserved, and with inputs
rewritten in place, to catch stale-memory reads, verification detection and result caches.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cuda_agent.profiler import warm_kernel_trace
from cuda_agent.records import GuardViolation
from cuda_agent.records.nested import SLICE_ELEMENTS, flat_slices
from cuda_agent.records.nested import leaves as flatten
from cuda_agent.records.nested import tensor_leaves as tensors

from . import harness
from .checks import Findings
from .opclass import HALF_DTYPE_NAMES, TORCH_NAMESPACES, base_name, classify

# ----------------------------------------------------------------------------- helpers


def fingerprint(t: torch.Tensor, *, slice_elements: int = SLICE_ELEMENTS) -> tuple:
    """A content fingerprint computed on the tensor's device: shape, stride, dtype and three
    integer sums over the raw bits (any single changed element changes it). The sums run slice
    by slice (``slice_elements`` words each): an int64 sum casts its input, and a whole-tensor
    cast would double a multi-GB tensor's footprint."""
    meta = (tuple(t.shape), tuple(t.stride()), str(t.dtype), t.device.type)
    if t.numel() == 0:
        return meta + (0, 0, 0)
    with torch.no_grad():
        base = torch.Tensor.detach(t)
        if base.is_conj() or base.is_neg():
            base = base.resolve_conj().resolve_neg()
        b = base.contiguous().view(-1).view(torch.uint8)
        n = b.numel()
        if n % 4 == 0:
            w = b.view(torch.int32)
        elif n % 2 == 0:
            w = b.view(torch.int16)
        else:
            w = b
        # per-slice reductions: no temporary as large as the tensor (the caching allocator's
        # state is part of what is being checked); the same sums as over the whole tensor, the
        # strided ones over the same global positions (0 mod 7, 1 mod 3)
        acc = torch.zeros(3, dtype=torch.int64, device=w.device)
        for start, part in flat_slices(w, slice_elements):
            acc[0] += part.sum(dtype=torch.int64)
            acc[1] += part[(-start) % 7 :: 7].sum(dtype=torch.int64)
            acc[2] += part[(1 - start) % 3 :: 3].sum(dtype=torch.int64)
        s1, s2, s3 = (int(v) for v in acc.tolist())
    return meta + (s1, s2, s3)


COMPARE_CHUNK = SLICE_ELEMENTS  # elements per slice of :func:`same_output`'s float64 comparison


def same_output(a: Any, b: Any, rtol: float = 1e-3) -> str | None:
    """``None`` when ``a`` and ``b`` hold the same values (NaN where NaN, within ``rtol`` of the
    largest magnitude), else a short description of the first difference. Tensors that are not
    bit-identical are compared in slices of :data:`COMPARE_CHUNK` elements: the temporaries stay
    a few hundred MB whatever the output's size (a whole-tensor float64 copy of a 6 GB output is
    12 GB, on a device the probe has already filled)."""
    fa, fb = flatten(a), flatten(b)
    if len(fa) != len(fb):
        return f"{len(fa)} outputs vs {len(fb)}"
    for i, (x, y) in enumerate(zip(fa, fb, strict=True)):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return f"output {i}: type {type(x).__name__} vs {type(y).__name__}"
        if not isinstance(x, torch.Tensor):
            if x != y and not (isinstance(x, float) and x != x and y != y):
                return f"output {i}: {x!r} vs {y!r}"
            continue
        x = torch.Tensor.detach(x)
        y = torch.Tensor.detach(y)
        if x.shape != y.shape:
            return f"output {i}: shape {tuple(x.shape)} vs {tuple(y.shape)}"
        if x.numel() == 0 or (x.dtype == y.dtype and torch.equal(x, y)):
            continue  # the common case, and cheap
        d = _slices_differ(x.reshape(-1), y.reshape(-1), rtol)
        if d:
            return f"output {i}: {d}"
    return None


def _slices_differ(x: torch.Tensor, y: torch.Tensor, rtol: float) -> str | None:
    """:func:`same_output`'s rule on two flat tensors of one length, slice by slice: NaN
    positions and infinities must match; the largest finite difference must be within ``rtol``
    of the largest finite magnitude of ``y`` (both maxima over the whole tensor)."""
    nan_diff = 0
    diff = scale = 0.0
    any_finite = False
    for s, part in flat_slices(y, COMPARE_CHUNK):
        xd = x[s : s + COMPARE_CHUNK].to(torch.float64)
        yd = part.to(torch.float64)
        nx, ny = torch.isnan(xd), torch.isnan(yd)
        nan_diff += int((nx ^ ny).sum())
        if nan_diff:
            continue
        fx, fy = torch.isfinite(xd), torch.isfinite(yd)
        if not torch.equal(fx, fy) or not torch.equal(xd[~fx & ~nx], yd[~fy & ~ny]):
            return "infinities differ"
        if fx.any():
            any_finite = True
            diff = max(diff, (xd[fx] - yd[fx]).abs().max().item())
            scale = max(scale, yd[fx].abs().max().item())
    if nan_diff:
        return f"NaN in {nan_diff} positions differs"
    if any_finite and diff > rtol * max(scale, 1e-6) + 1e-7:
        return f"max |diff| {diff:.3g} (scale {scale:.3g})"
    return None


def clone_inputs(inputs: Sequence[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def clone_at_new_addresses(inputs: Sequence[Any]) -> list[Any]:
    """Copies of ``inputs`` (same shapes, strides and values) at data pointers that no plain
    allocation can have had: each starts 256 bytes (CUDA; blocks start on multiples of 512) or
    32 bytes (CPU; 64) into a slightly larger buffer. Fresh tensors from ``clone`` may get the
    address of one freed a moment ago, and a cache keyed by pointer then hits."""
    out = []
    for x in inputs:
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        pad = max(1, (256 if x.device.type == "cuda" else 32) // x.element_size())
        span = 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride(), strict=True) if n)
        buf = torch.empty(pad + (span if x.numel() else 0), dtype=x.dtype, device=x.device)
        t = buf.as_strided(x.shape, x.stride(), pad)
        t.copy_(x)
        out.append(t)
    return out


def perturbed(inputs: Sequence[Any], seed: int = 1234) -> list[Any]:
    """Fresh inputs with new values of the same shape and dtype (floats: new normal draws at the
    same scale; integers and bools: a rotation of the values). The draws are made on each
    input's own device (a multi-GB input drawn on the CPU took seconds)."""
    gens: dict[torch.device, torch.Generator] = {}
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
            xd = x.detach().to(torch.float32)
            scale = float(xd.std()) if x.numel() > 1 else 1.0
            scale = scale if scale > 0 and scale == scale else 1.0
            mean = float(xd.mean())
            if x.device not in gens:
                gens[x.device] = torch.Generator(device=x.device).manual_seed(seed)
            noise = torch.randn(x.shape, generator=gens[x.device], device=x.device).to(x.dtype)
            # in place: the same values as ``noise * scale + mean`` without two more temporaries
            # of the input's size (an 8 GB input's probe peaked at 5x its size on the H200)
            out.append(noise.mul_(scale).add_(mean))
        elif isinstance(x, torch.Tensor) and x.numel() > 1:
            out.append(torch.roll(x, 1).clone())
        else:
            out.append(x.clone() if isinstance(x, torch.Tensor) else x)
    return out


def _os_thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _is_own_file(path: str | None) -> bool:
    if not path or not path.endswith((".so", ".pyd", ".dylib")):
        return False
    real = os.path.realpath(path)
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {sys.prefix, sys.base_prefix}
    return not any(real.startswith(os.path.realpath(r) + os.sep) for r in roots if r)


# ----------------------------------------------------------------------------- recorders


class OpRecorder(TorchDispatchMode):
    """Records the ATen ops dispatched while active: name, class, and dtype conversions."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.casts: list[tuple[str, str]] = []  # (from dtype, to dtype) of _to_copy

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps __torch_dispatch__ in torch._disable_dynamo otherwise, which imports
        # torch._dynamo on first use (15+ s on a busy 2-core machine)
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = str(func)
        self.ops.append(name)
        if base_name(name) in ("_to_copy", "to") and args and isinstance(args[0], torch.Tensor):
            dt = kwargs.get("dtype")
            if dt is not None and dt != args[0].dtype:
                self.casts.append((str(args[0].dtype), str(dt)))
        return func(*args, **kwargs)


@dataclass
class CallRecord:
    """What one observed call did."""

    ops: list[str] = field(default_factory=list)
    casts: list[tuple[str, str]] = field(default_factory=list)
    own_calls: list[str] = field(default_factory=list)
    kernels: list[tuple[str, int]] = field(default_factory=list)  # (name, stream id)
    kernel_ns: dict[str, int] = field(default_factory=dict)  # device time per kernel name
    marker_stream: int | None = None
    seconds: float = 0.0


class _ProfileHook:
    """``sys.setprofile`` hook that records C calls into the candidate's own extension modules."""

    def __init__(self, is_own: Callable[[Any], str | None]):
        self.is_own = is_own
        self.calls: list[str] = []
        self.prev: Any = None

    def __call__(self, frame, event, arg):  # noqa: ANN001
        if event == "c_call":
            name = self.is_own(arg)
            if name is not None:
                self.calls.append(name)
        return None

    def __enter__(self) -> _ProfileHook:
        self.prev = sys.getprofile()
        sys.setprofile(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        current = sys.getprofile()
        try:
            sys.setprofile(self.prev)
        except TypeError:  # a C-level profiler (cProfile) cannot be restored from Python
            sys.setprofile(None)
        self.replaced = current is not self


# ----------------------------------------------------------------------------- the guard


class RuntimeGuardImpl:
    """The implementation behind :class:`cuda_agent.guards.api.RuntimeGuard`."""

    def __init__(
        self,
        policy: str = "strict",
        backend: str = "cuda",
        own_kernels: Sequence[str] = (),
        *,
        own_modules: Sequence[str] = (),
        protect: Sequence[Any] = (),
        float32_task: bool | None = None,
        trace_kernels: bool | None = None,
    ):
        self.fs = Findings(policy)
        self.policy = policy
        self.backend = backend
        self.own_kernels = [k for k in own_kernels if k]
        self.own_module_names = set(own_modules)
        self.protect = list(protect)
        self.float32_task = float32_task
        self.trace_kernels = (backend == "cuda") if trace_kernels is None else trace_kernels
        self.records: list[CallRecord] = []
        self.timings: dict[str, float] = {}
        self._modules_before = set(sys.modules)
        self._snap = harness.snapshot(self.protect)
        self._threads_base: set[int] = {t.ident or 0 for t in threading.enumerate()}
        self._os_threads_first: int | None = None
        self._pre: list[tuple] = []
        self._last_outputs: list[torch.Tensor] = []
        self._call_no = 0
        self._installed = False
        self._own_cache: dict[int, str | None] = {}
        self._mutated = False
        self.min_own_share = 0.05  # kernelbench: own kernels must take at least this device time
        self._l2_base: tuple[int, int] | None = None

    # -- set-up -------------------------------------------------------------------------

    def install(self) -> None:
        """Snapshot what must not change; report what the candidate's import already changed."""
        if self.policy == "off":
            return
        t0 = time.perf_counter()
        self._harness_check("while the candidate was imported or built")
        for name in harness.unpristine(harness.IMPORT_SNAPSHOT) + harness.unpristine(self._snap):
            code = "G-TIMER-PATCH" if name in harness.TIMING else "G-HARNESS-PATCH"
            self.fs.add(code, f"{name} is not torch's or Python's own function", name)
        for name, mod in list(sys.modules.items()):
            if name not in self._modules_before and _is_own_file(getattr(mod, "__file__", None)):
                self.own_module_names.add(name)
        if self.trace_kernels:
            # the tracer's set-up (seconds) and the native threads it leaves, before any watched
            # call: otherwise the first call's thread check waits its full second for them
            self.timings["trace_setup"] = warm_kernel_trace()
        self._snap = harness.snapshot(self.protect)
        self._threads_base = {t.ident or 0 for t in threading.enumerate()}
        if self.backend == "cuda" and torch.cuda.is_available():
            self._l2_base = l2_state()
        self._installed = True
        self.timings["install"] = time.perf_counter() - t0

    def _harness_check(self, when: str) -> None:
        now = harness.snapshot(self.protect)
        changed = [k for k, v in self._snap.items() if k in now and now[k] is not v]
        if not changed:
            return
        foreign = set(harness.unpristine({k: now[k] for k in changed}))
        # importing torch._dynamo (lazily, during a call) rebinds torch.manual_seed to torch's own
        # wrapper of the same function: not a patch
        changed = [
            k
            for k in changed
            if k in foreign or getattr(now[k], "__wrapped__", None) is not self._snap[k]
        ]
        for name in changed:
            timing = name in harness.TIMING
            code = "G-TIMER-PATCH" if timing else "G-HARNESS-PATCH"
            # torch rebinds a few of its own functions lazily; a replacement from torch's own code
            # is only flagged, except for timing functions
            sev = None if (timing or name in foreign or name.startswith("sys.modules")) else "flag"
            self.fs.add(
                code, f"{name} was replaced {when}", f"{name}: {now[name]!r}"[:300], severity=sev
            )
        self._snap = now

    def _is_own(self, fn: Any) -> str | None:
        key = id(fn)
        if key in self._own_cache:
            return self._own_cache[key]
        mod = getattr(fn, "__module__", None)
        if not isinstance(mod, str):
            self_obj = getattr(fn, "__self__", None)
            mod = getattr(self_obj, "__name__", None) if self_obj is not None else None
        res = None
        if isinstance(mod, str) and mod.split(".")[0] in self.own_module_names | {
            m.split(".")[0] for m in self.own_module_names
        }:
            res = f"{mod}.{getattr(fn, '__name__', '?')}"
        self._own_cache[key] = res
        return res

    # -- one call -----------------------------------------------------------------------

    @contextmanager
    def watch(self, inputs: Sequence[Any]) -> Iterator[CallRecord]:
        """Observe one forward call: dispatched ops, own-module calls, CUDA kernels."""
        rec = CallRecord()
        if self.policy == "off":
            yield rec
            return
        if not self._installed:
            self.install()
        t0 = time.perf_counter()
        self._pre = [fingerprint(x) if isinstance(x, torch.Tensor) else None for x in inputs]
        self._pre_ptrs = [_storage_ptr(x) for x in inputs]
        self._threads_before = {t.ident or 0 for t in threading.enumerate()}
        self._os_before = _os_thread_count()
        prof = None
        if self.trace_kernels and torch.cuda.is_available():
            from torch.profiler import ProfilerActivity, profile

            prof = profile(activities=[ProfilerActivity.CUDA])
            prof.__enter__()
            torch.empty(1, device="cuda").fill_(0.0)  # marker kernel on the current stream
        recorder = OpRecorder()
        hook = _ProfileHook(self._is_own)
        self.timings["pre"] = self.timings.get("pre", 0.0) + time.perf_counter() - t0
        t1 = time.perf_counter()
        try:
            with hook, recorder:
                yield rec
        finally:
            rec.seconds = time.perf_counter() - t1
            t2 = time.perf_counter()
            rec.ops, rec.casts, rec.own_calls = recorder.ops, recorder.casts, hook.calls
            if getattr(hook, "replaced", False):
                self.fs.add(
                    "G-INTROSPECTION",
                    "the profile hook was replaced during the call",
                    repr(sys.getprofile()),
                )
            if prof is not None:
                torch.cuda.synchronize()
                prof.__exit__(None, None, None)
                rec.kernels, rec.marker_stream = _kernels_of(prof, rec.kernel_ns)
            self.records.append(rec)
            self.timings["post"] = self.timings.get("post", 0.0) + time.perf_counter() - t2

    def after_call(self, inputs: Sequence[Any], outputs: Any) -> None:
        """Checks on the call just watched: output types, aliasing, deferred work, mutation,
        threads, harness identity, dispatched ops and kernels."""
        if self.policy == "off":
            return
        t0 = time.perf_counter()
        self._call_no += 1
        n = self._call_no
        rec = self.records[-1] if self.records else CallRecord()
        leaves = flatten(outputs)
        plain: list[torch.Tensor] = []
        for i, o in enumerate(leaves):
            problem = _output_problem(o, self.backend)
            if problem and problem.startswith("is on "):
                # a device the reference may share (e.g. a .cpu() result): the parent's structure
                # check decides; here it is only recorded
                self.fs.add("G-OUTPUT-TYPE", f"output {i} {problem}", f"call {n}", severity="flag")
                plain.append(o)
            elif problem:
                self.fs.add("G-OUTPUT-TYPE", f"output {i} {problem}", f"call {n}: {type(o)!r}")
            elif isinstance(o, torch.Tensor):
                plain.append(o)
        # deferred work: fingerprint after the current stream finishes, then after everything
        if torch.cuda.is_available() and any(t.is_cuda for t in plain):
            torch.cuda.current_stream().synchronize()
        first = [fingerprint(t) for t in plain]
        new_threads = [
            t
            for t in threading.enumerate()
            if (t.ident or 0) not in self._threads_before and t.is_alive()
        ]
        for t in new_threads:
            t.join(timeout=2.0)
        self._wait_os_threads(self._os_before, 1.0)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        time.sleep(0.002)
        second = [fingerprint(t) for t in plain]
        if first != second:
            self.fs.add(
                "G-DEFERRED",
                "an output changed after the call returned",
                "work continued on another thread or an unsynchronised stream",
            )
        if new_threads:
            self.fs.add(
                "G-THREAD",
                f"call {n}: {len(new_threads)} Python thread(s) started and still "
                "running when the call returned",
                ", ".join(t.name for t in new_threads),
            )
        os_now = _os_thread_count()
        if self._os_threads_first is None:
            self._os_threads_first = os_now
        elif os_now > self._os_threads_first:
            self.fs.add(
                "G-THREAD",
                f"call {n}: native threads grew from {self._os_threads_first} to "
                f"{os_now} after the first call",
                "threads outlive the call",
            )
        # inputs unchanged
        for i, (x, pre) in enumerate(zip(inputs, self._pre, strict=False)):
            if isinstance(x, torch.Tensor) and pre is not None and fingerprint(x) != pre:
                self._mutated = True
                self.fs.add(
                    "G-INPUT-MUTATION",
                    f"input {i} changed during the call",
                    f"call {n}: shape {tuple(x.shape)}",
                )
        # aliasing
        in_ptrs = {p: i for i, p in enumerate(self._pre_ptrs) if p}
        seen: dict[int, int] = {}
        for j, o in enumerate(plain):
            p = _storage_ptr(o)
            if p and p in in_ptrs:
                self.fs.add(
                    "G-OUTPUT-ALIAS",
                    f"call {n}: output {j} shares memory with input {in_ptrs[p]}",
                    f"storage {p:#x}",
                )
            elif p and p in seen and o.numel() > 0:
                self.fs.add(
                    "G-OUTPUT-ALIAS",
                    f"call {n}: outputs {seen[p]} and {j} share memory",
                    f"storage {p:#x}",
                    severity="flag",
                )
            seen[p] = j
        prev = {_storage_ptr(t): t for t in self._last_outputs}
        for j, o in enumerate(plain):
            p = _storage_ptr(o)
            if p and p in prev and prev[p] is not None and o.numel() > 0:
                self.fs.add(
                    "G-CACHE",
                    f"call {n}: output {j} is the buffer returned by the previous call",
                    f"storage {p:#x}",
                )
        self._last_outputs = list(plain)
        self._harness_check(f"during call {n}")
        self._judge_record(rec, n, inputs)
        if torch.cuda.is_available() and self.backend == "cuda":
            _l2_check(self.fs, n, self._l2_base)
        self.timings["after_call"] = self.timings.get("after_call", 0.0) + time.perf_counter() - t0

    def _wait_os_threads(self, target: int, timeout: float) -> None:
        end = time.monotonic() + timeout
        while _os_thread_count() > target and time.monotonic() < end:
            time.sleep(0.005)

    def _judge_record(self, rec: CallRecord, n: int, inputs: Sequence[Any]) -> None:
        compute = [o for o in rec.ops if _ns(o) in TORCH_NAMESPACES and classify(o) == "compute"]
        random_ops = [o for o in rec.ops if _ns(o) in TORCH_NAMESPACES and classify(o) == "random"]
        own_ops = [o for o in rec.ops if _ns(o) not in TORCH_NAMESPACES]
        if compute:
            uniq = sorted(set(compute))
            self.fs.add(
                "G-TORCH-COMPUTE",
                f"torch compute ops in forward: {', '.join(uniq[:8])}",
                f"call {n}: {len(compute)} compute ops of {len(rec.ops)}",
            )
        if random_ops:
            self.fs.add(
                "G-RNG", f"random ops in forward: {', '.join(sorted(set(random_ops)))}", f"call {n}"
            )
        f32 = self.float32_task
        if f32 is None:
            floats = [
                x.dtype for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()
            ]
            f32 = bool(floats) and all(d == torch.float32 for d in floats)
        low = [c for c in rec.casts if c[1].replace("torch.", "") in HALF_DTYPE_NAMES]
        if f32 and low:
            self.fs.add(
                "G-PRECISION", f"casts to {low[0][1]} on a float32 task", f"call {n}: {low}"
            )
        own_kernels = [k for k, _ in rec.kernels if self._kernel_is_own(k)]
        if not (rec.own_calls or own_ops or own_kernels):
            self.fs.add(
                "G-NO-KERNEL",
                f"call {n} ran none of the candidate's own kernels or functions",
                f"ops: {', '.join(sorted(set(rec.ops))[:10])}; kernels: "
                f"{', '.join(sorted({k for k, _ in rec.kernels})[:6])}",
            )
        own_ns = sum(v for k, v in rec.kernel_ns.items() if self._kernel_is_own(k))
        # torch's share: ATen kernels, plus library kernels when torch compute ops were dispatched
        # (cuBLAS/cuDNN called by the candidate's own C++ count as the candidate's work)
        torch_ns = sum(
            v
            for k, v in rec.kernel_ns.items()
            if not self._kernel_is_own(k) and (compute or "at::native" in k)
        )
        total_ns = own_ns + torch_ns
        if own_kernels and total_ns > 0 and own_ns < self.min_own_share * total_ns:
            # the own kernels are a token next to library/torch kernels doing the work
            self.fs.add(
                "G-NO-KERNEL",
                f"call {n}: the candidate's own kernels took {own_ns / total_ns:.1%} of the "
                "device time",
                f"own {own_ns} ns of {total_ns} ns",
                severity=None if self.policy == "kernelbench" else "flag",
            )
        if rec.kernels and rec.marker_stream is not None:
            off = sorted({k for k, s in rec.kernels if s != rec.marker_stream})
            if off:
                self.fs.add(
                    "G-STREAM", f"call {n}: kernels ran off the current stream", ", ".join(off[:5])
                )
        if self.backend == "cuda" and self.policy == "strict":
            aten_k = [
                k
                for k, _ in rec.kernels
                if "at::native" in k
                and not any(s in k for s in ("Fill", "fill", "copy", "Copy", "zero"))
            ]
            if aten_k:
                self.fs.add(
                    "G-TORCH-COMPUTE",
                    "ATen compute kernels ran in forward",
                    f"call {n}: {', '.join(sorted(set(aten_k))[:4])}",
                )

    def _kernel_is_own(self, name: str) -> bool:
        import re

        return any(re.search(rf"(?<![\w]){re.escape(k)}(?![\w])", name) for k in self.own_kernels)

    # -- extra calls --------------------------------------------------------------------

    def probe(
        self,
        model: Callable[..., Any],
        inputs: Sequence[Any],
        outputs: Any = None,
        seed: int = 1234,
    ) -> None:
        """Re-run ``model`` to catch what one observed call cannot: poisoned-allocator runs (NaN,
        then random) must reproduce ``outputs``; an unobserved call must too; inputs rewritten in
        place must give the same result as fresh tensors holding the same values; a repeated call
        on the same values must run the same own kernels (no content cache)."""
        if self.policy == "off" or self._mutated:
            return  # a candidate that mutates its inputs is rejected already; reruns would mislead
        t0 = time.perf_counter()
        with torch.no_grad():
            if outputs is None:
                outputs = model(*clone_inputs(inputs))
            out_bytes = [t.untyped_storage().nbytes() for t in tensors(outputs)]
            sizes = out_bytes + [x.untyped_storage().nbytes() for x in tensors(inputs)]
            dev = _device_of(inputs, outputs)
            # 1. poisoned allocator (NaN, then random), observed as in verification
            stale = False
            for mode in ("nan", "random"):
                ins = clone_inputs(inputs)
                with poisoned(mode, sizes, device=dev):
                    out_p = self._call(model, ins, observed=True)
                d = same_output(out_p, outputs)
                del out_p, ins
                if d:
                    stale = True
                    self.fs.add(
                        "G-STALE-MEMORY", f"output changed on a {mode}-poisoned allocator", d
                    )
                    break
            # 2. unobserved (no dispatch mode, no profile hook), NaN-poisoned so that stale memory
            #    cannot cover for work it skips
            ins = clone_inputs(inputs)
            with poisoned("nan", sizes, device=dev):
                out_u = self._call(model, ins, observed=False)
            d = same_output(out_u, outputs)
            if d and not stale:
                self.fs.add("G-OBSERVER", "an unobserved call gave a different output", d)
            del out_u, ins
            # 3. pointer cache: same buffers, new values, vs fresh buffers with those values;
            #    content cache: the first call on new values runs the same own kernels as repeats.
            #    Each output is dropped once compared: a multi-GB problem holds a few at a time.
            bufs = clone_inputs(inputs)
            model(*bufs)
            _sync()
            newvals = perturbed(inputs, seed)
            changed = _differs(inputs, newvals)
            for b, v in zip(bufs, newvals, strict=False):
                if isinstance(b, torch.Tensor):
                    b.copy_(v)
            out_a, kernels_a = self._observe_own(model, bufs)
            del bufs
            # fresh tensors at addresses never used before: a plain clone could get the address
            # of ``bufs`` or of an earlier clone of these inputs, whose cached output would match
            out_b, kernels_b = self._observe_own(model, clone_at_new_addresses(newvals))
            d = same_output(out_a, out_b)
            del out_a
            kernels_c = self._observe_own(model, clone_at_new_addresses(newvals))[1]
            del newvals
            if d:
                self.fs.add(
                    "G-CACHE",
                    "inputs rewritten in place gave a different result than fresh "
                    "tensors with the same values (cache keyed by pointer)",
                    d,
                )
            elif kernels_a != kernels_b or kernels_b != kernels_c:
                self.fs.add(
                    "G-CACHE",
                    "repeated calls with the same values ran different own kernels "
                    "(cache keyed by content)",
                    f"{kernels_a[:4]} / {kernels_b[:4]} / {kernels_c[:4]}",
                )
            if changed and _bit_identical(out_b, outputs):
                self.fs.add(
                    "G-INPUT-INSENSITIVE",
                    "output identical for different inputs",
                    "perturbed inputs gave a bit-identical output",
                    severity="flag",
                )
        self.timings["probe"] = self.timings.get("probe", 0.0) + time.perf_counter() - t0

    def _call(self, model: Callable[..., Any], inputs: Sequence[Any], observed: bool) -> Any:
        if not observed:
            out = model(*inputs)
        else:
            with _ProfileHook(self._is_own), OpRecorder():
                out = model(*inputs)
        _sync()
        return out

    def _observe_own(
        self, model: Callable[..., Any], inputs: Sequence[Any]
    ) -> tuple[Any, list[str]]:
        """Call once with only the light observers (own calls and kernel names)."""
        hook = _ProfileHook(self._is_own)
        prof = None
        if self.trace_kernels and torch.cuda.is_available():
            from torch.profiler import ProfilerActivity, profile

            prof = profile(activities=[ProfilerActivity.CUDA])
            prof.__enter__()
        with hook:
            out = model(*inputs)
        _sync()
        names = list(hook.calls)
        if prof is not None:
            prof.__exit__(None, None, None)
            names += [k for k, _ in _kernels_of(prof)[0] if self._kernel_is_own(k)]
        return out, names

    def finish(self) -> list[GuardViolation]:
        """All findings of this process (a last harness check included)."""
        if self.policy != "off":
            self._harness_check("by the end of verification")
        return list(self.fs.items)


# ----------------------------------------------------------------------------- poison


@contextmanager
def poisoned(mode: str, sizes: Sequence[int], device: str) -> Iterator[None]:
    """Fill memory the allocator will hand out next with NaN (``mode='nan'``) or random values.

    CUDA: blocks of each size (and one large block) are allocated, filled and freed into the
    caching allocator. Both devices: ``torch.empty`` itself fills new tensors with NaN in the NaN
    pass (deterministic fill-uninitialised-memory mode)."""
    import torch.utils.deterministic as det

    dev = torch.device(device)
    blocks = []
    sizes = [s for s in sizes if s > 0]
    big = min(sum(sizes) * 2, 1 << 30) if sizes else 0
    for s in [*sizes, *sizes, big]:
        if s <= 0:
            continue
        n = (s + 3) // 4
        b = torch.empty(n, dtype=torch.float32, device=dev)
        if mode == "nan":
            b.fill_(float("nan"))
        else:
            b.uniform_(-1e3, 1e3)
        blocks.append(b)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    del blocks
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_fill = det.fill_uninitialized_memory
    if mode == "nan":
        torch._C._set_deterministic_algorithms(True, warn_only=True)
        det.fill_uninitialized_memory = True
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch._C._set_deterministic_algorithms(prev_det, warn_only=prev_warn)
        det.fill_uninitialized_memory = prev_fill


# ----------------------------------------------------------------------------- small pieces


def _ns(op: str) -> str:
    return op.split(".")[0] if "." in op else op.split("::")[0]


def _storage_ptr(x: Any) -> int:
    if not isinstance(x, torch.Tensor) or type(x) is not torch.Tensor:
        return 0
    try:
        return x.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _output_problem(o: Any, backend: str) -> str | None:
    if isinstance(o, torch.Tensor):
        if type(o) is not torch.Tensor:
            return f"is a tensor subclass {type(o).__module__}.{type(o).__name__}"
        if o.is_meta:
            return "is a meta tensor (no data)"
        if o.layout != torch.strided:
            return f"has layout {o.layout}"
        if o.is_nested:
            return "is a nested tensor"
        if o.is_neg() or o.is_conj():
            return "carries a lazy neg/conj bit"
        try:
            from torch._C._functorch import is_functorch_wrapped_tensor

            if is_functorch_wrapped_tensor(o):
                return "is a functorch wrapper"
        except ImportError:
            pass
        want = "cuda" if backend == "cuda" else "cpu"
        if o.device.type != want:
            return f"is on {o.device.type}, expected {want}"
        try:
            o.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return "has no materialised storage"
        return None
    if isinstance(o, int | float | bool | str | type(None)):
        return None
    return f"is a {type(o).__module__}.{type(o).__name__}, not a torch.Tensor"


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _device_of(*objs: Any) -> str:
    for o in objs:
        for t in tensors(o):
            return str(t.device)
    return "cpu"


def _bit_identical(a: Any, b: Any) -> bool:
    """Whether two outputs have the same structure and bit-identical tensors (no temporaries)."""
    fa, fb = flatten(a), flatten(b)
    if len(fa) != len(fb):
        return False
    for x, y in zip(fa, fb, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
            return False
    return True


def _differs(a: Sequence[Any], b: Sequence[Any]) -> bool:
    for x, y in zip(a, b, strict=False):
        if (
            isinstance(x, torch.Tensor)
            and isinstance(y, torch.Tensor)
            and x.is_floating_point()
            and not torch.equal(x, y)
        ):
            return True
    return False


def _kernels_of(
    prof: Any, durations: dict[str, int] | None = None
) -> tuple[list[tuple[str, int]], int | None]:
    """(kernel name, stream id) of every CUDA kernel in a finished profile, and the stream of the
    guard's marker kernel (the first fill kernel); ``durations`` collects device ns per name."""
    out: list[tuple[str, int]] = []
    marker = None
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError:
        return out, None

    def start(e: Any) -> int:
        try:
            return int(e.start_ns())
        except (AttributeError, RuntimeError):
            return 0

    for e in sorted(events, key=start):
        try:
            if e.device_type() != torch.autograd.DeviceType.CUDA:
                continue
            name = e.name()
            stream = int(e.device_resource_id())
        except (AttributeError, RuntimeError):
            continue
        if "memcpy" in name.lower() or "memset" in name.lower():
            continue
        if marker is None and ("fill" in name.lower() or "Fill" in name):
            marker = stream
            continue
        out.append((name, stream))
        if durations is not None:
            with suppress(AttributeError, RuntimeError):
                durations[name] = durations.get(name, 0) + int(e.duration_ns())
    return out, marker


_CUDART: Any = None


def _cudart() -> Any:
    """The CUDA runtime library this process loaded (found in /proc/self/maps), or None."""
    global _CUDART
    if _CUDART is None:
        import ctypes

        _CUDART = False
        try:
            with open("/proc/self/maps") as f:
                paths = {ln.split()[-1] for ln in f if "libcudart.so" in ln}
        except OSError:
            paths = set()
        if not paths:  # torch may link cudart statically: use the runtime of its wheel, if any
            import glob

            for root in sys.path:
                paths |= set(glob.glob(os.path.join(root, "nvidia", "cu*", "lib", "libcudart.so*")))
                paths |= set(
                    glob.glob(os.path.join(root, "nvidia", "cuda_runtime", "lib", "libcudart.so*"))
                )
            paths |= set(glob.glob("/usr/local/cuda/lib64/libcudart.so*"))
        for p in sorted(paths):
            try:
                _CUDART = ctypes.CDLL(p)
                break
            except OSError:
                continue
    return _CUDART or None


def l2_state() -> tuple[int, int] | None:
    """(persisting-L2 limit of the device, access-policy window bytes of the current stream), or
    ``None`` when the CUDA runtime cannot be queried."""
    import ctypes

    lib = _cudart()
    if lib is None:
        return None
    limit, window = -1, -1
    val = ctypes.c_size_t(0)
    with suppress(Exception):
        if lib.cudaDeviceGetLimit(ctypes.byref(val), 0x06) == 0:
            limit = int(val.value)
    buf = (ctypes.c_byte * 64)()
    with suppress(Exception):
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        if lib.cudaStreamGetAttribute(stream, 1, ctypes.byref(buf)) == 0:
            window = int(ctypes.c_size_t.from_buffer(buf, 8).value)
    return limit, window


def _l2_check(fs: Findings, n: int, base: tuple[int, int] | None) -> None:
    """A persisting-L2 limit or stream access-policy window that grew past its value at install
    (the device's default limit is not zero on every GPU)."""
    now = l2_state()
    if now is None or base is None:
        return
    if now[0] > max(base[0], 0):
        fs.add(
            "G-L2-PERSIST",
            f"call {n}: persisting-L2 limit raised from {base[0]} to {now[0]} bytes",
            "cudaLimitPersistingL2CacheSize",
        )
    if now[1] > max(base[1], 0):
        fs.add(
            "G-L2-PERSIST",
            f"call {n}: the current stream has an L2 access-policy window of {now[1]} bytes",
            "cudaStreamAttributeAccessPolicyWindow",
        )
