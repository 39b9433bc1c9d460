"""The device gate across processes (real processes, real ``flock``): exclusive holds of two
processes never overlap, shared ones do, an exclusive and a shared one exclude each other, a
waiting exclusive request holds back new shared ones of every process (threads of one process
included, without deadlock), and a killed holder releases."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cuda_agent.sandbox.gate import DeviceGate, HostLock, device_gate, host_lock, lock_key
from cuda_agent.sandbox.isolation import Limits, run_confined

# One process: each actor is a thread taking ``device_gate("host")`` (the process's gate, with
# its host-wide lock in $CUDA_AGENT_GATE_DIR) as its plan says, recording wall-clock times.
CHILD = r"""
import json, sys, threading, time
from pathlib import Path
from cuda_agent.sandbox.gate import device_gate

spec = json.loads(sys.argv[1])
sync = Path(spec["sync"])
gate = device_gate("host")
assert gate.host_lock is not None and str(gate.host_lock.directory) == spec["gates"]


def wait_for(name):
    end = time.monotonic() + 30
    while not (sync / name).exists():
        if time.monotonic() > end:
            raise TimeoutError(name)
        time.sleep(0.005)


def actor(a):
    out = {"holds": []}
    try:
        if a.get("start_on"):
            wait_for(a["start_on"])
        for mode in a["plan"]:
            req = time.time()
            (sync / f"req-{a['id']}").touch()
            with gate.exclusive() if mode == "exclusive" else gate.shared():
                t0 = time.time()
                (sync / f"held-{a['id']}").touch()
                for name in a.get("release_on", []):
                    wait_for(name)
                time.sleep(a.get("hold_s", 0.0))
                t1 = time.time()
            out["holds"].append({"mode": mode, "req": req, "t0": t0, "t1": t1})
    except BaseException as e:
        out["error"] = repr(e)
    (sync / f"{a['id']}.json").write_text(json.dumps(out))


ts = [threading.Thread(target=actor, args=(a,)) for a in spec["actors"]]
for t in ts:
    t.start()
for t in ts:
    t.join()
