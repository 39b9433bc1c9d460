"""Admission control: a device phase starts only when the memory and disk it needs are there.

An evaluation's verification needs, at once, GPU memory for two processes (the candidate's and
the judge's: inputs, the candidate's output, the reference output the judge recomputes), host
memory for one output on its way to the judge, and disk for that output's file. Several device
workers share a GPU and a host, so each phase *reserves* what it needs in a ledger of this
process and waits (bounded) until the reservations of the others and what the machine has free
leave room for it. What never fits, or does not fit within the wait, is the sandbox's failure:
:class:`NoRoom` names the resource, and the evaluation reports ``infra_error`` (a candidate is
never blamed for what the sandbox ran out of).

Free amounts: GPU memory from NVML (``pynvml``; unknown without it: not checked), host memory
from ``MemAvailable`` in ``/proc/meminfo``, disk from ``shutil.disk_usage`` of the directory.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30


class NoRoom(RuntimeError):
    """What a phase needs is not there (``resource``, bytes ``need`` and ``free``)."""

    def __init__(self, resource: str, need: int, free: int, waited_s: float):
        self.resource, self.need, self.free, self.waited_s = resource, need, free, waited_s
        super().__init__(
            f"not enough {resource}: the phase needs {need / GIB:.2f} GiB, "
            f"{free / GIB:.2f} GiB free after waiting {waited_s:.0f}s"
        )


@dataclass(frozen=True)
class Need:
    """Bytes one phase needs of each resource (0: not needed)."""

    gpu: int = 0
    host: int = 0
    disk: int = 0


def host_available() -> int | None:
    """``MemAvailable`` in bytes, or None where ``/proc/meminfo`` does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def gpu_total(gpu: str | None) -> int | None:
    """Total memory of the GPU with this index (NVML), or None when unknown."""
    return _gpu_memory(gpu, "total")


def gpu_free(gpu: str | None) -> int | None:
    """Free memory of the GPU with this index (NVML), or None when unknown."""
    return _gpu_memory(gpu, "free")


def _gpu_memory(gpu: str | None, field: str) -> int | None:
    if gpu is None or not gpu.strip().isdigit():
        return None
    from cuda_agent.profiler.nvml import memory_bytes

    return memory_bytes(int(gpu), field)  # None without NVML: the GPU's memory is not checked


