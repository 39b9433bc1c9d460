"""The positive corpus (``corpus/positive``): honest solutions of real KernelBench problems with
the verdicts the evaluator must give them.

Layout (relative to the corpus root): ``KernelBench/level{N}/<id>_<Name>.py`` (verbatim problems),
``solutions/`` (solutions in the layouts ``kernelbench-eval solutions --dir`` reads) and
``expected/level{N}.toml`` (one ``[[solution]]`` table per solution). Loading validates all of it;
pairing goes through :mod:`.tree` and :mod:`.solutions`, the same code as the CLI.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import msgspec

from cuda_agent.records import Candidate

from .solutions import FLAT_NAME, LEVEL_DIR, NESTED_NAME, import_solutions, scan_dir
from .tree import PROBLEM_FILE, ProblemIssue, iter_problems

#: The corpus's own root in this package's source tree.
DEFAULT_ROOT = Path(__file__).resolve().parents[3] / "corpus" / "positive"

#: Styles a solution may be tagged with (the issue's list).
STYLES = frozenset(
    {
        "default-stream",
        "no-error-check",
        "grid-stride",
        "float4",
        "shared-reduction",
        "warp-shuffle",
        "tiled-gemm",
        "fused-epilogue",
        "algorithmic",
        "workdir",
        "load_inline",
        "cublas",
        "multi-gb",
        "sub-50us",
    }
)

_STATUS = re.compile(r"^(ok|guard_violation:(G-[A-Z0-9-]+))$")
_EXPECTED_FILE = re.compile(r"^level(\d+)\.toml$")


class CorpusError(ValueError):
    """The corpus does not validate; the message lists every problem found."""


class ExpectedSolution(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One ``[[solution]]`` table of ``expected/level{N}.toml``."""

    path: str  # relative to the corpus root, e.g. "solutions/level_1_problem_12_sample_0_kernel.py"
    level: int
    problem: int
    styles: list[str]
    strict: str  # "ok" or "guard_violation:G-CODE"
    kernelbench: str
    note: str

    def expected(self, policy: str) -> tuple[str, str | None]:
        """(status, guard code or None) expected under guard policy ``strict`` or ``kernelbench``."""
        if policy not in ("strict", "kernelbench"):
            raise ValueError(f"no expected verdict for guard policy {policy!r}")
        return parse_status(getattr(self, policy))


class ExpectedFile(msgspec.Struct, forbid_unknown_fields=True):
    solution: list[ExpectedSolution] = []


@dataclass
class Entry:
    """A validated solution: what is expected of it and its candidate (task + solution)."""

    expected: ExpectedSolution
    candidate: Candidate


@dataclass
class Corpus:
    root: Path
    entries: list[Entry]

    def by_solution_id(self) -> dict[str, Entry]:
        """Entries keyed by ``Solution.id`` (what an ``EvalResult``'s ``solution_id`` names)."""
        return {e.candidate.solution.id: e for e in self.entries}


def parse_status(text: str) -> tuple[str, str | None]:
    """``"ok"`` -> ("ok", None); ``"guard_violation:G-X"`` -> ("guard_violation", "G-X")."""
    m = _STATUS.match(text)
    if not m:
        raise ValueError(f"bad expected status {text!r} (use 'ok' or 'guard_violation:G-CODE')")
    return ("ok", None) if m.group(1) == "ok" else ("guard_violation", m.group(2))


def _solution_key(rel: str) -> tuple[int, int, int] | None:
    """(level, problem, sample) that ``scan_dir`` reads from a path under ``solutions/``."""
    p = Path(rel)
    m = FLAT_NAME.match(p.name)
    if m:
        return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    lm, nm = LEVEL_DIR.match(p.parent.name), NESTED_NAME.match(p.name)
    if lm and nm and len(p.parts) == 2:
        return int(lm.group(1)), int(nm.group(1)), 0
    return None