"""


class Host:
    """Processes of one host sharing the lock directory ``gates``; ``sync`` holds their markers."""

    def __init__(self, root: Path):
        self.gates = root / "gates"
        self.sync = root / "sync"
        self.sync.mkdir()
        self.procs: list[subprocess.Popen] = []

    def start(self, *actors: dict) -> subprocess.Popen:
        spec = {"sync": str(self.sync), "gates": str(self.gates), "actors": list(actors)}
        env = {**os.environ, "CUDA_AGENT_GATE_DIR": str(self.gates)}
        p = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(spec)], env=env)
        self.procs.append(p)
        return p

    def mark(self, name: str) -> None:
        (self.sync / name).touch()

    def seen(self, name: str) -> bool:
        return (self.sync / name).exists()

    def wait(self, name: str, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while not self.seen(name):
            assert time.monotonic() < end, f"no {name} within {timeout}s"
            time.sleep(0.005)

    def holds(self, actor: str) -> list[dict]:
        out = json.loads((self.sync / f"{actor}.json").read_text())
        assert "error" not in out, out["error"]
        return out["holds"]

    def join(self) -> None:
        for p in self.procs:
            assert p.wait(60) == 0

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path)
    yield h
    h.close()


def _overlap(a: dict, b: dict) -> bool:
    return a["t0"] < b["t1"] and b["t0"] < a["t1"]


def test_exclusive_holds_of_two_processes_never_overlap(host):
    host.start({"id": "a", "plan": ["exclusive"], "release_on": ["release-a"]})
    host.wait("held-a")
    host.start({"id": "b", "plan": ["exclusive"], "hold_s": 0.05})
    host.wait("req-b")
    time.sleep(0.5)
    assert not host.seen("held-b")  # the other process's exclusive hold keeps it out
    host.mark("release-a")
    host.join()
    (a,), (b,) = host.holds("a"), host.holds("b")
    assert b["req"] < a["t1"] <= b["t0"]  # it asked while a held, and got it after


def test_shared_holds_of_two_processes_overlap(host):
    # three shared holds, two of them threads of one process (two open files, two locks): each
    # releases only once all three hold at once
    everyone = ["held-a1", "held-a2", "held-b"]
    host.start(
        {"id": "a1", "plan": ["shared"], "release_on": everyone},
        {"id": "a2", "plan": ["shared"], "release_on": everyone},
    )
    host.start({"id": "b", "plan": ["shared"], "release_on": everyone})
    host.join()
    holds = [host.holds(x)[0] for x in ("a1", "a2", "b")]
    assert all(_overlap(x, y) for x in holds for y in holds if x is not y)


@pytest.mark.parametrize("first", ["shared", "exclusive"])
def test_exclusive_and_shared_holds_exclude_each_other(host, first):
    second = "exclusive" if first == "shared" else "shared"
    host.start({"id": "a", "plan": [first], "release_on": ["release-a"]})
    host.wait("held-a")
    host.start({"id": "b", "plan": [second]})
    host.wait("req-b")
    time.sleep(0.5)
    assert not host.seen("held-b")
    host.mark("release-a")
    host.join()
    (a,), (b,) = host.holds("a"), host.holds("b")
    assert a["t1"] <= b["t0"]


def test_a_waiting_exclusive_request_holds_back_new_shared_ones_of_every_process(host):
    # a1 holds shared; b (another process) asks exclusive and waits; then a2, a thread of a1's
    # process, asks shared: it waits behind b (the turnstile), and nothing deadlocks although
    # a1 and a2 share a process whose gate lets both in
    host.start(
        {"id": "a1", "plan": ["shared"], "release_on": ["release-a1"]},
        {"id": "a2", "plan": ["shared"], "start_on": "go-a2"},
    )
    host.wait("held-a1")
    host.start({"id": "b", "plan": ["exclusive"], "hold_s": 0.2})
    host.wait("req-b")
    time.sleep(0.3)
    host.mark("go-a2")
    host.wait("req-a2")
    time.sleep(0.5)
    assert not host.seen("held-b") and not host.seen("held-a2")
    host.mark("release-a1")
    host.join()
    (a1,), (a2,), (b,) = host.holds("a1"), host.holds("a2"), host.holds("b")
    assert a1["t1"] <= b["t0"] and b["t1"] <= a2["t0"]


def test_random_holds_of_two_processes_keep_exclusive_ones_alone(host):
    rng = random.Random(0)

    def actor(i: str) -> dict:
        plan = ["exclusive" if rng.random() < 0.4 else "shared" for _ in range(12)]
        return {"id": i, "plan": plan, "hold_s": 0.004, "start_on": "go"}

    host.start(actor("p0"), actor("p1"))
    host.start(actor("q0"), actor("q1"))
    host.mark("go")
    host.join()
    holds = [(i, h) for i in ("p0", "p1", "q0", "q1") for h in host.holds(i)]
    for i, h in holds:
        if h["mode"] == "exclusive":
            bad = [(j, g) for j, g in holds if g is not h and _overlap(h, g)]
            assert not bad, (i, h, bad[:2])


def test_a_killed_holder_releases(host):
    p = host.start({"id": "a", "plan": ["exclusive"], "release_on": ["never"]})
    host.wait("held-a")
    host.start({"id": "b", "plan": ["exclusive"]})
    host.wait("req-b")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(10)
    host.procs.remove(p)
    host.join()
    assert host.holds("b")


def test_this_process_gate_and_another_process_exclude_each_other(host):
    # the in-process gate with a host lock (what device_gate makes) against a child's
    g = DeviceGate("host", host_lock=HostLock(host.gates, "host"))
    with g.exclusive():
        host.start({"id": "b", "plan": ["shared"]})
        host.wait("req-b")
        time.sleep(0.3)
        assert not host.seen("held-b")
        t1 = time.time()
    host.join()
    assert host.holds("b")[0]["t0"] >= t1
    assert sorted(p.name for p in host.gates.iterdir()) == ["host.lock", "host.turnstile"]
    assert host.gates.stat().st_mode & 0o7777 == 0o1777


def test_lock_files_and_the_off_switch(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_GATE_DIR", str(tmp_path))
    lock = host_lock("host")
    assert lock is not None and lock.path == tmp_path / "host.lock"
    key = lock_key("cuda:3")  # the GPU's UUID where NVML knows GPU 3, else its index
    assert key.startswith("cuda-GPU-") or key == "cuda-index-3"
    assert lock_key("cuda:GPU-1a2b/x") == "cuda-GPU-1a2b_x"  # always a plain file name
    monkeypatch.setenv("CUDA_AGENT_GATE_DIR", "off")
    assert host_lock("host") is None
    # the process's gates (made once per domain) hold a host lock unless it was off then
    assert device_gate("host").host_lock is None or device_gate("host").host_lock.key == "host"


def test_create_makes_the_files_a_read_only_process_can_lock(tmp_path):
    """``create`` makes the directory and both files and holds nothing; a confined process (its
    file system read-only: it could not create them) then takes the lock."""
    gates = tmp_path / "gates"
    HostLock(gates, "host").create()
    assert sorted(p.name for p in gates.iterdir()) == ["host.lock", "host.turnstile"]
    code = (
        "import sys\nfrom cuda_agent.sandbox.gate import HostLock\n"
        "with HostLock(sys.argv[1], 'host').held(exclusive=True): print('held')"
    )
    out = run_confined(
        [sys.executable, "-c", code, str(gates)],
        cwd=tmp_path,
        env=dict(os.environ),
        limits=Limits(timeout_s=60, drop_user=False),
    )
    assert out.returncode == 0 and out.stdout == "held\n", out.stderr
    assert out.isolation.get("filesystem"), out.isolation  # it ran read-only
