"""docs/learning.png from the session's two sampled-evaluation runs (lr 3e-5 and lr 1e-5)."""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

here = Path(__file__).parent
fig, ax = plt.subplots(figsize=(7, 4))
for run, label in (
    ("sampled-task-baseline-lr3e-5", "PPO lr 3e-5"),
    ("sampled-task-baseline-lr1e-5", "PPO lr 1e-5"),
):
    rows = [json.loads(x) for x in (here / run / "results.jsonl").read_text().splitlines() if x]
    for seed in sorted({r["seed"] for r in rows if r["stage"] == "ppo"}):
        pts = sorted(
            (0 if r["stage"] == "rft" else r["ppo_step"], r["reward_mean"])
            for r in rows
            if r["stage"] == "rft" or r["seed"] == seed
        )
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{label}, seed {seed}")
ax.set_ylim(-1.05, 1.05)
ax.set_xlabel("multi-turn PPO steps from the RFT actor")
ax.set_ylabel("held-out mean reward (32 episodes, T=0.6)")
ax.set_title("SmolLM2-135M on cpu-sandbox rewards, 2-core machine")
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(sys.argv[1] if len(sys.argv) > 1 else "docs/learning.png", dpi=110)
