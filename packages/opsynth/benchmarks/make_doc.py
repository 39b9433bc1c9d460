"""Turn the JSON of bin/gpu-check-opsynth.sh into docs/opsynth.md (markdown on stdout).

    uv run python packages/opsynth/benchmarks/make_doc.py GPU_OUT/opsynth > docs/opsynth.md
    uv run python packages/opsynth/benchmarks/make_doc.py --placeholder > docs/opsynth.md

Reads RUN_DIR/{env,ours,ops6k}.json and the task files next to them (composed.jsonl,
kept.*.jsonl), and the Ops-6K full-file statistics committed beside this script
(ops6k_full_describe.json from `opsynth stats --json`, ops6k_full_import_report.json from
`opsynth import-ops6k --report`). Without a run directory it writes the Ops-6K side only.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# the device call that produced the JSON (DOC_CMD overrides: say the exact call you made)
CMD = os.environ.get(
    "DOC_CMD",
    'run(command="bash bin/gpu-check-opsynth.sh", carry=[".whl", ".gpu-data"], timeout_s=300)',
)


def load(p: Path) -> Any:
    return json.loads(p.read_text()) if p.exists() else None


def tasks(paths: list[Path]) -> list[Any]:
    from cuda_agent.records.jsonl import load_records
    from cuda_agent.records.types import Task

    return [t for p in paths if p.exists() for t in load_records(p) if isinstance(t, Task)]


def f_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def fmt_ms(d: dict[str, float] | None, key: str) -> str:
    return "-" if not d else f"{d[key]:g}"


def side_table(sets: dict[str, dict[str, Any]]) -> list[str]:
    names = list(sets)
    out = ["| | " + " | ".join(names) + " |", "|---" + "|---:" * len(names) + "|"]

    def row(label: str, f) -> None:
        out.append(f"| {label} | " + " | ".join(f(sets[n]) for n in names) + " |")

    row("tasks in / checked", lambda s: f"{s['tasks_input']} / {s['tasks_done']}")
    row("passed", lambda s: f"{s['passed']} ({f_pct(s['pass_rate'])})")
    row("filter workers / GPUs", lambda s: f"{s['workers']} / {s.get('gpus', 1)}")
    row(
        "filter wall time",
        lambda s: (
            f"{s['filter_wall_s']:.0f} s"
            + (" (stopped at the deadline)" if s["stopped_at_deadline"] else "")
        ),
    )
    row(
        "**throughput, tasks checked per GPU-hour**",
        lambda s: f"**{s['tasks_per_hour']:,.0f}**" if s["tasks_per_hour"] else "-",
    )
    row(
        "tasks kept per GPU-hour",
        lambda s: f"{s['kept_per_hour']:,.0f}" if s["kept_per_hour"] else "-",
    )
    row(
        "worker seconds per task, median / p90",
        lambda s: (
            f"{fmt_ms(s['probe_s_per_task'], 'p50')} / {fmt_ms(s['probe_s_per_task'], 'p90')}"
        ),
    )
    row("outside the window at first measurement", lambda s: str(s["outside_window_first"]))
    row("rescaled (kept / all)", lambda s: f"{s['rescaled_kept']} / {s['rescaled_any']}")
    row(
        "eager ms of kept, p10 / median / p90",
        lambda s: " / ".join(fmt_ms(s["eager_ms_kept"], k) for k in ("p10", "p50", "p90")),
    )
    return out


def funnel_table(sets: dict[str, dict[str, Any]]) -> list[str]:
    names = list(sets)
    out = [
        "| check (in probe order) | "
        + " | ".join(f"{n}: entered / rejected / pass rate" for n in names)
        + " |",
        "|---" + "|---:" * len(names) + "|",
    ]
    stages = [f["check"] for f in next(iter(sets.values()))["funnel"]]
    for i, st in enumerate(stages):
        cells = []
        for n in names:
            f = sets[n]["funnel"][i]
            cells.append(f"{f['entered']} / {f['rejected']} / {f_pct(f['pass_rate'])}")
        out.append(f"| {st} | " + " | ".join(cells) + " |")
    return out


def reasons_table(sets: dict[str, dict[str, Any]]) -> list[str]:
    names = list(sets)
    reasons = sorted(
        {r for s in sets.values() for r in s["reasons"]},
        key=lambda r: -sum(s["reasons"].get(r, 0) for s in sets.values()),
    )
    out = ["| reason | " + " | ".join(names) + " |", "|---" + "|---:" * len(names) + "|"]
    for r in reasons:
        out.append(
            f"| `{r}` | " + " | ".join(str(sets[n]["reasons"].get(r, 0)) for n in names) + " |"
        )
    return out


def hist_table(sets: dict[str, dict[str, Any]], key: str) -> list[str]:
    names = list(sets)
    bins = list(next(iter(sets.values()))[key])
    out = ["| eager ms | " + " | ".join(names) + " |", "|---" + "|---:" * len(names) + "|"]
    for b in bins:
        out.append(f"| {b} | " + " | ".join(str(sets[n][key].get(b, 0)) for n in names) + " |")
    return out


def static_section() -> list[str]:
    rep = load(HERE / "ops6k_full_import_report.json")
    if not rep:
        return []
    n = rep["imported"]
    out = [
        "## Ops-6K, the whole released file (static scan, CPU)",
        "",
        "`opsynth import-ops6k cuda_agent_ops_6k.parquet --kernelbench tests/fixtures/KernelBench "
        "--report packages/opsynth/benchmarks/ops6k_full_import_report.json`",
        "",
        "| finding | rows | share |",
        "|---|---:|---:|",
    ]
    for k, v in sorted(rep["issues"].items(), key=lambda kv: -kv[1]):
        out.append(f"| `{k}` | {v:,} | {100 * v / n:.1f}% |")
    kinds = ", ".join(f"`{k}` {v}" for k, v in rep.get("random_forward_kinds", {}).items())
    out += ["", f"Randomness in `forward`: {kinds}.", ""]
    return out


def composition_section(run: Path | None) -> list[str]:
    from cuda_agent.opsynth.stats import describe, markdown_compare

    named: dict[str, Any] = {}
    if run is not None:
        comp = tasks([run / "composed.jsonl"])
        if comp:
            named[f"ours, composed ({len(comp)})"] = describe(comp)
        kept = tasks(sorted(run.glob("kept.ours.*.jsonl")))
        if kept:
            named[f"ours, kept by the GPU filter ({len(kept)})"] = describe(kept)
        k6 = tasks(sorted(run.glob("kept.ops6k.*.jsonl")))
        if k6:
            named[f"Ops-6K sample, kept ({len(k6)})"] = describe(k6)
    full = load(HERE / "ops6k_full_describe.json")
    if full:
        for v in full["sets"].values():
            v["lengths"] = {int(k): n for k, n in v["lengths"].items()}  # JSON keys are strings
            named[f"Ops-6K, released ({v['tasks']:,})"] = v
    return [
        "## Composition, side by side",
        "",
        "Ops per task and operator categories (`opsynth stats`; Ops-6K categories come from its `ops` "
        "labels by name rules, and 10% of those labels are wrong, see below).",
        "",
        markdown_compare(named),
        "",
    ]


def phases_lines(sets: dict[str, dict]) -> list[str]:
    """Where the filter workers' time went, by check (runs that recorded ``phases_s``)."""
    out = []
    for name, s in sets.items():
        ph = s.get("phases_s_total") or {}
        total = sum(ph.values())
        if total:
            parts = ", ".join(f"{k} {v / total:.0%}" for k, v in ph.items() if v / total >= 0.005)
            out.append(f"- {name}: {total:,.0f} worker-seconds: {parts}")
    if not out:
        return []
    return [
        "Where the workers' time went (`meta.filter.phases_s` summed over the tasks; `process`: "
        "forking the probe process and handing the result back; `failed`: the check that "
        "stopped a task):",
        "",
        *out,
        "",
    ]


