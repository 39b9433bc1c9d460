"""The positive corpus on a GPU: every honest solution's verdict against its expected one, its
speed-up vs eager, and (given two runs) whether the speed-up held within 3%.

Usage (repo root, after ``. bin/gpu-env.sh`` on the GPU machine):

  python packages/kernelbench-eval/benchmarks/positive_corpus.py run --policy strict \\
      --out gpu-out/positive --runs 2
  python packages/kernelbench-eval/benchmarks/positive_corpus.py check RESULTS.jsonl \\
      [RESULTS2.jsonl] [--policy strict]
  # two separate runs under different policies (each judged under its own; the 3% check
  # between them): results-strict-1.jsonl results-kernelbench-1.jsonl

``run`` is ``kernelbench-eval tasks --root corpus/positive | solutions --dir
corpus/positive/solutions | run --backend cuda --guard-policy P`` (resumable: ``-o --resume``;
run ``i`` writes ``OUT/results-<P>-<i>.jsonl``, ``results-<P>-paired-<i>.jsonl`` with
``--paired-eager``, ``-robust`` before the run number with ``--robust`` (the robust setting,
``--stress-trials --shape-check``) and ``-<mode>`` with ``--baseline-compile-mode``; ``--no-compile-baseline`` unless ``--compile-baseline``), then
``check`` on what it wrote. ``check`` prints one row per solution and a summary, and writes
``--json`` when asked. On results of the robust setting it adds how many of the solutions
expected ``ok`` kept passing and, for the others, why (the stress variant failed, the shape
check, another status), and which stress variants were skipped because the reference itself is
unstable under them (reported, not failed).

A false rejection: a ``guard_violation`` where the corpus expects ``ok``, or one whose rejecting
codes do not include the expected code. Exit codes: 0 all as expected; 1 at least one false
rejection; 3 no false rejection, but another status differs from the expected one (incorrect,
compile_error, ..., or a rejection that was expected and not made), a solution has no result,
or a speed-up moved by more than 3% between the two runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from cuda_agent.kernelbench_eval.corpus import DEFAULT_ROOT, Corpus, Entry, load_corpus
from cuda_agent.kernelbench_eval.tree import parse_ranges
from cuda_agent.records import EvalResult
from cuda_agent.records.jsonl import load_records

CLI = [sys.executable, "-m", "cuda_agent.kernelbench_eval.cli"]
WITHIN = 0.03


@dataclass
class Row:
    path: str
    level: int
    problem: int
    styles: list[str]
    expected: str
    got: list[str]  # one status per run ("missing" when a run has no result)
    rejects: list[list[str]]  # rejecting guard codes per run
    speedup: list[float | None]  # vs eager, per run
    ratio: float | None  # run 2 / run 1
    verdict: str  # "ok" | "FALSE-REJECTION" | "MISMATCH" | "MISSING" | "UNSTABLE"
    message: str = ""


def _status(r: EvalResult | None) -> tuple[str, list[str]]:
    if r is None:
        return "missing", []
    codes = sorted({g.code for g in r.guards if g.severity == "reject"})
    return str(r.status), codes


def judge(entry: Entry, runs: list[tuple[str, dict[str, EvalResult]]]) -> Row:
    """One solution's row: its results (one per run, each under its guard policy) against what
    the corpus expects under that policy."""
    sid = entry.candidate.solution.id
    res = [run.get(sid) for _, run in runs]
    got, rejects = zip(*(_status(r) for r in res), strict=True)
    speed = [r.speedup_vs_eager if r is not None else None for r in res]
    verdict = "ok"
    expect_ok = True
    for (policy, _), st, codes in zip(runs, got, rejects, strict=True):
        exp_status, exp_code = entry.expected.expected(policy)
        expect_ok = expect_ok and exp_status == "ok"
        if st == "missing":
            verdict = "MISSING" if verdict == "ok" else verdict
        elif st == "guard_violation" and (exp_status == "ok" or exp_code not in codes):
            verdict = "FALSE-REJECTION"
        elif st != exp_status and verdict != "FALSE-REJECTION":
            verdict = "MISMATCH"
    ratio = None
    if len(speed) == 2 and speed[0] and speed[1]:
        ratio = speed[1] / speed[0]
        if verdict == "ok" and expect_ok and abs(ratio - 1) > WITHIN:
            verdict = "UNSTABLE"
    msg = next(
        (
            r.message
            for (policy, _), r in zip(runs, res, strict=True)
            if r is not None and str(r.status) != entry.expected.expected(policy)[0]
        ),
        "",
    )
    if verdict == "UNSTABLE":
        msg = _moved_where(res[0], res[1])
    return Row(
        path=entry.expected.path.removeprefix("solutions/"),
        level=entry.expected.level,
        problem=entry.expected.problem,
        styles=list(entry.expected.styles),
        expected=" / ".join(dict.fromkeys(getattr(entry.expected, p) for p, _ in runs)),
        got=list(got),
        rejects=[list(c) for c in rejects],
        speedup=speed,
        ratio=ratio,
        verdict=verdict,
        message=msg[:300],
    )


def _moved_where(a: EvalResult | None, b: EvalResult | None) -> str:
    """Which side of a speed-up moved between two runs, and where each was timed: medians of
    the candidate and eager, SM and memory clocks, the GPU (as far as the results say)."""
    parts = []
    for side in ("candidate", "eager"):
        sa, sb = (getattr(r.timing, side, None) if r and r.timing else None for r in (a, b))
        if sa is None or sb is None:
            continue
        line = f"{side} {sa.median_ms:.4g} -> {sb.median_ms:.4g} ms"
        for label, field in (("SM", "sm_clock_mhz"), ("mem", "mem_clock_mhz")):
            ca, cb = getattr(sa, field), getattr(sb, field)
            if ca is not None and cb is not None:
                line += f", {label} {ca:.0f} -> {cb:.0f} MHz"
        if sa.gpu_uuid and sb.gpu_uuid:
            line += ", same GPU" if sa.gpu_uuid == sb.gpu_uuid else ", another GPU"
        parts.append(line)
    return "; ".join(parts) or "no timing details in the results"


def _results(path: Path) -> dict[str, EvalResult]:
    return {r.solution_id: r for r in load_records(path, EvalResult)}


def _policies(runs: list[dict[str, EvalResult]], given: str | None) -> list[str]:
    """Each run's guard policy: the one its results carry (one per run), or ``given``."""
    out = []
    for i, run in enumerate(runs, 1):
        seen = {str(r.meta.get("guard_policy")) for r in run.values()}
        if given is not None:
            if seen - {given, "None"}:
                raise SystemExit(f"run {i} was run under {sorted(seen)}, not --policy {given}")
            out.append(given)
        elif len(seen) != 1 or not seen <= {"strict", "kernelbench"}:
            raise SystemExit(
                f"run {i}'s results carry guard policies {sorted(seen)}: give --policy"
            )
        else:
            out.append(seen.pop())
    return out


