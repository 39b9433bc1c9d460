"""SIGUSR1 of a process running the sandbox's gates reports who holds and who waits (a real
process, a real signal)."""

import json
import os
import signal
import subprocess
import sys
import time

SCRIPT = r"""
import threading, time
from cuda_agent.sandbox import state_report
from cuda_agent.sandbox.gate import Occupant, device_gate

assert state_report.install()
g = device_gate("host")
held = threading.Event()

def reader():
    with g.shared(Occupant("slow reference"), "reference"):
        held.set()
        time.sleep(600)

def writer():
    held.wait()
    with g.exclusive(Occupant("timed candidate"), "time"):
        pass

threading.Thread(target=reader, daemon=True).start()
threading.Thread(target=writer, daemon=True).start()
held.wait()
time.sleep(0.3)
print("ready", flush=True)
time.sleep(600)
"""


def test_sigusr1_reports_holders_waiters_and_stacks():
    env = dict(os.environ, CUDA_AGENT_GATE_DIR="off")
    p = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGUSR1)
        time.sleep(1.5)
    finally:
        p.kill()
    err = p.communicate()[1]
    reports = [json.loads(ln) for ln in err.splitlines() if ln.startswith('{"state_report"')]
    assert reports, err[-2000:]
    (gate,) = reports[0]["state_report"]["gates"]
    assert gate["readers"] == 1 and gate["writers_waiting"] == 1 and not gate["writer"]
    assert gate["present"] == [{"occupant": "slow reference", "holding": ["shared reference"]}]
    (waiting,) = gate["waiting"]
    assert waiting["occupant"] == "timed candidate" and waiting["mode"] == "exclusive"
    assert "_grant_exclusive" in err  # the waiting thread's stack
