"""A per-device reader/writer gate: phases that may share a device, and phases that must not.

Several device workers may use one GPU (or, on the cpu backend, the host) at once. Correctness
phases (reference outputs, candidate verification, the timing process's start-up) hold the gate
**shared**: they may overlap with each other. Anything that is *timed* (the candidate's timing,
baseline and speed-of-light measurements) holds it **exclusive**: nothing else holds the gate
while it runs. The gate is writer-preferring: once an exclusive request waits, new shared requests
wait behind it, so timing is never starved by a stream of verifications.

Besides holding the gate, a candidate can be *present* on the device without holding it (its
timing process, built and idle, waiting for the exclusive section). Presence is what
``Occupant.overlapped`` reports: whether any other occupant was present on the device at any time
while this one was. ``exclusive(alone=True)`` additionally waits until no other occupant is
present (a re-run that must have the device, memory included, to itself).

Gates are per process: :func:`device_gate` returns the one gate of a domain (``"cuda:0"``,
``"host"``), shared by every pool and ``evaluate`` call in the process.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Occupant:
    """One candidate's stay on a device: whether it overlapped another, and what it held when."""

    name: str = ""
    overlapped: bool = False
    # one dict per gate hold: {"phase", "mode": "shared"|"exclusive", "t0", "t1"} (time.time())
    phases: list[dict[str, Any]] = field(default_factory=list)
    waited_s: dict[str, float] = field(default_factory=dict)  # per mode, seconds spent waiting


class DeviceGate:
    """Reader/writer gate of one device (see the module docstring). Thread-safe; not reentrant:
    a thread holding it must not acquire it again (deadlock)."""

    def __init__(self, name: str = ""):
        self.name = name
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._present: dict[Occupant, int] = {}

    # -- presence ---------------------------------------------------------------------------

    def _enter_locked(self, occ: Occupant) -> None:
        n = self._present.get(occ, 0)
        if n == 0 and self._present:
            occ.overlapped = True
            for other in self._present:
                other.overlapped = True
        self._present[occ] = n + 1

    def _leave_locked(self, occ: Occupant) -> None:
        n = self._present.get(occ, 0)
        if n <= 1:
            self._present.pop(occ, None)
            self._cond.notify_all()  # an ``alone`` request may be waiting for this
        else:
            self._present[occ] = n - 1

    def enter(self, occ: Occupant) -> None:
        """Mark ``occ`` present on the device (nestable; pair with :meth:`leave`)."""
        with self._cond:
            self._enter_locked(occ)

    def leave(self, occ: Occupant) -> None:
        """End one :meth:`enter` of ``occ``."""
        with self._cond:
            self._leave_locked(occ)

    def present(self) -> int:
        """How many occupants are present now."""
        with self._cond:
            return len(self._present)

    # -- holds ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def shared(self, occ: Occupant | None = None, phase: str = "") -> Iterator[None]:
        """Hold the gate shared (others may hold it shared too; never while it is held or
        wanted exclusive). ``occ`` is present while it holds."""
        t = time.monotonic()
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
            if occ is not None:
                self._enter_locked(occ)
        rec = _start(occ, phase, "shared", time.monotonic() - t)
        try:
            yield
        finally:
            _stop(rec)
            with self._cond:
                self._readers -= 1
                if occ is not None:
                    self._leave_locked(occ)
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(
        self, occ: Occupant | None = None, phase: str = "", *, alone: bool = False
    ) -> Iterator[None]:
        """Hold the gate exclusive: no other hold, shared or exclusive, while it is held; with
        ``alone`` also no other occupant present. Waiting requests block new shared ones."""
        t = time.monotonic()
        with self._cond:
            self._writers_waiting += 1
            try:
                while (
                    self._writer
                    or self._readers
                    or (alone and any(o is not occ for o in self._present))
                ):
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
                self._cond.notify_all()  # readers held back by this request may go if it left
            self._writer = True
            if occ is not None:
                self._enter_locked(occ)
        rec = _start(occ, phase, "exclusive", time.monotonic() - t)
        try:
            yield
        finally:
            _stop(rec)
            with self._cond:
                self._writer = False
                if occ is not None:
                    self._leave_locked(occ)
                self._cond.notify_all()


def _start(occ: Occupant | None, phase: str, mode: str, waited: float) -> dict[str, Any] | None:
    if occ is None:
        return None
    occ.waited_s[mode] = occ.waited_s.get(mode, 0.0) + waited
    rec = {"phase": phase, "mode": mode, "t0": round(time.time(), 6), "t1": None}
    occ.phases.append(rec)
    return rec


def _stop(rec: dict[str, Any] | None) -> None:
    if rec is not None:
        rec["t1"] = round(time.time(), 6)


_GATES: dict[str, DeviceGate] = {}
_GATES_LOCK = threading.Lock()


def device_gate(domain: str) -> DeviceGate:
    """The process-wide gate of ``domain`` (``"cuda:<id>"`` per GPU, ``"host"`` for the cpu
    backend): every pool and ``evaluate`` call in this process that uses the device shares it."""
    with _GATES_LOCK:
        g = _GATES.get(domain)
        if g is None:
            g = _GATES[domain] = DeviceGate(domain)
        return g


def domain_of(backend: str, gpu: str | None) -> str:
    """The timing domain of a worker: one per GPU on cuda, the whole host on cpu."""
    if backend == "cuda":
        return f"cuda:{gpu if gpu is not None else 'default'}"
    return "host"
