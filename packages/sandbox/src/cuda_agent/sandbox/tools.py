"""The workspace tools behind ``utils/compile.py``, ``verify.py``, ``profile.py`` and ``ncu.py``.

Each finds the workspace (the current directory or a parent holding ``.sandbox/task.json``), runs
through this package exactly as the evaluator does, prints a short report for an agent, and
returns an exit code (0: success).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cuda_agent.records import Candidate

from .config import SandboxConfig
from .isolation import cap_text

OUT_CAP = 12000


def find_workspace(start: Path | None = None) -> Path:
    """The workspace containing ``start`` (default: the current directory)."""
    p = (start or Path.cwd()).resolve()
    for d in [p, *p.parents]:
        if (d / ".sandbox" / "task.json").exists():
            return d
    raise SystemExit(f"not inside a sandbox workspace (no .sandbox/task.json above {p})")


def _config(backend: str, **kw: object) -> SandboxConfig:
    return SandboxConfig(backend=backend, **kw)  # type: ignore[arg-type]


def _compile(ws: Path, argv: list[str]) -> int:
    from .build import build_cache, build_workdir
    from .evaluate import cache_root
    from .workspace import load_workspace_task

    ap = argparse.ArgumentParser(
        prog="utils/compile.py",
        description="Build kernels/ into build/cuda_extension.so (cached per file).",
    )
    ap.add_argument("--jobs", type=int, default=max(2, min(8, os.cpu_count() or 2)))
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args(argv)
    _, backend = load_workspace_task(ws)
    cfg = _config(backend)
    res = build_workdir(
        ws,
        ws / "build",
        backend=backend,
        cache=build_cache(cache_root(cfg)),
        jobs=a.jobs,
        timeout_s=a.timeout,
    )
    for u in res.units:
        state = "cached" if u["cached"] else f"{u['seconds']:.1f}s"
        print(f"  {'ok ' if u['ok'] else 'ERR'} {u['file']} ({u['kind']}, {state})")
    if res.log.strip():
        print(cap_text(res.log, OUT_CAP))
    print(
        f"{'BUILD OK' if res.ok else 'BUILD FAILED'} in {res.seconds:.1f}s"
        + (f": {res.so_path}" if res.ok else "")
    )
    return 0 if res.ok else 1


def _evaluate(ws: Path, timing: bool, trials: int) -> int:
    from .evaluate import evaluate
    from .workspace import load_workspace_task, solution_from_workspace, workspace_guard_policy

    task, backend = load_workspace_task(ws)
    policy = workspace_guard_policy(ws)  # the policy the workspace's SKILL.md states
    sol = solution_from_workspace(ws)
    fmt = "workdir" if any(k.startswith("kernels/") for k in sol.files) else "kernelbench"
    if fmt != sol.format:
        from cuda_agent.records import Solution

        sol = Solution.make(
            fmt,
            sol.files if fmt == "workdir" else {"model_new.py": sol.files["model_new.py"]},
            origin="workspace",
        )
    cfg = _config(backend, timing=timing, trials=trials, guard_policy=policy)
    r = evaluate(Candidate(task=task, solution=sol), cfg)
    print(f"status: {r.status.value}  ({r.seconds:.1f}s)")
    if r.message:
        print(cap_text(r.message, OUT_CAP // 2))
    if r.compile is not None and not r.compile.ok:
        print(cap_text(r.compile.log_tail, OUT_CAP // 2))
    if r.correctness is not None:
        for i, t in enumerate(r.correctness.trials):
            err = (
                f"max_abs={t.max_abs_err:.3g} rel_norm={t.rel_norm_err:.3g}"
                if t.max_abs_err is not None and t.rel_norm_err is not None
                else ""
            )
            print(
                f"  trial {i} [{t.variant}] {'PASS' if t.passed else 'FAIL'} {err} {t.message}".rstrip()
            )
    for g in r.guards:
        print(f"  guard {g.code} ({g.severity}): {g.message}")
    if r.timing is not None and r.timing.candidate is not None:
        tm = r.timing
        print(f"  ModelNew: {tm.candidate.median_ms:.4f} ms (n={tm.candidate.n})")
        if tm.eager:
            print(f"  eager:    {tm.eager.median_ms:.4f} ms  -> speed-up {r.speedup_vs_eager:.2f}x")
        if tm.compile:
            print(
                f"  compile:  {tm.compile.median_ms:.4f} ms  -> speed-up {r.speedup_vs_compile:.2f}x"
            )
    print("PASS" if r.status.value == "ok" else "FAIL")
    return 0 if r.status.value == "ok" else 1


def _verify(ws: Path, argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="utils/verify.py",
        description="Check ModelNew against model.py as the evaluator does (fresh seed, >= 5 trials).",
    )
    ap.add_argument("--trials", type=int, default=5)
    a = ap.parse_args(argv)
    return _evaluate(ws, timing=False, trials=a.trials)


def _profile(ws: Path, argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="utils/profile.py",
        description="Verify, then time ModelNew and the eager/compile baselines.",
    )
    ap.add_argument(
        "--reference", action="store_true", help="only time the reference (eager, torch.compile)"
    )
    a = ap.parse_args(argv)
    if a.reference:
        from cuda_agent.profiler.baseline import baseline_for_task

        from .workspace import load_workspace_task

        task, backend = load_workspace_task(ws)
        b = baseline_for_task(
            task,
            device="cuda" if backend == "cuda" else "cpu",
            compile_mode="default" if backend == "cuda" else None,
        )
        print(f"eager:   {b.eager.median_ms:.4f} ms" if b.eager else "eager: n/a")
        print(f"compile: {b.compile.median_ms:.4f} ms" if b.compile else "compile: n/a")
        if b.error:
            print("note:", b.error[:500])
        return 0
    return _evaluate(ws, timing=True, trials=5)


def _ncu(ws: Path, argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="utils/ncu.py",
        description="Per-kernel Nsight Compute summary of one ModelNew call (build first).",
    )
    ap.add_argument("--reference", action="store_true", help="profile model.py's Model instead")
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args(argv)
    from cuda_agent.profiler.ncu import profile_program, summary_text

    from .workspace import load_workspace_task

    task, backend = load_workspace_task(ws)
    if backend != "cuda":
        print("ncu needs the cuda backend")
        return 1
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ws / "build"), str(ws), os.environ.get("PYTHONPATH", "")) if p
    )
    os.chdir(ws)
    rep = profile_program(
        ws / "model.py",
        new=None if a.reference else ws / "model_new.py",
        timeout_s=a.timeout,
        model_mode=task.model_mode,
    )
    print(cap_text(summary_text(rep), OUT_CAP))
    return 0


TOOLS = {"compile": _compile, "verify": _verify, "profile": _profile, "ncu": _ncu}


def main(tool: str, argv: list[str] | None = None) -> int:
    """Run workspace tool ``tool`` ('compile', 'verify', 'profile', 'ncu') with ``argv``."""
    ws = find_workspace()
    try:
        return TOOLS[tool](ws, list(argv or []))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
