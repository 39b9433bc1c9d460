"""Read a KernelBench checkout (``KernelBench/level{N}/{id}_{Name}.py``) into ``Task`` records."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.profiler.program import ProgramError, check_contract, mode_dependence
from cuda_agent.records import Task

PROBLEM_FILE = re.compile(r"^(\d+)_(.+)\.py$")
# how `tasks` sets Task.model_mode: KernelBench's semantics ("kernelbench"), or one mode for all
MODE_CHOICES = ("kernelbench", "train", "eval")
LEVEL_DIR = re.compile(r"^level(\d+)$")


class TreeError(ValueError):
    """The path is not a KernelBench checkout."""


@dataclass
class ProblemIssue:
    """A problem file that could not become a task, and why."""

    path: Path
    message: str


def find_levels_dir(root: Path) -> Path:
    """The folder holding ``level1/`` ...: ``root/KernelBench`` (a clone) or ``root`` itself."""
    root = Path(root)
    for cand in (root / "KernelBench", root):
        if cand.is_dir() and any(LEVEL_DIR.match(p.name) for p in cand.iterdir() if p.is_dir()):
            return cand
    raise TreeError(
        f"{root}: no KernelBench/level*/ folders found (expected a clone of the KernelBench "
        "repository, or its KernelBench/ folder)"
    )


def parse_ranges(spec: str | None) -> set[int] | None:
    """``"1-20,40"`` -> {1..20, 40}; ``None`` -> no filter."""
    if spec is None or spec.strip() in ("", "all"):
        return None
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"bad range {part!r} (use e.g. 1-20,40)")
        lo = int(m.group(1))
        hi = int(m.group(2) or lo)
        if hi < lo:
            raise ValueError(f"bad range {part!r}: end before start")
        out.update(range(lo, hi + 1))
    return out


def kernelbench_mode(source: str, name: str = "kb_mode_probe") -> tuple[str, list[str]]:
    """The module mode KernelBench's semantics give the problem ``source``, and why.

    KernelBench's harness never calls ``.eval()``: its models run in train mode, where BatchNorm
    normalises with the batch's statistics, and so does this task ("train"). Where the two modes
    compute the same output the task keeps the default "eval" (the same program, the same
    baselines). Where train mode draws random numbers (Dropout with p > 0), no other process's
    output can be checked against the reference's: "eval", Dropout off."""
    dep = mode_dependence(source, name=name)
    if dep.random:
        return "eval", ["random in train mode: " + "; ".join(dep.random[:3])]
    if dep.statistics:
        return "train", dep.statistics[:3]
    return "eval", []


def kernelbench_task(
    name: str,
    ref_code: str,
    level: int,
    problem_id: int,
    meta: dict[str, Any] | None = None,
    model_mode: str = "kernelbench",
) -> Task:
    """The task of a KernelBench problem, in ``model_mode``: "train" or "eval", or "kernelbench"
    (:func:`kernelbench_mode`, with its reasons in ``meta["model_mode_why"]``)."""
    if model_mode not in MODE_CHOICES:
        raise ValueError(f"model mode {model_mode!r}: one of {', '.join(MODE_CHOICES)}")
    meta = dict(meta or {})
    if model_mode == "kernelbench":
        model_mode, why = kernelbench_mode(ref_code, name=f"kb_mode_{level}_{problem_id}")
        if why:
            meta["model_mode_why"] = why
    return Task.make(
        name,
        ref_code,
        source="kernelbench",
        level=level,
        problem_id=problem_id,
        model_mode=model_mode,
        meta=meta,
    )


def iter_problems(
    root: Path,
    levels: set[int] | None = None,
    problems: set[int] | None = None,
    model_mode: str = "kernelbench",
) -> Iterator[Task | ProblemIssue]:
    """Tasks of the checkout in (level, problem id) order; files breaking the contract come back
    as :class:`ProblemIssue` instead of being skipped silently. ``model_mode``: as
    :func:`kernelbench_task`'s."""
    if model_mode not in MODE_CHOICES:
        raise ValueError(f"model mode {model_mode!r}: one of {', '.join(MODE_CHOICES)}")
    base = find_levels_dir(root)
    level_dirs = []
    for d in base.iterdir():
        m = LEVEL_DIR.match(d.name)
        if d.is_dir() and m and (levels is None or int(m.group(1)) in levels):
            level_dirs.append((int(m.group(1)), d))
    for level, d in sorted(level_dirs):
        files = []
        for f in d.iterdir():
            m = PROBLEM_FILE.match(f.name)
            if f.is_file() and m:
                files.append((int(m.group(1)), m.group(2), f))
        for pid, name, f in sorted(files):
            if problems is not None and pid not in problems:
                continue
            source = f.read_text()
            try:
                missing = check_contract(source)
            except ProgramError as e:
                yield ProblemIssue(f, str(e))
                continue
            if missing:
                yield ProblemIssue(f, f"does not define {', '.join(missing)}")
                continue
            meta = {"path": str(f.relative_to(base.parent if base.name == "KernelBench" else base))}
            yield kernelbench_task(name, source, level, pid, meta, model_mode)
