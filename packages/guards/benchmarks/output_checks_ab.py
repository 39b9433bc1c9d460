"""Paired A/B of the parent's output checks (``behaviour.output_findings``) between another
checkout of the repository and this one: same process, same tensors, alternating, medians.

    git worktree add /tmp/old <commit> && python packages/guards/benchmarks/output_checks_ab.py /tmp/old [TRIALS] [ROWS]

Prints one JSON line (medians in seconds and their ratio) for TRIALS (3) passing outputs of
ROWSxROWS (8192) fp32 each."""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import cuda_agent.guards

HERE = Path(__file__).resolve().parents[1] / "src" / "cuda_agent" / "guards" / "behaviour.py"


def _load(path: Path, tag: str):  # noqa: ANN202
    name = f"cuda_agent.guards._behaviour_{tag}"  # inside the package: its relative imports work
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    other = Path(sys.argv[1]) / "packages/guards/src/cuda_agent/guards/behaviour.py"
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    rows = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
    assert cuda_agent.guards  # the package the loaded modules live in
    mods = {"before": _load(other, "before"), "after": _load(HERE, "after")}
    g = torch.Generator().manual_seed(0)
    refs = [torch.randn(rows, rows, generator=g) for _ in range(trials)]
    cands = [r + 1e-4 for r in refs]
    times: dict[str, list[float]] = {k: [] for k in mods}
    for i in range(3):
        for name in ("before", "after")[:: 1 if i % 2 == 0 else -1]:
            t = time.perf_counter()
            assert mods[name].output_findings(refs, cands) == []
            times[name].append(time.perf_counter() - t)
    med = {k: round(statistics.median(v), 3) for k, v in times.items()}
    ratio = round(med["after"] / med["before"], 3)
    print(json.dumps({"trials": trials, "rows": rows, "median_s": med, "after/before": ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
