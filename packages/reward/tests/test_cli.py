import json
import subprocess
import sys

import msgspec

from cuda_agent.records import encode
from cuda_agent.records.examples import result, task, trajectory

CMD = [sys.executable, "-m", "cuda_agent.reward.cli"]


def run(args, stdin=b""):
    return subprocess.run([*CMD, *args], input=stdin, capture_output=True, timeout=120)


def test_help_shows_examples():
    p = run(["--help"])
    assert p.returncode == 0 and b"reward score < results.jsonl" in p.stdout
    p = run(["score", "--help"])
    assert p.returncode == 0 and b"--scheme" in p.stdout


def test_score_results_and_trajectories():
    r = msgspec.structs.replace(
        result(0), timing=None, speedup_vs_eager=2.0, speedup_vs_compile=1.0
    )
    p = run(["score"], encode(r) + encode(trajectory(1)))
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert [x["kind"] for x in lines] == ["eval_result", "trajectory"]
    assert lines[0]["reward"] == 2.0 and "eager only" in lines[0]["reward_reason"]
    assert lines[1]["reward"] == 3.0
    assert b"2 written" in p.stderr


def test_wrong_kind_is_malformed():
    p = run(["score"], encode(task(0)))
    assert (
        p.returncode == 2
        and b"line 1: expected kind eval_result or trajectory, got 'task'" in p.stderr
    )
    assert p.stdout == b""


def test_unknown_scheme_is_usage_error():
    p = run(["score", "--scheme", "bogus"], b"")
    assert p.returncode == 2 and b"unknown scheme" in p.stderr
