"""Build the CPU candidates' C++ kernels into one pybind11 module (no torch headers, one translation unit: ~10-20 s),
cached on disk by content hash. Each candidate's ``kernels/*.cpp`` defines ``bind_<name>``; the
module exposes one submodule per candidate (``guards_cpu_kernels.<name>``)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

MODULE = "guards_cpu_kernels"


def build(sources: dict[str, str]) -> object:
    """Compile (or reuse) the module holding every candidate's kernels and import it."""
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    import torch.utils.cpp_extension as ce

    main = ["#include <pybind11/pybind11.h>"]
    main += [f"void bind_{n}(pybind11::module_& m);" for n in sorted(sources)]
    main.append(f"PYBIND11_MODULE({MODULE}, m) {{")
    main += [f'  {{ auto sub = m.def_submodule("{n}"); bind_{n}(sub); }}' for n in sorted(sources)]
    main.append("}")
    # one translation unit: the pybind11 headers are parsed once (~10 s instead of minutes)
    texts = {
        "all.cpp": "\n".join(t for _, t in sorted(sources.items())) + "\n" + "\n".join(main) + "\n"
    }
    h = hashlib.sha256(repr(sorted(texts.items())).encode() + sys.version.encode()).hexdigest()[:16]
    root = (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "cuda-agent-guards-tests"
        / h
    )
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    so = root / f"{MODULE}{suffix}"
    if not so.exists():
        root.mkdir(parents=True, exist_ok=True)
        for k, v in texts.items():
            (root / k).write_text(v)
        inc = [sysconfig.get_paths()["include"], ce.include_paths()[0]]
        cmd = ["g++", "-O1", "-shared", "-fPIC", "-std=c++17", "-w"]
        cmd += [f"-I{i}" for i in inc] + [str(root / k) for k in texts] + ["-o", str(so) + ".tmp"]
        subprocess.run(cmd, check=True)
        os.replace(str(so) + ".tmp", so)
    spec = importlib.util.spec_from_file_location(MODULE, so)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[MODULE] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod
