"""What an agent waits for at each step of an iteration on the GPU: edit a kernel's body, then
``python utils/compile.py``, ``utils/verify.py`` and ``utils/profile.py``, each run as the
agent's Bash tool runs it (``sandbox.exec_shell`` in this process: confined, as a leased uid
when started as root), plus ``verify.py`` as a bare subprocess (what the confinement adds).

    python packages/sandbox/benchmarks/agent_tools_time.py [ROUNDS] [BACKEND]

Needs the fixture's task to run (BACKEND ``cuda``: a GPU). Prints a JSON line after every round
(what a cut-short run still leaves) and a last one with the median seconds of each step; each
step's start and end go to stderr as they happen."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from tool_compile_ab import edit, fixture_workspace

from cuda_agent.sandbox.execute import exec_shell, prepare_trusted_cache

STEPS = ("compile", "verify", "verify_bare", "profile")
STEP_TIMEOUT_S = float(os.environ.get("STEP_TIMEOUT_S", "200"))


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    backend = sys.argv[2] if len(sys.argv) > 2 else "cuda"
    _, ws = fixture_workspace("agent-tools-time-", backend)
    prepare_trusted_cache(backend)
    py = sys.executable

    t0 = time.perf_counter()

    def step(name: str) -> tuple[float, str]:
        tool = "verify" if name == "verify_bare" else name
        print(f"[{time.perf_counter() - t0:7.1f}s] {name} ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        if name == "verify_bare":
            p = subprocess.run(
                [py, "utils/verify.py"],
                cwd=ws,
                capture_output=True,
                text=True,
                timeout=STEP_TIMEOUT_S,
            )
            rc, out = p.returncode, p.stdout + p.stderr
        else:
            o = exec_shell(ws, f"{py} utils/{tool}.py", timeout=STEP_TIMEOUT_S)
            rc, out = o.returncode, o.stdout + o.stderr
        s = time.perf_counter() - t
        print(
            f"[{time.perf_counter() - t0:7.1f}s] {name}: rc={rc} in {s:.2f}s",
            file=sys.stderr,
            flush=True,
        )
        assert rc == 0, (name, out[-2000:])
        return s, out

    step("compile")  # not timed: the tools' cache gets its prelude and bindings
    step("profile")  # not timed: the task's eager and compile baselines, once per task
    times: dict[str, list[float]] = {k: [] for k in STEPS}
    lines: dict[str, list[str]] = {k: [] for k in STEPS}
    for r in range(rounds):
        edit(ws / "kernels" / "fused.cu", r + 1)
        for name in STEPS:
            s, out = step(name)
            times[name].append(round(s, 3))
            keep = ("BUILD", "status:", "ModelNew:", "eager:", "compile:")
            lines[name].append(
                " | ".join(ln.strip() for ln in out.splitlines() if ln.strip().startswith(keep))
            )
    med = {k: round(statistics.median(v), 3) for k, v in times.items()}
    print(
        json.dumps(
            {
                "rounds": rounds,
                "backend": backend,
                "cpus": os.cpu_count(),
                "median_s": med,
                "iteration_s": round(med["compile"] + med["verify"] + med["profile"], 2),
                "all_s": times,
                "lines": lines,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
