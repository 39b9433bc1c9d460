"""Turn the agent GPU check's JSON into a Markdown section for docs/lab/history/benchmarks-agent.md.

Usage: python to_md.py OUT_DIR/agent [--command "bash bin/gpu-check-agent.sh"] > section.md
OUT_DIR/agent holds agent_gpu.json and env.txt (written by bin/gpu-check-agent.sh).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _f(x, fmt: str = "{:.2f}", none: str = "n/a") -> str:
    return none if x is None else fmt.format(x)


def _env(d: Path) -> dict[str, str]:
    p = d / "env.txt"
    lines = p.read_text().splitlines() if p.exists() else []
    out = {"date": lines[0] if lines else "?", "commit": lines[1] if len(lines) > 1 else "?"}
    out["gpu"] = lines[2] if len(lines) > 2 else "?"
    out["software"] = lines[3] if len(lines) > 3 else "?"
    return out


def scripted_md(s: dict) -> list[str]:
    """The scripted-policy episode: outcome, speed-ups, time split."""
    if "error" in s:
        return [f"**Scripted episode failed to run**: `{s['error']}`", ""]
    ev = s.get("eval") or {}
    sec = s.get("seconds") or {}
    tools = sum(v for k, v in sec.items() if k.startswith("tool_"))
    out = [
        f"Task `{s['task']}`; the ScriptedPolicy reads `SKILL.md`, writes the kernel, binding and "
        "`ModelNew` (workdir format), runs "
        + ", ".join(f"`{b['command']}`" for b in s.get("bash", []))
        + " through the sandbox's confined Bash, and submits; a fresh `sandbox.evaluate` then "
        "scores it.",
        "",
        "| stop | turns | tool calls (failed) | final status | reward | speed-up vs eager | "
        "speed-up vs compile | candidate / eager / compile (ms) |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | --- |",
        f"| {s['stop_reason']} | {s['turns']} | {s['tool_calls']} ({s['tool_failures']}) | "
        f"{ev.get('status')} | {_f(s.get('reward'), '{:+.1f}')} | "
        f"{_f(ev.get('speedup_vs_eager'), '{:.2f}x')} | "
        f"{_f(ev.get('speedup_vs_compile'), '{:.2f}x')} | "
        f"{_f(ev.get('candidate_ms'), '{:.4f}')} / {_f(ev.get('eager_ms'), '{:.4f}')} / "
        f"{_f(ev.get('compile_ms'), '{:.4f}')} |",
        "",
        f"Reward reason: {s.get('reward_reason')}.",
        "",
        f"Time split of the episode ({s['wall_s']:.1f} s wall): tools {tools:.1f} s "
        + "("
        + ", ".join(f"`{b['command']}` {b['seconds']:.1f} s" for b in s.get("bash", []))
        + f"), final evaluation {sec.get('eval_s', 0):.1f} s "
        + "(stages: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in (ev.get("stages_s") or {}).items())
        + ").",
        "",
    ]
    return out


def tiny_md(t: dict) -> list[str]:
    """The tiny random-weight model's batched episodes: throughput and where the time goes."""
    if "error" in t:
        return [f"**Tiny-model episodes failed to run**: `{t['error']}`", ""]
    sp = t.get("time_split_s", {})
    mem = t.get("peak_gpu_mem_mib", {})
    m = t.get("model", {})
    cfg = t.get("config", {})
    out = [
        f"{t['episodes']} episodes of a {m.get('kind')} ({m.get('params', 0) / 1e3:.0f}k "
        f"parameters, {m.get('dtype')}) on {cfg.get('tasks')} fixture tasks, at most "
        f"{cfg.get('max_turns')} turns of {cfg.get('max_new_tokens')} new tokens. Concurrency: "
        f"{t.get('concurrency')}.",
        "",
        "| episodes | wall (s) | episodes / hour | generate (s) | tools (s) | eval (s) | "
        "generated tok/s | peak GPU mem: policy / device (MiB) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        f"| {t['episodes']} | {t['wall_s']:.1f} | {_f(t.get('episodes_per_hour'), '{:.0f}')} | "
        f"{sp.get('generate_s', 0):.1f} | {sp.get('tools_s', 0):.1f} | {sp.get('eval_s', 0):.1f} | "
        f"{_f(t.get('generated_tokens_per_s'), '{:.0f}')} | "
        f"{_f(mem.get('policy_torch_max_allocated'), '{:.0f}')} / "
        f"{_f(mem.get('device_used_peak_nvml'), '{:.0f}')} |",
        "",
        f"Stop reasons {t.get('stop_reasons')}; final statuses {t.get('eval_status')}; "
        f"{t.get('tool_calls')} tool calls, {t.get('schema_violations')} schema violations; "
        f"prompt {min(t.get('prompt_tokens') or [0])}-{max(t.get('prompt_tokens') or [0])} "
        "tokens. A random-weight model writes no tool calls, so its episodes end at the turn "
        "limit (or after idle turns) and the final evaluation rejects the untouched starter "
        "`model_new.py` (PyTorch only) at the static guards: the figure measures the loop and "
        "batched generation, not kernel work; the scripted episode above measures the tools and "
        "the evaluation.",
        "",
        f"Note on the split: {t.get('time_split_note')}.",
        "",
    ]
    return out


def render(d: Path, command: str) -> str:
    """The whole section for one GPU check's output folder."""
    rep = json.loads((d / "agent_gpu.json").read_text())
    env = _env(d)
    lines = [
        "## Agent on the GPU (issue #8)",
        "",
        f"{env['date']}; GPU: {env['gpu']}; {env['software']}; commit `{env['commit'][:12]}`; "
        f"command: `{command}` (backend {rep.get('backend')}, budget {rep.get('budget_s')} s, "
        f"elapsed {rep.get('elapsed_s')} s).",
        "",
        f"### Scripted policy solves a task through the real sandbox ({rep.get('backend')} backend)",
        "",
    ]
    lines += scripted_md(rep["scripted"]) if "scripted" in rep else ["(not run)", ""]
    lines += ["### Tiny random-weight model: concurrent episodes", ""]
    lines += tiny_md(rep["tiny"]) if "tiny" in rep else ["(not run)", ""]
    if rep.get("skipped"):
        lines += [f"Skipped for time: {rep['skipped']}.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="the agent output folder (holds agent_gpu.json)")
    ap.add_argument("--command", default='run(command="bash bin/gpu-check-agent.sh")')
    a = ap.parse_args()
    print(render(a.dir, a.command))


if __name__ == "__main__":
    main()
