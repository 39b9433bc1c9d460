"""`deepspeed --num_gpus N --module cuda_agent.ppo.cli train ...` starts each rank as
``python -u -m cuda_agent.ppo.cli --local_rank=R train ...``: the CLI takes that option and ignores
it (LOCAL_RANK in the environment is the rank)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LAUNCHED = [sys.executable, "-u", "-m", "cuda_agent.ppo.cli", "--local_rank=3"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LAUNCHED, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_deepspeed_launcher_local_rank_is_accepted():
    r = _run("check-config", "--config", "configs/tiny-cpu.toml")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"]["actor"] == "smollm2"
    # in front of `train`, too: the command runs (and stops here at the missing config)
    r = _run("train", "--config", "no-such.toml")
    assert r.returncode == 2 and "No such option" not in r.stderr, r.stderr
    assert "no-such.toml: [Errno 2]" in r.stderr, r.stderr
