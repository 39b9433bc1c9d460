"""`kernelbench-eval run` refuses a setting it cannot use before it evaluates anything."""

import subprocess
import sys


def test_unknown_guard_policy_is_refused():
    cmd = [sys.executable, "-m", "cuda_agent.kernelbench_eval.cli", "run", "--backend", "cpu"]
    p = subprocess.run(
        [*cmd, "--guard-policy", "kernelbenc"], input=b"", capture_output=True, timeout=300
    )
    assert p.returncode == 2, p.stderr.decode()[-2000:]
    assert b"unknown guard policy 'kernelbenc'" in p.stderr


def test_sandbox_eval_refuses_an_unknown_guard_policy_too():
    cmd = [sys.executable, "-m", "cuda_agent.sandbox.cli", "eval", "--backend", "cpu"]
    p = subprocess.run(
        [*cmd, "--guard-policy", "strct"], input=b"", capture_output=True, timeout=300
    )
    assert p.returncode == 2, p.stderr.decode()[-2000:]
    assert b"unknown guard policy 'strct'" in p.stderr
