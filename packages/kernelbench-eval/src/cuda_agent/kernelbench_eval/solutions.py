"""Import solutions (KernelBench ``ModelNew`` files or CUDA-Agent workdirs) and pair them with
their tasks into ``Candidate`` records."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from cuda_agent.records import Candidate, Solution, Task
from cuda_agent.records.jsonl import DecodeError, iter_lines
from cuda_agent.sandbox.workspace import solution_from_workspace

# level_1_problem_19_sample_0_kernel.py (KernelBench's generated-kernel names)
FLAT_NAME = re.compile(r"^level_(\d+)_problem_(\d+)(?:_sample_(\d+))?(?:_kernel)?\.py$")
# level1/19_ReLU.py or level1/19_ReLU/ (a workdir)
NESTED_NAME = re.compile(r"^(\d+)(?:_.*?)?(?:\.py)?$")
LEVEL_DIR = re.compile(r"^level_?(\d+)$")

WORKDIR_MARKER = "model_new.py"


class SolutionEntry(msgspec.Struct, kw_only=True):
    """One line of ``solutions --jsonl``: a solution for (level, problem_id)."""

    level: int
    problem_id: int
    code: str | None = None  # a KernelBench model_new.py
    files: dict[str, str] | None = None  # or a workdir's files
    format: Literal["workdir", "kernelbench"] | None = None
    sample: int = 0
    origin: str = "jsonl"


@dataclass
class FoundSolution:
    level: int
    problem_id: int
    sample: int
    solution: Solution


@dataclass
class ImportReport:
    candidates: list[Candidate] = field(default_factory=list)
    missing: list[Task] = field(default_factory=list)  # tasks with no solution
    orphans: list[str] = field(default_factory=list)  # solutions with no task
    unreadable: list[str] = field(default_factory=list)


def scan_dir(root: Path, origin: str | None = None) -> tuple[list[FoundSolution], list[str]]:
    """Solutions found under ``root`` and paths that look like solutions but cannot be read."""
    root = Path(root)
    origin = origin or f"import:{root}"
    found: list[FoundSolution] = []
    bad: list[str] = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        m = FLAT_NAME.match(p.name)
        if p.is_file() and m:
            level, pid, sample = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
            sol = Solution.make("kernelbench", {"model_new.py": p.read_text()}, f"{origin}/{rel}")
            found.append(FoundSolution(level, pid, sample, sol))
            continue
        lm = LEVEL_DIR.match(p.parent.name)
        nm = NESTED_NAME.match(p.name)
        if not (lm and nm):
            continue
        level, pid = int(lm.group(1)), int(nm.group(1))
        if p.is_file() and p.suffix == ".py":
            sol = Solution.make("kernelbench", {"model_new.py": p.read_text()}, f"{origin}/{rel}")
        elif p.is_dir() and (p / WORKDIR_MARKER).is_file():
            sol = solution_from_workspace(p, origin=f"{origin}/{rel}")
        elif p.is_dir():
            bad.append(f"{rel}: a folder without {WORKDIR_MARKER}")
            continue
        else:
            continue
        found.append(FoundSolution(level, pid, 0, sol))
    return found, bad


def scan_jsonl(path: Path) -> tuple[list[FoundSolution], list[str]]:
    """Solutions from JSONL lines of :class:`SolutionEntry`; raises ``DecodeError`` naming a bad line."""
    found = []
    for n, line in iter_lines(path):
        try:
            e = msgspec.json.decode(line, type=SolutionEntry)
        except (msgspec.ValidationError, msgspec.DecodeError) as err:
            raise DecodeError(n, str(err), line) from None
        if (e.code is None) == (e.files is None):
            raise DecodeError(n, "give exactly one of 'code' (model_new.py) or 'files'", line)
        if e.code is not None:
            sol = Solution.make("kernelbench", {"model_new.py": e.code}, e.origin)
        else:
            fmt = e.format or (
                "workdir" if any(k.startswith("kernels/") for k in e.files) else "kernelbench"
            )
            sol = Solution.make(fmt, dict(e.files), e.origin)
        found.append(FoundSolution(e.level, e.problem_id, e.sample, sol))
    return found, []


def import_solutions(tasks: Iterable[Task], found: Iterable[FoundSolution]) -> ImportReport:
    """Pair solutions with tasks by (level, problem id); every sample becomes a candidate.

    Tasks without any solution are listed in ``missing`` (they count as failures in the report).
    """
    by_key: dict[tuple[int, int], Task] = {}
    for t in tasks:
        if t.level is not None and t.problem_id is not None:
            by_key[(t.level, t.problem_id)] = t
    rep = ImportReport()
    covered: set[tuple[int, int]] = set()
    for f in sorted(found, key=lambda f: (f.level, f.problem_id, f.sample)):
        t = by_key.get((f.level, f.problem_id))
        if t is None:
            rep.orphans.append(f"level {f.level} problem {f.problem_id} ({f.solution.origin})")
            continue
        covered.add((f.level, f.problem_id))
        meta: dict[str, Any] = {"level": f.level, "problem_id": f.problem_id, "sample": f.sample}
        rep.candidates.append(Candidate(task=t, solution=f.solution, meta=meta))
    rep.missing = [t for k, t in sorted(by_key.items()) if k not in covered]
    return rep