def _fmt(x: float | None, f: str = "{:.2f}x") -> str:
    return "-" if x is None else f.format(x)


def table(rows: list[Row], policy: str, nruns: int) -> str:
    """The per-solution table (Markdown) and a summary line."""
    head = ["solution", "styles", f"expected ({policy})", "got", "rejected by", "speed-up"]
    if nruns == 2:
        head += ["speed-up run 2", "ratio", "within 3%"]
    head += ["verdict"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r.path,
            ", ".join(r.styles),
            r.expected,
            " / ".join(r.got),
            " / ".join(",".join(c) or "-" for c in r.rejects),
            _fmt(r.speedup[0]),
        ]
        if nruns == 2:
            within = "-" if r.ratio is None else ("yes" if abs(r.ratio - 1) <= WITHIN else "NO")
            cells += [_fmt(r.speedup[1]), _fmt(r.ratio, "{:.3f}"), within]
        cells += [r.verdict + (f" ({r.message})" if r.message and r.verdict != "ok" else "")]
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    n = {v: sum(r.verdict == v for r in rows) for v in ("ok", "FALSE-REJECTION", "MISMATCH")}
    n["MISSING"] = sum(r.verdict == "MISSING" for r in rows)
    n["UNSTABLE"] = sum(r.verdict == "UNSTABLE" for r in rows)
    out.append("")
    out.append(
        f"{len(rows)} solutions under `{policy}`: {n['ok']} as expected, "
        f"{n['FALSE-REJECTION']} false rejections, {n['MISMATCH']} other status mismatches, "
        f"{n['MISSING']} without a result"
        + (
            f", {n['UNSTABLE']} speed-ups outside {WITHIN:.0%} between the runs"
            if nruns == 2
            else ""
        )
    )
    return "\n".join(out) + "\n"


