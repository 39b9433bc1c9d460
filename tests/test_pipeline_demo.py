"""The demo's config end to end through bin/train_all.sh: every stage's real CLI, the cpu sandbox,
a tiny random-weight policy in place of SmolLM2 (the SmolLM2 path is covered by the agent's
tests) and fewer generated tokens, so CI runs the whole chain in a few minutes."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cuda_agent.records import Status

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("ppo") is None, reason="run under `uv run pytest`")
def test_demo_config_end_to_end(tmp_path):
    run = tmp_path / "run"
    sets = [
        "model.tiny=true",
        "rollout.max_new_tokens=24",
        "rollout.max_turns=2",
        "rollout.include_skill=false",
        "pipeline.synth_n=4",  # seed 0: 3 of 4 pass the filter, the first 2 are used
        'sandbox.backend="cpu"',
        'train.device="cpu"',
    ]
    cmd = ["bash", "bin/train_all.sh", "--config", "configs/tiny-cpu.toml", "--run-dir", str(run)]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stderr[-5000:]
    for stage in ("data", "baselines", "warmup", "collect", "rft", "critic", "ppo", "eval"):
        assert (run / stage / ".done").exists(), stage
        assert (run / "logs" / f"{stage}.log").exists(), stage
    assert (run / "ppo" / "final" / "config.json").exists()
    steps = [json.loads(x) for x in (run / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert steps and all("reward_mean" in s and "clipfrac" in s for s in steps)
    # the KernelBench-style report of the miniature tree: one outcome per level-1 problem, each
    # with a real status, and the level and overall rows that count them
    tasks = [json.loads(x) for x in (run / "eval" / "tasks.jsonl").read_text().splitlines()]
    report = json.loads((run / "eval" / "report.json").read_text())
    assert tasks and {t["level"] for t in tasks} == {1}
    probs = report["problems"]
    assert sorted((p["level"], p["problem_id"]) for p in probs) == sorted(
        (t["level"], t["problem_id"]) for t in tasks
    )
    assert {p["status"] for p in probs} <= {s.value for s in Status} | {"missing"}, probs
    rows = {r["level"]: r for r in report["levels"]}
    assert set(rows) == {"1", "overall"}
    ok = sum(p["status"] == "ok" for p in probs)
    for r in rows.values():
        assert r["problems"] == len(tasks) and r["correct"] == ok, r
        assert r["pass_rate"] == pytest.approx(ok / len(tasks))
        assert -1.0 <= r["mean_reward"] <= 3.0
    assert set(report["settings"]) == {
        "threshold",
        "guard policy",
        "atol/rtol",
        "device",
        "results",
    }
    md = (run / "eval" / "report.md").read_text()
    assert md.startswith("# KernelBench report")
    assert f"| overall | {len(tasks)} | {ok / len(tasks):.1%} |" in md
    assert "The paper's published rows" in md

    # a second run of the same command skips every finished stage
    r2 = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert r2.stderr.count("done already") == 8