def disk_free(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


class Ledger:
    """Reservations of this process's phases per resource key (``gpu:0``, ``host``,
    ``disk:/dev/vda``). A reservation fits when its bytes plus those the others reserved fit in
    what is free now (conservative: the others may not have allocated theirs yet). A phase that
    does not fit waits while others hold reservations (they end and free theirs); alone, it
    waits ``alone_wait_s`` for memory other programs may free, then fails."""

    def __init__(self, alone_wait_s: float = 5.0) -> None:
        self._cond = threading.Condition()
        self._held: dict[str, int] = {}
        self.alone_wait_s = alone_wait_s

    def state(self) -> dict[str, int]:
        """Bytes reserved now per resource key (for a stall report; read without the lock)."""
        return dict(self._held)

    @contextlib.contextmanager
    def reserve(
        self,
        wants: dict[str, tuple[int, Callable[[], int | None]]],
        *,
        timeout_s: float,
        poll_s: float = 0.5,
    ) -> Iterator[float]:
        """Hold ``wants`` (key -> (bytes, free-bytes probe; None = unknown, not checked)) for
        the block; yields the seconds waited. Raises :class:`NoRoom` naming the first resource
        that did not fit."""
        t0 = time.monotonic()
        with self._cond:
            while True:
                short = None
                for k, (n, probe) in wants.items():
                    free = probe() if n > 0 else None
                    if free is not None and n + self._held.get(k, 0) > free:
                        short = (k, n, free)
                        break
                if short is None:
                    for k, (n, _) in wants.items():
                        self._held[k] = self._held.get(k, 0) + n
                    break
                key, need, free = short
                waited = time.monotonic() - t0
                limit = timeout_s if self._held.get(key) else min(timeout_s, self.alone_wait_s)
                if waited >= limit:
                    raise NoRoom(_resource_name(key), need, free, waited)
                self._cond.wait(timeout=poll_s)
        try:
            yield time.monotonic() - t0
        finally:
            with self._cond:
                for k, (n, _) in wants.items():
                    self._held[k] = self._held.get(k, 0) - n
                self._cond.notify_all()


def _resource_name(key: str) -> str:
    kind, _, where = key.partition(":")
    return {
        "gpu": f"GPU memory on GPU {where}",
        "host": "host memory",
        "disk": f"disk space at {where}",
    }.get(kind, key)


LEDGER = Ledger()


def reserve(need: Need, *, gpu: str | None, disk_at: Path, timeout_s: float):
    """Reserve ``need`` in this process's ledger (see :class:`Ledger`); a context manager
    yielding the seconds waited, raising :class:`NoRoom`."""
    wants: dict[str, tuple[int, Callable[[], int | None]]] = {}
    if need.gpu and gpu is not None:
        wants[f"gpu:{gpu}"] = (need.gpu, lambda: gpu_free(gpu))
    if need.host:
        wants["host"] = (need.host, host_available)
    if need.disk:
        wants[f"disk:{disk_at}"] = (need.disk, lambda: disk_free(disk_at))
    return LEDGER.reserve(wants, timeout_s=timeout_s)


def verification_need(input_bytes: int, output_bytes: int, param_bytes: int, backend: str) -> Need:
    """What a verification phase (candidate + judge at once) needs, from the reference's
    trusted report: on the GPU the candidate's inputs, weights and output (twice: its working
    copy and the one being saved) and the judge's weights, recomputed reference output, the
    candidate's output it loaded and the comparison's temporaries (about two outputs); on the
    host one output (the candidate's CPU copy; the judge reads the file through the page
    cache); on disk one output file."""
    dev = 2 * (input_bytes + param_bytes) + 6 * output_bytes
    host = 2 * output_bytes
    if backend != "cuda":  # the cpu backend's "device" is host memory
        return Need(host=host + dev, disk=output_bytes + (64 << 20))
    return Need(gpu=dev, host=host, disk=output_bytes + (64 << 20))


#: A candidate's process under the runtime guard was seen holding ~4.7x its task's working set
#: (inputs + outputs + weights) on the GPU: 60 GiB for KernelBench L1/24 LogSoftmax (6.4 GB in,
#: 6.4 GB out) on the H200, over a 0.45 share (62.9 GiB) with two workers per GPU.
CANDIDATE_WORKING_SET_FACTOR = 6

#: Of a GPU's memory, what the caps of the processes sharing it may add up to (the rest: CUDA
#: contexts, the L2 flush buffer, other programs); split evenly between the workers of a GPU.
GPU_MEMORY_SHARE = 0.9


@dataclass(frozen=True)
class Share:
    """How one evaluation's device half uses its GPU's memory. ``fraction``: the cap of each of
    its processes' allocators (None: no cap); ``alone``: it takes the device to itself (no other
    occupant, no cap); ``large``: a cap above the even share, held in :data:`LARGE_SHARES`
    while it runs; ``why``: the reason for either, for the result's meta."""

    fraction: float | None
    alone: bool = False
    large: bool = False
    why: str = ""


def device_share(
    working_set_bytes: int, mem_fraction: float | None, gpu_total_bytes: int | None
) -> Share:
    """The share of a task whose working set (inputs, outputs, weights) is ``working_set_bytes``
    on a GPU of ``gpu_total_bytes`` split into even shares of ``mem_fraction``. A candidate's
    process may hold :data:`CANDIDATE_WORKING_SET_FACTOR` times the working set: within the even
    share, the even share; within :data:`GPU_MEMORY_SHARE` of the GPU, a large share of that
    size, next to other workers' candidates (the others keep theirs: the caps are ceilings, and
    what each verification really needs is reserved in :data:`LEDGER`); beyond that, alone (it
    would fail under any share and be re-run alone, which cost 135 s on that LogSoftmax).
    Unknown sizes, or no share to exceed (one worker): ``mem_fraction``, shared, as before (a
    memory failure is re-run alone)."""
    if mem_fraction is None or working_set_bytes <= 0 or not gpu_total_bytes:
        return Share(mem_fraction)
    want = CANDIDATE_WORKING_SET_FACTOR * working_set_bytes / gpu_total_bytes
    if want <= mem_fraction:
        return Share(mem_fraction)
    gib = working_set_bytes / GIB
    if want <= GPU_MEMORY_SHARE:
        # whole percent, readable in the meta (the ceiling of 0.9 * 100 in floats is 91)
        fraction = min(math.ceil(want * 100) / 100, GPU_MEMORY_SHARE)
        return Share(
            fraction,
            large=True,
            why=f"working set {gib:.1f} GiB: a {fraction:.2f} share instead of {mem_fraction:.2f}",
        )
    return Share(None, alone=True, why=f"working set {gib:.1f} GiB too large to share")


class ShareBudget:
    """The large shares in flight per GPU (key ``gpu:0``): a large share starts when it and the
    others held on its GPU add up to at most :data:`GPU_MEMORY_SHARE` (or when it is the only
    one), so two candidates that could each fill most of the GPU never share it, while a large
    one and the even-share ones do. Holders end (every device half has its time limits), so the
    wait is unbounded."""

    def __init__(self, limit: float = GPU_MEMORY_SHARE) -> None:
        self._cond = threading.Condition()
        self._held: dict[str, float] = {}
        self.limit = limit

    def state(self) -> dict[str, float]:
        """The large shares held now per GPU (for a stall report; read without the lock)."""
        return dict(self._held)

    @contextlib.contextmanager
    def hold(self, key: str, fraction: float) -> Iterator[float]:
        """Hold ``fraction`` of GPU ``key`` for the block; yields the seconds waited."""
        t0 = time.monotonic()
        with self._cond:
            while self._held.get(key, 0.0) > 0.0 and self._held[key] + fraction > self.limit + 1e-9:
                self._cond.wait()
            self._held[key] = self._held.get(key, 0.0) + fraction
        try:
            yield time.monotonic() - t0
        finally:
            with self._cond:
                self._held[key] -= fraction
                if self._held[key] <= 1e-9:
                    del self._held[key]
                self._cond.notify_all()


LARGE_SHARES = ShareBudget()
