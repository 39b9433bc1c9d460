"""DeviceGate with real threads: shared holds overlap, exclusive holds overlap nothing, waiting
writers block new readers, ``alone`` waits for every other occupant to leave."""

from __future__ import annotations

import os
import random
import threading
import time

from cuda_agent.sandbox.gate import DeviceGate, Occupant, device_gate, domain_of


def _wait_until(cond, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.001)
    return cond()


def test_shared_holds_overlap():
    g = DeviceGate("t")
    both = threading.Barrier(2, timeout=5)  # raises BrokenBarrierError if they cannot overlap
    a, b = Occupant("a"), Occupant("b")
    errors: list[BaseException] = []

    def reader(o: Occupant) -> None:
        try:
            with g.shared(o, "verify"):
                both.wait()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=reader, args=(o,)) for o in (a, b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert not errors
    assert a.overlapped and b.overlapped
    assert [p["mode"] for p in a.phases] == ["shared"] and a.phases[0]["t1"] >= a.phases[0]["t0"]


def test_exclusive_never_overlaps_anything():
    g = DeviceGate("t")
    lock = threading.Lock()
    state = {"readers": 0, "writers": 0}
    bad: list[str] = []
    rng = random.Random(0)
    plans = [[rng.random() < 0.3 for _ in range(25)] for _ in range(6)]

    def worker(plan: list[bool]) -> None:
        for excl in plan:
            cm = g.exclusive() if excl else g.shared()
            with cm:
                with lock:
                    if excl:
                        state["writers"] += 1
                        if state["writers"] != 1 or state["readers"]:
                            bad.append(f"exclusive with {state}")
                    else:
                        state["readers"] += 1
                        if state["writers"]:
                            bad.append(f"shared with {state}")
                time.sleep(0.0005)
                with lock:
                    state["writers" if excl else "readers"] -= 1

    ts = [threading.Thread(target=worker, args=(p,)) for p in plans]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not any(t.is_alive() for t in ts), "deadlock"
    assert not bad, bad[:3]


def test_waiting_writer_blocks_new_readers():
    g = DeviceGate("t")
    order: list[str] = []
    release_first = threading.Event()
    first_in = threading.Event()

    def first_reader() -> None:
        with g.shared():
            first_in.set()
            release_first.wait(5)
        order.append("r1 out")

    def writer() -> None:
        with g.exclusive():
            order.append("w in")
            time.sleep(0.02)
            order.append("w out")

    def late_reader() -> None:
        with g.shared():
            order.append("r2 in")

    t1 = threading.Thread(target=first_reader)
    t1.start()
    assert first_in.wait(5)
    tw = threading.Thread(target=writer)
    tw.start()
    assert _wait_until(lambda: g._writers_waiting == 1)
    t2 = threading.Thread(target=late_reader)
    t2.start()
    time.sleep(0.05)
    assert "r2 in" not in order  # a shared request never passes a waiting exclusive one
    release_first.set()
    for t in (t1, tw, t2):
        t.join(10)
    assert order.index("w out") < order.index("r2 in"), order


def test_lengthy_shared_hold_lets_readers_in_beside_a_waiting_writer():
    """While a lengthy shared hold (a baseline's torch.compile set-up) keeps a writer waiting,
    ordinary shared requests go in beside it; a lengthy one waits; once the lengthy hold ends,
    writer preference is back."""
    g = DeviceGate("t")
    order: list[str] = []
    release_long, long_in = threading.Event(), threading.Event()
    release_short = threading.Event()

    def long_setup() -> None:
        with g.shared(phase="baseline_setup", lengthy=True):
            long_in.set()
            release_long.wait(5)
        order.append("long out")

    def writer() -> None:
        with g.exclusive():
            order.append("w in")

    def reader(tag: str, *, lengthy: bool = False, hold: threading.Event | None = None) -> None:
        with g.shared(lengthy=lengthy):
            order.append(f"{tag} in")
            if hold is not None:
                hold.wait(5)

    t_long = threading.Thread(target=long_setup)
    t_long.start()
    assert long_in.wait(5)
    tw = threading.Thread(target=writer)
    tw.start()
    assert _wait_until(lambda: g._writers_waiting == 1)
    t_short = threading.Thread(target=reader, args=("short",), kwargs={"hold": release_short})
    t_short.start()
    assert _wait_until(lambda: "short in" in order)  # in beside the lengthy hold
    t_long2 = threading.Thread(target=reader, args=("long2",), kwargs={"lengthy": True})
    t_long2.start()
    time.sleep(0.05)
    assert "long2 in" not in order  # a lengthy request never passes a waiting writer
    release_long.set()
    assert _wait_until(lambda: "long out" in order)
    t_late = threading.Thread(target=reader, args=("late",))
    t_late.start()
    time.sleep(0.05)
    assert "late in" not in order and "w in" not in order  # the writer waits for "short" only
    release_short.set()
    for t in (t_long, tw, t_short, t_long2, t_late):
        t.join(10)
    assert order.index("w in") < order.index("late in"), order
    assert order.index("w in") < order.index("long2 in"), order
    assert g._lengthy == 0 and g._readers == 0


def test_alone_waits_for_present_occupants_and_marks_overlap():
    g = DeviceGate("t")
    idle, solo = Occupant("idle"), Occupant("solo")
    with g.shared(idle):
        g.enter(idle)  # like a built timing process waiting for its turn, gate released
    got = threading.Event()

    def rerun() -> None:
        with g.exclusive(solo, "rerun_alone", alone=True):
            got.set()

    t = threading.Thread(target=rerun)
    t.start()
    time.sleep(0.05)
    assert not got.is_set()  # an occupant is still present
    with g.exclusive(idle, "time"):  # the idle one may still take its exclusive turn
        pass
    g.leave(idle)
    assert got.wait(5)
    t.join(5)
    assert g.present() == 0
    assert not solo.overlapped and solo.phases[0]["phase"] == "rerun_alone"


def test_domains():
    assert domain_of("cuda", "1") == "cuda:1" and domain_of("cpu", None) == "host"
    assert device_gate("host") is device_gate("host")
    assert device_gate("cuda:0") is not device_gate("cuda:1")


def test_present_occupant_gets_its_shared_hold_beside_a_waiting_alone_request():
    """A baseline present on the device (its worker holds memory) asks for its set-up hold while
    a re-run alone waits for every present occupant to leave: held back by writer preference,
    the two waited for each other forever (the batch's stall on the H200, session 25)."""
    g = DeviceGate("t")
    baseline, rerun = Occupant("baseline"), Occupant("re-run alone")
    order: list[str] = []
    g.enter(baseline)

    def alone() -> None:
        with g.exclusive(rerun, "rerun_alone", alone=True):
            order.append("alone in")

    ta = threading.Thread(target=alone)
    ta.start()
    assert _wait_until(lambda: g._writers_waiting == 1)

    def setup() -> None:
        with g.shared(baseline, "baseline_setup", lengthy=True):
            order.append("setup in")
        g.leave(baseline)

    ts = threading.Thread(target=setup)
    ts.start()
    ts.join(5)
    ta.join(5)
    assert not ts.is_alive() and not ta.is_alive(), "deadlock"
    assert order == ["setup in", "alone in"]
    # an occupant not present still waits behind the waiting writer
    g2, stranger, done = DeviceGate("t2"), Occupant("new"), threading.Event()
    g2.enter(baseline)

    def alone2() -> None:
        with g2.exclusive(rerun, alone=True):
            order.append("alone2 in")
            done.wait(5)

    def late() -> None:
        with g2.shared(stranger):
            order.append("late in")

    t2, t3 = threading.Thread(target=alone2), threading.Thread(target=late)
    t2.start()
    assert _wait_until(lambda: g2._writers_waiting == 1)
    t3.start()
    time.sleep(0.05)
    assert "late in" not in order
    g2.leave(baseline)
    assert _wait_until(lambda: "alone2 in" in order)
    assert "late in" not in order
    done.set()
    for t in (t2, t3):
        t.join(5)
    assert order[-2:] == ["alone2 in", "late in"]


def test_an_exclusive_hold_records_how_busy_the_host_was():
    """An exclusive (timed) hold says what fraction of the host's CPU time was busy while it was
    held (all of it with a process spinning on each CPU); shared holds say nothing of it."""
    import subprocess
    import sys

    g = DeviceGate("busy")

    def held(spinners: int) -> float:
        procs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(spinners)
        ]
        try:
            time.sleep(0.3 if spinners else 0)  # the spinners are running before the hold
            o = Occupant("timed")
            with g.exclusive(o, "time"):
                time.sleep(1.0)
            with g.shared(o, "verify"):
                pass
        finally:
            for p in procs:
                p.kill()
                p.wait()
        timed, shared = o.phases
        assert "host_busy" not in shared
        assert 0.0 <= timed["host_busy"] <= 1.0
        return timed["host_busy"]

    held(0)  # whatever else runs on this host (another test worker): a fraction, no more
    # a spinner per CPU: the host was busy all the time the hold lasted
    assert held(os.cpu_count() or 1) >= 0.9
