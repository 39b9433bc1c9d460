"""A per-device reader/writer gate: phases that may share a device, and phases that must not.

Several device workers may use one GPU (or, on the cpu backend, the host) at once. Correctness
phases (reference outputs, candidate verification, the timing process's start-up) hold the gate
**shared**: they may overlap with each other. Anything that is *timed* (the candidate's timing,
baseline and speed-of-light measurements) holds it **exclusive**: nothing else holds the gate
while it runs. The gate is writer-preferring: once an exclusive request waits, new shared requests
wait behind it, so timing is never starved by a stream of verifications. One exception: a shared
hold declared *lengthy* (a baseline's ``torch.compile`` set-up, tens of seconds) keeps any waiting
exclusive request waiting anyway, so while one is held new (ordinary) shared requests are let in
beside it; lengthy requests themselves wait behind a waiting exclusive one. An exclusive request
so waits at most for the lengthy holds already granted plus the ordinary ones let in beside them,
never for a stream: once the last lengthy hold ends, writer preference holds again. And a shared
request of an occupant already present is never held back by waiting exclusive ones: it holds
device memory, and an ``alone`` request waits for it to leave (held back, the two would wait for
each other forever).

Besides holding the gate, a candidate can be *present* on the device without holding it (its
timing process, built and idle, waiting for the exclusive section). Presence is what
``Occupant.overlapped`` reports: whether any other occupant was present on the device at any time
while this one was. ``exclusive(alone=True)`` additionally waits until no other occupant is
present (a re-run that must have the device, memory included, to itself).

Gates are per process: :func:`device_gate` returns the one gate of a domain (``"cuda:0"``,
``"host"``), shared by every pool and ``evaluate`` call in the process. Its holds are also
**host-wide**: every hold additionally holds an OS lock (:class:`HostLock`, ``flock``) shared by
every process of the host that times on the device (the ranks of a ``torchrun`` job, several
pools, other users' runs), ``LOCK_SH`` for a shared hold and ``LOCK_EX`` for an exclusive one. So
nothing of another process overlaps a timed section either.

The OS lock is taken after the in-process gate grants the hold and released before the gate is
released, so the in-process semantics (writer preference, presence, ``alone``) are unchanged and
at most one thread of a process waits for, or holds, the exclusive lock. Each hold opens its own
file (``flock`` locks belong to an open file description: two shared holds of one process are two
shared locks, and releasing one leaves the other). A second file, the *turnstile*, makes the
host-wide lock writer-preferring like the gate: an exclusive request holds it exclusive while it
waits, and a shared request passes through it (shared) before taking the lock. A process that dies
loses its locks with its files: nothing stays held.

Lock files live in ``$CUDA_AGENT_GATE_DIR`` (default ``<system temp dir>/cuda-agent-gates``,
created world-writable and sticky, like ``/tmp``): processes share a device's gate when they see
the same directory (containers on one host: mount one directory there and point the variable at
it). ``CUDA_AGENT_GATE_DIR=off`` turns the host-wide locks off (gates per process, as before:
nothing of other processes is excluded). File names (:func:`lock_key`): ``host.lock`` for the cpu
backend's domain; on cuda the GPU's UUID from NVML (``cuda-GPU-<uuid>.lock``) for the index the
sandbox uses (NVML numbering, the physical index or an entry of ``CUDA_VISIBLE_DEVICES``), so
processes that number the GPU differently still share it; without NVML, the index as this process
names it (``cuda-index-<n>.lock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GATE_DIR_ENV = "CUDA_AGENT_GATE_DIR"


@dataclass(eq=False)
class Occupant:
    """One candidate's stay on a device: whether it overlapped another, and what it held when."""

    name: str = ""
    overlapped: bool = False
    # one dict per gate hold: {"phase", "mode": "shared"|"exclusive", "t0", "t1"} (time.time());
    # an exclusive one also "host_busy": the host's CPUs' busy fraction over the hold (what the
    # host did around a timed section; None where /proc/stat cannot be read)
    phases: list[dict[str, Any]] = field(default_factory=list)
    waited_s: dict[str, float] = field(default_factory=dict)  # per mode, seconds spent waiting