def sets_of(ours: dict | None, o6: dict | None) -> dict[str, dict]:
    """The sets of a run that have results, by their column name."""
    sets = {"ours": ours} if ours else {}
    if o6 and "skipped" not in o6:
        sets["Ops-6K sample"] = o6
    return sets


def resumed_lines(env: dict, sets: dict[str, dict]) -> list[str]:
    """One line saying which calls a resumed run (``RESUME=1``) was made of, if it was."""
    later = env.get("later_calls") or []
    if not later:
        return []
    calls = "; ".join(
        f"{c.get('date_utc')} UTC, commit `{c.get('git_commit')}`, knobs `{json.dumps(c.get('knobs', {}))}`"
        for c in later
    )
    walls = "; ".join(
        name + ": " + " + ".join(f"{c['wall_s']:.0f}" for c in s["calls"]) + " s"
        for name, s in sets.items()
        if s.get("calls")
    )
    return [
        f"- one run over {len(later) + 1} device calls (`RESUME=1`: each call continues the "
        f"workers' files of the one before; throughput uses the sum of the filter wall times, "
        f"{walls}); later calls: {calls}"
    ]


def main() -> int:
    run = None if len(sys.argv) < 2 or sys.argv[1] == "--placeholder" else Path(sys.argv[1])
    env = load(run / "env.json") if run else None
    ours = load(run / "ours.json") if run else None
    o6 = load(run / "ops6k.json") if run else None
    lines = [
        "# opsynth: the synthesised task set on an H200, and Ops-6K side by side",
        "",
        "Generated by `packages/opsynth/benchmarks/make_doc.py` from the JSON of "
        "`bin/gpu-check-opsynth.sh` (issue 7).",
        "",
    ]
    if not ours:
        lines += [
            "**GPU results pending**: the H200 run has not been made yet. Device command:",
            "",
            f"    {CMD}",
            "",
            "then `uv run python packages/opsynth/benchmarks/make_doc.py <files_at>/opsynth > docs/opsynth.md`.",
            "The Ops-6K side below is computed on the CPU from the released parquet.",
            "",
        ]
    else:
        e = ours.get("env", env or {})
        lines += [
            f"- date (UTC): {e.get('date_utc')}; GPU: {str(e.get('gpu')).replace(chr(10), ' + ')}; "
            f"{e.get('cores')} CPU cores; "
            f"backend `{e.get('backend')}`; git commit `{e.get('git_commit')}`",
            f"- command: `{CMD}`; knobs: `{json.dumps(e.get('knobs', {}))}`",
            f"- filter: `opsynth filter {' '.join(ours.get('filter_args', []))}`, window "
            f"{ours['window_ms']} ms eager time, one process per task, {ours['workers']} workers "
            f"spread round robin over {ours.get('gpus', 1)} GPU(s); eager timing serialised "
            "across the workers of a GPU by the GPU's gate (`cuda_agent.sandbox.gate`) so no "
            "two tasks are timed at once on one GPU.",
            *resumed_lines(env or e, sets_of(ours, o6)),  # env.json lists every call
            f"- composed: {ours['compose']['composed']} tasks (`--size {ours['compose']['size']}`) "
            f"in {ours['compose']['wall_s']:.0f} s by {ours['compose']['processes']} processes; "
            f"lengths {ours['compose']['lengths']}",
            "",
        ]
        sets = sets_of(ours, o6)
        if "Ops-6K sample" in sets:
            e6 = o6.get("env") or {}
            if (e6.get("date_utc"), e6.get("git_commit")) != (
                e.get("date_utc"),
                e.get("git_commit"),
            ):
                lines[-1:-1] = [  # the two sets came from different runs: say so
                    f"- the Ops-6K sample column comes from another run: {e6.get('date_utc')} UTC, "
                    f"git commit `{e6.get('git_commit')}`, {o6.get('workers')} workers on "
                    f"{o6.get('gpus', 1)} GPU(s), knobs `{json.dumps(e6.get('knobs', {}))}`",
                ]
        lines += ["## Throughput and outcome", ""] + side_table(sets) + [""]
        lines += [
            "Throughput counts every task the filter finished (kept or rejected) over the filter's "
            "wall time per GPU the workers shared (tasks / wall / GPUs); a task outside the window is rescaled (batch size) and re-probed "
            "up to twice, and torch.compile runs only for tasks inside the window.",
            "",
        ]
        lines += phases_lines(sets)
        lines += ["## Per-filter pass rates", ""] + funnel_table(sets) + [""]
        lines += ["## Rejection reasons", ""] + reasons_table(sets) + [""]
        lines += [
            "## Runtime distribution (eager ms on the GPU)",
            "",
            "Kept tasks (after any rescaling):",
            "",
        ]
        lines += hist_table(sets, "eager_ms_kept_hist") + [""]
        lines += [
            "Every task timed, at its first measurement (as composed / as released, before rescaling):",
            "",
        ]
        lines += hist_table(sets, "eager_ms_first_hist") + [""]
        if o6 and "skipped" not in o6:
            lines += [
                "## Our filter on 300 rows of Ops-6K",
                "",
                f"Rows checked: {o6['tasks_done']} of {o6['tasks_input']} "
                f"(sample `import-ops6k --sample 300 --seed 0`). Rejected: "
                f"**{o6['tasks_done'] - o6['passed']}** "
                f"({f_pct(1 - o6['pass_rate']) if o6['pass_rate'] is not None else '-'}).",
                "",
                "| reason | rows | examples |",
                "|---|---:|---|",
            ]
            for r, n in o6["reasons"].items():
                ex = "; ".join(
                    f"row {x.get('row', '?')} `{x['name']}`: {' '.join(x['detail'].split())[:120]}".replace(
                        "|", "\\|"
                    )
                    for x in o6["examples"].get(r, [])[:2]
                )
                lines.append(f"| `{r}` | {n} | {ex} |")
            lines.append("")
        elif o6:
            lines += ["## Our filter on 300 rows of Ops-6K", "", o6["skipped"], ""]
    lines += composition_section(run)
    lines += static_section()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
