"""Paired A/B of runner processes started ahead of need (``SandboxConfig.warm_processes``): the
same honest candidate evaluated with spares (``WARM_N``, default 3, per environment) and without (every phase starts
cold and imports torch), alternating, on the cpu backend; median seconds of the evaluation and
of each stage. Each run waits ``SETTLE`` seconds first, so spares started by the previous run
have finished importing and take no CPU from the next one.

    python packages/sandbox/benchmarks/warm_ab.py [ROUNDS] [SETTLE_S] [BACKEND]

``WARM_MODE=fork``: the warm arm forks its phases from the fork server
(``SandboxConfig.fork_server``) instead of taking spares; the cold arm has both off.

Prints one JSON line."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from early_verify_ab import FIX, HONEST
from paired import paired_medians

from cuda_agent.records import Candidate, Solution, Task
from cuda_agent.sandbox import SandboxConfig, evaluate

WARM = int(os.environ.get("WARM_N", "3"))
FORK = os.environ.get("WARM_MODE", "spares") == "fork"


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    settle = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    backend = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    task = Task.make("scale_add", (FIX / "model.py").read_text())
    cand = Candidate(task=task, solution=Solution.make("kernelbench", {"model_new.py": HONEST}))
    cfg = SandboxConfig(
        backend=backend, cache_dir=tempfile.mkdtemp(prefix="warm-ab-"), guard_policy="off",
        baselines=False, timing_config={"time_cap_s": 0.5, "min_samples": 3},
    )  # fmt: skip
    Path(cfg.cache_dir or "").chmod(0o755)
    evaluate(cand, cfg)  # warm-up: caches, first imports, the spares' first start
    stages: dict[str, dict[str, list[float]]] = {"warm": {}, "cold": {}}
    warm_used: list[int] = []

    def run(name: str) -> None:
        warm = name == "warm"
        r = evaluate(cand, cfg.with_(warm_processes=WARM if warm and not FORK else 0,
                                     fork_server=warm and FORK))  # fmt: skip
        assert r.status == "ok", r.message
        for k, v in r.meta["stages_s"].items():
            stages[name].setdefault(k, []).append(v)
        warm_used.append(len(r.meta.get("warm_phases") or []))

    med = paired_medians(
        {"warm": lambda: run("warm"), "cold": lambda: run("cold")},
        rounds,
        2,
        after_each=lambda: time.sleep(settle),
    )
    print(
        json.dumps(
            {
                "rounds": rounds,
                "backend": backend,
                "warm_mode": "fork" if FORK else f"{WARM} spares",
                "settle_s": settle,
                "evaluate_s_median": med,
                "stage_s_median": {
                    n: {k: round(statistics.median(v), 2) for k, v in s.items()}
                    for n, s in stages.items()
                },
                "warm/cold": round(med["warm"] / med["cold"], 3),
                "reference_s": stages["warm"].get("reference"),
                "reference_s_cold": stages["cold"].get("reference"),
                "warm_phases_per_run": warm_used,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