def robust_reasons(r: EvalResult | None) -> list[str]:
    """Why a result of the robust setting is not ``ok``: each failed stress variant, a failed
    shape check, or else its status; [] for ``ok``."""
    if r is None:
        return ["no result"]
    if str(r.status) == "ok":
        return []
    stress = r.meta.get("stress_trials") or {}
    out = [f"stress trial `{f['variant']}`" for f in stress.get("failed", [])]
    shape = r.meta.get("shape_check") or {}
    if shape.get("passed") is False:
        out.append("shape check")
    return out or [f"status `{r.status}`"]


def robust_summary(corpus: Corpus, policy: str, run: dict[str, EvalResult]) -> str:
    """Markdown: of the solutions the corpus expects ``ok`` under ``policy``, how many passed
    under the robust setting, the others by reason (a solution counts once per reason), and the
    stress variants skipped because the reference is unstable under them. '' when ``run`` holds
    no result of stress trials or the shape check."""
    results = list(run.values())
    if not any("stress_trials" in r.meta or "shape_check" in r.meta for r in results):
        return ""
    honest = [e for e in corpus.entries if e.expected.expected(policy)[0] == "ok"]
    got = [run.get(e.candidate.solution.id) for e in honest]
    passed = sum(r is not None and str(r.status) == "ok" for r in got)
    reasons = Counter(x for r in got for x in dict.fromkeys(robust_reasons(r)))
    unstable = Counter(
        u["variant"]
        for r in got
        if r is not None
        for u in (r.meta.get("stress_trials") or {}).get("reference_unstable", [])
    )
    lines = [
        "",
        f"Robust setting: {passed} of {len(honest)} solutions expected `ok` under `{policy}` "
        f"passed ({passed / max(len(honest), 1):.0%})",
    ]
    if reasons:
        lines += ["", "| why not | solutions |", "|---|---|"]
        lines += [f"| {k} | {n} |" for k, n in reasons.most_common()]
    if unstable:
        skipped = ", ".join(f"`{k}` {n}" for k, n in unstable.most_common())
        lines += ["", f"Stress variants skipped, the reference unstable under them: {skipped}"]
    return "\n".join(lines) + "\n"


def exit_code(rows: list[Row]) -> int:
    if any(r.verdict == "FALSE-REJECTION" for r in rows):
        return 1
    return 0 if all(r.verdict == "ok" for r in rows) else 3


def check(corpus: Corpus, results: list[Path], policy: str | None, json_out: Path | None) -> int:
    if not 1 <= len(results) <= 2:
        raise SystemExit("give one or two results files")
    runs = [_results(p) for p in results]
    pols = _policies(runs, policy)
    rows = [judge(e, list(zip(pols, runs, strict=True))) for e in corpus.entries]
    pol = " / ".join(dict.fromkeys(pols))
    sys.stdout.write(table(rows, pol, len(runs)))
    for p, run in zip(pols, runs, strict=True):
        sys.stdout.write(robust_summary(corpus, p, run))
    if json_out is not None:
        doc = {
            "policy": pol,
            "results": [str(p) for p in results],
            "rows": [asdict(r) for r in rows],
        }
        json_out.write_text(json.dumps(doc, indent=1) + "\n")
    return exit_code(rows)


def _sh(args: list[str], stdin: Path | None, stdout: Path | None) -> None:
    with (
        open(stdin, "rb") if stdin else open("/dev/null", "rb") as i,
        open(stdout, "wb") if stdout else open("/dev/null", "wb") as o,
    ):
        p = subprocess.run([*CLI, *args], stdin=i, stdout=o)
    if p.returncode != 0:
        raise SystemExit(f"kernelbench-eval {args[0]} failed (exit {p.returncode})")


