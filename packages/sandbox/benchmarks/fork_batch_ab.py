"""Paired A/B of the fork server on a batch (``sandbox eval``, cpu backend): the same N honest
kernelbench candidates (distinct solutions) evaluated with every phase forked from the fork
server and with every phase started cold, alternating; each arm is one ``sandbox eval``
process, so the CPU seconds reported are the whole evaluation's (every process it waited for,
the fork server's launchers included). Guards and baselines off, timing on (0.3 s cap).

    python packages/sandbox/benchmarks/fork_batch_ab.py [ROUNDS] [N] [CPU_WORKERS]

Prints one JSON line."""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from early_verify_ab import FIX, HONEST
from paired import paired_medians

from cuda_agent.records import Candidate, Solution, Task
from cuda_agent.records.jsonl import encode

ARMS = {
    "fork": ["--fork-server"],
    "cold": ["--no-fork-server", "--warm-processes", "0"],
}


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    workers = sys.argv[3] if len(sys.argv) > 3 else "2"
    root = Path(tempfile.mkdtemp(prefix="fork-batch-ab-"))
    root.chmod(0o755)
    task = Task.make("scale_add", (FIX / "model.py").read_text())
    cands = root / "cands.jsonl"
    cands.write_bytes(
        b"".join(
            encode(Candidate(task=task, solution=Solution.make("kernelbench", {
                "model_new.py": HONEST + f"\n# candidate {i}\n"})))
            for i in range(n)
        )
    )  # fmt: skip
    cpu: dict[str, list[float]] = {k: [] for k in ARMS}
    statuses: dict[str, list[str]] = {}

    def run(arm: str) -> None:
        out = root / f"{arm}.results.jsonl"
        cmd = [
            sys.executable, "-m", "cuda_agent.sandbox.cli", "eval", str(cands), "-o", str(out),
            "--backend", "cpu", "--cpu-workers", workers, "--guard-policy", "off",
            "--no-baselines", "--timing-config", '{"time_cap_s": 0.3, "min_samples": 3}',
            "--cache-dir", str(root / "cache"), *ARMS[arm],
        ]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(cmd, check=True, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu[arm].append(
            (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        )  # fmt: skip
        rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
        statuses[arm] = [r["status"] for r in rows]
        assert len(rows) == n and all(s == "ok" for s in statuses[arm]), statuses[arm]
        out.unlink()

    run("fork")  # warm-up: the cache, the page cache
    cpu["fork"].clear()
    med = paired_medians({k: (lambda k=k: run(k)) for k in ARMS}, rounds, 2)
    print(
        json.dumps(
            {
                "rounds": rounds,
                "n": n,
                "cpu_workers": workers,
                "batch_s_median": med,
                "per_hour": {k: round(n / v * 3600, 1) for k, v in med.items()},
                "cpu_s_median": {k: round(statistics.median(v), 1) for k, v in cpu.items()},
                "fork/cold wall": round(med["fork"] / med["cold"], 3),
                "statuses": statuses,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
