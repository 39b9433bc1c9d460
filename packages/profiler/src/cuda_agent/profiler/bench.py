"""Acceptance measurements of the timing protocol (run by ``bin/gpu-check-profiler.sh``).

``python -m cuda_agent.profiler.bench <command>``:

- ``tasks DIR``: Task JSONL of every ``level*/*.py`` under a KernelBench-format directory.
- ``spread DIR --proc I``: in one process, every problem timed with this protocol and with a
  KernelBench-style timer (events on the current stream, 3 warm-up calls, fixed 100 trials on the
  same inputs); one JSON line per problem. Run it in N processes and ``report`` the spread.
- ``compile DIR``: eager vs ``torch.compile`` interleaved for every problem, in this process.
- ``exploits DIR``: each exploit ``ModelNew`` against its reference, with both timers.
- ``report``: aggregate the JSON lines into a JSON summary and a Markdown table.

``--shrink K`` divides every module-level int constant >= 256 by K (CPU smoke runs).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np


def _problems(root: Path, only: str | None = None) -> list[Path]:
    def key(p: Path) -> tuple[str, int]:
        m = re.match(r"(\d+)_", p.name)
        return (p.parent.name, int(m.group(1)) if m else 0)

    ps = sorted(root.glob("level*/*.py"), key=key)
    if only:
        pat = re.compile(only)
        ps = [p for p in ps if pat.search(f"{p.parent.name}/{p.name}")]
    return ps


def _name(p: Path) -> str:
    return f"{p.parent.name}/{p.stem}"


def shrink_source(src: str, k: int) -> str:
    """Divide module-level ``name = <int>`` constants >= 256 by ``k`` (at least 1)."""
    if k <= 1:
        return src

    def sub(m: re.Match) -> str:
        v = int(m.group(2))
        return f"{m.group(1)}{max(1, v // k) if v >= 256 else v}"

    return re.sub(r"(?m)^(\w+ = )(\d+)$", sub, src)


def kb_style(model: Any, inputs: list[Any], trials: int = 100, warmup: int = 3) -> list[float]:
    """KernelBench-style timing: events on the current stream, same inputs, no flush (ms)."""
    import torch

    with torch.no_grad():
        for _ in range(warmup):
            model(*inputs)
        torch.cuda.synchronize()
        out = []
        for _ in range(trials):
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            model(*inputs)
            e.record()
            torch.cuda.synchronize()
            out.append(s.elapsed_time(e))
    return out


def _emit(fh, d: dict[str, Any]) -> None:
    fh.write(json.dumps(d) + "\n")
    fh.flush()


def _free() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def cmd_tasks(a: argparse.Namespace) -> int:
    from cuda_agent.records import Task, encode

    for p in _problems(a.dir, a.only):
        m = re.match(r"(\d+)_", p.name)
        lvl = re.match(r"level(\d+)", p.parent.name)
        t = Task.make(
            _name(p),
            shrink_source(p.read_text(), a.shrink),
            source="kernelbench",
            level=int(lvl.group(1)) if lvl else None,
            problem_id=int(m.group(1)) if m else None,
        )
        sys.stdout.buffer.write(encode(t))
    return 0


def _cfg(a: argparse.Namespace):
    from .config import TimingConfig

    return TimingConfig(
        time_cap_s=a.time_cap, warmup_ms=a.warmup_ms, trace_check=a.trace, max_samples=2000
    )


def cmd_spread(a: argparse.Namespace) -> int:
    import torch

    from .baseline import load_reference, make_input_pool
    from .sol import count_work
    from .timing import measure

    cfg = _cfg(a)
    cuda = a.device.startswith("cuda")
    with open(a.out, "a") as fh:
        for p in _problems(a.dir, a.only):
            t0 = time.monotonic()
            src = shrink_source(p.read_text(), a.shrink)
            rec: dict[str, Any] = {"problem": _name(p), "proc": a.proc, "device": a.device}
            try:
                prog = load_reference(src)
                model = prog.make_model(device=a.device, seed=0)
                pool = make_input_pool(prog, a.device, seed=1000, max_sets=a.sets)
                st = measure(model, pool, device=a.device, config=cfg)
                rec["ours"] = msgspec.to_builtins(st)
                if cuda:
                    kb = kb_style(model, pool[0], trials=a.kb_trials)
                    rec["kb"] = {
                        "mean_ms": float(np.mean(kb)),
                        "median_ms": float(np.median(kb)),
                        "std_ms": float(np.std(kb)),
                        "n": len(kb),
                    }
                if a.proc == 0:
                    rec["work"] = msgspec.to_builtins(count_work(src))
            except Exception as e:  # noqa: BLE001 - recorded per problem
                rec["error"] = f"{type(e).__name__}: {e}"[:500]
            rec["seconds"] = time.monotonic() - t0
            _emit(fh, rec)
            med = rec.get("ours", {}).get("median_ms")
            print(
                f"[proc {a.proc}] {rec['problem']}: {med} ms ({rec['seconds']:.1f}s)",
                file=sys.stderr,
                flush=True,
            )
            model = pool = None  # noqa: F841
            _free()
    del torch
    return 0


def cmd_compile(a: argparse.Namespace) -> int:
    from .baseline import time_program

    cfg = _cfg(a)
    with open(a.out, "a") as fh:
        for p in _problems(a.dir, a.only):
            t0 = time.monotonic()
            rec: dict[str, Any] = {"problem": _name(p), "compile_mode": a.mode}
            try:
                res = time_program(
                    shrink_source(p.read_text(), a.shrink),
                    device=a.device,
                    compile_mode=a.mode,
                    config=cfg,
                    max_sets=a.sets,
                )
                rec["eager"] = msgspec.to_builtins(res.stats["eager"])
                rec["compile"] = msgspec.to_builtins(res.stats["compile"])
                rec["speedup_compile"] = res.speedup("eager", "compile")
                rec["speedup_compile_ci"] = list(res.speedup_ci("eager", "compile"))
                rec["flags"] = res.flags
            except Exception as e:  # noqa: BLE001
                rec["error"] = f"{type(e).__name__}: {e}"[:500]
            rec["seconds"] = time.monotonic() - t0
            _emit(fh, rec)
            print(
                f"[compile] {rec['problem']}: {rec.get('speedup_compile')} "
                f"({rec['seconds']:.1f}s) {rec.get('error', '')}",
                file=sys.stderr,
                flush=True,
            )
            _free()
    return 0


def cmd_precompile(a: argparse.Namespace) -> int:
    """Compile and run once each problem of shard i/n (fills inductor's on-disk caches)."""
    import torch

    from .baseline import load_reference

    i, n = (int(x) for x in a.shard.split("/"))
    for k, p in enumerate(_problems(a.dir, a.only)):
        if k % n != i:
            continue
        t0 = time.monotonic()
        try:
            prog = load_reference(shrink_source(p.read_text(), a.shrink))
            model = prog.make_model(device=a.device)
            x = prog.make_inputs(device=a.device, seed=1)
            c = torch.compile(model, mode=None if a.mode == "default" else a.mode)
            with torch.no_grad():
                c(*x)
            msg = "ok"
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {e}"[:200]
        print(
            f"[precompile {a.shard}] {_name(p)} {msg} {time.monotonic() - t0:.1f}s",
            file=sys.stderr,
            flush=True,
        )
        _free()
    return 0


def cmd_exploits(a: argparse.Namespace) -> int:
    from .baseline import load_reference, load_solution, time_program

    ref_src = shrink_source((a.dir / "ref_matmul.py").read_text(), a.shrink)
    cfg = _cfg(a)
    cuda = a.device.startswith("cuda")
    with open(a.out, "a") as fh:
        for p in sorted(a.dir.glob("*.py")):
            if p.name.startswith("ref_") or (a.only and not re.search(a.only, p.name)):
                continue
            if p.name == "side_stream.py" and not cuda:
                continue
            rec: dict[str, Any] = {"exploit": p.stem}
            t0 = time.monotonic()
            try:
                res = time_program(ref_src, device=a.device, new_source=p.read_text(), config=cfg)
                rec["eager_ms"] = res.stats["eager"].median_ms
                rec["new_ms"] = res.stats["new"].median_ms
                rec["speedup"] = res.speedup("eager", "new")
                rec["speedup_ci"] = list(res.speedup_ci("eager", "new"))
                rec["flags_new"] = res.stats["new"].flags
                rec["flags"] = res.flags
                if cuda:
                    ref = load_reference(ref_src)
                    new = load_solution(p.read_text())
                    m_ref = ref.make_model(device=a.device)
                    m_new = new.make_model(device=a.device, init_inputs=[])
                    x = ref.make_inputs(device=a.device, seed=7)
                    kb_ref = float(np.mean(kb_style(m_ref, x, trials=a.kb_trials)))
                    kb_new = float(np.mean(kb_style(m_new, x, trials=a.kb_trials)))
                    import torch

                    torch.cuda.synchronize()
                    rec["kb_eager_ms"], rec["kb_new_ms"] = kb_ref, kb_new
                    rec["kb_speedup"] = kb_ref / kb_new if kb_new > 0 else float("inf")
            except Exception as e:  # noqa: BLE001
                rec["error"] = f"{type(e).__name__}: {e}"[:500]
            rec["seconds"] = time.monotonic() - t0
            _emit(fh, rec)
            print(
                f"[exploit] {p.stem}: ours {rec.get('speedup')} flags {rec.get('flags_new')} "
                f"kb {rec.get('kb_speedup')}",
                file=sys.stderr,
                flush=True,
            )
            _free()
    return 0


def _load(paths: list[Path]) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        if p.exists():
            for line in p.read_text().splitlines():
                if line.strip().startswith("{"):
                    out.append(json.loads(line))
    return out


def _spread(v: list[float]) -> float:
    return float((max(v) - min(v)) / np.median(v)) if len(v) > 1 else float("nan")


def cmd_report(a: argparse.Namespace) -> int:
    """Summarise spread/compile/exploit lines (+ ceilings JSON) into JSON and Markdown."""
    from .sol import Ceilings, Work, datasheet_for, estimate

    spread = _load(a.spread)
    comp = {d["problem"]: d for d in _load(a.compile or [])}
    expl = _load(a.exploits or [])
    ceil = None
    if a.ceilings and a.ceilings.exists():
        lines = [ln for ln in a.ceilings.read_text().splitlines() if ln.startswith("{")]
        if lines:
            ceil = msgspec.json.decode(lines[-1], type=Ceilings)
    by: dict[str, list[dict[str, Any]]] = {}
    for d in spread:
        by.setdefault(d["problem"], []).append(d)
    rows = []
    for prob, ds in by.items():
        ours = [d["ours"]["median_ms"] for d in ds if "ours" in d]
        kb_mean = [d["kb"]["mean_ms"] for d in ds if "kb" in d]
        kb_med = [d["kb"]["median_ms"] for d in ds if "kb" in d]
        work = next((d["work"] for d in ds if "work" in d), None)
        row: dict[str, Any] = {
            "problem": prob,
            "procs": len(ours),
            "ours_median_ms": float(np.median(ours)) if ours else None,
            "ours_spread": _spread(ours) if ours else None,
            "ours_n": [d["ours"]["n"] for d in ds if "ours" in d],
            "ours_flags": sorted({f for d in ds if "ours" in d for f in d["ours"]["flags"]}),
            "kb_mean_ms": float(np.median(kb_mean)) if kb_mean else None,
            "kb_mean_spread": _spread(kb_mean) if kb_mean else None,
            "kb_median_spread": _spread(kb_med) if kb_med else None,
            "errors": [d["error"] for d in ds if "error" in d],
        }
        if work and ceil and ours:
            e = estimate(msgspec.convert(work, Work), ceil)
            row["sol_bound_ms"] = e.bound_ms
            row["sol_bound_by"] = e.bound_by
            row["sol_fraction"] = e.fraction(row["ours_median_ms"])
            row["below_bound"] = e.impossible(row["ours_median_ms"])
        c = comp.get(prob)
        if c and "compile" in c:
            row["eager_ms"] = c["eager"]["median_ms"]
            row["compile_ms"] = c["compile"]["median_ms"]
            row["compile_speedup"] = c["speedup_compile"]
            row["compile_speedup_ci"] = c["speedup_compile_ci"]
        elif c:
            row["compile_error"] = c.get("error")
        rows.append(row)
    sp = [r["ours_spread"] for r in rows if r.get("ours_spread") is not None]
    kbs = [r["kb_mean_spread"] for r in rows if r.get("kb_mean_spread") is not None]
    summary = {
        "problems": len(rows),
        "ours_spread": _dist(sp),
        "ours_under_1pct": int(sum(s < 0.01 for s in sp)),
        "kb_mean_spread": _dist(kbs),
        "kb_under_1pct": int(sum(s < 0.01 for s in kbs)),
    }
    out = {
        "summary": summary,
        "rows": rows,
        "exploits": expl,
        "ceilings": msgspec.to_builtins(ceil) if ceil else None,
    }
    a.json_out.write_text(json.dumps(out, indent=1))
    md = _markdown(summary, rows, expl, ceil, datasheet_for(ceil.device) if ceil else None)
    a.md_out.write_text(md)
    print(md)
    return 0


def _dist(v: list[float]) -> dict[str, float] | None:
    if not v:
        return None
    x = np.asarray(v)
    return {
        "median": float(np.median(x)),
        "p90": float(np.percentile(x, 90)),
        "max": float(x.max()),
        "min": float(x.min()),
    }


def _pct(v: float | None) -> str:
    return "-" if v is None or v != v else f"{100 * v:.2f}%"


def _f(v: float | None, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def _markdown(summary, rows, expl, ceil, ds) -> str:
    L = []
    if ceil:
        L.append(f"### Ceilings ({ceil.device}, torch {ceil.torch_version})\n")
        L.append("| ceiling | measured | datasheet (dense) | ratio |\n| --- | --- | --- | --- |")
        dsv = ds or {}
        cg = dsv.get("copy_gbps")
        L.append(
            f"| copy GB/s (read+write) | {ceil.copy_gbps:.0f} | {_f(cg, '.0f')} | "
            f"{_f(ceil.copy_gbps / cg if cg else None, '.2f')} |"
        )
        if ceil.read_gbps:
            L.append(
                f"| read GB/s (sum) | {ceil.read_gbps:.0f} | {_f(cg, '.0f')} | "
                f"{_f(ceil.read_gbps / cg if cg else None, '.2f')} |"
            )
        for k, v in ceil.matmul_tflops.items():
            d = dsv.get(k)
            L.append(
                f"| {k} matmul TFLOP/s (n={ceil.matmul_n}) | {v:.1f} | {_f(d, '.1f')} | "
                f"{_f(v / d if d else None, '.2f')} |"
            )
        L.append("")
    s = summary
    L.append("### Spread of the median across processes\n")
    L.append(
        f"{s['problems']} problems. This protocol: median spread {_pct(s['ours_spread'] and s['ours_spread']['median'])}, "
        f"p90 {_pct(s['ours_spread'] and s['ours_spread']['p90'])}, max {_pct(s['ours_spread'] and s['ours_spread']['max'])}; "
        f"{s['ours_under_1pct']}/{s['problems']} under 1%. KernelBench-style (mean of 100 trials): "
        f"median {_pct(s['kb_mean_spread'] and s['kb_mean_spread']['median'])}, "
        f"p90 {_pct(s['kb_mean_spread'] and s['kb_mean_spread']['p90'])}, "
        f"max {_pct(s['kb_mean_spread'] and s['kb_mean_spread']['max'])}; {s['kb_under_1pct']} under 1%.\n"
    )
    L.append(
        "| problem | ours median ms | ours spread | n per proc | KB mean ms | KB spread | "
        "SoL bound ms | SoL fraction | eager ms | compile ms | compile speed-up [CI] | flags |"
    )
    L.append("| --- " * 12 + "|")
    for r in rows:
        ci = r.get("compile_speedup_ci")
        cs = (
            f"{r['compile_speedup']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"
            if r.get("compile_speedup")
            else (r.get("compile_error") or "-")[:40]
        )
        L.append(
            f"| {r['problem']} | {_f(r['ours_median_ms'], '.4f')} | {_pct(r['ours_spread'])} | "
            f"{min(r['ours_n']) if r['ours_n'] else '-'}-{max(r['ours_n']) if r['ours_n'] else '-'} | "
            f"{_f(r['kb_mean_ms'], '.4f')} | {_pct(r['kb_mean_spread'])} | "
            f"{_f(r.get('sol_bound_ms'), '.4f')} | {_pct(r.get('sol_fraction'))} | "
            f"{_f(r.get('eager_ms'), '.4f')} | {_f(r.get('compile_ms'), '.4f')} | {cs} | "
            f"{', '.join(r['ours_flags']) or '-'}{' ERR' if r['errors'] else ''} |"
        )
    if expl:
        L.append("\n### Timing exploits (ModelNew vs eager reference, 4096^2 fp32 matmul+ReLU)\n")
        L.append(
            "| program | ours speed-up [CI] | flags on ModelNew | KernelBench-style speed-up |"
        )
        L.append("| --- | --- | --- | --- |")
        for e in expl:
            ci = e.get("speedup_ci") or [float("nan")] * 2
            L.append(
                f"| {e['exploit']} | {_f(e.get('speedup'), '.2f')} [{ci[0]:.2f}, {ci[1]:.2f}] | "
                f"{', '.join(e.get('flags_new', [])) or '-'} | {_f(e.get('kb_speedup'), '.2f')} |"
                + (f" error: {e['error'][:80]}" if "error" in e else "")
            )
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="cuda_agent.profiler.bench")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p, out=True):
        p.add_argument("dir", type=Path)
        p.add_argument("--only", default=None, help="regex on level*/name")
        p.add_argument("--device", default="cuda")
        p.add_argument("--shrink", type=int, default=1)
        p.add_argument("--time-cap", type=float, default=1.0)
        p.add_argument("--warmup-ms", type=float, default=100.0)
        p.add_argument("--trace", action="store_true")
        p.add_argument("--sets", type=int, default=2)
        p.add_argument("--kb-trials", type=int, default=100)
        if out:
            p.add_argument("--out", type=Path, required=True)

    p = sub.add_parser("tasks")
    common(p, out=False)
    p = sub.add_parser("spread")
    common(p)
    p.add_argument("--proc", type=int, default=0)
    p = sub.add_parser("compile")
    common(p)
    p.add_argument("--mode", default="default")
    p = sub.add_parser("precompile")
    common(p, out=False)
    p.add_argument("--mode", default="default")
    p.add_argument("--shard", default="0/1")
    p = sub.add_parser("exploits")
    common(p)
    p = sub.add_parser("report")
    p.add_argument("--spread", type=Path, nargs="+", required=True)
    p.add_argument("--compile", type=Path, nargs="*")
    p.add_argument("--exploits", type=Path, nargs="*")
    p.add_argument("--ceilings", type=Path)
    p.add_argument("--json-out", type=Path, required=True)
    p.add_argument("--md-out", type=Path, required=True)
    a = ap.parse_args(argv)
    return {
        "tasks": cmd_tasks,
        "spread": cmd_spread,
        "compile": cmd_compile,
        "precompile": cmd_precompile,
        "exploits": cmd_exploits,
        "report": cmd_report,
    }[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
