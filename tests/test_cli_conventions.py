"""Every record-reading command follows the CLI conventions: --help shows an example, and a
malformed line gives exit code 2 with `line N:` on stderr and nothing half-written on stdout."""

import json
import subprocess
import sys

import pytest

# (module, arguments) of commands that read records on stdin
READERS = [
    ("cuda_agent.records.cli", ["validate"]),
    ("cuda_agent.records.cli", ["stats"]),
    ("cuda_agent.reward.cli", ["score"]),
    ("cuda_agent.sandbox.cli", ["eval", "--backend", "cpu"]),
    ("cuda_agent.guards.cli", ["check"]),
    ("cuda_agent.profiler.cli", ["baseline", "--device", "cpu"]),
    ("cuda_agent.opsynth.cli", ["filter", "--backend", "cpu"]),
    ("cuda_agent.opsynth.cli", ["dedup"]),
    ("cuda_agent.rft.cli", ["select"]),
    ("cuda_agent.agent.cli", ["replay"]),
    ("cuda_agent.kernelbench_eval.cli", ["run", "--backend", "cpu"]),
    ("cuda_agent.kernelbench_eval.cli", ["report"]),
]
CLIS = sorted({m for m, _ in READERS} | {"cuda_agent.ppo.cli", "cuda_agent.critic.cli"})


def run(module, args, stdin=b""):
    return subprocess.run(
        [sys.executable, "-m", module, *args], input=stdin, capture_output=True, timeout=300
    )


@pytest.mark.parametrize("module", CLIS)
def test_help_has_an_example(module):
    p = run(module, ["--help"])
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert b"xample" in p.stdout, p.stdout.decode()


@pytest.mark.parametrize(
    "module,args", READERS, ids=lambda x: x if isinstance(x, str) else " ".join(x)
)
def test_malformed_line_exit_2(module, args):
    p = run(module, args, b"{this is not json\n")
    assert p.returncode == 2, (p.returncode, p.stderr.decode()[-2000:])
    assert b"line 1:" in p.stderr, p.stderr.decode()[-2000:]
    assert p.stdout == b"" or p.stdout.endswith(b"\n")
    for line in p.stdout.splitlines():
        json.loads(line)


@pytest.mark.parametrize(
    "module, command, says",
    [
        ("cuda_agent.rft.cli", "train", "rft train: model"),
        ("cuda_agent.critic.cli", "pretrain", "critic pretrain: model"),
    ],
)
@pytest.mark.parametrize("where", ["group", "command"])
def test_deepspeed_launcher_local_rank_is_accepted(tmp_path, module, command, says, where):
    # `deepspeed --num_gpus N --module M CMD ...` starts each rank as
    # `python -u -m M --local_rank=R CMD ...`: the CLI takes the option and ignores it (LOCAL_RANK
    # in the environment is the rank), before the command or after its options
    args = [command, "--model", str(tmp_path / "none"), "--data", "x.jsonl"]
    args += ["--out", str(tmp_path / "out")]
    argv = ["--local_rank=1", *args] if where == "group" else [*args, "--local_rank=1"]
    r = subprocess.run(
        [sys.executable, "-u", "-m", module, *argv], capture_output=True, text=True, timeout=120
    )
    # the command itself ran: it names the missing model, not an unknown option
    assert r.returncode == 2 and "No such option" not in r.stderr, r.stderr
    assert says in r.stderr, r.stderr
