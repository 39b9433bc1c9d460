"""benchmarks/kb_references.py on the cpu device: rows, error classes, resume, the table."""

import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from cuda_agent.records import Task, encode

HERE = Path(__file__).parent
SCRIPT = HERE.parent / "benchmarks" / "kb_references.py"
FIX = HERE / "fixtures" / "KernelBench"

spec = importlib.util.spec_from_file_location("kb_references", SCRIPT)
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


def _run(args, env, timeout=120):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def test_rows_error_class_resume_and_table(tmp_path, monkeypatch, md_row):
    import os

    env = {**os.environ, "CUDA_AGENT_CACHE": str(tmp_path / "cache")}
    relu = (FIX / "level1" / "1_ReLU.py").read_text()
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(
        encode(Task.make("ReLU", relu, source="kernelbench", level=1, problem_id=1))
        + encode(Task.make("Raises", RAISES, source="kernelbench", level=1, problem_id=9))
    )
    out = tmp_path / "rows.jsonl"
    common = [
        "--tasks",
        str(tasks),
        "-o",
        str(out),
        "--device",
        "cpu",
        "--jobs",
        "2",
        "--compile-mode",
        "none",
        "--time-cap",
        "0.2",
        "--warmup-ms",
        "5",
    ]
    p = _run(["run", *common], env)
    assert p.returncode == 0, p.stderr
    rows = {r["name"]: r for r in map(json.loads, out.read_text().splitlines())}
    ok, bad = rows["ReLU"], rows["Raises"]
    assert ok["status"] == "ok" and ok["error_class"] is None
    assert ok["input_bytes"] == ok["output_bytes"] == 4 * 256 * 256  # 256x256 fp32 in and out
    assert ok["eager_ms"] > 0 and ok["ref_s"] > 0 and ok["compile_ms"] is None
    assert ok["timed_s"] > 0  # the worker's timed section went through the lock
    assert bad["status"] == "ref_error" and bad["error_class"] == "problem"
    assert "this reference is broken" in bad["error"] and bad["eager_ms"] is None
    assert "2/2" in p.stderr  # progress on stderr

    # resume: nothing left to run; a cut last line is dropped
    with out.open("a") as fh:
        fh.write('{"task_id": "cut')
    p = _run(["run", *common, "--resume"], env)
    assert p.returncode == 0, p.stderr
    assert "0 to run of 2 problems (2 done)" in p.stderr
    assert len(kbr.read_rows(out)) == 2

    env_txt = tmp_path / "env.txt"
    env_txt.write_text("Tue Dec  1 13:00:00 UTC 2026\ncommit abc1234\n0, NVIDIA H200, 9.0\n")
    md = kbr.render(kbr.read_rows(out), env_txt.read_text().splitlines(), "bash x.sh", "T")
    assert "commit `abc1234`" in md and "NVIDIA H200" in md and "`bash x.sh`" in md
    assert md_row(md, 1, 2, 1, 0, 1, 0)  # level 1: 2 problems, 1 ok, 1 problem error
    assert md_row(md, 9, "Raises", "-", "-", "-")
    assert md_row(md, "L1/9 Raises", "ref_error", "problem")


def _row(task, **kw):
    return kbr.Row(task_id=task.id, level=1, problem=task.problem_id, name=task.name, **kw)


def test_resume_redoes_infra_rows_and_asked_statuses():
    a, b, c, d = (Task.make(n, f"# {n}", level=1, problem_id=i) for i, n in enumerate("abcd"))
    rows = [
        _row(a, status="ok"),
        _row(b, status="infra_error", error_class="infra", error="out_of_memory: x"),
        _row(c, status="infra_error", error_class="infra"),
        _row(c, status="timeout", error_class="problem"),  # the last row of a task counts
    ]
    assert [t.name for t in kbr.pending([a, b, c, d], rows, set())] == ["b", "d"]
    assert [t.name for t in kbr.pending([a, b, c, d], rows, {"timeout"})] == ["b", "c", "d"]


def test_table_counts_a_problem_whose_task_changed_once_by_its_newer_row(md_row):
    old = Task.make("BatchNorm", "# eval", level=1, problem_id=33)
    new = Task.make("BatchNorm", "# eval", level=1, problem_id=33, model_mode="train")
    other = Task.make("ReLU", "# relu", level=1, problem_id=19)
    assert old.id != new.id
    rows = [
        _row(old, status="ok", eager_ms=1.0),
        _row(other, status="ok", eager_ms=2.0),
        _row(new, status="ref_error", error_class="problem", error="x"),
    ]
    assert [r.task_id for r in kbr.latest_per_problem(rows)] == [new.id, other.id]
    md = kbr.render(rows, [], "", "T")
    assert md_row(md, 1, 2, 1, 0, 1, 0)  # 2 problems (not 3): the BatchNorm counts by its new row


def test_infra_kinds():
    assert kbr.infra_kind("torch.OutOfMemoryError: CUDA out of memory. Tried") == "out_of_memory"
    assert kbr.infra_kind("OSError: [Errno 28] No space left on device") == "disk"
    assert kbr.infra_kind("worker exited with signal 9") == "killed"
    assert kbr.infra_kind("ModuleNotFoundError: No module named 'einops'") == "environment"
    assert kbr.infra_kind("RuntimeError: shape mismatch") is None


def test_mem_budget_first_come_first_served():
    b = kbr.MemBudget(10)
    order, held = [], []

    def take(n, name):
        cm = b.hold(n)
        cm.__enter__()
        held.append(cm)
        order.append(name)

    with b.hold(6):
        big = threading.Thread(target=take, args=(8, "big"))
        big.start()
        time.sleep(0.1)
        small = threading.Thread(target=take, args=(2, "small"))
        small.start()
        time.sleep(0.1)
        assert order == []  # 2 would fit beside 6, but the larger request came first
    big.join(2)
    small.join(2)
    assert order == ["big", "small"] and b.used == 10
    alone = kbr.MemBudget(4)
    with alone.hold(100):  # larger than the budget: runs when nothing else holds any
        assert alone.used == 100
