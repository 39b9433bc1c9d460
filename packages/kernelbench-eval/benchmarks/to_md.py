"""Turn the kernelbench-eval GPU check's output into docs: a Markdown section, and optionally a copy
of the report (report.md, report.json, speedup.png) into a docs folder.

Usage: python to_md.py OUT_DIR/kbeval [--copy-to docs/kernelbench-example] > section.md
OUT_DIR/kbeval holds summary.json, env.txt and report/ (written by bin/gpu-check-kbeval.sh).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def _f(x, fmt: str = "{:.2f}x", none: str = "n/a") -> str:
    return none if x is None else fmt.format(x)


def _env(d: Path) -> list[str]:
    p = d / "env.txt"
    return p.read_text().splitlines() if p.exists() else []


def render(d: Path, command: str, report_link: str | None) -> str:
    """The section: settings, per-problem outcomes against the expected ones, the report table."""
    s = json.loads((d / "summary.json").read_text())
    env = _env(d) + ["?"] * 4
    lines = [
        f"## KernelBench fixture tree through the {s['backend']} path (issue #6)",
        "",
        f"{env[0]}; GPU: {env[2]}; {env[3]}; commit `{env[1][:12]}`; command: `{command}` "
        f"(backend {s['backend']}). Wall time: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in s["wall_s"].items())
        + f"; exit codes {s['exit_codes']}.",
        "",
        f"{s['tasks']} problems with a valid contract (one more fixture file breaks the contract "
        f"and is skipped), {s['candidates']} candidates (one problem has no solution: a failure), "
        f"{s['results']} results.",
        "",
        "| problem | status (expected) | speed-up vs eager | vs compile | "
        "candidate / eager / compile (ms) | reward | eval (s) |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: |",
    ]
    exp = s.get("expected_status", {})
    for p in sorted(s["problems"], key=lambda p: (p["level"] or 0, p["problem_id"] or 0)):
        key = f"{p['level']}/{p['problem_id']}"
        e = exp.get(key, "?")
        mark = "" if p["status"] == e else " **unexpected**"
        lines.append(
            f"| L{key} {p['name']} | {p['status']} ({e}){mark} | "
            f"{_f(p['speedup_vs_eager'])} | {_f(p['speedup_vs_compile'])} | "
            f"{_f(p['candidate_ms'], '{:.4f}')} / {_f(p['eager_ms'], '{:.4f}')} / "
            f"{_f(p['compile_ms'], '{:.4f}')} | {_f(p['reward'], '{:+.1f}')} | "
            f"{_f(p['seconds'], '{:.1f}')} |"
        )
    lines.append("")
    rep_md = d / "report" / "report.md"
    if rep_md.exists():
        body = rep_md.read_text().split("\n", 1)[1].strip()  # drop its own H1
        lines += ["### The report (`kernelbench-eval report`)", "", body, ""]
        if report_link:
            lines += [f"![speed-up per level]({report_link}/speedup.png)", ""]
    else:
        lines += ["(no report was written; see report.stderr.txt)", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="the kbeval output folder (holds summary.json)")
    ap.add_argument("--command", default='run(command="bash bin/gpu-check-kbeval.sh")')
    ap.add_argument(
        "--copy-to",
        type=Path,
        default=None,
        help="copy report.md, report.json, speedup.png and summary.json here (e.g. "
        "docs/kernelbench-example); the section then links the plot relative to docs/",
    )
    a = ap.parse_args()
    link = None
    if a.copy_to is not None:
        a.copy_to.mkdir(parents=True, exist_ok=True)
        for name in ("report.md", "report.json", "speedup.png"):
            src = a.dir / "report" / name
            if src.exists():
                shutil.copy(src, a.copy_to / name)
        shutil.copy(a.dir / "summary.json", a.copy_to / "summary.json")
        link = a.copy_to.name
    print(render(a.dir, a.command, link))


if __name__ == "__main__":
    main()
