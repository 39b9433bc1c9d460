"""The CUDA-L1 corpus through our evaluator (issue 27): a verdict for every line, and a table of
verdicts by reason.

    python cudal1.py candidates h100_even_tasks.jsonl -o candidates.jsonl --tasks-out tasks.jsonl
    sandbox eval --backend cuda --gpus all -o results.jsonl --resume < candidates.jsonl
    python cudal1.py summary --candidates candidates.jsonl --results strict=results.jsonl \\
        [--refs cudal1_refs.jsonl] [--env env.txt] [--command CMD] > docs/kernelbench-cudal1.md

Each line ``{"level", "problem_id", "ref_code", "code", ...}`` becomes a Candidate against its
OWN reference (``ref_code``: KernelBench v0, whose sizes differ from today's): the task is
``kernelbench_task("cudal1_L{level}_{id}", ref_code, ...)`` (KernelBench's module mode) and the solution and
pairing are ``kernelbench-eval solutions --jsonl``'s (:func:`scan_jsonl`,
:func:`import_solutions`), so the candidates are what ``kernelbench-eval`` would make.
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from cuda_agent.kernelbench_eval.solutions import import_solutions, scan_jsonl
from cuda_agent.kernelbench_eval.tree import kernelbench_task
from cuda_agent.profiler.program import ProgramError, check_contract
from cuda_agent.records import Candidate, EvalResult, RecordWriter, Task
from cuda_agent.records.jsonl import iter_lines, read_records

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)


class Line(msgspec.Struct, kw_only=True):
    """The fields of a corpus line this script reads (others are ignored)."""

    level: int
    problem_id: int
    ref_code: str
    code: str
    claimed_speedup_vs_eager_h100: float | None = None


def task_name(level: int, problem_id: int) -> str:
    return f"cudal1_L{level}_{problem_id}"


def to_candidates(path: Path) -> tuple[list[Task], list[Candidate], list[str]]:
    """Tasks (one per line, from its ``ref_code``), their candidates, and problems found."""
    lines = []
    issues = []
    for n, raw in iter_lines(path):
        try:
            lines.append(msgspec.json.decode(raw, type=Line))
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise typer.BadParameter(f"{path}:{n}: {e}") from None
    tasks = []
    for ln in lines:
        try:
            missing = check_contract(ln.ref_code)
        except ProgramError as e:
            missing = [str(e)]
        if missing:
            issues.append(f"L{ln.level}/{ln.problem_id}: ref_code lacks {', '.join(missing)}")
        tasks.append(
            kernelbench_task(
                task_name(ln.level, ln.problem_id),
                ln.ref_code,
                ln.level,
                ln.problem_id,
                meta={
                    "corpus": "cuda-l1",
                    "claimed_speedup_vs_eager_h100": ln.claimed_speedup_vs_eager_h100,
                },
            )
        )
    keys = [(t.level, t.problem_id) for t in tasks]
    dup = [k for k, c in collections.Counter(keys).items() if c > 1]
    if dup:
        raise typer.BadParameter(f"{path}: several lines for (level, problem_id) {dup}")
    found, _ = scan_jsonl(path)
    rep = import_solutions(tasks, found)
    cands = []
    for c in rep.candidates:
        origin = f"cuda-l1:L{c.task.level}/{c.task.problem_id}"
        sol = msgspec.structs.replace(c.solution, origin=origin)
        meta = {**c.meta, "name": c.task.name, "corpus": "cuda-l1"}
        meta["claimed_speedup_vs_eager_h100"] = c.task.meta["claimed_speedup_vs_eager_h100"]
        cands.append(msgspec.structs.replace(c, solution=sol, meta=meta))
    issues += [f"no solution: L{t.level}/{t.problem_id}" for t in rep.missing]
    return tasks, cands, issues


@app.command()
def candidates(
    corpus: Annotated[Path, typer.Argument(help="The CUDA-L1 JSONL.")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Candidates.")] = None,
    tasks_out: Annotated[Path | None, typer.Option(help="Also write the tasks here.")] = None,
) -> None:
    """Write one Candidate per corpus line (stdout or -o), its task built from its ref_code."""
    tasks, cands, issues = to_candidates(corpus)
    with RecordWriter(output, append=False) as w:
        w.write_all(cands)
    if tasks_out is not None:
        with RecordWriter(tasks_out, append=False) as w:
            w.write_all(tasks)
    for i in issues:
        print(f"cudal1: {i}", file=sys.stderr)
    print(f"cudal1: {len(cands)} candidates from {len(tasks)} lines", file=sys.stderr)


# ---------------------------------------------------------------- verdicts


_NUM = re.compile(r"(?<![A-Za-z])[-+]?(?:0x[0-9a-fA-F]+|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def _words(text: str, n: int) -> str:
    text = re.sub(r"(?<![\w+])/[\w.+-]+(?:/[\w.+-]+)+", "<path>", text)
    text = _NUM.sub("#", text)
    return " ".join(text.split()[:n]).rstrip(".,;:")


def reason(r: EvalResult, words: int = 8) -> tuple[str, str, str]:
    """(status, rejecting guard codes or "-", first words with numbers as #: of the first code's
    description for a guard violation, else of the message)."""
    codes = sorted({g.code for g in r.guards if g.severity == "reject"})
    msg = r.message or ""
    if codes and r.status == "guard_violation":
        # the guards' messages name the evidence (an op, a line): the check's own description
        # groups alike lines instead
        from cuda_agent.guards import CHECKS

        check = CHECKS.get(codes[0])
        msg = check.description if check is not None else msg
    return str(r.status), "+".join(codes) or "-", _words(msg, words)


def detail(r: EvalResult) -> str:
    """One line saying more than the reason: the first compiler error line, else the message."""
    if r.compile is not None and not r.compile.ok and r.compile.log_tail:
        errs = [x for x in r.compile.log_tail.splitlines() if "error" in x.lower()]
        if errs:
            return errs[0].strip()
    return r.message


def _cell(s: str, n: int) -> str:
    s = re.sub(r"\s+", " ", s or "").strip()
    s = s if len(s) <= n else s[: n - 1] + "…"
    return s.replace("|", "\\|")


def _env(lines: list[str]) -> tuple[str, str, str]:
    date = lines[0] if lines else "(date: fill in)"
    commit = next((x.split()[1] for x in lines if x.startswith("commit ")), "(commit: fill in)")
    gpu = next((x for x in lines if "NVIDIA" in x), "(GPU: fill in)")
    return date, gpu, commit


def _examples(cs: list[Candidate], n: int = 6) -> str:
    ex = ", ".join(f"L{c.task.level}/{c.task.problem_id}" for c in cs[:n])
    return ex + (f" (+{len(cs) - n})" if len(cs) > n else "")


def render_policy(
    label: str, cands: list[Candidate], results: list[EvalResult], refs: dict[str, Any]
) -> list[str]:
    """One results set's section: verdicts by status, by reason, by guard code, every line."""
    by_key = {r.key: r for r in results}  # the last result of a candidate counts
    rows = [(c, by_key.get(c.key)) for c in cands]
    have = [(c, r) for c, r in rows if r is not None]
    out = [
        f"## Guard policy `{label}`" if label else "## Verdicts",
        "",
        f"{len(have)} of {len(rows)} lines have a verdict"
        + ("." if len(have) == len(rows) else f": **{len(rows) - len(have)} not yet**."),
        "",
        "| status | lines |",
        "| --- | ---: |",
    ]
    st = collections.Counter(str(r.status) for _, r in have)
    out += [f"| {k} | {v} |" for k, v in st.most_common()]
    groups: dict[tuple[str, str, str], list[Candidate]] = {}
    codes: dict[str, list[Candidate]] = {}
    for c, r in have:
        groups.setdefault(reason(r), []).append(c)
        for g in sorted({g.code for g in r.guards if g.severity == "reject"}):
            codes.setdefault(g, []).append(c)
    out += [
        "",
        f"### Verdicts by reason{f' ({label})' if label else ''}",
        "",
        "Reason: the status, the guard codes that rejected, and the first words (numbers as #) "
        "of the first code's description (docs/guards.md), else of the message.",
        "",
        "| status | guard | reason | lines | examples |",
        "| --- | --- | --- | ---: | --- |",
    ]
    for (s, g, w), cs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        out.append(f"| {s} | {g} | {_cell(w, 90)} | {len(cs)} | {_examples(cs)} |")
    if codes:
        from cuda_agent.guards import CHECKS

        out += [
            "",
            "Lines rejected by each guard code (a line may have several):",
            "",
            "| guard | lines | what it catches | examples |",
            "| --- | ---: | --- | --- |",
        ]
        for code, cs in sorted(codes.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            check = CHECKS.get(code)
            what = check.description if check is not None else ""
            out.append(f"| {code} | {len(cs)} | {_cell(what, 100)} | {_examples(cs)} |")
    out += [
        "",
        f"### Every line{f' ({label})' if label else ''}",
        "",
        "`x eager`: our speed-up over eager PyTorch (the sandbox's paired baseline, else the "
        "references run's eager median over the candidate's median, marked ~); `claimed`: "
        "CUDA-L1's own figure on an H100.",
        "",
        "| problem | status | guard | message | x eager | claimed |",
        "| --- | --- | --- | --- | ---: | ---: |",
    ]
    for c, r in rows:
        claimed = c.meta.get("claimed_speedup_vs_eager_h100")
        cl = "-" if claimed is None else f"{claimed:.2f}"
        if r is None:
            out.append(f"| L{c.task.level}/{c.task.problem_id} | (no verdict) | | | | {cl} |")
            continue
        s, g, _ = reason(r)
        sp = "-" if r.speedup_vs_eager is None else f"{r.speedup_vs_eager:.2f}"
        cand_ms = r.timing.candidate.median_ms if r.timing and r.timing.candidate else None
        ref = refs.get(c.task.id)
        if r.speedup_vs_eager is None and cand_ms and ref and ref.get("eager_ms"):
            sp = f"~{ref['eager_ms'] / cand_ms:.2f}"
        out.append(
            f"| L{c.task.level}/{c.task.problem_id} | {s} | {g} | {_cell(detail(r), 110)} "
            f"| {sp} | {cl} |"
        )
    return out


def render(
    cands: list[Candidate],
    results: list[EvalResult] | list[tuple[str, list[EvalResult]]],
    refs: dict[str, Any],
    env: list[str],
    command: str,
) -> str:
    """The Markdown document: the run's header, then per results set (a guard policy) the
    verdicts by status, by reason, by guard code, and one row per line."""
    sets = results if results and isinstance(results[0], tuple) else [("", results)]
    cands = sorted(cands, key=lambda c: (c.task.level or 0, c.task.problem_id or 0))
    date, gpu, commit = _env(env)
    out = [
        "# The CUDA-L1 corpus through our evaluator",
        "",
        f"{date}; GPU: {gpu}; commit `{commit}`; command: `{command or '(fill in)'}`.",
        "",
        f"{len(cands)} lines of CUDA-L1's released H100 kernels (`../shared/corpora/cuda-l1`, "
        "MIT), each evaluated against its own KernelBench-v0 reference.",
        "",
    ]
    for label, rs in sets:
        out += render_policy(label, cands, rs, refs) + [""]
    return "\n".join(out).rstrip("\n") + "\n"


def _records(path: Path, kind: type) -> list[Any]:
    out = []
    for _, rec in read_records(path, kind):
        if isinstance(rec, kind):
            out.append(rec)
    return out


@app.command()
def summary(
    candidates_file: Annotated[Path, typer.Option("--candidates", help="From `candidates`.")],
    results_files: Annotated[
        list[str],
        typer.Option(
            "--results",
            help="sandbox eval's results, as FILE or POLICY=FILE (repeat for several policies).",
        ),
    ],
    refs: Annotated[
        Path | None, typer.Option(help="kb_references.py rows of the same tasks (eager ms).")
    ] = None,
    env: Annotated[Path | None, typer.Option(help="The run's env.txt.")] = None,
    command: Annotated[str, typer.Option(help="The command that made the results.")] = "",
) -> None:
    """Print the Markdown verdict tables (a result missing for a line is said so)."""
    cands = _records(candidates_file, Candidate)
    sets = []
    for spec in results_files:
        label, _, name = spec.rpartition("=") if "=" in spec.split("/")[0] else ("", "", spec)
        path = Path(name)
        sets.append((label, _records(path, EvalResult) if path.exists() else []))
    ref_rows: dict[str, Any] = {}
    if refs is not None and refs.exists():
        for _, raw in iter_lines(refs):
            try:
                d = json.loads(raw)
            except json.JSONDecodeError:
                continue
            ref_rows[d.get("task_id", "")] = d
    lines = env.read_text().splitlines() if env is not None and env.exists() else []
    sys.stdout.write(render(cands, sets, ref_rows, lines, command))


if __name__ == "__main__":
    app()
