"""Several device workers on one timing domain (cpu backend, real processes): verdicts as with one
worker, nothing overlaps a timed section, the ready/go handshake survives a candidate that dies in
its timing start-up, and a runtime error met while sharing the device is re-run alone."""

from __future__ import annotations

import threading
import time

from cuda_agent.records import Status
from cuda_agent.sandbox import SandboxConfig, SandboxPool
from cuda_agent.sandbox.evaluate import prepare, run_on_device
from cuda_agent.sandbox.gate import DeviceGate, Occupant, device_gate
from cuda_agent.sandbox.isolation import Limits, run_confined

from .conftest import kb_candidate

HEAD = (
    "import os, sys\nimport torch\nimport torch.nn as nn\n\n"
    "class ModelNew(nn.Module):\n"
    "    def __init__(self, cols):\n        super().__init__()\n"
    "{init}"
    "        self.w = nn.Parameter(torch.empty(cols))\n        self.b = nn.Parameter(torch.empty(cols))\n"
    "    def forward(self, x):\n{body}"
)
VALID = HEAD.format(init="", body="        return x * self.w + self.b\n")
WRONG = HEAD.format(init="", body="        return x * self.w\n")
RAISES = HEAD.format(init="", body="        raise RuntimeError('boom in forward')\n")
# what a neighbour can cause: the allocator refusing memory (a plain exception is not re-run)
OOM = HEAD.format(init="", body="        raise MemoryError('boom: out of memory in forward')\n")
# passes verification, then dies while the timing process starts (before it says "ready")
DIES_AT_TIMING = HEAD.format(
    init="        if sys.argv[-1].endswith('time.spec.json'):\n            os._exit(7)\n",
    body="        return x * self.w + self.b\n",
)


def _overlaps(a: dict, b: dict) -> bool:
    return a["t0"] < b["t1"] and b["t0"] < a["t1"]


def _phases(r) -> list[dict]:
    first = (r.meta.get("rerun_alone") or {}).get("device_phases") or []
    return list(r.meta.get("device_phases") or []) + list(first)


def test_two_workers_time_alone_and_keep_verdicts(cache_dir, scale_add_task):
    # rerun_alone off here (its own test below): the verdict is the first run's
    cfg = SandboxConfig(
        backend="cpu", cache_dir=str(cache_dir), guard_policy="off", rerun_alone=False
    )
    cases = [(VALID, Status.OK), (WRONG, Status.INCORRECT), (DIES_AT_TIMING, Status.RUNTIME_ERROR)]
    cands = [kb_candidate(scale_add_task, src) for src, _ in cases]
    with SandboxPool(cfg, compile_workers=2, cpu_workers=2) as pool:
        assert pool.workers_per_device == 2 and pool.mem_fraction is None
        results = list(pool.map(cands))
    g = device_gate("host")  # every hold released, nobody left present
    assert g.present() == 0 and g._readers == 0 and not g._writer
    assert [r.solution_id for r in results] == [c.solution.id for c in cands]
    assert [r.status for r in results] == [want for _, want in cases], [
        (r.status, r.message) for r in results
    ]
    ok, _, died = results
    # the handshake: start-up shared, then the timed section exclusive, the measurement inside it
    names = [(p["phase"], p["mode"]) for p in ok.meta["device_phases"]]
    assert ("time_startup", "shared") in names and ("time", "exclusive") in names, names
    timed = next(p for p in ok.meta["device_phases"] if p["phase"] == "time")
    w0, w1 = ok.meta["timed_wall"]
    assert timed["t0"] <= w0 <= w1 <= timed["t1"]
    assert "time_wait" in ok.meta["stages_s"] and ok.timing is not None
    # where the reference and verification processes spent their time, and the parent's compare
    assert "compare" in ok.meta["stages_s"]
    # the judge recomputed each trial's reference output and compared the candidate's on the
    # device (the reference process keeps no output: it saves nothing)
    assert {"reference", "wait_candidate", "load_candidate", "compare"} <= set(
        ok.meta["phases_s"]["judge"]
    )
    for stage, saved in (("reference", set()), ("verify", {"save"})):
        ph = ok.meta["phases_s"][stage]
        assert {"import_torch", "init_device", "inputs", "forward", "startup"} | saved <= set(ph)
        assert all(v >= 0 for k, v in ph.items() if k != "other"), ph
        # a process started early: its start-up, import and wait (summed as before_stage) came
        # before the stage's clock; the other phases and "other" make up the stage
        before = ph.get("before_stage", 0.0)
        during = sum(v for k, v in ph.items() if k != "before_stage") - before
        assert abs(during - ok.meta["stages_s"][stage]) < 0.01, ph
    assert ok.timing.candidate.median_ms > 0
    # each process's peak memory, per stage (host RSS on the cpu backend)
    for stage in ("reference", "verify", "time", "judge"):
        assert ok.meta["peak_memory_mb"][stage]["host_rss"] > 10, ok.meta["peak_memory_mb"]
    # nothing of any other candidate overlapped anything held exclusive
    for i, r in enumerate(results):
        for e in (p for p in _phases(r) if p["mode"] == "exclusive"):
            for j, other in enumerate(results):
                if j != i:
                    hits = [p for p in _phases(other) if _overlaps(e, p)]
                    assert not hits, (r.message, e, other.message, hits)
    # died before "ready": reported, gate released (the pool finished), never timed
    assert "while timed" in died.message, died.message
    assert "rerun_alone" not in died.meta
    names = [p["phase"] for p in died.meta["device_phases"]]
    assert "time_startup" in names and "time" not in names, names


