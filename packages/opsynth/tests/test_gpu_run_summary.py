"""The GPU run's summary over real filter record shapes, incl. out-of-memory rescales."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_run.py"


def _gpu_run():
    spec = importlib.util.spec_from_file_location("opsynth_gpu_run", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_summary_counts_oom_rescales_and_first_times():
    gr = _gpu_run()
    kept = [
        # rescaled after running out of memory, then once more for time: first timed is 0.4 ms
        {
            "name": "a",
            "meta": {
                "filter": {
                    "eager_ms": 2.0,
                    "rescaled": [
                        {"after": "out_of_memory", "batch_size": 16},
                        {"eager_ms_before": 0.4, "batch_size": 64},
                    ],
                }
            },
        },
        {"name": "b", "meta": {"filter": {"eager_ms": 5.0}}},
    ]
    rejected = [
        # rescaled only after out-of-memory, then rejected: no time before any rescale
        {
            "name": "c",
            "meta": {
                "rejected": {
                    "reason": "out_of_memory",
                    "detail": "x",
                    "rescaled": [
                        {"after": "out_of_memory", "batch_size": 2},
                    ],
                }
            },
        },
        {"name": "d", "meta": {"rejected": {"reason": "too_fast", "eager_ms": 0.2}}},
    ]
    pool = {"wall_s": 36.0, "stopped_at_deadline": False, "gpus": 2}
    s = gr.summarize("ours", kept, rejected, 5, pool, [1.0, 100.0], 4)
    assert s["tasks_done"] == 4 and s["passed"] == 2
    assert s["eager_ms_first"]["max"] == 5.0 and s["eager_ms_first"]["p10"] == 0.2
    assert s["outside_window_first"] == 2  # 0.4 and 0.2 ms
    assert s["rescaled_any"] == 2 and s["rescaled_kept"] == 1
    assert s["tasks_per_hour"] == 200.0  # 4 tasks / 36 s / 2 GPUs
    assert s["tasks_per_hour_all_gpus"] == 400.0
    assert s["reasons"] == {"out_of_memory": 1, "too_fast": 1}


def test_resumed_run_finishes_what_a_stopped_call_left(tmp_path):
    """A real CPU run, then a call that lost a record (cut mid-line) and a ``RESUME=1`` call:
    the lost task is redone, every task is done once, the compose is reused, the calls add up."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    out = tmp_path / "run"
    env = {
        **os.environ,
        "BACKEND": "cpu",
        "N": "4",
        "WORKERS": "2",
        "COMPILE": "0",
        "PARTS": "ours",
        "BUDGET_S": "300",
    }
    subprocess.run([sys.executable, str(SCRIPT), str(out)], env=env, check=True)
    # kept and rejected alike (on a loaded machine a tiny task can be slow enough to be kept)
    files = sorted([*out.glob("kept.ours.*.jsonl"), *out.glob("rejected.ours.*.jsonl")])
    lines = {f: f.read_text().splitlines(keepends=True) for f in files}
    assert sum(map(len, lines.values())) == 4
    # a worker stopped while writing its last record: half a line, its claim not marked done
    cut = next(f for f in files if lines[f])
    cut.write_text("".join(lines[cut][:-1]) + lines[cut][-1][:25])
    lost = json.loads(lines[cut][-1])
    lost_id = (lost["meta"].get("filter") or lost["meta"]["rejected"]).get("input_id", lost["id"])
    claim = out / "claims.ours" / lost_id
    assert claim.read_text() == "done\n"
    # and the queue itself is gone (a run copied from another machine, or made with shards):
    # the resumed call rebuilds it from the records, so only the lost task runs again
    shutil.rmtree(out / "claims.ours")
    composed = (out / "composed.jsonl").read_text()
    subprocess.run([sys.executable, str(SCRIPT), str(out)], env={**env, "RESUME": "1"}, check=True)
    assert (out / "composed.jsonl").read_text() == composed
    files = sorted([*out.glob("kept.ours.*.jsonl"), *out.glob("rejected.ours.*.jsonl")])
    tasks = [json.loads(x) for f in files for x in f.read_text().splitlines()]
    # each composed task exactly once (by input id: a redone task may be rescaled differently)
    composed_ids = sorted(json.loads(x)["id"] for x in composed.splitlines())
    inputs = [
        (t["meta"].get("filter") or t["meta"]["rejected"]).get("input_id", t["id"]) for t in tasks
    ]
    assert sorted(inputs) == composed_ids
    assert len(tasks) == 4 and lost_id in inputs  # the lost one redone
    s = json.loads((out / "ours.json").read_text())
    assert s["tasks_done"] == 4 and len(s["calls"]) == 2
    # worker seconds by check: every check the records timed, each the sum over the tasks
    # (rounded to 0.1 s, so a fast check such as "load" may read 0.0)
    timed: dict[str, float] = {}
    for t in tasks:
        info = t["meta"].get("filter") or t["meta"]["rejected"]
        for k, v in (info.get("phases_s") or {}).items():
            timed[k] = timed.get(k, 0.0) + float(v)
    phases = s["phases_s_total"]
    assert {"load", "process"} <= set(phases) and set(phases) == set(timed)
    assert all(abs(phases[k] - timed[k]) <= 0.06 for k in timed), (phases, timed)
    assert phases["process"] > 0
    assert s["filter_wall_s"] == round(sum(c["wall_s"] for c in s["calls"]), 2)
    assert json.loads((out / "env.json").read_text())["later_calls"][0]["knobs"]["RESUME"] == "1"
