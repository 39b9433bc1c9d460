"""Paired A/B of the early process starts: the same honest candidate evaluated with the start
on and off, alternating, on the cpu backend (guards off); median seconds of the evaluation,
and of the stage.

    python packages/sandbox/benchmarks/early_verify_ab.py [ROUNDS] [verify|time] [ROWS]

``verify`` (default): ``early_verify`` on/off, timing off; the early start needs a mount
namespace (``sandbox caps``). ``time``: ``early_time`` on/off, timing on (0.5 s cap), no
baselines; the timing process's start-up overlaps the comparison of the outputs, so the gain
grows with their size: ``ROWS`` x 256 fp32 per trial (default: the fixture's 64).
Prints one JSON line."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

from paired import paired_medians

from cuda_agent.records import Candidate, Solution, Task
from cuda_agent.sandbox import SandboxConfig, evaluate
from cuda_agent.sandbox.isolation import caps

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "scale_add"
HONEST = (
    "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
    "    def __init__(self, cols):\n        super().__init__()\n"
    "        self.w = nn.Parameter(torch.empty(cols))\n        self.b = nn.Parameter(torch.empty(cols))\n"
    "    def forward(self, x):\n        return x * self.w + self.b\n"
)


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    what = sys.argv[2] if len(sys.argv) > 2 else "verify"
    rows = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    if what == "verify" and not caps().network_ns:
        print(json.dumps({"skipped": "no mount namespace: the early start is off here"}))
        return 0
    ref = (
        (FIX / "model.py").read_text().replace("torch.randn(64, 256)", f"torch.randn({rows}, 256)")
    )
    task = Task.make("scale_add", ref)
    cand = Candidate(task=task, solution=Solution.make("kernelbench", {"model_new.py": HONEST}))
    cfg = SandboxConfig(
        backend="cpu", cache_dir=tempfile.mkdtemp(prefix="early-ab-"), timing=what == "time",
        guard_policy="off", baselines=False, timing_config={"time_cap_s": 0.5, "min_samples": 3},
    )  # fmt: skip
    cfg_dir = Path(cfg.cache_dir or "")
    cfg_dir.chmod(0o755)
    evaluate(cand, cfg)  # warm-up: caches, first imports
    stage: dict[str, list[float]] = {"early": [], "late": []}

    def run(name: str) -> None:
        knob = {"early_verify" if what == "verify" else "early_time": name == "early"}
        r = evaluate(cand, cfg.with_(**knob))
        assert r.status == "ok", r.message
        stage[name].append(r.meta["stages_s"][what])

    med = paired_medians({"early": lambda: run("early"), "late": lambda: run("late")}, rounds, 2)
    print(
        json.dumps(
            {
                "rounds": rounds,
                "what": what,
                "rows": rows,
                "evaluate_s_median": med,
                f"{what}_stage_s_median": {
                    k: round(statistics.median(v), 2) for k, v in stage.items()
                },
                "early/late": round(med["early"] / med["late"], 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
