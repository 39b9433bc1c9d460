"""Where an honest solution's speed-up drifts between runs on one GPU: host load, or memory.

Issue 27's 3% check: on one H200 at the same clocks the device-bound kernels of the positive
corpus kept their speed-up within 1.1% between two runs, while short programs (0.08-0.11 ms,
KernelBench L1/12 diag(A) @ B) moved 3-25% (docs/lab/session20). This probe times chosen
solutions of the positive corpus against their reference's eager program in one process, with
the profiler's protocol, paired (candidate and eager interleaved, ``profiler.timing.paired``),
repeated under conditions in turn:

- ``idle``: nothing else on the host or the GPU;
- ``cpu_load``: one busy process per core (what eight compile jobs and four device workers'
  start-ups put on the host during a batch);
- ``gpu_memory``: another process holding most of the GPU's memory in many blocks (what other
  workers' candidates hold), and this process's inputs allocated again after it took them;
- ``fresh_inputs``: the inputs drawn again (new addresses) before each repetition, nothing else.

A measurement experiment, not an evaluation: the solutions are the corpus's own honest ones and
run in this process. Writes one JSON document (``--out``) and prints a table: per solution and
condition the candidate's and eager's medians and the speed-up, their spread over the
repetitions, and the SM clock.

    python3 packages/kernelbench-eval/benchmarks/drift_probe.py --out drift.json \\
        --solutions level_1_problem_12_sample_1_kernel.py,level_1_problem_5_sample_0_kernel.py
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_ROOT = Path(__file__).resolve().parents[1] / "corpus" / "positive"
CONDITIONS = ("idle", "cpu_load", "gpu_memory", "fresh_inputs")


def reference_path(root: Path, solution: str) -> Path:
    """The KernelBench reference a ``level_L_problem_P_sample_S_kernel.py`` solution is for."""
    m = re.match(r"level_(\d+)_problem_(\d+)_sample_\d+_kernel\.py$", solution)
    if not m:
        raise SystemExit(f"{solution}: not a level_L_problem_P_sample_S_kernel.py name")
    level, problem = m.groups()
    hits = sorted((root / "KernelBench" / f"level{level}").glob(f"{problem}_*.py"))
    if not hits:
        raise SystemExit(f"{solution}: no reference level{level}/{problem}_*.py under {root}")
    return hits[0]


def _spin(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def _hold_gpu_memory(gib: float, ready: Any, stop: Any) -> None:
    import torch

    # 256 MiB blocks: four per GiB (eight asked 2x the memory and ran the H200 out of it)
    blocks = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(int(gib * 4))]
    blocks = blocks[1::2]  # every other block freed: holes between the ones kept
    torch.cuda.synchronize()
    ready.set()
    stop.wait()
    del blocks


class Condition:
    """A condition entered for one repetition (``with Condition(name):``)."""

    def __init__(self, name: str, gpu_gib: float) -> None:
        self.name, self.gpu_gib = name, gpu_gib
        self.ctx = mp.get_context("spawn")
        self.procs: list[Any] = []
        self.stop = self.ctx.Event()

    def __enter__(self) -> Condition:
        if self.name == "cpu_load":
            for _ in range(os.cpu_count() or 2):
                p = self.ctx.Process(target=_spin, args=(self.stop,), daemon=True)
                p.start()
                self.procs.append(p)
            time.sleep(1.0)
        elif self.name == "gpu_memory":
            ready = self.ctx.Event()
            p = self.ctx.Process(
                target=_hold_gpu_memory, args=(self.gpu_gib, ready, self.stop), daemon=True
            )
            p.start()
            self.procs.append(p)
            if not ready.wait(300):
                raise RuntimeError("the memory-holding process did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def probe(
    root: Path,
    solution: str,
    conditions: list[str],
    reps: int,
    gpu_gib: float,
    device: str = "cuda",
) -> dict:
    """Paired timings of one solution and its reference's eager program, ``reps`` rounds of
    ``conditions`` in turn (so that slow drift is spread over every condition alike)."""
    import torch

    from cuda_agent.kernelbench_eval.tree import kernelbench_mode
    from cuda_agent.profiler.program import Program, load_module, set_mode
    from cuda_agent.profiler.timing import paired

    ref_source = reference_path(root, solution).read_text()
    mode, _ = kernelbench_mode(ref_source)  # the module mode its task runs in
    ref = Program.from_source(ref_source, name="drift_ref")
    sol = load_module((root / "solutions" / solution).read_text(), name="drift_sol")
    eager = ref.make_model(device, seed=0, mode=mode)
    cand = set_mode(sol.ModelNew(*ref.init_inputs()).to(device), mode)
    cand.load_state_dict(eager.state_dict(), strict=False)

    def draw(seed: int) -> list[list[Any]]:
        return [ref.make_inputs(device, seed=seed + k) for k in range(2)]

    def call(model: Any) -> Any:
        def fn(*xs: Any) -> Any:
            with torch.no_grad():
                return model(*xs)

        return fn

    sets = draw(0)
    rows: dict[str, list[dict[str, float]]] = {c: [] for c in conditions}
    for rep in range(reps):
        for cond in conditions:
            with Condition(cond, gpu_gib):
                if cond in ("gpu_memory", "fresh_inputs"):
                    del sets
                    if device == "cuda":
                        torch.cuda.empty_cache()
                    sets = draw(100 * (rep + 1))
                res = paired({"cand": call(cand), "eager": call(eager)}, sets, device=device)
            c, e = res.stats["cand"], res.stats["eager"]
            rows[cond].append(
                {
                    "cand_ms": c.median_ms,
                    "eager_ms": e.median_ms,
                    "speedup": e.median_ms / c.median_ms,
                    "n": c.n,
                    "sm_clock_mhz": c.sm_clock_mhz or 0.0,
                    "cand_iqr_ms": c.iqr_ms,
                }
            )
            print(f"{solution} {cond} rep {rep}: {rows[cond][-1]}", file=sys.stderr, flush=True)
    return {"solution": solution, "conditions": rows}


def summary(doc: dict) -> str:
    """A markdown table: per solution and condition, medians over the repetitions and the
    spread (max / min - 1) of the candidate's time and of the speed-up."""
    out = [
        "| solution | condition | candidate ms | eager ms | speed-up | candidate spread | "
        "speed-up spread | SM MHz |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in doc["solutions"]:
        for cond, rs in s["conditions"].items():
            if not rs:
                continue
            cm = [r["cand_ms"] for r in rs]
            sp = [r["speedup"] for r in rs]
            out.append(
                f"| {s['solution']} | {cond} | {statistics.median(cm):.4f} | "
                f"{statistics.median(r['eager_ms'] for r in rs):.4f} | {statistics.median(sp):.3f} | "
                f"{max(cm) / min(cm) - 1:.1%} | {max(sp) / min(sp) - 1:.1%} | "
                f"{statistics.median(r['sm_clock_mhz'] for r in rs):.0f} |"
            )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="positive corpus root")
    ap.add_argument("--solutions", required=True, help="comma-separated solution file names")
    ap.add_argument(
        "--conditions",
        default=None,
        help="comma-separated (default: all; on cpu all but gpu_memory)",
    )
    ap.add_argument("--reps", type=int, default=4, help="rounds of every condition")
    ap.add_argument(
        "--gpu-gib",
        type=float,
        default=80.0,
        help="gpu_memory: GiB allocated, then every other block freed (half held, in holes)",
    )
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (a rehearsal)")
    ap.add_argument("--out", type=Path, required=True, help="JSON results")
    a = ap.parse_args(argv)
    default = [c for c in CONDITIONS if a.device == "cuda" or c != "gpu_memory"]
    conditions = [c for c in a.conditions.split(",") if c] if a.conditions else default
    bad = [c for c in conditions if c not in CONDITIONS]
    if bad:
        raise SystemExit(f"--conditions: unknown {', '.join(bad)} (choose from {CONDITIONS})")
    if a.device != "cuda" and "gpu_memory" in conditions:
        raise SystemExit("--conditions gpu_memory needs --device cuda")
    doc: dict[str, Any] = {"conditions": conditions, "reps": a.reps, "solutions": []}
    for s in [x for x in a.solutions.split(",") if x]:
        doc["solutions"].append(probe(a.root, s, conditions, a.reps, a.gpu_gib, a.device))
        a.out.write_text(json.dumps(doc, indent=1) + "\n")  # what is done survives a kill
    print(summary(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