def run(a: argparse.Namespace) -> int:
    if a.baseline_compile_mode and not a.compile_baseline:
        raise SystemExit(
            "--baseline-compile-mode needs --compile-baseline (no compile baseline is timed)"
        )
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    tasks, cands = out / "tasks.jsonl", out / "candidates.jsonl"
    sel = ["--levels", a.levels] + (["--problems", a.problems] if a.problems else [])
    _sh(["tasks", "--root", str(a.root), "--strict", *sel], None, tasks)
    _sh(["solutions", "--dir", str(a.root / "solutions")], tasks, cands)
    results = []
    for i in range(1, a.runs + 1):
        tags = ("-paired" if a.paired_eager else "") + ("-robust" if a.robust else "")
        if a.baseline_compile_mode not in (None, "default"):
            tags += f"-{a.baseline_compile_mode}"
        res = out / f"results-{a.policy}{tags}-{i}.jsonl"
        extra = ["--timing-config", a.timing_config] if a.timing_config else []
        extra += ["--gpus", a.gpus] if a.gpus else []
        extra += ["--workers-per-gpu", str(a.workers_per_gpu)] if a.workers_per_gpu else []
        extra += [] if a.compile_baseline else ["--no-compile-baseline"]
        extra += ["--paired-eager"] if a.paired_eager else []
        extra += ["--stress-trials", "--shape-check"] if a.robust else []
        extra += (
            ["--baseline-compile-mode", a.baseline_compile_mode] if a.baseline_compile_mode else []
        )
        _sh(
            [
                "run",
                "--backend",
                "cuda",
                "--guard-policy",
                a.policy,
                "-o",
                str(res),
                "--resume",
                *extra,
            ],
            cands,
            None,
        )
        results.append(res)
    corpus = _corpus(a)
    return check(corpus, results, a.policy, a.json or out / f"check-{a.policy}.json")


def _corpus(a: argparse.Namespace) -> Corpus:
    corpus = load_corpus(a.root, parse_ranges(a.levels))
    if a.problems:
        keep = parse_ranges(a.problems)
        corpus.entries = [e for e in corpus.entries if e.expected.problem in keep]
    return corpus


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "check"):
        p = sub.add_parser(name)
        p.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="corpus root")
        p.add_argument("--levels", default="1,2,3", help="levels, e.g. 1 or 1,2,3")
        p.add_argument("--problems", default=None, help="problem ids, e.g. 12,19")
        p.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    r = sub.choices["run"]
    r.add_argument("--policy", choices=("strict", "kernelbench"), default="strict")
    r.add_argument("--out", type=Path, required=True, help="folder for tasks, candidates, results")
    r.add_argument("--runs", type=int, choices=(1, 2), default=2, help="2: the 3%% check")
    r.add_argument("--timing-config", default=None, help="JSON passed to `run --timing-config`")
    r.add_argument("--gpus", default=None, help="passed to `run --gpus`")
    r.add_argument(
        "--workers-per-gpu", type=int, default=None, help="passed to `run --workers-per-gpu`"
    )
    r.add_argument(
        "--compile-baseline",
        action="store_true",
        help="also time torch.compile baselines (10-30 s per task; the check uses eager only)",
    )
    r.add_argument(
        "--paired-eager",
        action="store_true",
        help="passed to `run`: eager timed again beside each candidate (the 3%% check's lever)",
    )
    r.add_argument(
        "--robust",
        action="store_true",
        help="passed to `run` as --stress-trials --shape-check (the robust setting)",
    )
    r.add_argument(
        "--baseline-compile-mode",
        default=None,
        help="passed to `run`: the torch.compile mode of the compile baseline (with "
        "--compile-baseline), e.g. max-autotune",
    )
    c = sub.choices["check"]
    c.add_argument("results", type=Path, nargs="+", help="one or two results.jsonl files")
    c.add_argument("--policy", choices=("strict", "kernelbench"), default=None)
    a = ap.parse_args(argv)
    if a.cmd == "run":
        return run(a)
    return check(_corpus(a), a.results, a.policy, a.json)


if __name__ == "__main__":
    sys.exit(main())
