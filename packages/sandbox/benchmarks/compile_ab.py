"""Compile-time A/B of the workdir build, and the call cost of bindings per optimisation level.

  python compile_ab.py OUT ROUNDS [JOBS]   cold (new .cu + new _binding.cpp, prelude and
      binding.cpp built once before) and warm (.cu changed) builds of the gpu_fused fixture,
      interleaved: "before" (modules linked against torch's real libraries) vs "after" (the
      current flags: against symbol-less stand-ins, build.ensure_link_stubs). Needs nvcc;
      without a GPU set CUDA_AGENT_ARCH=9.0. Writes OUT/ab.json. (Until commit 78c0803 the
      A/B was -O1 binding glue and the default linker vs -Og and a faster linker.)
  python compile_ab.py --calls OUT         builds the cpu fixture with all binding glue at -O1,
      with the current flags (binding.cpp -O1, bindings -Og), all -Og and all -O0, and times
      100,000 calls of trivial bound functions, each module in a fresh process, 8 rounds.

Numbers go to docs/lab/history/benchmarks-sandbox.md (section 2, CPU host).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIX = HERE.parent / "tests" / "fixtures"


def _files(name: str) -> dict[str, str]:
    root = FIX / name
    skip = ("model.py", "kb_model_new.py")
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in skip
    }


def ab(root: Path, rounds: int, jobs: int) -> None:
    import cuda_agent.sandbox.build as B
    from cuda_agent.records import Solution, Task
    from cuda_agent.sandbox.isolation import Limits
    from cuda_agent.sandbox.toolchain import flags_for
    from cuda_agent.sandbox.workspace import materialise

    task = Task.make("fused", (FIX / "gpu_fused" / "model.py").read_text())
    base = _files("gpu_fused")
    after = flags_for("cuda")
    # before: the same flags, linked against torch's real libraries (no stand-ins)
    before = dataclasses.replace(after, link_stubs=(), key=after.key[:10] + "before")
    variants = {"before": before, "after": after}
    keys = ("cold", "cold_binding", "cold_cu", "cold_link", "warm", "warm_link")
    res = {k: {x: [] for x in keys} for k in variants}
    caches = {}

    def build(name: str, files: dict[str, str], tag: str):
        w = materialise(task, Solution.make("workdir", files), root / f"w_{name}_{tag}", "cuda")
        r = B.build_workdir(w, w / "build", backend="cuda", cache=caches[name], jobs=jobs)
        assert r.ok, r.log
        return r

    for name, fl in variants.items():
        B.flags_for = lambda backend, fl=fl: fl  # the build module's view of the flags
        caches[name] = B.ObjectCache(root / name)
        t = time.monotonic()
        note = B.ensure_pch(caches[name], fl, Limits())[1]
        print(name, note, f"{time.monotonic() - t:.1f}s", flush=True)
        f = dict(base)
        f["kernels/fused.cu"] += "\n// warmup\n"
        f["kernels/fused_binding.cpp"] += "\n// warmup\n"
        build(name, f, "warmup")  # binding.cpp into the object cache
    for i in range(rounds):
        for name, fl in variants.items():
            B.flags_for = lambda backend, fl=fl: fl
            tag = uuid.uuid4().hex[:8]
            f = dict(base)
            f["kernels/fused.cu"] += f"\n// {tag}\n"
            f["kernels/fused_binding.cpp"] += f"\n// {tag}\n"
            r = build(name, f, tag)
            u = {x["file"]: x for x in r.units}
            assert r.pch == "on" and u["binding.cpp"]["cached"], (r.pch, r.units)
            f["kernels/fused.cu"] += "// warm\n"
            r2 = build(name, f, tag + "_warm")
            row = dict(
                cold=r.seconds,
                cold_binding=u["kernels/fused_binding.cpp"]["seconds"],
                cold_cu=u["kernels/fused.cu"]["seconds"],
                cold_link=r.link_seconds,
                warm=r2.seconds,
                warm_link=r2.link_seconds,
            )
            for k, v in row.items():
                res[name][k].append(v)
            print(i, name, {k: round(v, 2) for k, v in row.items()}, os.getloadavg()[0], flush=True)
    med = {n: {k: round(statistics.median(v), 2) for k, v in d.items()} for n, d in res.items()}
    paired = {
        k: round(
            statistics.median(
                a / b for a, b in zip(res["after"][k], res["before"][k], strict=True)
            ),
            3,
        )
        for k in ("cold", "cold_binding", "cold_link", "warm", "warm_link")
    }
    out = {"median": med, "paired_after_over_before": paired, "raw": res}
    (root / "ab.json").write_text(json.dumps(out, indent=1))
    print(json.dumps({"median": med, "paired_after_over_before": paired}, indent=1))


CALLS = """
import importlib.util, statistics, sys, time, torch
spec = importlib.util.spec_from_file_location("cuda_extension", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
x = torch.randn(4)
out = {}
for name, fn, arg in (("ident(Tensor)", m.ident, x), ("add1(int)", m.add1, 3)):
    res = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(100000):
            fn(arg)
        res.append((time.perf_counter() - t) / 100000 * 1e9)
    out[name] = round(statistics.median(res))
print(out)
"""

IDENT = """#include "../binding_registry.h"
static torch::Tensor ident(torch::Tensor x) { return x; }
static long add1(long v) { return v + 1; }
static void register_ident(pybind11::module_& m) { m.def("ident", &ident); m.def("add1", &add1); }
REGISTER_BINDING(ident, register_ident);
"""


def calls(root: Path) -> None:
    import cuda_agent.sandbox.build as B
    from cuda_agent.records import Solution, Task
    from cuda_agent.sandbox.toolchain import flags_for
    from cuda_agent.sandbox.workspace import materialise

    task = Task.make("scale_add", (FIX / "scale_add" / "model.py").read_text())
    files = {**_files("scale_add"), "kernels/ident_binding.cpp": IDENT}
    cur = flags_for("cpu")
    sos = {}
    for opt in ("-O1", "current", "-Og", "-O0"):  # current: binding.cpp -O1, bindings -Og
        fl = cur
        if opt != "current":
            bf = tuple(opt if a in ("-O1", "-Og", "-O0") else a for a in cur.binding_cflags)
            fl = dataclasses.replace(cur, binding_cflags=bf, main_cflags=bf, key=cur.key[:12] + opt)
        B.flags_for = lambda backend, fl=fl: fl
        d = root / f"calls{opt}"
        shutil.rmtree(d, ignore_errors=True)
        w = materialise(task, Solution.make("workdir", files), d / "w", "cpu")
        r = B.build_workdir(
            w, w / "build", backend="cpu", cache=B.ObjectCache(d / "cache"), pch=False, jobs=2
        )
        assert r.ok, r.log
        sos[opt] = str(r.so_path)
    for rep in range(8):
        for opt, so in sos.items():
            p = subprocess.run([sys.executable, "-c", CALLS, so], capture_output=True, text=True)
            print(rep, opt, "ns per call", p.stdout.strip() or p.stderr[-500:], flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--calls":
        calls(Path(sys.argv[2]))
    else:
        out = Path(sys.argv[1])
        out.mkdir(parents=True, exist_ok=True)
        ab(out, int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 2)