def test_runtime_error_while_sharing_is_rerun_alone(cache_dir, scale_add_task):
    cfg = SandboxConfig(backend="cpu", cache_dir=str(cache_dir), timing=False, guard_policy="off")
    gate = DeviceGate("test-host")
    neighbour = Occupant("neighbour")
    holding, release = threading.Event(), threading.Event()

    def hold_shared() -> None:  # another worker's verification, present when this one starts
        with gate.shared(neighbour, "verify"):
            holding.set()
            release.wait(120)

    def release_when_joined() -> None:
        end = time.monotonic() + 120
        while gate.present() < 2 and time.monotonic() < end:
            time.sleep(0.005)
        time.sleep(0.2)
        release.set()

    ts = [threading.Thread(target=hold_shared), threading.Thread(target=release_when_joined)]
    ts[0].start()
    assert holding.wait(10)
    ts[1].start()
    p = prepare(kb_candidate(scale_add_task, OOM), cfg, backend="cpu")
    r = run_on_device(p, slot=5, gate=gate)
    for t in ts:
        t.join(10)
    assert r.status == Status.RUNTIME_ERROR and "out of memory" in r.message, r.message
    first = r.meta["rerun_alone"]
    assert first["status"] == "runtime_error" and "another candidate" in first["why"]
    assert any(ph["phase"] == "reference" for ph in first["device_phases"])
    # the reference succeeded: the re-run reuses its secret trials and outputs
    assert r.meta["reference_reused"] is True and "first_run" in r.meta["stages_s"]
    assert "reference" not in r.meta["stages_s"] and "verify" in r.meta["stages_s"]
    # the re-run held the host alone: after the neighbour left, nobody else present
    assert not r.meta["overlapped"]
    rerun = r.meta["device_phases"]
    assert [(x["phase"], x["mode"]) for x in rerun] == [("rerun_alone", "exclusive")]
    assert rerun[0]["t0"] >= neighbour.phases[0]["t1"]
    assert gate.present() == 0


def test_gate_wait_does_not_count_against_the_time_limit(tmp_path):
    lim = Limits(timeout_s=0.5, nproc=None, rss_mb=None, drop_user=False)
    cmd = ["sleep", "1.5"]
    waited = run_confined(
        cmd, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, limits=lim, extend=lambda: 3.0
    )
    assert waited.returncode == 0 and not waited.timed_out, waited.describe()
    plain = run_confined(cmd, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, limits=lim)
    assert plain.timed_out and plain.seconds < 1.4


def test_cuda_pool_layout_without_running_anything():
    # construction only (no GPU needed): N workers per GPU, each its own slot, a memory share
    with SandboxPool(SandboxConfig(backend="cuda"), gpus=["0", "1"], workers_per_device=3) as pool:
        assert pool.devices == ["0", "1"] and pool.workers_per_device == 3
        assert len(pool._workers) == 6 and abs(pool.mem_fraction - 0.3) < 1e-9
    with SandboxPool(SandboxConfig(backend="cuda", workers_per_gpu=1), gpus=["0"]) as pool:
        assert len(pool._workers) == 1 and pool.mem_fraction is None  # today's behaviour


def test_pool_records_the_time_each_candidate_queued(cache_dir, scale_add_task):
    """``compile_queue`` / ``device_queue`` in ``stages_s``: with one device worker the second
    candidate waits for the first's device half, the first does not wait."""
    cfg = SandboxConfig(backend="cpu", cache_dir=str(cache_dir), guard_policy="off", timing=False)
    cands = [kb_candidate(scale_add_task, VALID + f"\n# variant {i}\n") for i in range(2)]
    with SandboxPool(cfg, compile_workers=2, cpu_workers=1) as pool:
        first, second = list(pool.map(cands))
    assert first.status is Status.OK and second.status is Status.OK
    for r in (first, second):
        assert r.meta["stages_s"]["compile_queue"] >= 0 and r.meta["stages_s"]["device_queue"] >= 0
    on_device = sum(first.meta["stages_s"].get(k, 0.0) for k in ("reference", "verify", "compare"))
    assert on_device > 0.2, first.meta["stages_s"]
    queued = sorted((first, second), key=lambda r: r.meta["stages_s"]["device_queue"])
    assert queued[0].meta["stages_s"]["device_queue"] < 0.5 * on_device
    assert queued[1].meta["stages_s"]["device_queue"] > 0.5 * on_device, queued[1].meta["stages_s"]
