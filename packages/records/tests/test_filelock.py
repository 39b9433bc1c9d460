"""The shared file lock really excludes: a second holder waits for the first."""

import threading
import time

from cuda_agent.records.filelock import exclusive_lock


def test_second_holder_waits_for_the_first(tmp_path):
    lock = tmp_path / "x.lock"
    events: list[str] = []
    held = threading.Event()

    def first():
        with exclusive_lock(lock):
            events.append("first in")
            held.set()
            time.sleep(0.3)
            events.append("first out")

    t = threading.Thread(target=first)
    t.start()
    held.wait(5)
    with exclusive_lock(lock):  # its own open file: flock makes it wait for the thread's
        events.append("second in")
    t.join()
    assert events == ["first in", "first out", "second in"]
    with exclusive_lock(lock):  # released: taken again at once
        pass
