"""`kernelbench-eval report` over runs against two torch.compile baselines (`run
--baseline-compile-mode default` and `max-autotune`): the main table is one mode's, and the
compile columns are given per mode (issue 31: "the report (columns per baseline)")."""

import json
import subprocess
import sys

from cuda_agent.records import EvalResult, Status, Task
from cuda_agent.records.jsonl import encode


def _result(task: Task, mode: str | None, vs_compile: float) -> EvalResult:
    meta = {"level": task.level, "problem_id": task.problem_id, "name": task.name}
    if mode is not None:
        meta["baseline_compile_mode"] = mode
    return EvalResult(
        task_id=task.id,
        solution_id=f"s{task.problem_id}",
        backend="cuda",
        device="NVIDIA H200",
        status=Status.OK,
        speedup_vs_eager=2.0,
        speedup_vs_compile=vs_compile,
        meta=meta,
    )


def _report(tmp_path, tasks, results, *extra):
    (tmp_path / "tasks.jsonl").write_bytes(b"".join(encode(t) for t in tasks))
    (tmp_path / "results.jsonl").write_bytes(b"".join(encode(r) for r in results))
    args = ["report", str(tmp_path / "results.jsonl"), "--tasks", str(tmp_path / "tasks.jsonl")]
    cmd = [sys.executable, "-m", "cuda_agent.kernelbench_eval.cli", *args, *extra]
    return subprocess.run(
        [*cmd, "--out-dir", str(tmp_path / "rep")], capture_output=True, text=True
    )


def test_compile_columns_per_baseline_mode(tmp_path, md_row):
    tasks = [Task.make(f"p{i}", f"# {i}\n", level=1, problem_id=i) for i in (1, 2)]
    # against the default compile both beat it; against max-autotune only one does
    results = [_result(t, None, 1.5) for t in tasks]  # recorded before the mode was: default
    results += [_result(tasks[0], "max-autotune", 1.2), _result(tasks[1], "max-autotune", 0.8)]
    p = _report(tmp_path, tasks, results)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    md = (tmp_path / "rep" / "report.md").read_text()
    assert doc["settings"]["compile baseline"] == "default"
    assert doc["levels"][-1]["faster_than_compile"] == 1.0  # the main table: default's results
    by = doc["by_compile_mode"]
    assert list(by) == ["default", "max-autotune"]
    assert by["default"][-1]["faster_than_compile"] == 1.0
    assert by["max-autotune"][-1]["faster_than_compile"] == 0.5
    assert abs(by["max-autotune"][-1]["geomean_speedup_vs_compile_all"] - (1.2 * 0.8) ** 0.5) < 1e-9
    assert "default: faster (>0% / >5%)" in md and "max-autotune: geomean" in md
    assert md_row(
        md, "overall", "100.0% / 100.0%", "1.50x / 1.50x", "50.0% / 50.0%", "0.98x / 0.98x"
    )
    # the other mode's results as the main table; a mode with no results is an error
    p = _report(tmp_path, tasks, results, "--compile-mode", "max-autotune")
    assert json.loads(p.stdout)["levels"][-1]["faster_than_compile"] == 0.5
    p = _report(tmp_path, tasks, results, "--compile-mode", "reduce-overhead")
    assert p.returncode == 2 and "max-autotune" in p.stderr


def test_one_mode_adds_no_table(tmp_path):
    tasks = [Task.make("p1", "# 1\n", level=1, problem_id=1)]
    p = _report(tmp_path, tasks, [_result(tasks[0], "max-autotune", 1.1)])
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert "by_compile_mode" not in doc and doc["settings"]["compile baseline"] == "max-autotune"
    assert "by its mode" not in (tmp_path / "rep" / "report.md").read_text()
