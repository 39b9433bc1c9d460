"""bin/train_all.sh's reruns on real files: an unfinished `rft` stage run again continues without
duplicating its selection, `--force rft` redoes it from an empty directory, and the `rft` and
`critic` stages train on episodes up to `rollout.max_context` tokens (not a fixed 16384)."""

import os
import shutil
import subprocess
from pathlib import Path

import msgspec
import pytest

from cuda_agent.records import RecordWriter
from cuda_agent.training.data import example_from_trajectory
from cuda_agent.training.synthetic import tiny_training_setup

ROOT = Path(__file__).resolve().parents[1]


def _lines(p: Path) -> int:
    return len(p.read_text().splitlines())


@pytest.mark.skipif(shutil.which("ppo") is None, reason="run under `uv run pytest`")
def test_rft_rerun_force_and_max_len(tmp_path):
    model, trajs, _ = tiny_training_setup(tmp_path / "tiny", 3, turns=2, tool_output_lines=2)
    kept = [msgspec.structs.replace(t, reward=1.0) for t in trajs]
    low = msgspec.structs.replace(trajs[0], id="low", reward=-1.0)
    lens = sorted(len(example_from_trajectory(t)) for t in kept)
    assert lens[0] < lens[-1], lens
    max_context = lens[-1] - 1  # the longest kept episode is over it, the others are not
    too_long = sum(n > max_context for n in lens)

    run = tmp_path / "run"
    (run / "collect").mkdir(parents=True)
    (run / "warmup").mkdir()
    (run / "warmup" / "final").symlink_to(model)
    with RecordWriter(run / "collect" / "trajectories.jsonl", append=False) as w:
        w.write_all([*kept, low])

    def train_all(*args: str) -> subprocess.CompletedProcess:
        cmd = ["bash", "bin/train_all.sh", "--config", "configs/tiny-cpu.toml"]
        cmd += ["--run-dir", str(run), "--set", 'train.device="cpu"']
        cmd += ["--set", f"rollout.max_context={max_context}"]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        r = subprocess.run(
            [*cmd, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 0, r.stderr[-4000:]
        return r

    rft = run / "rft"
    train_all("--only", "rft")
    assert _lines(rft / "kept.jsonl") == 3 and _lines(rft / "dropped.jsonl") == 1
    assert (rft / "final" / "config.json").exists()
    log = (run / "logs" / "rft.log").read_text()
    assert f"left out {too_long} trajectories longer than --max-len {max_context}" in log

    # the stage stopped before its .done: a rerun selects nothing twice, and `rft train
    # --resume` accepts the unchanged kept.jsonl
    (rft / ".done").unlink()
    train_all("--only", "rft")
    assert _lines(rft / "kept.jsonl") == 3 and _lines(rft / "dropped.jsonl") == 1
    assert (rft / ".done").exists()

    # --force: the stage's directory is deleted first, and the stage runs from scratch
    (rft / "stale").write_text("from an earlier run")
    r = train_all("--only", "rft", "--force", "rft")
    assert "rft: forced" in r.stderr
    assert not (rft / "stale").exists()
    assert _lines(rft / "kept.jsonl") == 3 and _lines(rft / "dropped.jsonl") == 1
    assert (rft / ".done").exists() and (rft / "final" / "config.json").exists()

    train_all("--only", "critic")
    log = (run / "logs" / "critic.log").read_text()
    assert f"longer than --max-len {max_context}" in log
    assert (run / "critic" / ".done").exists()
