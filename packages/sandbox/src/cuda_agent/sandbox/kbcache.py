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
LIGHT_HEADERS = os.environ.get("CUDA_AGENT_KB_LIGHT_HEADERS", "1") != "0"
_EXT_H = re.compile(r"#\s*include\s*[<\"]torch/extension\.h[>\"]")
_LIGHT = "#include <torch/types.h>\n"  # what CUDA code uses of torch/extension.h, minus torch/all.h and Python


def _lighter(params: dict[str, Any]) -> dict[str, Any] | None:
    """``params`` with ``torch/extension.h`` in the CUDA sources replaced by lighter headers,
    or None when there is nothing to lighten."""
    cuda = params.get("cuda_sources")
    if not cuda:
        return None
    srcs = [cuda] if isinstance(cuda, str) else list(cuda)
    if not any(_EXT_H.search(x) for x in srcs):
        return None
    new = [_EXT_H.sub(_LIGHT, x) for x in srcs]
    return dict(params, cuda_sources=new[0] if isinstance(cuda, str) else new)


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
        light = _lighter(params) if kind == "load_inline" and LIGHT_HEADERS else None
        light_used = False
        try:
            mod = None
            if light is not None:
                # the CUDA part with lighter torch headers first (nvcc parsing torch/extension.h
                # is most of a cold build); on any failure, the sources exactly as given
                try:
                    mod = _ORIG[kind](**light)
                    light_used = True
                except Exception:  # noqa: BLE001 - fall back to the original sources
                    shutil.rmtree(build, ignore_errors=True)
                    build.mkdir()
                    mod = None
            if mod is None:
                mod = _ORIG[kind](**params)
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
                "light_headers": light_used,
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
