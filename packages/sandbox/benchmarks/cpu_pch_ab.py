"""The cpu backend's bindings with and without the precompiled prelude: builds the scale_add
fixture twice per mode (each time with new binding text, so the binding is compiled and the rest
comes from the cache), in fresh caches, and the prelude itself once. Prints one JSON line.

    python packages/sandbox/benchmarks/cpu_pch_ab.py

The figures behind ``build.PCH_AFTER_DEFAULT`` (a 2-core host: 26.4 / 26.7 s a binding without,
8.9 / 8.8 s with, 45.4 s to build it) are in docs/lab/history/benchmarks.md ("Session 12")."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from early_verify_ab import FIX

from cuda_agent.records import Solution, Task
from cuda_agent.sandbox.build import build_cache, build_workdir, ensure_pch
from cuda_agent.sandbox.isolation import Limits
from cuda_agent.sandbox.toolchain import flags_for
from cuda_agent.sandbox.workspace import materialise


def main() -> int:
    files = {
        str(p.relative_to(FIX)): p.read_text()
        for p in sorted(FIX.rglob("*"))
        if p.is_file() and p.name != "model.py"
    }
    task = Task.make("scale_add", (FIX / "model.py").read_text())
    out: dict[str, object] = {}
    for pch in (False, True):
        root = Path(tempfile.mkdtemp(prefix="pch-ab-"))
        cache = build_cache(root / "cache")
        if pch:
            t = time.monotonic()
            _, note = ensure_pch(cache, flags_for("cpu"), Limits(drop_user=False))
            out["prelude_build_s"] = round(time.monotonic() - t, 1)
            out["prelude_note"] = note
        seconds = []
        for i in range(2):
            changed = {
                k: v + f"\n// round {i} pch={pch}\n" if k.endswith("_binding.cpp") else v
                for k, v in files.items()
            }
            src = materialise(task, Solution.make("workdir", changed), root / f"w{i}", "cpu")
            r = build_workdir(src, src / "build", backend="cpu", cache=cache, jobs=1, pch=pch)
            assert r.ok, r.log
            seconds += [u["seconds"] for u in r.units if u["kind"] == "binding" and not u["cached"]]
        out["binding_s_with" if pch else "binding_s_without"] = seconds
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
