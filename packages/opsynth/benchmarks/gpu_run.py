"""The issue-7 GPU run in one process tree: compose N tasks, run them through the full filter in
parallel workers on one GPU, then run the filter on an Ops-6K sample; write JSON summaries.

    python3 packages/opsynth/benchmarks/gpu_run.py OUTDIR      (called by bin/gpu-check-opsynth.sh)

Environment (defaults in brackets): BUDGET_S [240] wall seconds for everything (a deadline:
workers still running are stopped and their finished records kept), BACKEND [cuda], SIZE
[gpu on cuda, tiny on cpu], N [500] composed tasks, SEED [0], GPUS [CUDA_VISIBLE_DEVICES, else
every GPU nvidia-smi lists] comma-separated GPUs the filter workers are spread over (round robin,
timing serialised per GPU by its gate), WORKERS [min(12 x GPUs, cores - 2)] filter workers, OURS_SHARE [0.6] share of the filter time for our tasks before the Ops-6K part
starts (unused time passes on), OPS6K [.gpu-data/ops6k_300.jsonl] Task JSONL of the Ops-6K
sample (skipped with a message when absent), COMPILE [1], COMPILE_BACKEND [inductor],
TIME_BUDGET [0.3] seconds of eager timing per probe, TASK_TIMEOUT [60] seconds per probe,
MEM_GB [9] per-task memory cap (GPU memory on cuda), TIMING_LOCK [1] serialise eager timing
across workers (one GPU: concurrent timing would inflate every time; 0: CUDA_AGENT_GATE_DIR=off), PARTS [ours,ops6k] the
sets to run (``ops6k`` alone: only the Ops-6K sample, with the whole budget), RESUME [0] 1:
continue an earlier call's run in OUTDIR (its composed tasks, its workers' kept/rejected files
and their task queue OUTDIR/claims.<set>: done tasks are skipped, tasks cut off by the deadline are
redone; a finished set is skipped; the filter wall time of every call is added up in
OUTDIR/<set>.calls.json, so throughput covers the whole run). The workers of a set take tasks
from one queue (``opsynth filter --claim``): a worker that meets slow tasks takes fewer.

After a run whose summary step did not finish: ``gpu_run.py OUTDIR --resummarize ours WALL_S``
rebuilds ``ours.json`` from the kept/rejected files (WALL_S: the filter pool's wall time).

Writes OUTDIR/{ours,ops6k}.json (compose/filter statistics, throughput, funnel), the task
files (composed, kept.*, rejected.*) and worker logs. Needs the packages on the path (the
workers run ``python -m cuda_agent.opsynth.cli``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cuda_agent.opsynth.workers import mark_done, record_input_id  # the workers' task queue

T0 = time.monotonic()
ENV = os.environ
BUDGET_S = float(ENV.get("BUDGET_S", "240"))
BACKEND = ENV.get("BACKEND", "cuda")
SIZE = ENV.get("SIZE", "gpu" if BACKEND == "cuda" else "tiny")
N = int(ENV.get("N", "500"))
SEED = int(ENV.get("SEED", "0"))


def _gpus() -> list[str]:
    """The GPUs filter workers run on: GPUS, else the visible ones, else every GPU listed."""
    if ENV.get("GPUS"):
        return [g for g in ENV["GPUS"].split(",") if g.strip()]
    if ENV.get("CUDA_VISIBLE_DEVICES"):
        return [g for g in ENV["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        n = sum(line.startswith("GPU ") for line in listed.stdout.splitlines())
    except (OSError, subprocess.TimeoutExpired):
        n = 0
    return [str(i) for i in range(max(1, n))]


GPUS = _gpus() if BACKEND == "cuda" else ["cpu"]
WORKERS = int(ENV.get("WORKERS", str(max(1, min(12 * len(GPUS), (os.cpu_count() or 2) - 2)))))
OURS_SHARE = float(ENV.get("OURS_SHARE", "0.6"))
OPS6K = Path(ENV.get("OPS6K", ".gpu-data/ops6k_300.jsonl"))
COMPILE = ENV.get("COMPILE", "1") == "1"
COMPILE_BACKEND = ENV.get("COMPILE_BACKEND", "inductor")
TIME_BUDGET = float(ENV.get("TIME_BUDGET", "0.3"))
TASK_TIMEOUT = float(ENV.get("TASK_TIMEOUT", "60"))
MEM_GB = float(ENV.get("MEM_GB", "9"))
TIMING_LOCK = ENV.get("TIMING_LOCK", "1") == "1"
PART_NAMES = ("ours", "ops6k")
PARTS = set(ENV.get("PARTS", ",".join(PART_NAMES)).split(","))  # which sets to run
if not PARTS.issubset(PART_NAMES):
    sys.exit(f"PARTS={ENV['PARTS']!r}: expected a comma-separated subset of {PART_NAMES}")
RESUME = ENV.get("RESUME", "0") == "1"

RESERVE_S = 12.0  # kept at the end for stopping workers and writing the summaries

# filter reasons -> the check that raised them, in the order the probe runs the checks
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("load", ("load_error",)),
    ("rng (no RNG consumed)", ("rng_consumed",)),
    (
        "runs (eager)",
        ("eager_error", "out_of_memory", "timeout", "crash", "probe_error", "infra_error"),
    ),
    (
        "sane output",
        ("not_tensor", "empty_output", "nonfinite", "constant_output", "saturated_output"),
    ),
    ("deterministic", ("nondeterministic",)),
    ("input-dependent", ("input_independent",)),
    ("time window", ("too_fast", "too_slow")),
    ("torch.compile", ("compile_error", "compile_mismatch")),
]
HIST_EDGES_MS = (0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000)


def log(msg: str) -> None:
    print(f"[gpu_run {time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def left() -> float:
    return BUDGET_S - (time.monotonic() - T0)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cuda_agent.opsynth.cli", *args]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            with contextlib.suppress(ValueError):  # a line cut short by a stopped worker
                out.append(json.loads(line))
    return out


def run_pool(
    cmds: list[tuple[list[str], Path]],
    deadline_s: float,
    env: dict[str, str],
    envs: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Start every command (own process group, stderr to its log; ``envs[i]`` overrides ``env``
    for command i); stop them at the deadline (SIGINT, then SIGKILL after 8 s). Returns wall
    seconds and whether the deadline hit."""
    t0 = time.monotonic()
    procs = []
    for i, (cmd, logf) in enumerate(cmds):
        if envs is not None:
            env = envs[i]
        fh = open(logf, "a" if RESUME else "w")  # noqa: SIM115 - closed after the pool ends
        procs.append(
            (
                subprocess.Popen(
                    cmd, stdout=subprocess.DEVNULL, stderr=fh, env=env, start_new_session=True
                ),
                fh,
            )
        )
    stopped = False
    while any(p.poll() is None for p, _ in procs):
        if time.monotonic() - t0 > deadline_s:
            stopped = True
            log(
                f"deadline ({deadline_s:.0f} s): stopping {sum(p.poll() is None for p, _ in procs)} workers"
            )
            for p, _ in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGINT)
            t_stop = time.monotonic()
            while any(p.poll() is None for p, _ in procs) and time.monotonic() - t_stop < 8:
                time.sleep(0.2)
            for p, _ in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            break
        time.sleep(0.5)
    for _, fh in procs:
        fh.close()
    return {
        "wall_s": round(time.monotonic() - t0, 2),
        "stopped_at_deadline": stopped,
        "exit_codes": [p.returncode for p, _ in procs],
    }