class HostLock:
    """The host-wide reader/writer lock of one device: ``flock`` on ``<dir>/<key>.lock`` (shared
    or exclusive), behind the turnstile ``<dir>/<key>.turnstile`` (writer preference; see the
    module docstring). Every :meth:`acquire` opens its own file description: holds of several
    threads of one process never merge. Blocking; waits as long as the holders hold."""

    def __init__(self, directory: str | os.PathLike[str], key: str, *, refuse_links: bool = False):
        self.directory = Path(directory)
        self.key = key
        self.path = self.directory / f"{key}.lock"
        self.turnstile = self.directory / f"{key}.turnstile"
        self.refuse_links = refuse_links  # the default directory, in a shared temp dir

    def _ensure_dir(self) -> None:
        """Create the directory (mode 1777, like ``/tmp``: every user's processes create their
        devices' files in it) where it is missing; with ``refuse_links`` one that is a link or
        no directory (someone else's, in a shared temp dir) is refused."""
        d = self.directory
        try:
            d.mkdir(parents=True)
            os.chmod(d, 0o1777)
        except FileExistsError:
            pass
        if self.refuse_links and not stat.S_ISDIR(os.lstat(d).st_mode):
            raise OSError(f"{d} is not a directory: remove it, or set ${GATE_DIR_ENV}")

    def _open(self, path: Path) -> int:
        """A new open file description of ``path``, created (readable by everyone) if missing.
        Read-only: flock needs no write access, so a file another user made is usable; and an
        existing file is opened without ``O_CREAT``, which ``fs.protected_regular`` refuses on
        other users' files in a sticky directory."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            for _ in range(3):
                try:
                    return os.open(path, flags)
                except FileNotFoundError:
                    pass
                try:
                    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:  # another process made it meanwhile
                    continue
                except FileNotFoundError:  # the first hold on this host, or the dir was removed
                    self._ensure_dir()
                    continue
                os.fchmod(fd, 0o644)  # whatever the umask: other users' processes open it too
                return fd
            raise FileNotFoundError(f"{path} vanished as it was made")
        except OSError as e:
            raise OSError(
                f"the device's host-wide gate {path}: {e} (set ${GATE_DIR_ENV} to a directory "
                "every process timing on this host can write, or to off)"
            ) from e

    def create(self) -> None:
        """Make the lock's files (and its directory) where they are missing, holding nothing: a
        process that cannot create them (confined, its file system read-only) can then take the
        lock, since :meth:`acquire` only opens existing files read-only."""
        for path in (self.turnstile, self.path):
            os.close(self._open(path))

    def acquire(self, exclusive: bool) -> int:
        """Hold the lock (``LOCK_EX`` when ``exclusive``, else ``LOCK_SH``) and return the file
        descriptor that holds it; pass it to :meth:`release`."""
        turn = self._open(self.turnstile)
        try:
            fcntl.flock(turn, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            fd = self._open(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            except BaseException:
                os.close(fd)
                raise
            return fd
        finally:  # the turnstile is only passed through (or held while waiting)
            self.release(turn)

    @staticmethod
    def release(fd: int) -> None:
        """End the hold of :meth:`acquire` (unlocked first: a child forked meanwhile that still
        shares the descriptor does not keep it)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def held(self, exclusive: bool) -> Iterator[None]:
        """The lock held for the block."""
        fd = self.acquire(exclusive)
        try:
            yield
        finally:
            self.release(fd)