def read_expected(
    root: Path, levels: set[int] | None = None
) -> tuple[list[ExpectedSolution], list[str]]:
    """Every ``[[solution]]`` of ``root/expected/*.toml`` (of ``levels``, default all) and the
    problems found with them."""
    errors: list[str] = []
    out: list[ExpectedSolution] = []
    files = sorted((root / "expected").glob("*.toml"))
    if not files:
        errors.append(f"{root}/expected: no *.toml files")
    for f in files:
        m = _EXPECTED_FILE.match(f.name)
        if not m:
            errors.append(f"{f.name}: expected files are named level<N>.toml")
            continue
        if levels is not None and int(m.group(1)) not in levels:
            continue
        try:
            doc = msgspec.toml.decode(f.read_bytes(), type=ExpectedFile)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            errors.append(f"{f.name}: {e}")
            continue
        for i, s in enumerate(doc.solution):
            where = f"{f.name} solution {i + 1} ({s.path})"
            if s.level != int(m.group(1)):
                errors.append(f"{where}: level {s.level} in {f.name}")
            bad = sorted(set(s.styles) - STYLES)
            if bad:
                errors.append(f"{where}: unknown styles {bad} (known: {sorted(STYLES)})")
            if len(set(s.styles)) != len(s.styles):
                errors.append(f"{where}: a style listed twice")
            for policy in ("strict", "kernelbench"):
                try:
                    s.expected(policy)
                except ValueError as e:
                    errors.append(f"{where}: {policy}: {e}")
            out.append(s)
    return out, errors


def load_corpus(root: Path | None = None, levels: set[int] | None = None) -> Corpus:
    """Read and validate the corpus (its ``levels``, default all); raises :class:`CorpusError` listing every problem: unknown
    keys, unknown styles or statuses, paths or problem files that do not exist, a path whose name
    says another level/problem than its table, duplicates, and solutions under ``solutions/``
    without a table (or tables that ``kernelbench-eval solutions`` would not pair)."""
    root = Path(root or DEFAULT_ROOT)
    expected, errors = read_expected(root, levels)
    problems: dict[tuple[int, int], Path] = {}
    for d in sorted((root / "KernelBench").glob("level*")):
        for f in d.iterdir():
            pm = PROBLEM_FILE.match(f.name)
            if pm and d.name[5:].isdigit() and (levels is None or int(d.name[5:]) in levels):
                problems[(int(d.name[5:]), int(pm.group(1)))] = f
    by_path: dict[str, ExpectedSolution] = {}
    for s in expected:
        if s.path in by_path:
            errors.append(f"{s.path}: listed twice")
            continue
        by_path[s.path] = s
        p = root / s.path
        if not p.exists():
            errors.append(f"{s.path}: no such file or folder")
        rel = s.path.removeprefix("solutions/")
        key = _solution_key(rel) if s.path.startswith("solutions/") else None
        if key is None:
            errors.append(f"{s.path}: not a solution path that `solutions --dir` reads")
        elif key[:2] != (s.level, s.problem):
            errors.append(
                f"{s.path}: names level {key[0]} problem {key[1]}, table says "
                f"level {s.level} problem {s.problem}"
            )
        if (s.level, s.problem) not in problems:
            errors.append(f"{s.path}: no problem file KernelBench/level{s.level}/{s.problem}_*.py")
    tasks = []
    for t in iter_problems(root, levels):
        if isinstance(t, ProblemIssue):
            errors.append(f"{t.path}: {t.message}")
        else:
            tasks.append(t)
    found, bad = scan_dir(root / "solutions", origin="corpus")
    if levels is not None:
        found = [f for f in found if f.level in levels]
        bad = [b for b in bad if (m := LEVEL_DIR.match(Path(b).parts[0])) and int(m[1]) in levels]
    errors += [f"solutions/{b}" for b in bad]
    rep = import_solutions(tasks, found)
    errors += [f"solution without a problem: {o}" for o in rep.orphans]
    entries: list[Entry] = []
    seen: set[tuple[int, int, int]] = set()
    for c in rep.candidates:
        rel = "solutions/" + c.solution.origin.removeprefix("corpus/")
        k = (c.meta["level"], c.meta["problem_id"], c.meta["sample"])
        if k in seen:
            errors.append(f"{rel}: a second solution for level {k[0]} problem {k[1]} sample {k[2]}")
        seen.add(k)
        s = by_path.pop(rel, None)
        if s is None:
            errors.append(f"{rel}: a solution without a table in expected/level{k[0]}.toml")
            continue
        entries.append(Entry(expected=s, candidate=c))
    for rel in by_path:
        if (root / rel).exists():
            errors.append(f"{rel}: listed but `solutions --dir` pairs no candidate with it")
    if errors:
        raise CorpusError(f"{root}: {len(errors)} problems:\n  " + "\n  ".join(errors))
    return Corpus(root=root, entries=entries)
