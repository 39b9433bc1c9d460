"""``opsynth filter --workers N``: N filter processes on one input, one task queue, one output.

The parent starts N copies of the filter command, each with its own part files
(``OUT.part<k>``, ``REJ.part<k>``) and a shared claim queue (``OUT.claims/``), waits for them,
and appends the parts to ``-o`` and ``--rejected``. The output files stay the record of what is
done: a run stopped at any point merges whatever parts it finds first, marks every task already
in the outputs done in a fresh queue, and goes on with the rest; the queue is removed at the end.
The workers share the device this process sees, their eager timings serialised by the device's
gate (:func:`cuda_agent.opsynth.probe.timing_hold`), with every other timer on it.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

from cuda_agent.records.jsonl import repair_tail


def _parts(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.part*"))


def merge_parts(path: Path) -> int:
    """Append every ``path.part<k>`` file to ``path`` (whole lines only) and delete it; returns
    the number of lines appended."""
    n = 0
    for part in _parts(path):
        repair_tail(part)
        data = part.read_bytes()
        if data:
            if path.exists():
                repair_tail(path)
            with open(path, "ab") as fh:
                fh.write(data)
            n += data.count(b"\n")
        part.unlink()
    return n


def record_input_id(record: dict) -> str:
    """:func:`.filter.input_id` of a filter record read as JSON."""
    from .filter import input_id

    return input_id(record.get("meta") or {}, str(record.get("id")))


def mark_done(queue: Path, keys: list[str]) -> None:
    """Mark ``keys`` done in the claim queue ``queue`` (tasks whose records already exist)."""
    from cuda_agent.records.claims import Claims

    claims = Claims(queue)
    for key in keys:
        if claims.take(key):
            claims.done(key)


def _input_ids(path: Path) -> list[str]:
    import json

    if not path.exists():
        return []
    ids = []
    for line in path.read_text().splitlines():
        try:
            ids.append(record_input_id(json.loads(line)))
        except ValueError:
            continue
    return ids


def run_workers(
    n: int, child_args: list[str], output: Path, rejected: Path | None, resume: bool
) -> int:
    """Run ``n`` filter processes (``child_args``: the filter command's options, without output
    files) over one queue and merge their outputs; returns the worst exit code."""
    from cuda_agent.records.cli_helpers import log

    outs = [output] + ([rejected] if rejected is not None else [])
    merged = sum(merge_parts(p) for p in outs)  # an earlier run stopped before merging
    if merged:
        log(f"filter: merged {merged} records left by an earlier run")
    queue = output.parent / f"{output.name}.claims"
    shutil.rmtree(queue, ignore_errors=True)
    if resume:
        done = {k for p in outs for k in _input_ids(p)}
        mark_done(queue, sorted(done))
        if done:
            log(f"resume: {len(done)} tasks already in the outputs")
    procs = []
    for k in range(n):
        cmd = [sys.executable, "-m", "cuda_agent.opsynth.cli", "filter", *child_args]
        cmd += ["--claim", str(queue), "-o", f"{output}.part{k}"]
        if rejected is not None:
            cmd += ["--rejected", f"{rejected}.part{k}"]
        procs.append(subprocess.Popen(cmd))
    log(f"filter: {n} workers, one queue ({queue})")
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:  # stop the workers; what they finished is merged below
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        codes = [p.wait() for p in procs]
        codes.append(130)
    n_out = sum(merge_parts(p) for p in outs)
    shutil.rmtree(queue, ignore_errors=True)
    log(f"filter: {n} workers wrote {n_out} records to {', '.join(map(str, outs))}")
    return max(codes)