def pcts(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    xs = sorted(xs)

    def q(p: float) -> float:
        return round(xs[min(len(xs) - 1, int(p * len(xs)))], 4)

    return {
        "p10": q(0.1),
        "p50": q(0.5),
        "p90": q(0.9),
        "max": round(xs[-1], 4),
        "mean": round(sum(xs) / len(xs), 4),
    }


def histogram(xs: list[float]) -> dict[str, int]:
    h = {}
    edges = (0.0, *HIST_EDGES_MS, math.inf)
    for a, b in zip(edges, edges[1:], strict=False):
        label = f"[{a:g}, {b:g})" if b != math.inf else f">= {a:g}"
        h[label] = sum(a <= x < b for x in xs)
    return h


def summarize(
    name: str,
    kept: list[dict],
    rejected: list[dict],
    total: int,
    pool: dict[str, Any],
    window: list[float],
    workers: int,
) -> dict[str, Any]:
    """Filter statistics of one set: funnel, reasons, eager-time distribution, throughput."""
    reasons = Counter(str(t["meta"].get("rejected", {}).get("reason")) for t in rejected)
    done = len(kept) + len(rejected)
    funnel = []
    entered = done
    for stage, codes in STAGES:
        dropped = sum(reasons.get(c, 0) for c in codes)
        funnel.append(
            {
                "check": stage,
                "entered": entered,
                "rejected": dropped,
                "pass_rate": round((entered - dropped) / entered, 4) if entered else None,
                "reasons": {c: reasons[c] for c in codes if reasons.get(c)},
            }
        )
        entered -= dropped
    known = {c for _, codes in STAGES for c in codes}
    other = {r: n for r, n in reasons.items() if r not in known}
    eager_kept = [
        float(t["meta"]["filter"]["eager_ms"])
        for t in kept
        if t["meta"].get("filter", {}).get("eager_ms") is not None
    ]
    # eager time as first measured (before any rescaling) for every task that got that far
    first_ms: list[float] = []
    for t in kept + rejected:
        info = t["meta"].get("filter") or t["meta"].get("rejected") or {}
        # a rescale after an out-of-memory failure has no time before it: use the first timed one
        timed = [r for r in info.get("rescaled") or [] if "eager_ms_before" in r]
        if timed:
            first_ms.append(float(timed[0]["eager_ms_before"]))
        elif info.get("eager_ms") is not None:
            first_ms.append(float(info["eager_ms"]))
    probe_s = [
        float((t["meta"].get("filter") or t["meta"].get("rejected") or {}).get("probe_s") or 0)
        for t in kept + rejected
    ]
    # worker seconds by check, summed over the tasks (all their probes, incl. rescales)
    phases: Counter[str] = Counter()
    for t in kept + rejected:
        for k, v in (
            (t["meta"].get("filter") or t["meta"].get("rejected") or {}).get("phases_s") or {}
        ).items():
            phases[k] += float(v)
    wall = pool.get("wall_s") or 0.0
    gpus = max(1, int(pool.get("gpus") or 1))
    examples: dict[str, list[dict[str, str]]] = {}
    for t in rejected:
        r = str(t["meta"]["rejected"].get("reason"))
        if len(examples.setdefault(r, [])) < 3:
            ex = {
                "name": t.get("name", ""),
                "detail": str(t["meta"]["rejected"].get("detail", ""))[:240],
            }
            if "row" in t["meta"]:
                ex["row"] = t["meta"]["row"]
            examples[r].append(ex)
    return {
        "set": name,
        "tasks_input": total,
        "tasks_done": done,
        "passed": len(kept),
        "pass_rate": round(len(kept) / done, 4) if done else None,
        "reasons": dict(reasons.most_common()),
        "unstaged_reasons": other,
        "funnel": funnel,
        "rescaled_kept": sum(bool(t["meta"]["filter"].get("rescaled")) for t in kept),
        "rescaled_any": sum(
            bool((t["meta"].get("filter") or t["meta"].get("rejected") or {}).get("rescaled"))
            for t in kept + rejected
        ),
        "window_ms": window,
        "eager_ms_kept": pcts(eager_kept),
        "eager_ms_kept_hist": histogram(eager_kept),
        "eager_ms_first": pcts(first_ms),
        "eager_ms_first_hist": histogram(first_ms),
        "outside_window_first": sum(not (window[0] <= x <= window[1]) for x in first_ms),
        "probe_s_per_task": pcts(probe_s),
        "phases_s_total": {k: round(v, 1) for k, v in phases.most_common()},
        "filter_wall_s": wall,
        "workers": workers,
        "gpus": gpus,
        "stopped_at_deadline": pool.get("stopped_at_deadline"),
        # per GPU-hour: tasks over wall time over the GPUs the workers shared
        "tasks_per_hour": round(done / wall / gpus * 3600, 1) if wall else None,
        "kept_per_hour": round(len(kept) / wall / gpus * 3600, 1) if wall else None,
        "tasks_per_hour_all_gpus": round(done / wall * 3600, 1) if wall else None,
        "examples": examples,
    }


def worker_outputs(out: Path, name: str) -> tuple[list[dict], list[dict]]:
    """The kept and the rejected tasks the filter workers of set ``name`` wrote so far (in every
    call of a resumed run)."""
    kept = [t for f in sorted(out.glob(f"kept.{name}.*.jsonl")) for t in read_jsonl(f)]
    rej = [t for f in sorted(out.glob(f"rejected.{name}.*.jsonl")) for t in read_jsonl(f)]
    return kept, rej


def window(extra: list[str]) -> list[float]:
    """The filter's eager-time window in ms: the backend's default unless ``extra`` sets it."""
    lo, hi = (1.0, 100.0) if BACKEND == "cuda" else (1.0, 1000.0)
    if "--min-ms" in extra:
        lo = float(extra[extra.index("--min-ms") + 1])
    if "--max-ms" in extra:
        hi = float(extra[extra.index("--max-ms") + 1])
    return [lo, hi]


def lengths(tasks: list[dict]) -> dict[int, int]:
    """How many tasks have each number of ops."""
    return dict(sorted(Counter(len(t.get("ops", [])) for t in tasks).items()))


def earlier_calls(out: Path, name: str) -> list[dict[str, Any]]:
    """The filter pools of earlier calls of a resumed run of set ``name`` (empty for a new run)."""
    f = out / f"{name}.calls.json"
    return json.loads(f.read_text()) if RESUME and f.exists() else []


def filter_set(
    name: str, src: Path, out: Path, budget_s: float, extra: list[str]
) -> dict[str, Any]:
    tasks = read_jsonl(src)
    calls = earlier_calls(out, name)
    w = max(1, min(WORKERS, len(tasks)))
    claims = out / f"claims.{name}"  # the workers' queue: a task goes to the first free worker
    if not calls:
        shutil.rmtree(claims, ignore_errors=True)
    else:
        kept, rej = worker_outputs(out, name)
        # the records are the truth: a lost queue, or one from a run made with shards, is rebuilt
        mark_done(claims, [record_input_id(t) for t in kept + rej])
        if len(kept) + len(rej) >= len(tasks):
            log(f"filter {name}: all {len(tasks)} tasks done in earlier calls")
            return summarize_calls(name, kept, rej, len(tasks), calls, extra, w)
    envs = []
    for i in range(w):
        env = dict(ENV)
        gpu = GPUS[i % len(GPUS)]
        if BACKEND == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = gpu
        if not TIMING_LOCK:  # the GPU's gate held by this worker's probes only
            env["CUDA_AGENT_GATE_DIR"] = "off"
        envs.append(env)
    args = [
        "--backend",
        BACKEND,
        "--compile" if COMPILE else "--no-compile",
        "--compile-backend",
        COMPILE_BACKEND,
        "--timeout",
        str(TASK_TIMEOUT),
        "--mem-gb",
        str(MEM_GB),
        "--time-budget",
        str(TIME_BUDGET),
        *extra,
    ]
    cmds = []
    if not calls:
        for f in [*out.glob(f"kept.{name}.*.jsonl"), *out.glob(f"rejected.{name}.*.jsonl")]:
            f.unlink()
    for i in range(w):
        cmds.append(
            (
                cli(
                    "filter",
                    str(src),
                    "--claim",
                    str(claims),
                    "-o",
                    str(out / f"kept.{name}.{i}.jsonl"),
                    "--rejected",
                    str(out / f"rejected.{name}.{i}.jsonl"),
                    *(["--resume"] if calls else []),
                    *args,
                ),
                out / f"filter.{name}.{i}.log",
            )
        )
    used = sorted({GPUS[i % len(GPUS)] for i in range(w)})
    log(
        f"filter {name}: {len(tasks)} tasks, {w} workers on GPUs {','.join(used)}, {budget_s:.0f} s"
        + (f" (resumed: call {len(calls) + 1})" if calls else "")
    )
    pool = run_pool(cmds, budget_s, dict(ENV), envs)
    pool["gpus"] = len(used) if BACKEND == "cuda" else 1
    pool["workers"] = w
    calls.append(pool)
    (out / f"{name}.calls.json").write_text(json.dumps(calls, indent=1))
    kept, rej = worker_outputs(out, name)
    s = summarize_calls(name, kept, rej, len(tasks), calls, extra, w)
    s["filter_args"] = args
    log(
        f"filter {name}: {s['tasks_done']}/{len(tasks)} done in {s['filter_wall_s']} s"
        f" ({len(calls)} call(s)), {s['passed']} kept, {s['tasks_per_hour']} tasks/h;"
        f" reasons {s['reasons']}"
    )
    return s


def summarize_calls(
    name: str,
    kept: list[dict],
    rej: list[dict],
    total: int,
    calls: list[dict[str, Any]],
    extra: list[str],
    workers: int,
) -> dict[str, Any]:
    """``summarize`` over a run made of one or more calls: their filter wall times add up."""
    pool = {
        "wall_s": round(sum(float(c["wall_s"]) for c in calls), 2),
        "stopped_at_deadline": bool(calls[-1].get("stopped_at_deadline")),
        "gpus": calls[-1].get("gpus", 1),
    }
    s = summarize(name, kept, rej, total, pool, window(extra), workers)
    s["calls"] = [
        {"wall_s": c["wall_s"], "stopped_at_deadline": c.get("stopped_at_deadline")} for c in calls
    ]
    return s


def compose(out: Path, budget_s: float) -> tuple[Path, dict[str, Any]]:
    path, info_file = out / "composed.jsonl", out / "compose.json"
    if RESUME and path.exists() and info_file.exists():
        log(f"compose: resumed run, reusing {path}")
        return path, json.loads(info_file.read_text())
    w = max(1, min(os.cpu_count() or 1, 16, N))
    per = math.ceil(N / w)
    cmds = []
    for i in range(w):
        f = out / f"composed.{i}.jsonl"
        f.unlink(missing_ok=True)
        cmds.append(
            (
                cli(
                    "compose",
                    "--n",
                    str(per),
                    "--seed",
                    str(SEED * 1000 + i),
                    "--size",
                    SIZE,
                    "-o",
                    str(f),
                ),
                out / f"compose.{i}.log",
            )
        )
    log(f"compose: {N} tasks, size {SIZE}, {w} processes x {per}")
    pool = run_pool(cmds, budget_s, dict(ENV))
    seen: set[str] = set()
    tasks = []
    for i in range(w):
        for t in read_jsonl(out / f"composed.{i}.jsonl"):
            if t["id"] not in seen:
                seen.add(t["id"])
                tasks.append(t)
    tasks = tasks[:N]
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    info = {
        "requested": N,
        "composed": len(tasks),
        "size": SIZE,
        "seed": SEED,
        "processes": w,
        "wall_s": pool["wall_s"],
        "stopped_at_deadline": pool["stopped_at_deadline"],
        "lengths": lengths(tasks),
    }
    info_file.write_text(json.dumps(info, indent=2))
    log(f"compose: {len(tasks)} distinct tasks in {pool['wall_s']} s")
    return path, info


def env_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "backend": BACKEND,
        "cores": os.cpu_count(),
        "budget_s": BUDGET_S,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    info["git_commit"] = os.environ.get("COMMIT", "")
    if not info["git_commit"]:  # the device copy's own git metadata can be stale: prefer COMMIT
        with contextlib.suppress(OSError):
            info["git_commit"] = subprocess.run(
                ["git", "rev-parse", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
    try:
        info["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        info["gpu"] = None
    info["knobs"] = {
        k: ENV.get(k)
        for k in (
            "N",
            "SIZE",
            "SEED",
            "WORKERS",
            "OURS_SHARE",
            "COMPILE",
            "COMPILE_BACKEND",
            "TIME_BUDGET",
            "TASK_TIMEOUT",
            "MEM_GB",
            "TIMING_LOCK",
            "GPUS",
            "PARTS",
            "RESUME",
        )
        if ENV.get(k)
    }
    return info


def resummarize(out: Path, name: str, wall_s: float) -> int:
    """Rebuild OUTDIR/<name>.json from the kept/rejected files a run left behind (when its own
    summary step did not finish), with the filter pool's wall time read from its log."""
    src = out / "composed.jsonl" if name == "ours" else OPS6K
    tasks = read_jsonl(src)
    total = len(tasks)
    w = len(list(out.glob(f"filter.{name}.*.log")))
    kept, rej = worker_outputs(out, name)
    env = json.loads((out / "env.json").read_text()) if (out / "env.json").exists() else {}
    gpus = len((env.get("gpu") or "x").splitlines()) if BACKEND == "cuda" else 1
    pool = {"wall_s": wall_s, "stopped_at_deadline": True, "gpus": gpus}
    s = summarize(name, kept, rej, total, pool, window([]), w)
    s["env"] = env
    s["resummarized"] = True
    if name == "ours" and tasks:
        s["compose"] = {
            "composed": total,
            "size": SIZE,
            "seed": SEED,
            "processes": "?",
            "wall_s": 0.0,
            "lengths": lengths(tasks),
        }
    (out / f"{name}.json").write_text(json.dumps(s, indent=2))
    log(
        f"{name}: {s['tasks_done']}/{total} done, {s['passed']} kept, {s['tasks_per_hour']} per GPU-h"
    )
    return 0


def main() -> int:
    if "--resummarize" in sys.argv:  # OUTDIR --resummarize NAME WALL_S
        if len(sys.argv) != 5 or sys.argv[2] != "--resummarize" or sys.argv[3] not in PART_NAMES:
            sys.exit("usage: gpu_run.py OUTDIR --resummarize ours|ops6k WALL_S")
        return resummarize(Path(sys.argv[1]), sys.argv[3], float(sys.argv[4]))
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-out/opsynth")
    out.mkdir(parents=True, exist_ok=True)
    info = env_info()
    # a resumed run: its first call describes it, later calls are listed
    if RESUME and (out / "env.json").exists():
        call = info
        info = json.loads((out / "env.json").read_text())
        info.setdefault("later_calls", []).append(
            {k: call[k] for k in ("date_utc", "git_commit", "gpu", "cores", "budget_s", "knobs")}
        )
    (out / "env.json").write_text(json.dumps(info, indent=2))
    have_ops6k = OPS6K.exists() and "ops6k" in PARTS
    if "ours" in PARTS:
        composed, cinfo = compose(out, max(10.0, 0.15 * left()))
        filter_time = left() - RESERVE_S
        share = OURS_SHARE if have_ops6k else 1.0
        ours = filter_set("ours", composed, out, max(5.0, share * filter_time), [])
        ours["compose"] = cinfo
        ours["env"] = info
        (out / "ours.json").write_text(json.dumps(ours, indent=2))
    if not have_ops6k:
        msg = (
            "Ops-6K part not asked for (PARTS)"
            if "ops6k" not in PARTS
            else f"Ops-6K part skipped: {OPS6K} is absent (make it with "
            "packages/opsynth/benchmarks/export_ops6k_sample.sh and carry .gpu-data)"
        )
        log(msg)
        (out / "ops6k.json").write_text(json.dumps({"skipped": msg}, indent=2))
        return 0
    o6 = filter_set("ops6k", OPS6K, out, max(5.0, left() - RESERVE_S), [])
    o6["env"] = info
    (out / "ops6k.json").write_text(json.dumps(o6, indent=2))
    log(f"done; {left():.0f} s of the budget left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
