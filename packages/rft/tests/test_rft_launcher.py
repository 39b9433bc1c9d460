"""`deepspeed --num_gpus N --module cuda_agent.rft.cli train ...` starts each rank as
``python -u -m cuda_agent.rft.cli --local_rank=R train ...``: the CLI takes that option and ignores
it (LOCAL_RANK in the environment is the rank)."""

import subprocess
import sys


def test_deepspeed_launcher_local_rank_is_accepted(tmp_path):
    for where in ("group", "command"):
        args = ["train", "--model", str(tmp_path / "none"), "--data", "x.jsonl"]
        args += ["--out", str(tmp_path / "out")]
        lr = ["--local_rank=1"]
        argv = [*lr, *args] if where == "group" else [*args, *lr]
        r = subprocess.run(
            [sys.executable, "-u", "-m", "cuda_agent.rft.cli", *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )
        # the command itself ran: it names the missing model, not an unknown option
        assert r.returncode == 2 and "No such option" not in r.stderr, (where, r.stderr)
        assert "rft train: model" in r.stderr, (where, r.stderr)
