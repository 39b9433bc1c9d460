"""Render metrics as JSON, a Markdown table laid out like the paper's, and a speed-up plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from . import metrics as M

# The paper's published KernelBench rows (CUDA Agent, Seed1.6 base, H100-class GPU).
PAPER_ROWS: dict[str, dict[str, str]] = {
    "overall": {
        "pass_rate": "98.8%",
        "faster_than_eager": "98.4%",
        "faster_than_compile": "96.8%",
        "geomean_vs_eager": "2.60x",
        "geomean_vs_compile": "2.11x",
    },
    "1": {"faster_than_compile": "97-100%"},
    "2": {"faster_than_compile": "100%"},
    "3": {
        "pass_rate": "94.0%",
        "faster_than_eager": "94.0%",
        "faster_than_compile": "90.0-92.0%",
        "geomean_vs_eager": "1.80x",
        "geomean_vs_compile": "1.52x",
    },
}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _x(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def markdown(
    rows: list[M.LevelMetrics],
    settings: dict[str, Any],
    by_mode: dict[str, list[M.LevelMetrics]] | None = None,
) -> str:
    """The report as Markdown: settings, our table, the compile columns per baseline mode (when
    ``by_mode`` has several), the paper's row, and every definition."""
    lines = ["# KernelBench report", ""]
    lines.append("Settings: " + ", ".join(f"{k} = {v}" for k, v in settings.items()))
    lines.append("")
    lines.append(
        "| split | problems | pass rate | faster than eager (>0% / >5%) | faster than compile "
        "(>0% / >5%) | geomean vs eager (all / correct) | geomean vs compile (all / correct) "
        "| mean reward |"
    )
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        name = "overall" if r.level == "overall" else f"level {r.level}"
        lines.append(
            f"| {name} | {r.problems} | {_pct(r.pass_rate)} | {_pct(r.faster_than_eager)} / "
            f"{_pct(r.faster_than_eager_5pct)} | {_pct(r.faster_than_compile)} / "
            f"{_pct(r.faster_than_compile_5pct)} | {_x(r.geomean_speedup_vs_eager_all)} / "
            f"{_x(r.geomean_speedup_vs_eager_correct)} | {_x(r.geomean_speedup_vs_compile_all)} / "
            f"{_x(r.geomean_speedup_vs_compile_correct)} | {r.mean_reward:+.2f} |"
        )
    lines += _shape_lines(rows)
    lines += _mode_lines(by_mode)
    lines += ["", "The paper's published rows (CUDA Agent, KernelBench L1-L3, 250 problems):", ""]
    lines.append(
        "| split | pass rate | faster than eager | faster than compile | geomean vs eager "
        "| geomean vs compile |"
    )
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for key in ("1", "2", "3", "overall"):
        p = PAPER_ROWS[key]
        name = "overall" if key == "overall" else f"level {key}"
        cells = [
            p.get(c, "-")
            for c in (
                "pass_rate",
                "faster_than_eager",
                "faster_than_compile",
                "geomean_vs_eager",
                "geomean_vs_compile",
            )
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Definitions",
        "",
        (M.__doc__ or "").split("Definitions (also printed in every report):")[-1].strip(),
        "",
    ]
    return "\n".join(lines)


def _mode_lines(by_mode: dict[str, list[M.LevelMetrics]] | None) -> list[str]:
    """Speed-ups vs each torch.compile baseline mode, one column group per mode."""
    if not by_mode or len(by_mode) < 2:
        return []
    modes = list(by_mode)
    lines = ["", "### Speed-up vs torch.compile, by its mode", ""]
    head = ["split"] + [f"{m}: faster (>0% / >5%) | {m}: geomean (all / correct)" for m in modes]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("| --- |" + " ---: | ---: |" * len(modes))
    splits = [r.level for r in by_mode[modes[0]]]
    for split in splits:
        cells = ["overall" if split == "overall" else f"level {split}"]
        for m in modes:
            r = next((x for x in by_mode[m] if x.level == split), None)
            if r is None:
                cells += ["-", "-"]
                continue
            cells.append(f"{_pct(r.faster_than_compile)} / {_pct(r.faster_than_compile_5pct)}")
            cells.append(
                f"{_x(r.geomean_speedup_vs_compile_all)} / {_x(r.geomean_speedup_vs_compile_correct)}"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _shape_lines(rows: list[M.LevelMetrics]) -> list[str]:
    """The shape check's table (``--shape-check``), when any result carries it."""
    if all(r.correct_at_task_shape is None for r in rows):
        return []
    lines = [
        "",
        "Shape generalisation (`--shape-check`: each correct solution verified again at a resized "
        "instance of its problem):",
        "",
        "| split | problems | correct at the task's shape | passes at resized shapes "
        "| not resizable (skipped) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        name = "overall" if r.level == "overall" else f"level {r.level}"
        if r.correct_at_task_shape is None:
            lines.append(f"| {name} | {r.problems} | - | - | - |")
            continue
        lines.append(
            f"| {name} | {r.problems} | {r.correct_at_task_shape} "
            f"({_pct(r.correct_at_task_shape / r.problems)}) | {r.passes_at_resized_shapes} "
            f"({_pct(r.passes_at_resized_shapes_rate or 0.0)}) | {r.not_resizable} |"
        )
    return lines


def plot(
    outs: list[M.ProblemOutcome], path: Path, title: str = "KernelBench speed-up vs eager"
) -> Path:
    """PNG of the speed-up distribution per level (log scale); failures counted in the labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted({o.level for o in outs})
    fig, ax = plt.subplots(figsize=(2.2 + 1.8 * len(levels), 4.2), dpi=120)
    data, labels = [], []
    for lv in levels:
        group = [o for o in outs if o.level == lv]
        vals = [
            o.speedup_vs_eager
            for o in group
            if o.correct and o.speedup_vs_eager is not None and o.speedup_vs_eager > 0
        ]
        failed = sum(1 for o in group if not o.correct)
        data.append(vals or [math.nan])
        labels.append(f"level {lv}\n{len(vals)} correct, {failed} failed")
    for i, vals in enumerate(data, start=1):
        xs = [i + 0.15 * math.sin(7.0 * k) for k in range(len(vals))]
        ax.scatter(xs, vals, s=14, alpha=0.7, zorder=3)
    finite = [v for v in data if not all(math.isnan(x) for x in v)]
    if finite:
        ax.boxplot(
            finite,
            positions=[i + 1 for i, v in enumerate(data) if v in finite],
            widths=0.5,
            showfliers=False,
        )
    ax.axhline(1.0, color="grey", lw=1, ls="--", zorder=1)
    ax.set_yscale("log")
    ax.set_xticks(range(1, len(levels) + 1), labels)
    ax.set_ylabel("speed-up vs eager (log)")
    ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
