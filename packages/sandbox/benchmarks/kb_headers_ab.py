"""Paired A/B of the KernelBench ``load_inline`` build by header level (kbcache).

  python kb_headers_ab.py OUT ROUNDS [LEVELS]   e.g. ``/tmp/kbh 2 0,1,2``

Each round builds the gpu_fused fixture's ``load_inline`` extension once per level (order
rotated each round), each in a fresh process with a fresh cache: 0 = the sources as given (what
plain ``load_inline`` compiles), 1 = ``torch/types.h`` in the CUDA source, 2 = per-operator ATen
headers in the CUDA source and the stand-in ``torch/extension.h`` for the generated main.cpp.
Seconds are whole processes (interpreter and ``import torch`` included). Needs nvcc; without a
GPU set CUDA_AGENT_ARCH / TORCH_CUDA_ARCH_LIST (default 9.0): the module is built and imported,
not run. ``ATen/cuda/CUDAContext.h`` is swapped for ``c10/cuda/CUDAStream.h`` (it needs
cusparse headers that a toolkit without the math libraries lacks). Writes OUT/ab.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
KB = HERE.parent / "tests" / "fixtures" / "gpu_fused" / "kb_model_new.py"

BUILD = """
import json, sys, time
from cuda_agent.sandbox import kbcache
kbcache.install(sys.argv[1])
t = time.monotonic()
ns = {}
exec(compile(open(sys.argv[2]).read(), sys.argv[2], "exec"), ns)
print(json.dumps({"build_s": time.monotonic() - t, "builds": kbcache.BUILDS}))
"""


def main() -> None:
    out, rounds = Path(sys.argv[1]), int(sys.argv[2])
    levels = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "0,1,2").split(",")]
    out.mkdir(parents=True, exist_ok=True)
    src = KB.read_text()
    src = src.replace("#include <ATen/cuda/CUDAContext.h>", "#include <c10/cuda/CUDAStream.h>")
    src = src.replace("at::cuda::getCurrentCUDAStream()", "c10::cuda::getCurrentCUDAStream()")
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST=os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0"))
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 2))
    if "CUDA_HOME" not in env:  # the toolkit the sandbox uses (torch may guess one without libs)
        from cuda_agent.sandbox.toolchain import cuda_home

        if cuda_home():
            env["CUDA_HOME"] = str(cuda_home())
    raw: dict[int, list[float]] = {lv: [] for lv in levels}
    runs = []
    for r in range(rounds):
        order = levels[r % len(levels) :] + levels[: r % len(levels)]
        for lv in order:
            d = Path(tempfile.mkdtemp(prefix=f"kbh{lv}-", dir=out))
            model = d / "kb.py"
            model.write_text(src.replace("kb_fused_ext", f"kb_fused_{lv}_{r}"))
            t = time.monotonic()
            p = subprocess.run(
                [sys.executable, "-c", BUILD, str(d / "cache"), str(model)],
                env=dict(env, CUDA_AGENT_KB_LIGHT_HEADERS=str(lv)),
                capture_output=True,
                text=True,
            )
            s = time.monotonic() - t
            rep = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {}
            used = [b.get("headers") for b in rep.get("builds", [])]
            failed = [f for b in rep.get("builds", []) for f in b.get("lighter_failed", [])]
            runs.append(
                {
                    "round": r,
                    "level": lv,
                    "seconds": round(s, 2),
                    "rc": p.returncode,
                    "headers": used,
                    "lighter_failed": failed,
                    "stderr": p.stderr[-1500:] if p.returncode else "",
                }
            )
            print(json.dumps(runs[-1]), flush=True)
            if p.returncode == 0:
                raw[lv].append(s)
    med = {lv: round(statistics.median(v), 2) for lv, v in raw.items() if v}
    res = {
        "median_s": med,
        "raw_s": raw,
        "runs": runs,
        "ratios_vs_level0": {lv: round(med[0] / m, 2) for lv, m in med.items() if 0 in med},
    }
    (out / "ab.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("median_s", "ratios_vs_level0")}))


if __name__ == "__main__":
    main()
