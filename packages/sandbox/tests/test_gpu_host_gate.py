"""The host-wide device gate on cuda (skipped without CUDA): ``cuda:0``'s lock file is named by
the GPU's UUID (``cuda-GPU-<uuid>.lock``) however a process names the GPU, exclusive holds of two
processes on it never overlap (one naming it ``cuda:0``, the other by its UUID, with CUDA work
inside every hold), and two processes evaluating with timing on the GPU never time at once."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cuda_agent.records import Status
from cuda_agent.sandbox import SandboxConfig, evaluate
from cuda_agent.sandbox.gate import lock_key

from .cuda_cases import mul_candidate

pytestmark = pytest.mark.gpu

TESTS = Path(__file__).parent


def _nvml_uuid(index: int) -> str:
    import pynvml

    pynvml.nvmlInit()
    try:
        u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
    finally:
        pynvml.nvmlShutdown()
    return u.decode() if isinstance(u, bytes) else str(u)


def test_the_lock_of_cuda0_is_keyed_by_the_gpus_uuid(monkeypatch):
    uuid = _nvml_uuid(0)
    key = lock_key("cuda:0")
    assert key == f"cuda-{uuid}", (key, uuid)
    assert re.fullmatch(r"cuda-GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", key), key
    # the same GPU named by its UUID, a prefix of it, or as the candidate's processes resolve
    # "default": one file
    assert lock_key(f"cuda:{uuid}") == lock_key(f"cuda:{uuid[:12]}") == key
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert lock_key("cuda:default") == key
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuid)
    assert lock_key("cuda:default") == key


# One process: each actor is a thread holding ``device_gate(domain)`` as its plan says, running a
# small CUDA kernel inside every hold, recording wall-clock times; markers in ``sync``.
CHILD = r"""
import json, sys, threading, time
from pathlib import Path
import torch
from cuda_agent.sandbox.gate import device_gate

spec = json.loads(sys.argv[1])
sync = Path(spec["sync"])
gate = device_gate(spec["domain"])
assert gate.host_lock is not None and str(gate.host_lock.directory) == spec["gates"]
x = torch.randn(1024, 1024, device="cuda")


def wait_for(name):
    end = time.monotonic() + 60
    while not (sync / name).exists():
        if time.monotonic() > end:
            raise TimeoutError(name)
        time.sleep(0.005)