class DeviceGate:
    """Reader/writer gate of one device (see the module docstring). Thread-safe; not reentrant:
    a thread holding it must not acquire it again (deadlock). ``host_lock``: the device's
    host-wide lock, held (shared or exclusive) inside every hold; None: this process only."""

    def __init__(self, name: str = "", *, host_lock: HostLock | None = None):
        self.name = name
        self.host_lock = host_lock
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._lengthy = 0  # of the shared holds, those declared lengthy
        self._writer = False
        self._writers_waiting = 0
        self._present: dict[Occupant, int] = {}
        self._waiting: dict[int, tuple[str, str, str, float]] = {}  # id -> (occ, phase, mode, t)

    def state(self) -> dict[str, Any]:
        """A snapshot for a stall report (read without the gate's lock: it must not block on a
        gate that is stuck): counts, who is present, what each present occupant holds now,
        and who waits for which hold since how long."""
        now = time.monotonic()
        return {
            "gate": self.name,
            "readers": self._readers,
            "lengthy": self._lengthy,
            "writer": self._writer,
            "writers_waiting": self._writers_waiting,
            "present": [
                {
                    "occupant": o.name,
                    "holding": [
                        f"{r['mode']} {r['phase']}" for r in list(o.phases) if r.get("t1") is None
                    ],
                }
                for o in list(self._present)
            ],
            "waiting": [
                {"occupant": n, "phase": ph, "mode": m, "for_s": round(now - t, 1)}
                for n, ph, m, t in list(self._waiting.values())
            ],
        }

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
    def shared(
        self, occ: Occupant | None = None, phase: str = "", *, lengthy: bool = False
    ) -> Iterator[None]:
        """Hold the gate shared (others may hold it shared too; never while it is held
        exclusive, nor while it is wanted exclusive unless a lengthy shared hold is in place).
        ``lengthy``: this hold lasts long (see the module docstring); it always waits behind a
        waiting exclusive request. ``occ`` is present while it holds."""
        grant = functools.partial(self._grant_shared, lengthy=lengthy)
        end = functools.partial(self._end_shared, lengthy=lengthy)
        with self._hold(occ, phase, "shared", grant, end):
            yield

    def _grant_shared(self, occ: Occupant | None, *, lengthy: bool) -> None:
        """(Under the gate's lock.) Wait while it is held exclusive, or wanted exclusive with no
        lengthy hold in place (lengthy requests: with or without), unless ``occ`` is present
        already; hold it shared."""
        present = occ is not None and occ in self._present
        while self._writer or (
            self._writers_waiting and not present and (lengthy or not self._lengthy)
        ):
            self._cond.wait()
        self._readers += 1
        self._lengthy += lengthy

    def _end_shared(self, occ: Occupant | None, *, lengthy: bool) -> None:
        with self._cond:
            self._readers -= 1
            self._lengthy -= lengthy
            if occ is not None:
                self._leave_locked(occ)
            self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(
        self, occ: Occupant | None = None, phase: str = "", *, alone: bool = False
    ) -> Iterator[None]:
        """Hold the gate exclusive: no other hold, shared or exclusive, while it is held; with
        ``alone`` also no other occupant present. Waiting requests block new shared ones."""
        grant = functools.partial(self._grant_exclusive, alone=alone)
        with self._hold(occ, phase, "exclusive", grant, self._end_exclusive):
            yield

    def _grant_exclusive(self, occ: Occupant | None, *, alone: bool) -> None:
        """(Under the gate's lock.) Wait, wanting it (new shared requests wait behind), while it
        is held (with ``alone``: while another occupant is present); hold it exclusive."""
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

    def _end_exclusive(self, occ: Occupant | None) -> None:
        with self._cond:
            self._writer = False
            if occ is not None:
                self._leave_locked(occ)
            self._cond.notify_all()

    @contextlib.contextmanager
    def _hold(
        self,
        occ: Occupant | None,
        phase: str,
        mode: str,
        grant: Callable[[Occupant | None], None],
        end: Callable[[Occupant | None], None],
    ) -> Iterator[None]:
        """One hold in ``mode`` ("shared" or "exclusive") for the block, what both kinds share:
        ``grant(occ)`` waits, under the gate's lock, until the hold may start and takes it
        (``occ`` made present with it); then the host-wide lock is taken, and at the end (or when
        taking it fails) released before ``end(occ)`` gives the in-process hold back. The time
        waited for both and the hold itself are recorded on ``occ``."""
        t = time.monotonic()
        token = object()
        with self._cond:
            self._waiting[id(token)] = (occ.name if occ else "", phase, mode, t)
            try:
                grant(occ)
            finally:
                del self._waiting[id(token)]
            if occ is not None:
                self._enter_locked(occ)
        try:
            fd = self._host_acquire(exclusive=mode == "exclusive")
        except BaseException:
            end(occ)
            raise
        rec = _start(occ, phase, mode, time.monotonic() - t)
        cpu0 = host_cpu_jiffies() if rec is not None and mode == "exclusive" else None
        try:
            yield
        finally:
            _stop(rec, cpu0)
            try:
                self._host_release(fd)
            finally:
                end(occ)

    # -- the host-wide lock (taken inside the in-process hold, released before it) ------------

    def _host_acquire(self, exclusive: bool) -> int | None:
        return self.host_lock.acquire(exclusive) if self.host_lock is not None else None

    def _host_release(self, fd: int | None) -> None:
        if fd is not None:
            HostLock.release(fd)


def host_cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) CPU time of the whole host since boot, in jiffies (``/proc/stat``'s first
    line; idle and iowait are not busy); None where it cannot be read."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
    return total - fields[3] - fields[4], total


