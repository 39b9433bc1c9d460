"""Entry point of the processes an evaluation starts: ``python -m cuda_agent.sandbox.runner SPEC``.

Operations (``spec["op"]``):

- ``reference`` (trusted code only): build ``Model`` under the init seed, save its state_dict,
  and for every trial draw the inputs from the trial's seed and variant and run the model once
  (its outputs are not kept: the judge recomputes them on the device); report the trials'
  input and output bytes, which the parent's admission control sizes the next phases by.
- ``judge`` (trusted code only; runs beside ``candidate``): rebuild ``Model`` with the
  reference's weights, and for each expected output file recompute the trial's reference
  output on the device, wait for the candidate's file, compare on the device (``compare``),
  delete the file (the candidate writes its next output only then: one output on disk at a
  time), and report a verdict per trial plus the guards' cross-trial output checks (on strided
  samples of at most ``SKETCH_ELEMENTS`` elements per tensor). No multi-GB tensor is written by
  the reference, and none is held on the host for the comparison. A numerics stress trial
  (``STRESS_VARIANTS``) has the reference run twice on its inputs: where it raises, is NaN/Inf
  everywhere, or disagrees with itself, the trial is skipped (``reference_unstable``); a denormal
  trial's output is also held to :func:`compare.subnormal_check`. Stress trials stay out of the
  cross-trial checks and the guard's probe.
- ``compile`` (candidate code, kernelbench format): import ``model_new.py`` so its
  ``load_inline`` builds run (cached by content); report each build.
- ``candidate`` (candidate code): build ``ModelNew``, load the reference's state_dict, draw each
  trial's inputs itself (same seed, same generator: same values) and save its outputs; the
  runtime guard watches every call. An exception on a stress trial is written for the judge
  (``out_N.pt.err``) in place of the output, and the next trials run.
- ``time`` (candidate code): build ``ModelNew`` and its input pool, then (when the spec has a
  ``go_path``) write ``ready_path`` and wait for the parent to create ``go_path`` (the parent
  takes the device's exclusive gate in between, see ``gate``); time ``ModelNew`` with the
  profiler's protocol, then run one more call on fresh trial inputs and save its output for the
  parent to re-check.

On cuda, ``spec["mem_fraction"]`` (set when several workers share a GPU) caps the caching
allocator of the reference, candidate and time processes right after the context is created.

Each op writes a JSON report to ``spec["report"]``. The parent never trusts a candidate's report
for the verdict: outputs are compared in the parent, and a missing output is a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

VARIANTS = ("base", "shift", "base", "scale", "base")
# numerics stress trials (``SandboxConfig.stress_trials``), one trial each, after the others
STRESS_VARIANTS = ("nan_inf", "denormal", "near_max", "offset")
STRESS_POSITIONS = 64  # nan_inf / near_max: at most this many elements per tensor and value
# offset: a shift by this many standard deviations (per dtype: the half types keep a few bits
# of the distribution's resolution at the offset)
OFFSET_SIGMAS = {"float16": 64.0, "bfloat16": 16.0}
OFFSET_SIGMAS_DEFAULT = 1024.0
T_IMPORT = time.time()  # wall clock when this module was imported: the parent knows the spawn


def warm_start() -> None:
    """Called by a warm launcher (``jail.py --warm``) as an already imported runner starts a job:
    ``t_import`` then marks the job's start, not the import done before the job existed."""
    global T_IMPORT
    T_IMPORT = time.time()


@contextlib.contextmanager
def _phase(report: dict[str, Any], name: str) -> Iterator[None]:
    """Add the wall seconds of the block to ``report["phases_s"][name]`` (informational: where
    an op's time goes; a candidate process could write anything there, so no verdict uses it)."""
    t = time.perf_counter()
    try:
        yield
    finally:
        d = report.setdefault("phases_s", {})
        d[name] = round(d.get(name, 0.0) + time.perf_counter() - t, 4)


def variant_schedule(n: int) -> list[str]:
    """Input variants of ``n`` trials: base first, shifted and scaled among them."""
    extra = ("shift", "scale", "base")
    return [VARIANTS[i] if i < len(VARIANTS) else extra[(i - len(VARIANTS)) % 3] for i in range(n)]


