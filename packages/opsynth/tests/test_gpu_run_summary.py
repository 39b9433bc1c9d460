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