def _start(occ: Occupant | None, phase: str, mode: str, waited: float) -> dict[str, Any] | None:
    if occ is None:
        return None
    occ.waited_s[mode] = occ.waited_s.get(mode, 0.0) + waited
    rec = {"phase": phase, "mode": mode, "t0": round(time.time(), 6), "t1": None}
    occ.phases.append(rec)
    return rec


def _stop(rec: dict[str, Any] | None, cpu0: tuple[int, int] | None = None) -> None:
    if rec is None:
        return
    rec["t1"] = round(time.time(), 6)
    if rec["mode"] == "exclusive":
        cpu1 = host_cpu_jiffies()
        busy = None
        if cpu0 is not None and cpu1 is not None and cpu1[1] > cpu0[1]:
            busy = round((cpu1[0] - cpu0[0]) / (cpu1[1] - cpu0[1]), 3)
        rec["host_busy"] = busy


_GATES: dict[str, DeviceGate] = {}
_GATES_LOCK = threading.Lock()


def device_gate(domain: str) -> DeviceGate:
    """The process-wide gate of ``domain`` (``"cuda:<id>"`` per GPU, ``"host"`` for the cpu
    backend): every pool and ``evaluate`` call in this process that uses the device shares it,
    and its holds hold the device's host-wide lock (:func:`host_lock`; none when
    ``$CUDA_AGENT_GATE_DIR`` is ``off``)."""
    with _GATES_LOCK:
        g = _GATES.get(domain)
        if g is None:
            g = _GATES[domain] = DeviceGate(domain, host_lock=host_lock(domain))
        return g


def gates_state() -> list[dict[str, Any]]:
    """:meth:`DeviceGate.state` of every gate of this process (for a stall report)."""
    return [g.state() for g in list(_GATES.values())]


def gate_dir() -> Path | None:
    """The directory of the host-wide lock files: ``$CUDA_AGENT_GATE_DIR``, else
    ``<system temp dir>/cuda-agent-gates``; None when the variable is ``off``."""
    env = os.environ.get(GATE_DIR_ENV, "").strip()
    if env.lower() == "off":
        return None
    return Path(env) if env else Path(tempfile.gettempdir()) / "cuda-agent-gates"


def lock_key(domain: str) -> str:
    """The file name (no suffix) of ``domain``'s host-wide lock: ``host``; ``cuda-<GPU UUID>``
    (NVML, for the index the sandbox uses, or a UUID given as the device); ``cuda-index-<n>``
    where NVML cannot say. Safe as a file name."""
    if not domain.startswith("cuda:"):
        key = domain
    else:
        gpu = domain.split(":", 1)[1]
        if gpu == "default":  # as the candidate's processes resolve it (evaluate._gpu_index)
            gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
        uuid = _gpu_uuid(gpu)
        key = f"cuda-{uuid}" if uuid else f"cuda-index-{gpu}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", key)


def host_lock(domain: str) -> HostLock | None:
    """``domain``'s host-wide lock in :func:`gate_dir` (None when host-wide locks are off)."""
    d = gate_dir()
    if d is None:
        return None
    return HostLock(d, lock_key(domain), refuse_links=not os.environ.get(GATE_DIR_ENV, "").strip())


def _gpu_uuid(gpu: str) -> str | None:
    """The UUID of the GPU the sandbox names ``gpu`` (an NVML index, or a UUID or the prefix
    of one, ``GPU-…``, as ``CUDA_VISIBLE_DEVICES`` takes them; ``MIG-…`` as given), or None
    where NVML cannot say."""
    if gpu.startswith("MIG-"):
        return gpu
    if not (gpu.isdigit() or gpu.startswith("GPU-")):
        return None
    from cuda_agent.profiler.nvml import device_uuids

    uuids = device_uuids()
    if uuids is None:  # no NVML (no driver): the index names it
        return gpu if gpu.startswith("GPU-") else None
    if gpu.isdigit():
        return uuids[int(gpu)] if int(gpu) < len(uuids) else None
    hits = [u for u in uuids if u.startswith(gpu)]
    return hits[0] if len(hits) == 1 else gpu


def domain_of(backend: str, gpu: str | None) -> str:
    """The timing domain of a worker: one per GPU on cuda, the whole host on cpu."""
    if backend == "cuda":
        return f"cuda:{gpu if gpu is not None else 'default'}"
    return "host"
