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


def test_a_task_too_big_for_its_even_share_gets_a_larger_one_or_the_gpu_alone():
    from cuda_agent.sandbox.admission import device_share

    h200 = 143771 << 20
    relu = 2 * 6_442_450_944  # KernelBench L1/19 ReLU: 6.4 GB in and out
    # four workers: a 0.225 share each; six working sets of the ReLU are 0.52 of the GPU
    s = device_share(relu, 0.225, h200)
    assert s.large and not s.alone and s.fraction == 0.52, s
    assert "0.52 share instead of 0.23" in s.why
    # two workers: the even share (0.45) is still too small, the large share fits
    assert device_share(relu, 0.45, h200).fraction == 0.52
    # a sum reduction over 8 GB: 0.35 of the GPU, over four workers' share, under two's
    red = 8_589_934_592
    assert device_share(red, 0.225, h200).large
    assert device_share(red, 0.45, h200) == device_share(64 << 20, 0.45, h200)
    assert not device_share(red, 0.45, h200).large
    # more than 0.9 of the GPU for one candidate: alone
    big = 24 << 30
    s = device_share(big, 0.225, h200)
    assert s.alone and s.fraction is None and "too large to share" in s.why
    # one worker (no share), unknown sizes: as given, shared
    assert device_share(relu, None, h200).fraction is None
    assert not device_share(relu, None, h200).alone
    assert device_share(relu, 0.45, None).fraction == 0.45
    assert device_share(0, 0.45, h200).fraction == 0.45


def test_large_shares_of_one_gpu_never_add_up_to_more_than_it_has():
    import threading

    from cuda_agent.sandbox.admission import ShareBudget

    budget = ShareBudget(limit=0.9)
    events: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def first() -> None:
        with budget.hold("gpu:0", 0.54):
            events.append("first in")
            inside.set()
            release.wait(10)
            events.append("first out")

    def second(key: str, fraction: float, name: str) -> None:
        with budget.hold(key, fraction) as waited:
            events.append(f"{name} in after {waited:.1f}")

    t1 = threading.Thread(target=first)
    t1.start()
    assert inside.wait(10)
    # 0.54 + 0.54 > 0.9 on the same GPU: waits; 0.35 on it and 0.54 on another GPU: at once
    t2 = threading.Thread(target=second, args=("gpu:0", 0.54, "second"))
    t3 = threading.Thread(target=second, args=("gpu:0", 0.35, "small"))
    t4 = threading.Thread(target=second, args=("gpu:1", 0.54, "other gpu"))
    for t in (t2, t3, t4):
        t.start()
    t3.join(10)
    t4.join(10)
    assert not t3.is_alive() and not t4.is_alive()
    assert t2.is_alive(), events  # still waiting for the first
    assert not any(e.startswith("second") for e in events)
    release.set()
    t1.join(10)
    t2.join(10)
    assert not t2.is_alive()
    assert events.index("first out") < next(
        i for i, e in enumerate(events) if e.startswith("second")
    ), events
    # alone on its GPU, a share larger than the limit still runs (nothing to wait for)
    with budget.hold("gpu:0", 0.95) as waited:
        assert waited < 1.0
