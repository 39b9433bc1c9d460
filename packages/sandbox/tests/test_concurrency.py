"""Several device workers on one timing domain (cpu backend, real processes): verdicts as with one
worker, nothing overlaps a timed section, the ready/go handshake survives a candidate that dies in
its timing start-up, and a runtime error met while sharing the device is re-run alone."""

from __future__ import annotations

import os
import threading
import time

from cuda_agent.records import Status
from cuda_agent.sandbox import SandboxConfig, SandboxPool
from cuda_agent.sandbox.evaluate import prepare, run_on_device
from cuda_agent.sandbox.gate import DeviceGate, Occupant, device_gate
from cuda_agent.sandbox.isolation import Limits, run_confined

from .conftest import fixture_files, kb_candidate, workdir_candidate

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


def test_pool_records_the_wait_for_a_compile_worker(cache_dir, scale_add_task):
    """``stages_s.compile_queue``: with one compile worker the second candidate waits for the
    first's compile, the first does not wait."""
    cfg = SandboxConfig(backend="cpu", cache_dir=str(cache_dir), guard_policy="off", timing=False)
    first, second = (
        workdir_candidate(
            scale_add_task,
            fixture_files("scale_add"),
            **{"kernels/ops.cpp": fixture_files("scale_add")["kernels/ops.cpp"] + f"\n// q{i}\n"},
        )
        for i in (time.time_ns(), time.time_ns() + 1)  # new sources: compiles, not cache hits
    )
    with SandboxPool(cfg, compile_workers=1, cpu_workers=2) as pool:
        a, b = list(pool.map([first, second]))
    assert a.status is Status.OK and b.status is Status.OK, (a.message, b.message)
    assert a.compile is not None and a.compile.seconds > 0.1
    assert a.meta["stages_s"]["compile_queue"] < 0.5 * a.compile.seconds
    assert b.meta["stages_s"]["compile_queue"] > 0.5 * a.compile.seconds, b.meta["stages_s"]


def test_a_static_rejection_does_not_wait_behind_device_work(cache_dir, scale_add_task):
    """A verdict the CPU half decided (here the strict policy's static rejection of a torch-only
    ModelNew) is delivered when it is decided, not after the device work queued before it: one
    device worker, two honest workdir candidates ahead of it."""
    cfg = SandboxConfig(
        backend="cpu", cache_dir=str(cache_dir), guard_policy="strict", timing=False
    )
    honest = [
        workdir_candidate(
            scale_add_task,
            fixture_files("scale_add"),
            **{"kernels/ops.cpp": fixture_files("scale_add")["kernels/ops.cpp"] + f"\n// r{i}\n"},
        )
        for i in (time.time_ns(), time.time_ns() + 1)
    ]
    rejected = kb_candidate(scale_add_task, VALID)  # torch operators only: G-NO-KERNEL
    done: list[str] = []
    with SandboxPool(cfg, compile_workers=1, cpu_workers=1) as pool:
        futs = [pool.submit(c) for c in [*honest, rejected]]
        for f, name in zip(futs, ["honest0", "honest1", "rejected"], strict=True):
            f.add_done_callback(lambda _f, n=name: done.append(n))
        results = [f.result() for f in futs]
    assert [r.status for r in results] == [Status.OK, Status.OK, Status.GUARD_VIOLATION], [
        r.message for r in results
    ]
    # compiled last, while the one device worker still had the second honest candidate to run
    assert done.index("rejected") < done.index("honest1"), done
    assert "worker" not in results[2].meta  # no device worker handled it
    assert results[2].meta["pool_pid"] == os.getpid()