def actor(a):
    out = {"holds": [], "lock": gate.host_lock.path.name}
    try:
        (sync / f"ready-{a['id']}").touch()
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
                y = x @ x
                torch.cuda.synchronize()
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
    """Processes sharing the lock directory ``gates``; ``sync`` holds their markers."""

    def __init__(self, root: Path):
        self.gates = root / "gates"
        self.sync = root / "sync"
        self.sync.mkdir()
        self.procs: list[subprocess.Popen] = []

    def start(self, domain: str, *actors: dict) -> subprocess.Popen:
        spec = {
            "sync": str(self.sync),
            "gates": str(self.gates),
            "domain": domain,
            "actors": list(actors),
        }
        env = {**os.environ, "CUDA_AGENT_GATE_DIR": str(self.gates)}
        p = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(spec)], env=env)
        self.procs.append(p)
        return p

    def mark(self, name: str) -> None:
        (self.sync / name).touch()

    def seen(self, name: str) -> bool:
        return (self.sync / name).exists()

    def wait(self, name: str, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while not self.seen(name):
            assert time.monotonic() < end, f"no {name} within {timeout}s"
            assert all(p.poll() in (None, 0) for p in self.procs), "a child failed"
            time.sleep(0.005)

    def result(self, actor: str) -> dict:
        out = json.loads((self.sync / f"{actor}.json").read_text())
        assert "error" not in out, out["error"]
        return out

    def join(self) -> None:
        for p in self.procs:
            assert p.wait(180) == 0

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


def test_exclusive_holds_of_two_processes_on_the_gpu_never_overlap(host):
    uuid = _nvml_uuid(0)
    key = lock_key("cuda:0")
    host.start("cuda:0", {"id": "a", "plan": ["exclusive"], "release_on": ["release-a"]})
    host.wait("held-a")
    # the other process names the same GPU by its UUID: the same lock file
    host.start(f"cuda:{uuid}", {"id": "b", "plan": ["exclusive"], "hold_s": 0.05})
    host.wait("req-b")
    time.sleep(0.5)
    assert not host.seen("held-b")  # a's exclusive hold keeps it out
    host.mark("release-a")
    host.join()
    a, b = host.result("a"), host.result("b")
    assert a["lock"] == b["lock"] == f"{key}.lock"
    (ha,), (hb,) = a["holds"], b["holds"]
    assert hb["req"] < ha["t1"] <= hb["t0"]  # it asked while a held, and got it after
    assert sorted(p.name for p in host.gates.iterdir()) == [f"{key}.lock", f"{key}.turnstile"]


def test_random_holds_of_two_processes_on_the_gpu_keep_exclusive_ones_alone(host):
    rng = random.Random(0)

    def actor(i: str) -> dict:
        plan = ["exclusive" if rng.random() < 0.4 else "shared" for _ in range(12)]
        return {"id": i, "plan": plan, "hold_s": 0.01, "start_on": "go"}

    host.start("cuda:0", actor("p0"), actor("p1"))
    host.start(f"cuda:{_nvml_uuid(0)}", actor("q0"), actor("q1"))
    for i in ("p0", "p1", "q0", "q1"):  # both processes up (torch imported, CUDA context made)
        host.wait(f"ready-{i}")
    host.mark("go")
    host.join()
    holds = [(i, h) for i in ("p0", "p1", "q0", "q1") for h in host.result(i)["holds"]]
    assert len(holds) == 48
    for i, h in holds:
        if h["mode"] == "exclusive":
            bad = [(j, g) for j, g in holds if g is not h and _overlap(h, g)]
            assert not bad, (i, h, bad[:2])


# One process: one evaluation of cuda_mul with timing on the GPU; its device phases (gate holds
# with wall-clock times) and verdict as JSON.
EVAL = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from cuda_cases import mul_candidate
from cuda_agent.sandbox import SandboxConfig, evaluate

cfg = SandboxConfig(
    backend="cuda", cache_dir=sys.argv[2], guard_policy="off", compile_baseline=False,
    timing_config={"time_cap_s": 2},
)
r = evaluate(mul_candidate(), cfg)
t = r.timing.candidate.median_ms if r.timing is not None and r.timing.candidate else None
print(json.dumps({"status": r.status.value, "message": r.message, "median_ms": t,
                  "phases": r.meta.get("device_phases") or []}))
"""


@pytest.mark.slow
def test_two_processes_evaluating_on_the_gpu_never_time_at_once(tmp_path, cache_dir):
    # build once here, so that both processes reach the device at about the same time
    warm = evaluate(
        mul_candidate(),
        SandboxConfig(backend="cuda", cache_dir=str(cache_dir), guard_policy="off", timing=False),
    )
    assert warm.status == Status.OK, warm.message
    gates = tmp_path / "gates"
    env = {**os.environ, "CUDA_AGENT_GATE_DIR": str(gates)}
    cmd = [sys.executable, "-c", EVAL, str(TESTS), str(cache_dir)]
    # output to files, not pipes: a child blocked on a full pipe while it holds the gate would
    # hold up the other one
    logs = [(tmp_path / f"out{i}", tmp_path / f"err{i}") for i in range(2)]
    procs = []
    for so, se in logs:
        with so.open("w") as o, se.open("w") as e:
            procs.append(subprocess.Popen(cmd, env=env, stdout=o, stderr=e))
    outs = []
    try:
        for p, (so, se) in zip(procs, logs, strict=True):
            assert p.wait(600) == 0, se.read_text()[-3000:]
            outs.append(json.loads(so.read_text().strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for o in outs:
        assert o["status"] == "ok", o["message"]
        assert o["median_ms"] and o["median_ms"] > 0
        assert any(ph["phase"] == "time" and ph["mode"] == "exclusive" for ph in o["phases"]), o
    a, b = outs
    for x, y in ((a, b), (b, a)):
        for ex in (ph for ph in x["phases"] if ph["mode"] == "exclusive"):
            bad = [ph for ph in y["phases"] if ph["t1"] is not None and _overlap(ex, ph)]
            assert not bad, (ex, bad)
    # the GPU the evaluations ran on (the first of CUDA_VISIBLE_DEVICES, else 0), by its UUID
    key = lock_key("cuda:default")
    assert key.startswith("cuda-GPU-"), key
    assert {f"{key}.lock", f"{key}.turnstile"} <= {p.name for p in gates.iterdir()}
