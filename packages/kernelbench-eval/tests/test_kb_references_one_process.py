"""benchmarks/kb_references.py runs ONE process per problem: the profiler's baseline worker, whose
``setup`` line carries the reference step's figures; and the rows' classification from it."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.profiler.config import TimingConfig
from cuda_agent.records import Baseline, Task, TimingStats, encode

HERE = Path(__file__).parent
SCRIPT = HERE.parent / "benchmarks" / "kb_references.py"
FIXTURES = HERE / "fixtures"  # the CPU rehearsal's KB_ROOT (bin/gpu-check-kernelbench.sh)

spec = importlib.util.spec_from_file_location("kb_references_1p", SCRIPT)
kbr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kbr)

RAISES = """import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        raise ValueError("this reference is broken")

def get_inputs():
    return [torch.randn(8)]

def get_init_inputs():
    return []
"""

# every Python interpreter started under it appends its pid and argv to $KB_TEST_PYLOG
SITECUSTOMIZE = """import os, sys
_p = os.environ.get("KB_TEST_PYLOG")
if _p:
    with open(_p, "a") as _f:
        _f.write(repr((os.getpid(), list(getattr(sys, "orig_argv", sys.argv)))) + "\\n")
"""


def test_one_worker_process_per_problem_with_setup_figures(tmp_path):
    import ast

    tasks = kbr.load_tasks(FIXTURES, None, "1,2,3", None)
    assert len(tasks) == 6  # 4_Broken_no_inputs is skipped by the reader
    tasks.append(Task.make("Raises", RAISES, source="kernelbench", level=1, problem_id=9))
    tfile = tmp_path / "tasks.jsonl"
    tfile.write_bytes(b"".join(encode(t) for t in tasks))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "pythons.log"
    env = {
        **os.environ,
        "CUDA_AGENT_CACHE": str(tmp_path / "cache"),
        "KB_TEST_PYLOG": str(log),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
    }
    out = tmp_path / "rows.jsonl"
    args = ["--tasks", str(tfile), "-o", str(out), "--device", "cpu", "--jobs", "2"]
    args += ["--compile-mode", "none", "--time-cap", "0.2", "--warmup-ms", "5"]
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "run", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    rows = {r["name"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert len(rows) == 7
    bad = rows.pop("Raises")
    assert bad["status"] == "ref_error" and bad["error_class"] == "problem"
    assert "this reference is broken" in bad["error"] and bad["ref_s"] is None
    for name, r in rows.items():
        assert r["status"] == "ok" and r["error_class"] is None, (name, r)
        assert r["input_bytes"] > 0 and r["output_bytes"] > 0 and r["ref_s"] > 0, (name, r)
        assert r["peak_bytes"] is None and r["compile_s"] is None  # cpu; no compile mode
        assert r["eager_ms"] > 0 and r["timed_s"] > 0 and not r["baseline_cached"]
    assert rows["ReLU"]["input_bytes"] == rows["ReLU"]["output_bytes"] == 4 * 256 * 256

    procs = [ast.literal_eval(ln) for ln in log.read_text().splitlines()]
    children = [argv for _, argv in procs if str(SCRIPT) in argv and "run" not in argv]
    assert not any("_ref-child" in a for a in children)  # the reference step's process is gone
    assert len(children) == len(tasks)  # one per problem: the launcher of the profiler's worker
    assert all(a[a.index(str(SCRIPT)) + 1] == "_locked-worker" for a in children)
    assert len(procs) == 1 + len(tasks)  # and nothing else: this script plus its workers


# ---------------------------------------------------------------- classification (no processes)

STATS = TimingStats(median_ms=1.0, n=10)
SETUP = {
    "stage": "setup",
    "input_bytes": 10,
    "output_bytes": 20,
    "peak_bytes": None,
    "ref_s": 0.01,
    "compile_s": 3.0,
}
INFO = {"stage": "info", "device_name": "cpu:x", "torch_version": "2"}


def _baseline(error=None, eager=STATS, compiled=STATS, mode="default"):
    return Baseline(
        device="cpu:x",
        torch_version="2",
        protocol_version="p",
        eager=eager,
        compile=compiled,
        compile_mode=mode,
        backend="cpu",
        error=error,
    )


@pytest.fixture
def runner(tmp_path, monkeypatch):
    """A Runner whose baseline_for_task is scripted: ``script[compile_mode]`` = (lines, Baseline);
    ``calls`` lists the compile modes it was asked for."""
    from cuda_agent.profiler import baseline as B

    script: dict = {}
    calls: list = []
    hits: dict = {}

    def fake(task, *, compile_mode, on_line=None, report_setup=False, **kw):
        assert report_setup
        calls.append(compile_mode)
        lines, b = script[compile_mode]
        for d in lines:
            on_line(d)
        return b

    monkeypatch.setattr(B, "baseline_for_task", fake)
    monkeypatch.setattr(B, "cached_baseline", lambda task, **kw: hits.get(kw["compile_mode"]))
    monkeypatch.setattr(kbr, "estimate_bytes_locked", lambda task: 0)
    r = kbr.Runner(
        device="cpu",
        device_label="cpu:x",
        protocol="p",
        jobs=1,
        compile_mode="default",
        precompile=True,
        timeout=60.0,
        timing=TimingConfig(),
        recompute=False,
        lock=str(tmp_path / "lock"),
        stats_path=str(tmp_path / "stats.jsonl"),
        budget=kbr.MemBudget(None),
        default_share=0,
    )
    r.script, r.calls, r.hits = script, calls, hits
    return r


TASK = Task.make("T", RAISES, source="kernelbench", level=1, problem_id=5)


def test_ok_carries_the_setup_figures(runner):
    runner.script["default"] = ([INFO, SETUP, {"stage": "paired"}], _baseline())
    r = runner.one(TASK, False)
    assert (r.status, r.error_class) == ("ok", None)
    assert (r.input_bytes, r.output_bytes, r.ref_s, r.compile_s) == (10, 20, 0.01, 3.0)
    assert r.eager_ms == r.compile_ms == 1.0 and runner.calls == ["default"]
    runner.precompile = False  # --no-precompile: no compile_s in the row
    assert runner.one(TASK, False).compile_s is None


def test_a_cache_hit_is_a_valid_row_without_setup_figures(runner):
    runner.hits["default"] = _baseline()
    runner.script["default"] = ([], _baseline())  # a hit: no worker, no lines
    r = runner.one(TASK, False)
    assert r.status == "ok" and r.baseline_cached and r.ref_s is None and r.input_bytes is None


def test_compile_failure_keeps_eager(runner):
    err = "torch.compile failed: BackendCompilerFailed: x"
    lines = [INFO, {"stage": "error", "message": err}, dict(SETUP, compile_s=None)]
    runner.script["default"] = (lines, _baseline(error=err, compiled=None))
    r = runner.one(TASK, False)
    assert (r.status, r.error_class) == ("compile_error", "problem")
    assert r.eager_ms == 1.0 and r.compile_s is None and r.ref_s == 0.01


def test_the_reference_raising_in_its_set_up_is_a_ref_error(runner):
    msg = "ValueError: this reference is broken"
    runner.script["default"] = (
        [INFO, {"stage": "error", "message": msg}],
        _baseline(msg, None, None),
    )
    r = runner.one(TASK, False)
    assert (r.status, r.error_class, r.error) == ("ref_error", "problem", msg)
    assert runner.calls == ["default"]  # it said why: no second worker


def test_a_worker_dying_before_torch_imported_is_the_harness(runner):
    err = "worker exited with 1: ImportError: cannot import name x"
    runner.script["default"] = ([], _baseline(err, None, None))
    r = runner.one(TASK, False)
    assert (r.status, r.error_class) == ("infra_error", "infra") and r.error.startswith("harness")


def test_a_set_up_hanging_in_compile_is_a_compile_error_with_eager(runner):
    runner.script["default"] = ([INFO], _baseline("timeout after 60s", None, None))
    runner.script[None] = ([INFO, dict(SETUP, compile_s=None)], _baseline(compiled=None))
    r = runner.one(TASK, False)
    assert runner.calls == ["default", None]  # told apart by a worker without the compile
    assert (r.status, r.error_class) == ("compile_error", "problem")
    assert "timeout after 60s" in r.error and r.eager_ms == 1.0 and r.ref_s == 0.01


def test_a_set_up_hanging_in_the_reference_is_a_timeout(runner):
    runner.script["default"] = ([INFO], _baseline("timeout after 60s", None, None))
    runner.script[None] = ([INFO], _baseline("timeout after 60s", None, None))
    r = runner.one(TASK, False)
    assert (r.status, r.error_class) == ("timeout", "problem") and runner.calls == ["default", None]


def test_a_timing_failure_after_the_set_up_is_infra(runner):
    err = "worker exited with signal 11"
    runner.script["default"] = ([INFO, SETUP], _baseline(err, None, None))
    r = runner.one(TASK, False)
    assert (r.status, r.error_class, r.error) == ("infra_error", "infra", f"timing: {err}")


def test_out_of_memory_is_infra_shared_and_the_problems_alone(runner):
    err = "torch.OutOfMemoryError: CUDA out of memory. Tried"
    runner.script["default"] = ([INFO], _baseline(err, None, None))
    shared, alone = runner.one(TASK, False), runner.one(TASK, True)
    assert (shared.status, shared.error_class) == ("infra_error", "infra")
    assert shared.error.startswith("out_of_memory")
    assert (alone.status, alone.error_class, alone.retried_alone) == (
        "out_of_memory",
        "problem",
        True,
    )
