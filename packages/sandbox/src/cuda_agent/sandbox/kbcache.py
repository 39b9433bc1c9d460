"""Content-keyed cache for KernelBench ``load_inline`` / ``load`` builds (used inside a candidate's
process by the runner).

``install(cache_root)`` replaces ``torch.utils.cpp_extension.load_inline`` with a wrapper that
keys a build by (name, sources, flags, torch version, target arch): a hit imports the built module
directly (no ninja, no lock, no writes); a miss builds in a private directory (arch list set to
the device only, parallel ninja) and publishes it atomically, so every later process — the verify
and timing phases, a re-evaluation of the same solution — loads it in milliseconds. The sandbox
gives each solution its own cache root (``evaluate._extension_caches``): what is published here
comes from the candidate's own process, so it is never shared with another solution.
Every build is recorded in ``BUILDS`` (name, key, hit, seconds, error) for the compile phase.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BUILDS: list[dict[str, Any]] = []


# 0: the sources exactly as given; 1: first the CUDA sources with torch/types.h for
# torch/extension.h; 2 (default): first a stand-in torch/types.h for the CUDA sources (per-operator
# ATen headers) and a stand-in torch/extension.h for the generated main.cpp. One lighter try,
# then the sources as given (see _build_lighter)
def _light_level() -> int:
    v = os.environ.get("CUDA_AGENT_KB_LIGHT_HEADERS", "2").strip() or "0"
    if v not in ("0", "1", "2"):
        raise ValueError(f"CUDA_AGENT_KB_LIGHT_HEADERS={v!r}: expected 0, 1 or 2")
    return int(v)


LIGHT_HEADERS = _light_level()
_EXT_H = re.compile(r"#\s*include\s*[<\"]torch/extension\.h[>\"]")
_LIGHT = "#include <torch/types.h>\n"  # what CUDA code uses of torch/extension.h, minus torch/all.h and Python
_KB_STANDIN = Path(__file__).with_name("template") / "standin_kb"  # torch/extension.h for main.cpp
_CALL = re.compile(r"\b(?:torch|at)::(\w+)\s*\(")


def _aten_ops_dir() -> Path | None:
    import torch.utils.cpp_extension as ce

    for inc in ce.include_paths():
        d = Path(inc) / "ATen" / "ops"
        if d.is_dir():
            return d
    return None


# what torch/types.h adds to namespace torch, without the headers behind it
_TORCH_NS = (
    "#include <optional>\nnamespace torch { using namespace at; using std::nullopt; using std::optional;"
    " using Dtype = at::ScalarType;"
    + "".join(
        f" constexpr auto {a} = at::{b};"
        for a, b in (
            ("kUInt8", "kByte"),
            ("kInt8", "kChar"),
            ("kInt16", "kShort"),
            ("kInt32", "kInt"),
            ("kInt64", "kLong"),
            ("kFloat16", "kHalf"),
            ("kFloat32", "kFloat"),
            ("kFloat64", "kDouble"),
            ("kU8", "kByte"),
            ("kI8", "kChar"),
            ("kI16", "kShort"),
            ("kI32", "kInt"),
            ("kI64", "kLong"),
            ("kF16", "kHalf"),
            ("kF32", "kFloat"),
            ("kF64", "kDouble"),
        )
    )
    + " }"
)


def aten_ops_types_h(srcs: list[str], ops_dir: Path | None) -> str | None:
    """A stand-in ``torch/types.h`` for CUDA sources (``load_inline`` puts ``#include
    <torch/types.h>`` before them): the Tensor class, the per-operator header of each
    ``torch::``/``at::`` function they call, ``ATen/Dispatch.h`` where they dispatch, and
    namespace ``torch`` as torch/types.h makes it (``at`` plus the dtype names), so
    ``torch::empty_like`` is ``at::empty_like``: the same tensor, without the autograd
    bookkeeping a forward kernel does not use. None without per-operator headers."""
    if ops_dir is None:
        return None
    text = "\n".join(srcs)
    ops = sorted({m for m in _CALL.findall(text) if (ops_dir / f"{m}.h").is_file()})
    head = [
        "// sandbox stand-in for torch/types.h (kbcache, header level 2)",
        "#pragma once",
        "#include <ATen/core/Tensor.h>",
        *(f"#include <ATen/ops/{o}.h>" for o in ops),
    ]
    if "AT_DISPATCH" in text:
        head.append("#include <ATen/Dispatch.h>")
    return "\n".join([*head, _TORCH_NS, ""])


Attempt = tuple[str, dict[str, Any], str | None]  # (label, params, stand-in torch/types.h)


def _lighter_attempt(kind: str, params: dict[str, Any]) -> Attempt | None:
    """The one build to try before the sources as given, or None. Level 2: the CUDA sources with
    a stand-in ``torch/types.h`` (:func:`aten_ops_types_h`) and main.cpp with a stand-in
    ``torch/extension.h``; level 1: the real ``torch/types.h`` in place of ``torch/extension.h``
    in the CUDA sources. One lighter try only: when it fails in the CUDA sources the next build
    is the sources as given (a real compile error, frequent early in RL, costs two compiles, not
    three)."""
    cuda = params.get("cuda_sources")
    if kind != "load_inline" or not cuda or LIGHT_HEADERS < 1:
        return None
    srcs = [cuda] if isinstance(cuda, str) else list(cuda)
    light = [_EXT_H.sub(_LIGHT, x) for x in srcs]
    lp = dict(params, cuda_sources=light[0] if isinstance(cuda, str) else light)
    types_h = aten_ops_types_h(srcs, _aten_ops_dir()) if LIGHT_HEADERS >= 2 else None
    if types_h is not None:
        return ("aten_ops", lp, types_h)
    if light != srcs:
        return ("torch_types", lp, None)
    if LIGHT_HEADERS >= 2:
        return ("cuda_as_given", params, None)  # main.cpp's stand-in alone
    return None


def _failed_targets(err: BaseException) -> tuple[bool, bool]:
    """Which of a failed load_inline build's units failed (ninja's ``FAILED:`` lines): (the CUDA
    source, the generated main.cpp)."""
    failed = re.findall(r"FAILED:\s*(\S+)", str(err))
    return any("cuda" in f for f in failed), any("main" in f for f in failed)


def _first_error(err: BaseException) -> str:
    """The first compiler diagnostic (``error:``) of a failed build, else its last line."""
    lines = str(err).strip().splitlines()
    hits = [ln.strip() for ln in lines if "error:" in ln or "error " in ln]
    return (hits[0] if hits else lines[-1] if lines else "")[:500]


def _build_lighter(
    kind: str, params: dict[str, Any], build: Path, steps: list[dict[str, Any]] | None = None
) -> tuple[Any, str]:
    """Build with :func:`_lighter_attempt` first. When only main.cpp fails with its stand-in
    (ninja's ``FAILED:`` lines say which unit), the same try again with the real umbrella header;
    on any other failure, the sources exactly as given (whose errors are what a candidate sees).
    Returns (module, what was used); each failed lighter try is appended to ``steps``."""
    attempt = _lighter_attempt(kind, params)
    standin = LIGHT_HEADERS >= 2
    while attempt is not None:
        label, p, types_h = attempt
        p = dict(p)
        if types_h is not None:  # nvcc only: -I comes before torch's -isystem directories
            d = build / "aten_ops_standin"
            (d / "torch").mkdir(parents=True, exist_ok=True)
            (d / "torch" / "types.h").write_text(types_h)
            p["extra_cuda_cflags"] = [f"-I{d}", *(params.get("extra_cuda_cflags") or [])]
        if standin:
            p["extra_include_paths"] = [
                str(_KB_STANDIN),
                *(params.get("extra_include_paths") or []),
            ]
        used = label + ("+main_standin" if standin else "")
        try:
            return _ORIG[kind](**p), used
        except Exception as e:  # noqa: BLE001 - a lighter header set did not do: step down
            shutil.rmtree(build, ignore_errors=True)
            build.mkdir()
            cu_failed, main_failed = _failed_targets(e)
            if steps is not None:
                steps.append(
                    {
                        "headers": used,
                        "cuda_failed": cu_failed,
                        "main_failed": main_failed,
                        "error": _first_error(e),
                    }
                )
            # main.cpp alone failed with the stand-in: once more with the real header, where the
            # CUDA side is still lighter than as given
            again = standin and main_failed and not cu_failed and label != "cuda_as_given"
            standin = False
            attempt = attempt if again else None
    return _ORIG[kind](**params), "as_given"


_ORIG: dict[str, Any] = {}


def _key(name: str, payload: Any) -> str:
    import torch

    h = hashlib.sha256()
    h.update(json.dumps(payload, sort_keys=True, default=str).encode())
    h.update(torch.__version__.encode())
    h.update(os.environ.get("TORCH_CUDA_ARCH_LIST", "").encode())
    return f"{name}-{h.hexdigest()[:24]}"


def _import(name: str, so: Path):
    spec = importlib.util.spec_from_file_location(name, str(so))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {so}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules.setdefault(name, mod)
    return mod


def _find_so(d: Path, name: str) -> Path | None:
    for cand in (d / f"{name}.so", *d.glob(f"{name}*.so")):
        if cand.exists():
            return cand
    return None


def install(cache_root: str | os.PathLike[str]) -> None:
    """Patch ``load_inline`` and ``load`` of ``torch.utils.cpp_extension`` (idempotent)."""
    import torch.utils.cpp_extension as ce

    if _ORIG:
        return
    root = Path(cache_root)
    root.mkdir(parents=True, exist_ok=True)
    _ORIG["load_inline"] = ce.load_inline
    _ORIG["load"] = ce.load
    sig_inline = inspect.signature(ce.load_inline)
    sig_load = inspect.signature(ce.load)

    def wrapped(kind: str, *args: Any, **kwargs: Any):
        sig = sig_inline if kind == "load_inline" else sig_load
        bound = sig.bind(*args, **kwargs)
        params = dict(bound.arguments)
        name = params["name"]
        payload = {
            k: v
            for k, v in params.items()
            if k not in ("build_directory", "verbose", "keep_intermediates")
        }
        if kind == "load":
            srcs = params.get("sources") or []
            srcs = [srcs] if isinstance(srcs, str) else srcs
            payload["_source_text"] = [
                Path(s).read_text(errors="replace") if Path(s).exists() else s for s in srcs
            ]
        key = _key(name, payload)
        final = root / key
        t0 = time.monotonic()
        so = _find_so(final, name) if final.is_dir() else None
        if so is not None and params.get("is_python_module", True):
            mod = _import(so.name.split(".")[0], so)  # a fallback build may be named NAME_v1
            BUILDS.append({"name": name, "key": key, "hit": True, "seconds": time.monotonic() - t0})
            return mod
        build = Path(
            tempfile.mkdtemp(prefix=f"{key}.", dir=root if os.access(root, os.W_OK) else None)
        )
        params["build_directory"] = str(build)
        params.setdefault("verbose", False)
        steps: list[dict[str, Any]] = []
        try:
            mod, headers = _build_lighter(kind, params, build, steps)
        except BaseException as e:
            BUILDS.append(
                {
                    "name": name,
                    "key": key,
                    "hit": False,
                    "seconds": time.monotonic() - t0,
                    "error": f"{type(e).__name__}: {e}"[-20000:],
                }
            )
            shutil.rmtree(build, ignore_errors=True)
            raise
        BUILDS.append(
            {
                "name": name,
                "key": key,
                "hit": False,
                "seconds": time.monotonic() - t0,
                "headers": headers,
                **({"lighter_failed": steps} if steps else {}),
            }
        )
        try:  # publish: only the built module is needed by later loads
            os.chmod(build, 0o755)
            os.replace(build, final) if not final.exists() else None
        except OSError:
            pass
        return mod

    def load_inline(*a: Any, **k: Any):
        return wrapped("load_inline", *a, **k)

    def load(*a: Any, **k: Any):
        return wrapped("load", *a, **k)

    load_inline.__doc__ = _ORIG["load_inline"].__doc__
    ce.load_inline = load_inline
    ce.load = load
    _ = uuid  # keep import for future unique names
