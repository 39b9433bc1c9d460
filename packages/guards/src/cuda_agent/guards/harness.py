"""What the candidate must not change: timing, synchronisation and comparison functions, the
module system, the harness's own modules.

:func:`snapshot` records object identities; :func:`diff` names what changed; :func:`unpristine`
names entries that were already replaced before the snapshot (a function whose code lives outside
torch and the standard library). Importing this module takes a first snapshot, so the sandbox's
candidate runner should import :mod:`cuda_agent.guards.runtime` before the candidate's code.
"""

from __future__ import annotations

import builtins
import os
import sys
import sysconfig
from collections.abc import Iterable
from typing import Any

TIMING = [
    "time.perf_counter",
    "time.perf_counter_ns",
    "time.time",
    "time.time_ns",
    "time.monotonic",
    "time.monotonic_ns",
    "time.process_time",
    "time.sleep",
    "torch.cuda.synchronize",
    "torch.cuda.Event",
    "torch.cuda.Event.record",
    "torch.cuda.Event.elapsed_time",
    "torch.cuda.Event.synchronize",
    "torch.cuda.Event.query",
    "torch.cuda.Event.wait",
    "torch.cuda.current_stream",
    "torch.cuda.Stream",
    "torch.cuda.Stream.synchronize",
    "torch.cuda.default_stream",
    "torch.cuda.Stream.wait_event",
    "torch.cuda.Stream.wait_stream",
    "torch.cuda.Stream.record_event",
]
HARNESS = [
    "torch.allclose",
    "torch.isclose",
    "torch.equal",
    "torch.testing.assert_close",
    "torch.eq",
    "torch.abs",
    "torch.max",
    "torch.isnan",
    "torch.isfinite",
    "torch.sum",
    "torch.norm",
    "torch.linalg.vector_norm",
    "torch.Tensor.__eq__",
    "torch.Tensor.__sub__",
    "torch.Tensor.cpu",
    "torch.Tensor.to",
    "torch.Tensor.clone",
    "torch.Tensor.copy_",
    "torch.Tensor.numpy",
    "torch.Tensor.tolist",
    "torch.Tensor.item",
    "torch.Tensor.float",
    "torch.Tensor.double",
    "torch.Tensor.abs",
    "torch.Tensor.sub",
    "torch.Tensor.max",
    "torch.Tensor.norm",
    "torch.Tensor.detach",
    "torch.Tensor.contiguous",
    "torch.Tensor.__torch_function__",
    "torch.Tensor.__torch_dispatch__",
    "torch.Tensor.__class__",
    "torch.nn.Module.__call__",
    "torch.nn.Module._call_impl",
    "torch.nn.Module.load_state_dict",
    "torch.nn.Module.state_dict",
    "torch.nn.Module.eval",
    "torch.nn.Module.to",
    "torch.manual_seed",
    "torch.randn",
    "torch.rand",
    "torch.randint",
    "torch.empty",
    "torch.empty_like",
    "torch.zeros",
    "torch.no_grad",
    "torch.inference_mode",
    "torch.use_deterministic_algorithms",
    "torch.are_deterministic_algorithms_enabled",
    "torch.utils.deterministic",
    "torch.cuda.memory.empty_cache",
    "torch.cuda.empty_cache",
    "torch.cuda.is_available",
    "sys.setprofile",
    "sys.getprofile",
    "sys.settrace",
    "threading.enumerate",
    "threading.active_count",
    "os.listdir",
]
BUILTINS = [
    "isinstance",
    "type",
    "len",
    "print",
    "open",
    "getattr",
    "setattr",
    "hasattr",
    "__import__",
    "range",
    "zip",
    "min",
    "max",
    "sum",
    "abs",
    "float",
    "int",
    "str",
    "id",
    "hash",
    "iter",
    "next",
    "repr",
    "all",
    "any",
]


def _resolve(path: str) -> Any:
    parts = path.split(".")
    obj = sys.modules.get(parts[0])
    if obj is None:
        return _MISSING
    for i, p in enumerate(parts[1:], start=1):
        mod = sys.modules.get(".".join(parts[: i + 1]))
        try:
            if isinstance(obj, type):  # the stored attribute, not a fresh bound wrapper
                for klass in obj.__mro__:
                    if p in klass.__dict__:
                        obj = klass.__dict__[p]
                        break
                else:
                    raise AttributeError(p)
            else:
                obj = getattr(obj, p)
        except AttributeError:
            if mod is None:
                return _MISSING
            obj = mod
    return obj


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def snapshot(extra: Iterable[Any] = ()) -> dict[str, Any]:
    """Identities of the timing, harness and builtin objects, of ``sys.modules`` entries for
    torch and the standard modules, and of the public callables of each module in ``extra``."""
    snap: dict[str, Any] = {}
    for p in TIMING + HARNESS:
        snap[p] = _resolve(p)
    for b in BUILTINS:
        snap[f"builtins.{b}"] = builtins.__dict__.get(b, _MISSING)
    for m in (
        "torch",
        "time",
        "sys",
        "builtins",
        "torch.cuda",
        "torch.nn",
        "torch.testing",
        "torch.nn.functional",
        "threading",
    ):
        snap[f"sys.modules[{m!r}]"] = sys.modules.get(m, _MISSING)
    for mod in extra:
        if isinstance(mod, str):
            mod = sys.modules.get(mod)
        if mod is None:
            continue
        name = getattr(mod, "__name__", repr(mod))
        snap[f"sys.modules[{name!r}]"] = sys.modules.get(name, _MISSING)
        for k, v in list(vars(mod).items()):
            if callable(v) and not k.startswith("__"):
                snap[f"{name}.{k}"] = v
    return snap


def diff(before: dict[str, Any], after: dict[str, Any] | None = None) -> list[str]:
    """Names whose object changed between two snapshots (``after`` defaults to now)."""
    if after is None:
        extra = {k.split(".")[0] for k in before if not k.startswith(("sys.modules", "builtins."))}
        after = snapshot(m for m in extra if m not in ("time", "torch", "sys", "threading", "os"))
    return [k for k, v in before.items() if k in after and after[k] is not v]


_TRUSTED_DIRS: tuple[str, ...] | None = None


def _trusted_dirs() -> tuple[str, ...]:
    global _TRUSTED_DIRS
    if _TRUSTED_DIRS is None:
        dirs = {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
        for name in ("torch", "cuda_agent", "typing_extensions", "numpy"):
            mod = sys.modules.get(name)
            for p in getattr(mod, "__path__", []) or []:
                dirs.add(os.path.realpath(p))
            f = getattr(mod, "__file__", None)
            if f:
                dirs.add(os.path.dirname(os.path.realpath(f)))
        _TRUSTED_DIRS = tuple(sorted(dirs))
    return _TRUSTED_DIRS


def unpristine(snap: dict[str, Any]) -> list[str]:
    """Entries of ``snap`` that are Python functions defined outside torch and the standard
    library (a candidate's replacement), or wrappers whose origin cannot be told."""
    bad = []
    trusted = _trusted_dirs()
    for k, v in snap.items():
        if v is _MISSING or k.startswith("sys.modules"):
            continue
        code = getattr(v, "__code__", None) or getattr(
            getattr(v, "__func__", None), "__code__", None
        )
        if code is None:
            wrapped = getattr(v, "func", None)  # functools.partial
            if wrapped is not None and type(v).__name__ == "partial":
                bad.append(k)
            continue
        fname = os.path.realpath(code.co_filename) if not code.co_filename.startswith("<") else ""
        if not fname or not fname.startswith(trusted):
            bad.append(k)
    return bad


IMPORT_SNAPSHOT = snapshot()