def apply_variant(inputs: list[Any], variant: str, seed: int = 0) -> list[Any]:
    """Shift (+0.5 std, keeps signs of positive inputs) or scale (x2.5) floating tensors, or a
    numerics stress variant (:func:`stress_input`, positions drawn from ``seed``)."""
    import torch

    if variant == "base":
        return inputs
    if variant not in VARIANTS and variant not in STRESS_VARIANTS:
        raise ValueError(f"unknown trial variant {variant!r}")
    out = []
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 0:
            if variant == "shift":
                x = x + 0.5 * _std(x)
            elif variant == "scale":
                x = x * 2.5
            elif variant in STRESS_VARIANTS:
                x = stress_input(x, variant, seed, i)
        out.append(x)
    return out


def _std(x: Any) -> float:
    """The tensor's standard deviation, 1.0 where it is not a positive number."""
    s = float(x.float().std()) if x.numel() > 1 else 1.0
    return s if s == s and 0 < s < float("inf") else 1.0


def stress_input(x: Any, variant: str, seed: int, index: int) -> Any:
    """Input ``index`` of a trial (a floating tensor, the base draw) under a stress variant,
    deterministic in ``(seed, index)``: every position and value comes from a generator seeded
    from them on the tensor's own device, so the judge and the candidate get the same bits.

    - ``nan_inf``: ``k = clamp(numel // 1024, 1, 64)`` positions each set to NaN, +Inf, -Inf;
    - ``denormal``: about half the elements (a random mask) multiplied by ``finfo.tiny / 4``:
      subnormal values of the dtype (``|x| < 4``), the rest unchanged;
    - ``near_max``: ``k`` distinct positions set to ``sign(x) * u * finfo.max``, ``u`` uniform in
      [0.5, 1): finite values near the dtype's limit;
    - ``offset``: ``x + c * std(x)``, ``c`` 1024 (16 for bfloat16, 64 for float16): a large offset
      against which reductions cancel.
    """
    import torch

    fi = torch.finfo(x.dtype)
    g = torch.Generator(device=x.device)
    salt = 7919 * (index + 1) + STRESS_VARIANTS.index(variant)
    g.manual_seed((int(seed) * 1_000_003 + salt) % (1 << 63))
    if variant == "offset":
        c = OFFSET_SIGMAS.get(str(x.dtype).replace("torch.", ""), OFFSET_SIGMAS_DEFAULT)
        return x + c * _std(x)
    y = x.clone(memory_format=torch.contiguous_format)
    flat = y.view(-1)
    n = flat.numel()
    k = max(1, min(STRESS_POSITIONS, n // 1024))
    if variant == "nan_inf":
        pos = torch.randint(0, n, (3 * k,), generator=g, device=x.device)
        flat[pos[:k]] = float("nan")
        flat[pos[k : 2 * k]] = float("inf")
        flat[pos[2 * k :]] = float("-inf")
    elif variant == "denormal":
        mask = torch.rand(y.shape, generator=g, device=x.device, dtype=torch.float32) < 0.5
        y = torch.where(mask, y * (fi.tiny * 0.25), y)
    elif variant == "near_max":
        # distinct positions: one value per position whatever the device's scatter order
        pos = torch.unique(torch.randint(0, n, (k,), generator=g, device=x.device))
        u = torch.rand(pos.numel(), generator=g, device=x.device, dtype=torch.float64)
        sign = torch.where(flat[pos] < 0, -1.0, 1.0).to(torch.float64)
        flat[pos] = (sign * (0.5 + 0.5 * u) * fi.max).clamp(-fi.max, fi.max).to(x.dtype)
    return y


class _HostStaging:
    """Page-locked host buffers for the outputs a process saves, reused from one trial's output
    to the next (the n-th tensor of an output gets the n-th buffer). A device-to-host copy into
    pageable memory runs at a fraction of the bus speed and first faults in every page of a
    fresh allocation: seconds per trial for a multi-GB output. Tensors under ``min_bytes``, CPU
    tensors, and any buffer the driver cannot pin take the plain ``.to("cpu")``."""

    min_bytes = 64 << 20

    def __init__(self) -> None:
        self.buffers: dict[int, Any] = {}
        self.next = 0

    def to_host(self, x: Any) -> Any:
        import torch

        i, self.next = self.next, self.next + 1
        if x.device.type != "cuda" or x.numel() * x.element_size() < self.min_bytes:
            return x.to("cpu")
        buf = self.buffers.get(i)
        if buf is None or buf.dtype != x.dtype or buf.shape != x.shape:
            self.buffers.pop(i, None)
            try:
                buf = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
            except RuntimeError:  # no pinnable memory left: the pageable copy still works
                return x.to("cpu")
            self.buffers[i] = buf
        return buf.copy_(x)


_STAGING = _HostStaging()


#: A consumed output's file, handed back by the judge for the next trial's output to be written
#: over in place: the page cache keeps its pages, where a new file must get (and on a host
#: full of cached files, first reclaim) a page for every 4 KiB: 2x slower for 2 GiB on the CI
#: machine, seconds per multi-GB output
FREE_SLOT = "slot.free"


def _save_output(obj: Any, path: Path) -> None:
    """``torch.save`` of an output moved to the CPU (through :class:`_HostStaging`), without the
    zip's CRC-32 (about half the time for a large output; the file lives on this host only until
    the judge has read it), written under a temporary name and renamed: a reader never sees a
    partial file. The file the judge handed back (``FREE_SLOT`` beside ``path``) is written over
    in place when there is one."""
    import torch

    set_crc = getattr(torch.serialization, "set_crc32_options", None)  # torch >= 2.6
    if set_crc is not None:
        set_crc(False)
    tmp = path.with_name(path.name + ".part")
    fd = None
    with contextlib.suppress(OSError):
        os.replace(path.with_name(FREE_SLOT), tmp)
        fd = os.open(tmp, os.O_RDWR | os.O_NOFOLLOW)
    if fd is None:  # no slot handed back, or not one this process can write: a new file
        with contextlib.suppress(OSError):
            tmp.unlink()  # an unusable slot is not left behind (it may hold GBs)
        if tmp.exists() or tmp.is_symlink():
            tmp = path.with_name(f"{path.name}.{os.getpid()}.part")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
    _STAGING.next = 0
    obj = _moved(obj, "cpu", _STAGING.to_host)
    with os.fdopen(fd, "r+b") as f:
        torch.save(obj, f)
        f.truncate()  # a shorter output than the slot's last one: nothing of it left after
    os.replace(tmp, path)


def _wait_consumed(path: Path, spec: dict[str, Any]) -> None:
    """Wait until the judge has deleted ``path`` (its previous output), so that at most one
    output of this process is on disk at a time; stop when the parent says the judge failed."""
    failed = Path(spec["judge_failed_path"])
    deadline = time.monotonic() + float(spec.get("stream_wait_s", 600.0))
    while path.exists():
        if failed.exists():
            raise RuntimeError("the evaluator's comparison process stopped")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name} was not consumed by the judge")
        time.sleep(0.002)


def _moved(obj: Any, device: str, move: Callable[[Any], Any] | None = None) -> Any:
    """``obj`` with its tensors on ``device`` (each moved by ``move`` when given); a broadcast
    (stride-0) view stays one: its distinct values are copied and expanded again, so a saved
    file (and the judge's output floor) keeps its real size."""
    import torch

    from cuda_agent.records.nested import map_leaves

    to = move or (lambda t: t.to(device))

    def one(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        x = x.detach()
        if x.dim() and any(st == 0 for st in x.stride()):
            idx = tuple(slice(0, 1) if st == 0 else slice(None) for st in x.stride())
            return to(x[idx]).expand(x.shape)
        return to(x)

    return map_leaves(obj, one)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _device_name(device: str) -> str:
    import platform

    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(0)
    return f"cpu:{platform.machine()}"


def _init_device(spec: dict[str, Any]) -> None:
    """Create the CUDA context now and apply the spec's memory fraction (no-op on cpu)."""
    import torch

    device = spec["device"]
    if not device.startswith("cuda"):
        return
    torch.zeros(1, device=device)
    torch.cuda.synchronize()
    frac = spec.get("mem_fraction")
    if frac:
        torch.cuda.set_per_process_memory_fraction(float(frac))


class GateTimeout(RuntimeError):
    """The parent never let the timing start (no ``go`` file within ``go_timeout_s``)."""


def _wait_for_go(spec: dict[str, Any], report: dict[str, Any]) -> None:
    """Signal ``ready`` and poll (every ~2 ms) for ``go``, bounded by ``go_timeout_s``."""
    go = spec.get("go_path")
    if not go:
        return
    report["stage"] = "ready"
    Path(spec["ready_path"]).write_text("ready\n")
    t0 = time.monotonic()
    deadline = t0 + float(spec.get("go_timeout_s", 3600.0))
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise GateTimeout(f"no go signal within {spec.get('go_timeout_s', 3600.0)}s")
        time.sleep(0.002)
    report["go_wait_s"] = round(time.monotonic() - t0, 4)


def _mode(spec: dict[str, Any]) -> str:
    """The module mode both models run in (``Task.model_mode``)."""
    return str(spec.get("model_mode", "eval"))


def _load_reference(spec: dict[str, Any]):
    from cuda_agent.profiler.program import Program

    return Program.from_source(Path(spec["ref_path"]).read_text(), name="sandbox_reference")


def _reference_model(spec: dict[str, Any], ref) -> Any:
    """The reference's model on the spec's device, in its mode, with the weights the reference
    phase saved (trusted processes only: the judge, the paired eager timer)."""
    import torch

    init_inputs = torch.load(spec["init_path"], weights_only=False)  # the reference's file
    model = ref.make_model(
        device=spec["device"],
        seed=int(spec["init_seed"]),
        init_inputs=init_inputs,
        mode=_mode(spec),
    )
    model.load_state_dict(torch.load(spec["sd_path"], weights_only=True))
    return model


def _trial_inputs(ref, trial: dict[str, Any], device: str) -> list[Any]:
    inputs = ref.make_inputs(device=device, seed=int(trial["seed"]))
    return apply_variant(inputs, trial["variant"], int(trial["seed"]))


def is_stress(trial: dict[str, Any]) -> bool:
    """Whether a trial is a numerics stress trial."""
    return trial.get("variant") in STRESS_VARIANTS


def _load_model_new(spec: dict[str, Any]):
    """Import the solution's ``model_new.py`` and return its ``ModelNew`` class."""
    from cuda_agent.profiler.program import load_module

    workdir = spec["workdir"]
    if spec.get("module_dir"):
        sys.path.insert(0, spec["module_dir"])
    sys.path.insert(0, workdir)
    if spec["format"] == "kernelbench" and spec.get("kb_cache"):
        from . import kbcache

        kbcache.install(spec["kb_cache"])
    path = Path(workdir) / "model_new.py"
    mod = load_module(path.read_text(), name="model_new", filename=str(path))
    cls = getattr(mod, "ModelNew", None)
    if cls is None:
        raise AttributeError("model_new.py defines no ModelNew")
    return cls


def _build_model_new(spec: dict[str, Any], cls, device: str):
    import torch

    from cuda_agent.profiler.program import set_mode

    init_inputs = torch.load(spec["init_path"], weights_only=False) if spec.get("init_path") else []
    torch.manual_seed(int(spec["init_seed"]))
    with torch.device(device):
        model = cls(*init_inputs)
    if isinstance(model, torch.nn.Module):
        model = set_mode(model.to(device), _mode(spec))
    sd_info: dict[str, Any] = {}
    if spec.get("sd_path") and isinstance(model, torch.nn.Module):
        sd = torch.load(spec["sd_path"], weights_only=True)
        res = model.load_state_dict(sd, strict=False)
        sd_info = {
            "missing": list(res.missing_keys)[:50],
            "unexpected": list(res.unexpected_keys)[:50],
        }
        model = model.to(device)
    return model, sd_info


def op_reference(spec: dict[str, Any], report: dict[str, Any]) -> None:
    with _phase(report, "import_torch"):
        import torch

    device = spec["device"]
    with _phase(report, "init_device"):
        _init_device(spec)
    with _phase(report, "load"):
        ref = _load_reference(spec)
        report["device_name"] = _device_name(device)
    with _phase(report, "init"):
        init_inputs = ref.init_inputs()
        torch.save(init_inputs, spec["init_path"])
        model = ref.make_model(
            device=device, seed=int(spec["init_seed"]), init_inputs=init_inputs, mode=_mode(spec)
        )
        sd = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
        torch.save(sd, spec["sd_path"])
    from cuda_agent.profiler.baseline import tensor_bytes

    times = []
    in_bytes = out_bytes = 0
    for i, trial in enumerate(spec["trials"]):
        try:
            with _phase(report, "inputs"):
                inputs = _trial_inputs(ref, trial, device)
            t0 = time.perf_counter()
            with _phase(report, "forward"), torch.no_grad():
                out = model(*inputs)
                _sync(device)
        except Exception as e:  # a reference may refuse stressed inputs (the judge skips it)
            if not is_stress(trial):
                raise
            report.setdefault("stress_errors", {})[str(i)] = f"{type(e).__name__}: {e}"[:500]
            continue
        times.append(time.perf_counter() - t0)
        in_bytes, out_bytes = max(in_bytes, tensor_bytes(inputs)), max(out_bytes, tensor_bytes(out))
        del out, inputs
    report["forward_s"] = times
    report["input_bytes"] = in_bytes
    report["output_bytes"] = out_bytes
    report["param_bytes"] = tensor_bytes(sd)


SKETCH_ELEMENTS = 1 << 22  # per output tensor, for the cross-trial output checks


def _sketch(obj: Any) -> Any:
    """``obj`` with each tensor replaced by a strided sample of at most ``SKETCH_ELEMENTS`` of
    its elements, on the CPU (the same positions for equal shapes)."""
    import torch

    from cuda_agent.records.nested import map_leaves

    def one(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        flat = x.detach().reshape(-1)
        step = -(-flat.numel() // SKETCH_ELEMENTS) if flat.numel() > SKETCH_ELEMENTS else 1
        sample = flat[::step]
        # a copy of its own: on the CPU a loaded output is a view of the file, which the
        # candidate writes its next output over (FREE_SLOT)
        return sample.clone() if sample.device.type == "cpu" else sample.to("cpu")

    return map_leaves(obj, one)


def _wait_output(path: Path, done: Path, deadline: float, err: Path | None = None) -> bool:
    """Poll for the candidate's output file; False once the candidate is done without it, or
    has written ``err`` instead (a stress trial it raised on)."""
    while not path.exists():
        if done.exists() or (err is not None and err.exists()):
            return path.exists()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path.name} from the candidate and no end of its process")
        time.sleep(0.002)
    return True


def op_judge(spec: dict[str, Any], report: dict[str, Any]) -> None:
    with _phase(report, "import_torch"):
        import msgspec
        import torch

        from .compare import Tolerance, compare, stress_check
    device = spec["device"]
    with _phase(report, "init_device"):
        _init_device(spec)
    with _phase(report, "init"):
        ref = _load_reference(spec)
        model = _reference_model(spec, ref)
    tol = Tolerance(**spec["tol"])
    io, done = Path(spec["io_dir"]), Path(spec["done_path"])
    deadline = time.monotonic() + float(spec.get("wait_s", 3600.0))
    verdicts: list[dict[str, Any]] = []
    ref_sk: list[Any] = []
    cand_sk: list[Any] = []
    n_plain = 0  # outputs of trials that are not stress trials (the cross-trial checks' own)
    for item in spec["outputs"]:
        trial = spec["trials"][int(item["trial"])]
        stress = is_stress(trial)
        n_plain += not stress
        unstable = None
        with _phase(report, "reference"), torch.no_grad():
            if stress:
                expected, unstable = _stress_reference(ref, model, trial, device, tol, compare)
            else:
                inputs = _trial_inputs(ref, trial, device)
                expected = model(*inputs)
                del inputs
            _sync(device)
        f = io / item["file"]
        err = f.with_name(f.name + ".err")
        with _phase(report, "wait_candidate"):
            present = _wait_output(f, done, deadline, err)
        if unstable is not None:
            # not the candidate's to reproduce: reported, and left out of the verdict
            verdict: dict[str, Any] = {
                "passed": True,
                "skipped": True,
                "reference_unstable": unstable,
                "message": f"skipped: reference unstable under {trial['variant']}: {unstable}",
            }
        elif not present and err.exists():
            verdict = {"passed": False, "message": "the candidate raised: " + _read_err(err)}
        else:
            check = (lambda r, c, v=trial["variant"]: stress_check(v, r, c)) if stress else None
            verdict, sketch = _judge_file(f, present, expected, tol, device, compare, report, check)
            if sketch is not None and not stress:
                ref_sk.append(_sketch(expected))
                cand_sk.append(sketch)
        if stress:
            verdict["stress"] = trial["variant"]
        verdicts.append(verdict)
        del expected
        _hand_back(f, io / FREE_SLOT, keep=present and item is not spec["outputs"][-1])
        with contextlib.suppress(OSError):
            err.unlink()
    report["trials"] = verdicts
    policy = spec.get("guard_policy", "off")
    if policy != "off" and len(cand_sk) == n_plain > 1:
        from cuda_agent.guards.api import output_checks

        with _phase(report, "output_checks"):
            report["guards"] = [
                msgspec.to_builtins(g) for g in output_checks(ref_sk, cand_sk, policy=policy)
            ]


def _hand_back(f: Path, slot: Path, keep: bool) -> None:
    """The judged output's file handed back to the candidate as ``slot`` (its next output is
    written over it: :func:`_save_output`), or removed (the last, or when that fails)."""
    if keep:
        with contextlib.suppress(OSError):
            os.replace(f, slot)
            return
    with contextlib.suppress(OSError):
        f.unlink()


def _stress_reference(
    ref: Any, model: Any, trial: dict[str, Any], device: str, tol: Any, compare: Any
) -> tuple[Any, str | None]:
    """The reference's output on a stress trial's inputs, and why the reference itself is
    unstable under them (None when it is not): it raised, its output is NaN/Inf everywhere, or
    a second run on the same inputs (drawn again) does not match the first by the comparison
    itself (NaN where NaN, the same infinities, finite values within the tolerance)."""
    try:
        first = model(*_trial_inputs(ref, trial, device))
        again = model(*_trial_inputs(ref, trial, device))
        _sync(device)
    except Exception as e:  # noqa: BLE001 - trusted code refusing the stressed inputs
        return None, f"the reference raised {type(e).__name__}: {str(e)[:300]}"
    if _nowhere_finite(first):
        return first, "its output is NaN/Inf everywhere"
    v = compare(first, again, tol)
    del again
    if not v.passed:
        return first, f"two runs on the same inputs differ ({v.message[:300]})"
    return first, None


def _nowhere_finite(obj: Any) -> bool:
    """Whether ``obj`` has floating values and none of them is finite."""
    import torch

    from .compare import _flatten

    leaves: list[tuple[str, Any]] = []
    _flatten(obj, "out", leaves)
    floats = [
        t
        for _, t in leaves
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) and t.numel()
    ]
    return bool(floats) and not any(bool(torch.isfinite(t).any()) for t in floats)


def _read_err(err: Path) -> str:
    """The first 500 characters of the candidate's error marker: a regular file with one link,
    opened without following a link (the judge may run as root; the text goes into the result)."""
    try:
        fd = os.open(err, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        return f"(unreadable: {e.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            return "(not a regular file with one link)"
        return os.read(fd, 500).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _judge_file(
    f: Path,
    present: bool,
    expected: Any,
    tol: Any,
    device: str,
    compare: Any,
    report: dict,
    check: Callable[[Any, Any], Any] | None = None,
) -> tuple[dict[str, Any], Any]:
    """One trial's verdict (``passed``, ``message``, errors) and the sketch of the candidate's
    output (None when it could not be read); ``check(expected, candidate)``, when given, is a
    further verdict on an output that passed the comparison (a stress trial's own rule)."""
    import torch

    from cuda_agent.profiler.baseline import tensor_bytes
    from cuda_agent.profiler.sol import storage_bytes

    if not present:
        return {"passed": False, "message": "no output"}, None
    st = f.lstat()  # never follow a link the candidate planted (the judge may run as root)
    if not stat.S_ISREG(st.st_mode):
        return {"passed": False, "message": "output is not a regular file"}, None
    limit = 2 * tensor_bytes(expected) + (64 << 20)  # the zip's own overhead is small
    size = st.st_size
    if size > limit:
        return {
            "passed": False,
            "message": f"output file of {size} bytes for a reference output of "
            f"{tensor_bytes(expected)} bytes",
        }, None
    try:
        with _phase(report, "load_candidate"):
            loaded = torch.load(f, weights_only=True, mmap=True)
            stored = storage_bytes(loaded)  # before the move: a broadcast view is still one
            cand = _moved(loaded, device)
            _sync(device)
    except Exception as e:  # noqa: BLE001 - whatever the candidate wrote
        msg = f"unreadable output: {type(e).__name__}: {e}"[:500]
        return {"passed": False, "message": msg}, None
    with _phase(report, "compare"):
        v = compare(expected, cand, tol)
        if v.passed and check is not None:
            extra = check(expected, cand)
            if not extra.passed:
                v.passed, v.message = False, extra.message
        _sync(device)
    return {
        "passed": v.passed,
        "message": v.message,
        "max_abs_err": v.max_abs_err,
        "max_rel_err": v.max_rel_err,
        "rel_norm_err": v.rel_norm_err,
        "storage_bytes": stored,
    }, _sketch(cand)


def op_compile(spec: dict[str, Any], report: dict[str, Any]) -> None:
    from . import kbcache

    with _phase(report, "install"):
        kbcache.install(spec["kb_cache"])
    try:
        with _phase(report, "load_model_new"):  # its builds (or cache hits) happen here
            _load_model_new(spec)
        report["import_ok"] = True
    except BaseException as e:  # noqa: BLE001 - an import failure that is not a build failure is deferred
        report["import_ok"] = False
        report["import_error"] = f"{type(e).__name__}: {e}"[-4000:]
    report["builds"] = kbcache.BUILDS


def _wait_for_start(spec: dict[str, Any], report: dict[str, Any], phase: str) -> None:
    """Started early (verification: while the reference runs; timing: while the parent compares
    the outputs): poll (every ~5 ms) for the parent's ``start`` file or its ``abort`` file, the
    wait reported as ``phase``. Nothing to wait for without a ``start_path``. No stage is set
    yet, so a failure here is the sandbox's (infra_error)."""
    if not spec.get("start_path"):
        return
    start, abort = Path(spec["start_path"]), Path(spec["abort_path"])
    deadline = time.monotonic() + float(spec.get("start_timeout_s", 600.0))
    with _phase(report, phase):
        while not start.exists():
            if abort.exists():
                raise RuntimeError(f"{spec['op']} cancelled by the parent before it started")
            if time.monotonic() > deadline:
                raise TimeoutError("no start signal from the parent")
            time.sleep(0.005)


def op_candidate(spec: dict[str, Any], report: dict[str, Any]) -> None:
    with _phase(report, "import_torch"):
        import torch

    _wait_for_start(spec, report, "wait_reference")

    device = spec["device"]
    with _phase(report, "load_reference"):
        ref = _load_reference(spec)
    # create the context first, so the guard's snapshot sees the device's real settings
    with _phase(report, "init_device"):
        _init_device(spec)
    guard = None
    if spec.get("guard_policy", "strict") != "off":
        with _phase(report, "guard_setup"):
            from cuda_agent.guards.api import RuntimeGuard

            # constructed before the candidate's module is imported (it snapshots the harness)
            guard = RuntimeGuard(
                spec.get("guard_policy", "strict"),
                backend=spec["backend"],
                own_kernels=spec.get("own_kernels", []),
                own_modules=["cuda_extension"],
                protect=[sys.modules[__name__]],
            )
    report["stage"] = "load"
    with _phase(report, "load"):
        cls = _load_model_new(spec)
    report["stage"] = "init"
    with _phase(report, "init"):
        model, report["state_dict"] = _build_model_new(spec, cls, device)
    if guard is not None:
        with _phase(report, "guard_setup"):
            guard.install()
    out_dir = Path(spec["io_dir"])
    last = None
    for i, trial in enumerate(spec["trials"]):
        report["stage"] = f"trial {i}"
        inputs = None
        try:
            with _phase(report, "inputs"):
                inputs = _trial_inputs(ref, trial, device)
            with _phase(report, "forward"), torch.no_grad():
                if guard is not None:
                    with guard.watch(inputs):
                        out = model(*inputs)
                else:
                    out = model(*inputs)
                _sync(device)
        except Exception as e:
            if not is_stress(trial):
                raise
            # a stress trial the candidate refuses: the judge reads why (and fails the trial
            # unless the reference is unstable there too); the next trials still run
            if i > 0:
                _wait_consumed(out_dir / f"out_{i - 1}.pt", spec)
            err = out_dir / f"out_{i}.pt.err"
            tmp = err.with_name(err.name + ".part")
            tmp.write_text(f"{type(e).__name__}: {e}"[:500])
            os.replace(tmp, err)
            report["trials_done"] = i + 1
            del inputs
            continue
        if guard is not None:
            with _phase(report, "guard_checks"):
                guard.after_call(inputs, out)
        with _phase(report, "save"):
            if i > 0:
                _wait_consumed(out_dir / f"out_{i - 1}.pt", spec)
            _save_output(out, out_dir / f"out_{i}.pt")
        report["trials_done"] = i + 1
        if not is_stress(trial):  # the guard's probe runs on the last plain trial's inputs
            last = (inputs, out)
        del out, inputs
    if guard is not None and last is not None and spec.get("guard_probe", True):
        report["stage"] = "guard probe"
        with _phase(report, "guard_probe"), torch.no_grad():
            guard.probe(model, last[0], last[1])
            _sync(device)
    with _phase(report, "guard_checks"):
        report["guards"] = [_gv(g) for g in guard.finish()] if guard is not None else []
    report["stage"] = "done"


def _gv(g: Any) -> dict[str, Any]:
    import msgspec

    return msgspec.to_builtins(g)


def _timed_section(spec: dict[str, Any], report: dict[str, Any], model: Any, pool: list) -> None:
    """Time ``model`` on the input sets ``pool`` with the spec's protocol once the parent says
    ``go`` (the exclusive section), on the cores kept for it; ``stats`` and ``timing_s`` into
    the report."""
    import msgspec
    import torch

    from cuda_agent.profiler import TimingConfig, measure, warm_kernel_trace

    device = spec["device"]
    cfg = TimingConfig.from_dict(spec.get("timing_config") or {})
    if cfg.trace_check and device.startswith("cuda"):
        with _phase(report, "trace_setup"):  # seconds of CUPTI set-up, outside the exclusive hold
            warm_kernel_trace()

    def call(*xs: Any) -> Any:
        with torch.no_grad():
            return model(*xs)

    _wait_for_go(spec, report)
    if spec.get("timing_cpus"):
        # the section is held exclusive: time on the cores kept for it (profiler.cpus)
        from cuda_agent.profiler.cpus import enter_timed

        enter_timed(spec["timing_cpus"])
        report["timed_cpus"] = sorted(os.sched_getaffinity(0))
    report["stage"] = "timing"
    report["timed_from"] = time.time()
    t0 = time.monotonic()
    stats = measure(call, pool, device=device, config=cfg)
    report["timing_s"] = time.monotonic() - t0
    report["stats"] = msgspec.to_builtins(stats)


def _timing_pool(spec: dict[str, Any], ref: Any) -> list:
    """The input sets the timed calls cycle through: the first ``timing_sets`` trials'."""
    device = spec["device"]
    pool = [
        _trial_inputs(ref, t, device) for t in spec["trials"][: int(spec.get("timing_sets", 2))]
    ]
    _sync(device)
    return pool


def op_time(spec: dict[str, Any], report: dict[str, Any]) -> None:
    with _phase(report, "import_torch"):  # before the early process waits for its start
        import torch

        import cuda_agent.profiler  # noqa: F401

    _wait_for_start(spec, report, "wait_compare")
    device = spec["device"]
    _init_device(spec)
    ref = _load_reference(spec)
    report["stage"] = "load"
    cls = _load_model_new(spec)
    model, _ = _build_model_new(spec, cls, device)
    pool = _timing_pool(spec, ref)
    _timed_section(spec, report, model, pool)
    del pool
    report["stage"] = "recheck"
    inputs = _trial_inputs(ref, spec["trials"][0], device)
    with torch.no_grad():
        out = model(*inputs)
    _sync(device)
    _save_output(out, Path(spec["io_dir"]) / "timed_out.pt")
    # the window the parent checks against its gate
    report["timed_wall"] = [report.pop("timed_from"), time.time()]
    report["stage"] = "done"


def op_time_eager(spec: dict[str, Any], report: dict[str, Any]) -> None:
    """The reference's own program timed like the candidate, on the same input sets, in the same
    exclusive hold right after it (``SandboxConfig.paired_eager``): a trusted process (the
    reference's code only), so the speed-up's two sides see the same conditions. Started with
    the candidate's timing process, it touches the device only after its start signal, given
    once the candidate's process has ended (and freed its memory)."""
    with _phase(report, "import_torch"):  # before it waits for its start
        import torch  # noqa: F401

        import cuda_agent.profiler  # noqa: F401

    ref = _load_reference(spec)
    # nothing on the device before the start signal: the candidate may be timed meanwhile
    _wait_for_start(spec, report, "wait_candidate")
    _init_device(spec)
    # the parent's start signal says how the candidate was really timed (its CUDA-graph mode)
    overrides = json.loads(Path(spec["start_path"]).read_text() or "{}")
    spec = dict(spec, timing_config={**(spec.get("timing_config") or {}), **overrides})
    report["stage"] = "init"
    model = _reference_model(spec, ref)
    pool = _timing_pool(spec, ref)
    _timed_section(spec, report, model, pool)
    report["stage"] = "done"


OPS = {
    "reference": op_reference,
    "compile": op_compile,
    "candidate": op_candidate,
    "time": op_time,
    "time_eager": op_time_eager,
    "judge": op_judge,
}


def _peak_memory_mb() -> dict[str, float]:
    """This process's peak memory in MiB: its host RSS and, where it used CUDA, what its
    allocator held at most (allocated, reserved). Informational (the process may be the
    candidate's): what sizes a task's share of the GPU from real work."""
    import resource

    peak = {"host_rss": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            peak["device_allocated"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            peak["device_reserved"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    except Exception:  # noqa: BLE001 - a broken CUDA context: the host figure alone
        pass
    return peak


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    report: dict[str, Any] = {"op": spec["op"], "ok": False, "t_import": T_IMPORT}
    if hasattr(os, "sched_getaffinity"):
        report["cpus"] = sorted(os.sched_getaffinity(0))
    code = 0
    try:
        OPS[spec["op"]](spec, report)
        report["ok"] = True
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        tb = traceback.format_exc()
        report["error"] = {
            "type": type(e).__name__,
            "message": str(e)[-4000:],
            "traceback": tb[-6000:],
        }
        sys.stderr.write(tb[-6000:])
        code = 1
    report["peak_memory_mb"] = _peak_memory_mb()
    try:
        Path(spec["report"]).write_text(json.dumps(report, default=str))
    except OSError as e:
        sys.stderr.write(f"runner: cannot write report: {e}\n")
        code = code or 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: CUDA and extension destructors can hang or crash


if __name__ == "__main__":
    main(sys.argv[1:])
