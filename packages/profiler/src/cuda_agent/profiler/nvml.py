"""NVML: the one place the toolkit asks the driver about a GPU without creating a CUDA context
(names, UUIDs, memory, clocks). Every function answers None where NVML cannot (no driver, no
``pynvml``, a CPU host); none raises for that.

Indices here are NVML's (the machine's order). A torch device index, which counts only the
devices ``CUDA_VISIBLE_DEVICES`` shows, becomes one with :func:`nvml_index`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def nvml_index(torch_index: int, visible: str | None = None) -> int:
    """NVML index of torch device ``torch_index`` (honours ``visible``, default
    $CUDA_VISIBLE_DEVICES, when numeric)."""
    vis = visible if visible is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis:
        parts = [p.strip() for p in vis.split(",") if p.strip()]
        if torch_index < len(parts) and parts[torch_index].isdigit():
            return int(parts[torch_index])
    return torch_index


@contextmanager
def _session() -> Iterator[Any]:
    """NVML initialised for the block (its init is reference-counted), shut down after."""
    import pynvml

    pynvml.nvmlInit()
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _once(read: Any) -> Any:
    """``read(nvml)`` in an NVML session of its own, or None without NVML."""
    try:
        with _session() as nv:
            return read(nv)
    except Exception:  # noqa: BLE001 - no NVML
        return None


def device_name(index: int) -> str | None:
    """The GPU's name, e.g. ``NVIDIA H200``."""
    return _once(lambda nv: _text(nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(index))))


def device_uuids() -> list[str] | None:
    """Every GPU's UUID (``GPU-…``), in NVML's order."""
    return _once(
        lambda nv: [
            _text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i)))
            for i in range(nv.nvmlDeviceGetCount())
        ]
    )


def memory_bytes(index: int, field: str = "total") -> int | None:
    """The GPU's ``total``, ``free`` or ``used`` memory in bytes."""
    return _once(
        lambda nv: int(
            getattr(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(index)), field)
        )
    )


class Sampler:
    """One GPU's clocks and identity, read repeatedly (NVML stays initialised for the life of
    the process: a timing loop reads a clock after every call)."""

    def __init__(self, index: int | None):
        self.nv: Any = None
        self.handle: Any = None
        if index is None:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.nv = pynvml
        except Exception:  # noqa: BLE001 - no NVML: every reading is None
            self.handle = None

    def _ask(self, read: Any) -> Any:
        """``read(nvml, handle)``, or None without NVML or when the driver refuses."""
        if self.handle is None:
            return None
        try:
            return read(self.nv, self.handle)
        except Exception:  # noqa: BLE001
            return None

    def clock_mhz(self, which: str = "SM") -> float | None:
        """The current ``SM`` or ``MEM`` clock in MHz."""
        return self._ask(
            lambda nv, h: float(nv.nvmlDeviceGetClockInfo(h, getattr(nv, f"NVML_CLOCK_{which}")))
        )

    def memory_bytes(self, field: str = "used") -> int | None:
        """The GPU's ``total``, ``free`` or ``used`` memory in bytes, now."""
        return self._ask(lambda nv, h: int(getattr(nv.nvmlDeviceGetMemoryInfo(h), field)))

    def uuid(self) -> str | None:
        """The physical GPU's UUID: two GPUs of one name differ by percents."""
        return self._ask(lambda nv, h: _text(nv.nvmlDeviceGetUUID(h)))
