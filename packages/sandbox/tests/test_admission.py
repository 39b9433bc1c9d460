"""Admission control (real probes of this machine: /proc/meminfo, the disk) and an evaluation
that cannot fit: an infra_error naming the resource, the candidate never run."""

from __future__ import annotations

import threading
import time

import pytest

from cuda_agent.records import Candidate, Solution, Status, Task
from cuda_agent.sandbox import SandboxConfig, evaluate
from cuda_agent.sandbox.admission import Ledger, Need, NoRoom, disk_free, host_available, reserve


def test_a_need_within_what_is_free_is_admitted_at_once(tmp_path):
    with reserve(Need(host=1 << 20, disk=1 << 20), gpu=None, disk_at=tmp_path, timeout_s=5) as w:
        assert w < 1.0


def test_more_disk_than_the_disk_has_is_no_room_naming_the_disk(tmp_path):
    free = disk_free(tmp_path)
    assert free is not None
    t = time.monotonic()
    too_much = Need(disk=free * 4)
    with pytest.raises(NoRoom) as e, reserve(too_much, gpu=None, disk_at=tmp_path, timeout_s=60):
        pass
    assert "disk space at" in str(e.value) and str(tmp_path) in str(e.value)
    assert e.value.resource.startswith("disk")
    # alone, it waits only briefly for other programs (nothing of ours will free it)
    assert time.monotonic() - t < 30


def test_a_phase_waits_for_another_reservation_to_end():
    avail = host_available()
    assert avail is not None and avail > 0
    ledger = Ledger(alone_wait_s=0.5)
    need = int(avail * 0.6)  # two at once do not fit, one does

    def probe() -> int:  # this machine's memory as measured, steady while the test runs: other
        return avail  # test processes allocating and freeing would move a live probe

    order: list[str] = []

    def second() -> None:
        with ledger.reserve({"host": (need, probe)}, timeout_s=30, poll_s=0.05) as waited:
            order.append(f"second after {waited:.2f}s")

    with ledger.reserve({"host": (need, probe)}, timeout_s=5):
        th = threading.Thread(target=second)
        th.start()
        time.sleep(1.0)
        order.append("first done")
    th.join(30)
    assert order[0] == "first done" and order[1].startswith("second after")
    assert float(order[1].split()[2][:-1]) >= 0.9


def test_a_reservation_that_never_fits_beside_another_times_out():
    avail = host_available()
    assert avail is not None
    ledger = Ledger(alone_wait_s=0.2)
    need = int(avail * 0.6)
    want = {"host": (need, lambda: avail)}  # steady (see the test above)
    with (
        ledger.reserve(want, timeout_s=5),
        pytest.raises(NoRoom, match="host memory"),
        ledger.reserve(want, timeout_s=0.5, poll_s=0.05),
    ):
        pass


REF_BIG = """import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x + 1.0

N = {n}

def get_inputs():
    return [torch.ones(N)]

def get_init_inputs():
    return []
"""

NEW_PLAIN = """import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return x + 1.0
"""


@pytest.mark.slow
def test_a_task_too_large_for_the_host_is_an_infra_error_and_the_candidate_never_runs(
    tmp_path, cache_dir
):
    avail = host_available()
    if avail is None or avail > 40 << 30:
        pytest.skip("needs a host with at most 40 GiB available (the task is sized from it)")
    # the verification of a cpu task needs ~10x its output in host memory: 1/8 never fits
    n = avail // 8 // 4
    task = Task.make("too_large_for_host", REF_BIG.format(n=n))
    cand = Candidate(
        task=task,
        solution=Solution.make("kernelbench", {"model_new.py": NEW_PLAIN}),
    )
    cfg = SandboxConfig(
        backend="cpu",
        timing=False,
        guard_policy="off",
        cache_dir=str(cache_dir),
        admission_timeout_s=3.0,
    )
    r = evaluate(cand, cfg)
    assert r.status == Status.INFRA_ERROR, r.message
    assert "host memory" in r.message and "sandbox out of resources" in r.message
    stages = r.meta.get("stages_s") or {}
    assert "reference" in stages and "verify" not in stages  # no candidate process ran


def test_a_task_too_big_for_its_share_of_the_gpu_runs_alone():
    from cuda_agent.sandbox.admission import too_big_to_share

    h200 = 143771 << 20
    # KernelBench L1/24 LogSoftmax: 6.4 GB in and out; its candidate held 60 GiB under 0.45
    assert too_big_to_share(2 * 6_442_450_944, 0.45, h200)
    assert not too_big_to_share(2 * 6_442_450_944, None, h200)  # one worker: no share
    assert not too_big_to_share(64 << 20, 0.45, h200)
    assert not too_big_to_share(2 * 6_442_450_944, 0.45, None)  # no NVML: as before
