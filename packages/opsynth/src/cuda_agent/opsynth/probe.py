"""Run every execution check on one task source, in the current process (the child's side).

:func:`run_probe` is what the isolated child runs (see :mod:`cuda_agent.opsynth.isolate`); it
never raises: the result is a dict ``{"ok", "reason", "detail", "eager_ms", "checks", ...}``
whose ``reason`` is one of the codes in :mod:`cuda_agent.opsynth.checks`.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from cuda_agent.records.nested import tensor_leaves
from cuda_agent.sandbox.gate import Occupant, device_gate, domain_of

from . import checks as C


@dataclass
class ProbeConfig:
    """What the child checks, and how."""

    device: str = "cpu"
    compile: bool = True  # run under torch.compile and compare with eager
    compile_backend: str = "inductor"  # "aot_eager": graph capture only (fast, for tests)
    mode: str = "eval"  # model mode of the output checks ("eval" like Program.make_model)
    determinism_atol: float = 1e-5  # "same output twice" tolerance (GPU atomics reorder sums)
    time: bool = True
    time_budget_s: float = 2.0
    slow_ms: float | None = None  # first forward slower than 2x this: skip the timing protocol
    shrink_numel: int | None = None  # halve size constants until inputs hold <= this many elements
    # the eager window: when set, timing runs before torch.compile and a task outside it returns
    # (ok, with its eager time) without compiling; the caller rescales it or drops it
    window_ms: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_OOM = ("can't allocate memory", "not enough memory", "out of memory", "MemoryError")


def _fail(reason: str, detail: str, **kw: Any) -> dict[str, Any]:
    oom_able = ("eager_error", "load_error", "compile_error", "probe_error")
    if reason in oom_able and any(m in detail for m in _OOM):
        reason = "out_of_memory"
    return {"ok": False, "reason": reason, "detail": detail[:2000], **kw}


def _err(e: BaseException) -> str:
    tb = traceback.format_exception_only(type(e), e)
    return "".join(tb).strip()[-1500:]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def timing_domain(device: str) -> str:
    """The sandbox's timing domain (:func:`cuda_agent.sandbox.gate.domain_of`) of the torch
    device ``device`` as this process names it: ``"host"`` for ``cpu``; on cuda the GPU as the
    sandbox names it (``cuda`` and ``cuda:0`` are the first entry of ``$CUDA_VISIBLE_DEVICES``,
    ``cuda:N`` its N-th), so a probe and a sandbox timer on one GPU share its gate."""
    if not device.startswith("cuda"):
        return domain_of("cpu", None)
    index = int(device.partition(":")[2] or 0)
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    gpu = visible[index] if visible[0] and index < len(visible) else str(index)
    return domain_of("cuda", gpu)


@contextlib.contextmanager
def timing_hold(device: str, waited: dict[str, float] | None = None) -> Iterator[None]:
    """Hold ``device``'s gate exclusive for the block (:func:`cuda_agent.sandbox.gate.
    device_gate`, host-wide unless ``$CUDA_AGENT_GATE_DIR`` is ``off``): no other process of
    the host times on the device meanwhile, sandbox timers and other filter workers alike. The
    seconds spent waiting for it are added to ``waited["s"]``."""
    occ = Occupant("opsynth probe")
    with device_gate(timing_domain(device)).exclusive(occ, "time"):
        if waited is not None:
            waited["s"] = waited.get("s", 0.0) + occ.waited_s.get("exclusive", 0.0)
        yield


def time_eager(
    model: Any,
    inputs: list[Any],
    device: str,
    budget_s: float,
    waited: dict[str, float] | None = None,
) -> float:
    """Median eager time per forward in ms: the profiler's protocol when available, else a
    plain warm-up + ``perf_counter`` loop (CUDA synchronised). Holds the device's gate
    exclusive while it times (:func:`timing_hold`; seconds waiting for it added to
    ``waited["s"]``)."""
    with timing_hold(device, waited):
        return _time_eager(model, inputs, device, budget_s)


def _time_eager(model: Any, inputs: list[Any], device: str, budget_s: float) -> float:
    import torch

    try:
        from cuda_agent.profiler import measure
        from cuda_agent.profiler.config import quick_config

        # a window decision needs few samples: 5 after a short warm-up
        cfg = quick_config(time_cap_s=budget_s, trace_check=False, min_samples=5)

        def fn(*xs: Any) -> Any:
            with torch.no_grad():
                return model(*xs)

        return float(measure(fn, [inputs], device=device, config=cfg).median_ms)
    except ImportError:
        pass
    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        _sync(device)
        samples: list[float] = []
        t_end = time.perf_counter() + budget_s
        while len(samples) < 5 or (time.perf_counter() < t_end and len(samples) < 100):
            t0 = time.perf_counter()
            model(*inputs)
            _sync(device)
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


class _Laps:
    """Wall seconds per check of one probe (``phases_s``): each ``lap(name)`` closes the time
    since the previous one; a check that fails is closed by the caller."""

    def __init__(self) -> None:
        self.t = time.monotonic()
        self.s: dict[str, float] = {}

    def lap(self, name: str, waited: float = 0.0) -> None:
        """Close the current lap as ``name``; ``waited`` seconds of it go to ``<name>_wait``."""
        now = time.monotonic()
        spent = now - self.t
        if waited > 0:
            self.s[f"{name}_wait"] = round(self.s.get(f"{name}_wait", 0.0) + waited, 3)
            spent -= waited
        self.s[name] = round(self.s.get(name, 0.0) + spent, 3)
        self.t = now


def run_probe(source: str, cfg: ProbeConfig) -> dict[str, Any]:
    """All checks on ``source``; first failure wins. Never raises. ``phases_s`` says where the
    time went (load, rng, eager, deterministic, input_dependent, time, compile; ``failed``: the
    check that stopped it)."""
    laps = _Laps()
    try:
        res = _run(source, cfg, laps)
        if cfg.shrink_numel and "shrunk" not in res:
            from .shrink import shrink_source

            res["shrunk"] = shrink_source(source, cfg.shrink_numel)[1]
    except Exception as e:  # noqa: BLE001 - a check itself broke: report, don't crash
        res = _fail("probe_error", _err(e))
    if not res.get("ok"):
        laps.lap("failed")
    res["phases_s"] = laps.s
    return res


def _model(prog: Any, cfg: ProbeConfig) -> Any:
    import torch

    torch.manual_seed(0)
    with torch.device(cfg.device):
        m = prog.model_cls(*prog.init_inputs())
    m = m.to(cfg.device)
    return m.eval() if cfg.mode == "eval" else m.train()


def _forward(model: Any, inputs: list[Any]) -> list[Any]:
    import torch

    with torch.no_grad():
        return tensor_leaves(model(*inputs))


def _run(source: str, cfg: ProbeConfig, laps: _Laps) -> dict[str, Any]:
    import torch

    from cuda_agent.profiler.program import Program

    passed: list[str] = []
    t0 = time.monotonic()
    shrunk: dict[str, list[int]] = {}
    if cfg.shrink_numel:
        from .shrink import shrink_source

        try:
            source, shrunk = shrink_source(source, cfg.shrink_numel)
        except Exception as e:  # noqa: BLE001
            return _fail("load_error", _err(e))
    try:
        prog = Program.from_source(source, name="opsynth_task")
        model = _model(prog, cfg)
        inputs = prog.make_inputs(device=cfg.device, seed=0)
    except Exception as e:  # noqa: BLE001
        return _fail("load_error", _err(e))
    passed.append("load")
    laps.lap("load")

    # (b) no RNG consumed by forward, in train or eval mode
    try:
        rng = C.probe_stochastic(prog, device=cfg.device)
    except Exception as e:  # noqa: BLE001
        return _fail("eager_error", _err(e), checks=passed)
    if rng["train"] or rng["eval"]:
        modes = [m for m in ("train", "eval") if rng[m]]
        return _fail("rng_consumed", f"forward advances the RNG in {'/'.join(modes)} mode")
    passed.append("rng")
    laps.lap("rng")

    # (a) eager runs; outputs sane
    try:
        t_first = time.perf_counter()
        out1 = _forward(model, inputs)
        _sync(cfg.device)
        first_ms = (time.perf_counter() - t_first) * 1e3
    except Exception as e:  # noqa: BLE001
        return _fail("eager_error", _err(e), checks=passed)
    passed.append("eager")
    prob = C.output_problem(out1)
    if prob:
        return _fail(*prob, checks=passed, output_shapes=[list(o.shape) for o in out1])
    passed.append("output")
    laps.lap("eager")

    # (b) deterministic: rebuilt model, same inputs, same output
    model2 = _model(prog, cfg)
    inputs2 = prog.make_inputs(device=cfg.device, seed=0)
    out2 = _forward(model2, inputs2)
    same, diff = C.close(out1, out2, atol=cfg.determinism_atol, rtol=cfg.determinism_atol)
    if not same:
        return _fail("nondeterministic", f"two runs differ by up to {diff:.3g}", checks=passed)
    del model2, inputs2, out2  # GPU-sized tasks: keep at most a few tensors alive
    passed.append("deterministic")
    laps.lap("deterministic")

    # (c) depends on each input at the verifier's tolerance
    other = prog.make_inputs(device=cfg.device, seed=1)
    for i in range(len(inputs)):
        if not isinstance(inputs[i], torch.Tensor):
            continue
        varied = list(inputs)
        varied[i] = other[i]
        if C.identical([inputs[i]], [other[i]]):
            continue  # get_inputs gives this input fixed values; nothing to vary
        out_v = _forward(model, varied)
        same, diff = C.close(out1, out_v)
        if same:
            return _fail(
                "input_independent",
                f"output stays within atol=rtol={C.ATOL} when input {i} changes (max diff {diff:.3g})",
                checks=passed,
            )
        del out_v
    del other
    passed.append("input_dependent")
    laps.lap("input_dependent")

    eager_ms = None
    waited: dict[str, float] = {}
    if cfg.time and cfg.slow_ms is not None and first_ms > 2 * cfg.slow_ms:
        eager_ms = first_ms  # far too slow already: one (warm) forward is evidence enough
        passed.append("timed_once")
    elif cfg.time:
        eager_ms = time_eager(model, inputs, cfg.device, cfg.time_budget_s, waited)
        passed.append("timed")
    laps.lap("time", waited.get("s", 0.0))  # time_wait: another timer held the device
    outside = (
        cfg.window_ms is not None
        and eager_ms is not None
        and not (cfg.window_ms[0] <= eager_ms <= cfg.window_ms[1])
    )

    # (a) torch.compile runs and matches eager (only for a task inside the window, if one is set)
    out_shapes = [list(o.shape) for o in out1]
    if cfg.compile and not outside:
        if passed[-1] == "timed":
            # the profiler refreshes input values in place between timed calls: the eager
            # reference is recomputed on the inputs as they are now
            del out1
            out1 = _forward(model, inputs)
        try:
            torch._dynamo.reset()
            compiled = torch.compile(model, backend=cfg.compile_backend)
            out_c = _forward(compiled, inputs)
        except Exception as e:  # noqa: BLE001
            return _fail("compile_error", _err(e), checks=passed, eager_ms=eager_ms)
        ok, diff = C.close(out1, out_c)
        if not ok:
            return _fail(
                "compile_mismatch",
                f"compiled output differs by up to {diff:.3g}",
                checks=passed,
                eager_ms=eager_ms,
            )
        passed.append("compile")
        laps.lap("compile")
    elif cfg.compile:
        passed.append("compile_deferred")
    peak = None
    if cfg.device.startswith("cuda"):  # what a larger batch would need scales from this
        peak = round(torch.cuda.max_memory_allocated() / 2**30, 4)
    return {
        "ok": True,
        "peak_mem_gib": peak,
        "shrunk": shrunk,
        "reason": None,
        "detail": "",
        "checks": passed,
        "eager_ms": eager_ms,
        "output_shapes": out_shapes,
        "probe_s": round(time.monotonic() - t0, 3),
    }
