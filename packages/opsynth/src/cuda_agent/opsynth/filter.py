"""Execution filter: keep a task only if it runs, is deterministic, depends on its inputs, gives
sane outputs, matches under ``torch.compile`` and its eager time lies in the backend's window.

Each task runs in a fresh process confined by the sandbox
(:class:`~cuda_agent.opsynth.isolate.Isolator`) with a timeout and a memory cap. A task outside
the time window is rescaled once or twice by changing its module-level ``batch_size`` (what
changed is recorded in ``meta.filter.rescaled``); a task that runs out of its memory share is
retried with an 8x smaller batch the same way.

Default windows (``eager forward time``, ms):

- ``cuda``: [1, 100] (the paper's window, for an H100/H200-class GPU);
- ``cpu``: [1, 1000] (a CPU is 10-100x slower; only for running the pipeline without a GPU).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec

from cuda_agent.records.types import Task

from .isolate import Isolator
from .probe import ProbeConfig

WINDOWS_MS: dict[str, tuple[float, float]] = {"cuda": (1.0, 100.0), "cpu": (1.0, 1000.0)}
_BATCH = re.compile(r"^(batch_size\s*=\s*)(\d+)\s*$", re.M)


@dataclass
class FilterConfig:
    """Knobs of :class:`TaskFilter`; see the module docstring for the window defaults."""

    backend: str = "cpu"
    window_ms: tuple[float, float] | None = None
    compile: bool = True
    compile_backend: str = "inductor"
    mode: str = "eval"
    timeout_s: float = 180.0
    mem_gb: float | None = 16.0
    rescale: bool = True
    max_rescales: int = 2
    isolation: str = "fork"
    threads: int = 1
    time_budget_s: float = 2.0
    shrink_numel: int | None = None  # CPU studies of GPU-sized sets: shrink inputs to this size

    @property
    def window(self) -> tuple[float, float]:
        return self.window_ms or WINDOWS_MS[self.backend]

    @property
    def device(self) -> str:
        return "cuda" if self.backend == "cuda" else "cpu"


@dataclass
class Verdict:
    """Outcome of one task: the task to emit (possibly rescaled) and, if dropped, why."""

    task: Task
    passed: bool
    reason: str | None = None
    detail: str = ""
    probe: dict[str, Any] = field(default_factory=dict)


OOM_SHRINK = 1 / 8  # batch factor tried after an out-of-memory failure


def input_id(meta: dict[str, Any], task_id: str) -> str:
    """The id of the input task a filter record (kept or rejected) came from: a kept task that
    was rescaled has a new id, ``meta.filter.input_id`` keeps the original."""
    return str((meta.get("filter") or {}).get("input_id") or task_id)


def upscale_memory_cap(factor: float, peak_gib: float | None, mem_gb: float | None) -> float:
    """``factor`` limited so a batch that many times larger should use at most half the memory
    cap (peak memory grows about linearly with the batch): an upscale that would run out of
    memory costs two extra probes (the failure, then the shrink) for nothing."""
    if factor <= 1 or not peak_gib or not mem_gb:
        return factor
    return min(factor, max(1.0, 0.5 * mem_gb / peak_gib))


def rescale_source(source: str, factor: float) -> tuple[str, int, int] | None:
    """``source`` with its ``batch_size = N`` scaled by ``factor``: (new source, old, new).

    None when there is no module-level ``batch_size`` or the value would not change.
    """
    m = _BATCH.search(source)
    if not m:
        return None
    old = int(m.group(2))
    new = max(1, int(round(old * factor)))
    if new == old:
        return None
    return source[: m.start(2)] + str(new) + source[m.end(2) :], old, new


class TaskFilter:
    """Applies the checks to tasks one at a time; reuse one instance for a stream."""

    def __init__(self, cfg: FilterConfig):
        self.cfg = cfg
        self.iso = Isolator(cfg.isolation, threads=cfg.threads, warm_compile=cfg.compile)
        self.reasons: Counter[str] = Counter()
        self.passed = 0
        self.rescaled = 0
        self.probe_seconds = 0.0
        self._task_seconds = 0.0  # wall seconds of the current task's probes (all rescalings)
        self._task_phases: dict[str, float] = {}  # the same, by check

    def _probe(self, source: str) -> dict[str, Any]:
        pc = ProbeConfig(
            device=self.cfg.device,
            compile=self.cfg.compile,
            compile_backend=self.cfg.compile_backend,
            mode=self.cfg.mode,
            time_budget_s=self.cfg.time_budget_s,
            slow_ms=self.cfg.window[1],
            shrink_numel=self.cfg.shrink_numel,
            window_ms=list(self.cfg.window),
        )
        res = self.iso.run(source, pc.to_dict(), self.cfg.timeout_s, self.cfg.mem_gb)
        secs = float(res.get("seconds") or 0.0)
        self.probe_seconds += secs
        self._task_seconds += secs
        # where the task's time went, over all its probes; "process": start-up and hand-over
        # (the parent's wall time not spent inside a check), or the whole probe if it died
        inside = res.get("phases_s") or {}
        for k, v in [*inside.items(), ("process", secs - sum(inside.values()))]:
            self._task_phases[k] = round(self._task_phases.get(k, 0.0) + max(0.0, v), 3)
        return res

    def check(self, task: Task) -> Verdict:
        """Run every check on ``task`` (in a fresh process) and decide."""
        lo, hi = self.cfg.window
        self._task_seconds = 0.0
        self._task_phases = {}
        source = task.ref_code
        rescales: list[dict[str, Any]] = []
        res = self._probe(source)
        while True:
            if not res.get("ok"):
                # too big for this worker's memory share: a smaller batch usually fits (and a
                # task that needed that much memory was far above the window anyway)
                shrunk = None
                if (
                    res.get("reason") == "out_of_memory"
                    and self.cfg.rescale
                    and len(rescales) < self.cfg.max_rescales
                ):
                    shrunk = rescale_source(source, OOM_SHRINK)
                if shrunk is None:
                    return self._drop(task, res["reason"], res.get("detail", ""), res, rescales)
                source, old, new = shrunk
                rescales.append({"batch_size": [old, new], "after": "out_of_memory"})
                res = self._probe(source)
                continue
            ms = float(res["eager_ms"])
            if lo <= ms <= hi:
                break
            reason = "too_fast" if ms < lo else "too_slow"
            detail = f"eager {ms:.4g} ms outside [{lo:g}, {hi:g}] ms ({self.cfg.backend})"
            if not self.cfg.rescale or len(rescales) >= self.cfg.max_rescales:
                return self._drop(task, reason, detail, res, rescales)
            target = math.sqrt(lo * hi)
            # at most 64x up or down in total: time is rarely linear in batch at small sizes
            done = math.prod(r["batch_size"][1] / r["batch_size"][0] for r in rescales)
            factor = min(64.0 / done, max(1 / (64 * done), target / max(ms, 1e-6)))
            capped = upscale_memory_cap(factor, res.get("peak_mem_gib"), self.cfg.mem_gb)
            if capped < factor and capped < 1.05:
                return self._drop(
                    task,
                    reason,
                    detail + "; a larger batch would not fit the memory cap",
                    res,
                    rescales,
                )
            memory_capped = capped < factor
            factor = capped
            rs = rescale_source(source, factor)
            if rs is None:
                why = (
                    "; rescaling limit (64x) reached" if rescales else "; no batch_size to rescale"
                )
                return self._drop(task, reason, detail + why, res, rescales)
            source, old, new = rs
            step = {"batch_size": [old, new], "eager_ms_before": round(ms, 4)}
            if memory_capped:
                step["memory_capped"] = True
            rescales.append(step)
            res = self._probe(source)
        info = {
            "backend": self.cfg.backend,
            "window_ms": [lo, hi],
            "eager_ms": round(float(res["eager_ms"]), 4),
            "checks": res.get("checks", []),
            "compile_checked": self.cfg.compile_backend if self.cfg.compile else None,
            "mode": self.cfg.mode,
            "input_id": task.id,
            "probe_s": round(self._task_seconds, 3),
            "phases_s": self._task_phases,
        }
        if rescales:
            info["rescaled"] = rescales
            self.rescaled += 1
        if res.get("shrunk"):
            info["shrunk"] = res["shrunk"]
        out = task
        if source != task.ref_code:
            out = Task.make(task.name, source, **_task_fields(task))
        out = msgspec.structs.replace(out, meta={**out.meta, "filter": info})
        self.passed += 1
        return Verdict(out, True, probe=res)

    def _drop(
        self,
        task: Task,
        reason: str,
        detail: str,
        res: dict[str, Any],
        rescales: list[dict[str, Any]],
    ) -> Verdict:
        self.reasons[reason] += 1
        info: dict[str, Any] = {
            "reason": reason,
            "detail": detail,
            "backend": self.cfg.backend,
            "probe_s": round(self._task_seconds, 3),
            "phases_s": self._task_phases,
        }
        if res.get("eager_ms") is not None:
            info["eager_ms"] = round(float(res["eager_ms"]), 4)
        if rescales:
            info["rescaled"] = rescales
        if res.get("shrunk"):
            info["shrunk"] = res["shrunk"]
        out = msgspec.structs.replace(task, meta={**task.meta, "rejected": info})
        return Verdict(out, False, reason, detail, res)

    def summary(self) -> str:
        total = self.passed + sum(self.reasons.values())
        parts = [f"{self.passed}/{total} passed"]
        if self.rescaled:
            parts.append(f"{self.rescaled} after rescaling")
        parts += [f"{r} {n}" for r, n in self.reasons.most_common()]
        if self.iso.server_error:
            parts.append(f"tasks started cold, no fork server: {self.iso.server_error[:300]}")
        if self.iso.isolation:
            parts.append(
                "confined: " + "; ".join(f"{k} {v}" for k, v in self.iso.isolation.items())
            )
        if self.cfg.compile and self.iso.warm is not None:
            parts.append(f"compile imports pre-warmed in the fork server: {self.iso.warm}")
        return "filter: " + ", ".join(parts)

    def close(self) -> None:
        self.iso.close()


def _task_fields(t: Task) -> dict[str, Any]:
    return {
        "source": t.source,
        "level": t.level,
        "problem_id": t.problem_id,
        "ops": list(t.ops),
        "meta": dict(t.meta),
    }
