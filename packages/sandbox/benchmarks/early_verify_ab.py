"""Paired A/B of the early verification start: the same honest candidate evaluated with
``early_verify`` on and off, alternating, on the cpu backend (timing off, guards off); median
seconds from the start of the device half to the result, and the verify stage.

    python packages/sandbox/benchmarks/early_verify_ab.py [ROUNDS]   (default 4)

Prints one JSON line. The early start needs a mount namespace (``sandbox caps``)."""

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
    if not caps().network_ns:
        print(json.dumps({"skipped": "no mount namespace: the early start is off here"}))
        return 0
    task = Task.make("scale_add", (FIX / "model.py").read_text())
    cand = Candidate(task=task, solution=Solution.make("kernelbench", {"model_new.py": HONEST}))
    cfg = SandboxConfig(
        backend="cpu", cache_dir=tempfile.mkdtemp(prefix="early-ab-"), timing=False,
        guard_policy="off",
    )  # fmt: skip
    cfg_dir = Path(cfg.cache_dir or "")
    cfg_dir.chmod(0o755)
    evaluate(cand, cfg)  # warm-up: caches, first imports
    verify: dict[str, list[float]] = {"early": [], "late": []}

    def run(name: str) -> None:
        r = evaluate(cand, cfg.with_(early_verify=name == "early"))
        assert r.status == "ok", r.message
        verify[name].append(r.meta["stages_s"]["verify"])

    med = paired_medians({"early": lambda: run("early"), "late": lambda: run("late")}, rounds, 2)
    print(
        json.dumps(
            {
                "rounds": rounds,
                "evaluate_s_median": med,
                "verify_stage_s_median": {
                    k: round(statistics.median(v), 2) for k, v in verify.items()
                },
                "early/late": round(med["early"] / med["late"], 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
