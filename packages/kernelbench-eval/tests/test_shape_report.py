"""`kernelbench-eval report` with shape-checked results (`run --shape-check`): the passes at
resized shapes beside the pass rate. The records are shaped as the sandbox writes them
(packages/sandbox/tests/test_shape_check.py produces them for real)."""

import json
import subprocess
import sys

from cuda_agent.records import EvalResult, Status, Task
from cuda_agent.records.jsonl import encode

SIZES = {"rows": [64, 49], "cols": [256, 193]}


def _inst(status: str) -> dict:
    return {"factor": 0.75, "sizes": SIZES, "status": status, "build_cached": True}


def _result(task: Task, status: Status, shape: dict | None) -> EvalResult:
    meta = {"level": task.level, "problem_id": task.problem_id, "name": task.name}
    if shape is not None:
        meta["shape_check"] = shape
    ok = status is Status.OK
    return EvalResult(
        task_id=task.id,
        solution_id=f"s{task.problem_id}",
        backend="cpu",
        device="cpu",
        status=status,
        speedup_vs_eager=1.5 if ok else None,
        meta=meta,
    )


def _report(tmp_path, tasks: list[Task], results: list[EvalResult]) -> tuple[dict, str]:
    (tmp_path / "tasks.jsonl").write_bytes(b"".join(encode(t) for t in tasks))
    (tmp_path / "results.jsonl").write_bytes(b"".join(encode(r) for r in results))
    args = ["report", str(tmp_path / "results.jsonl"), "--tasks", str(tmp_path / "tasks.jsonl")]
    cmd = [sys.executable, "-m", "cuda_agent.kernelbench_eval.cli", *args]
    p = subprocess.run([*cmd, "--out-dir", str(tmp_path / "rep")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    return doc, (tmp_path / "rep" / "report.md").read_text()


def test_the_report_shows_the_passes_at_resized_shapes(tmp_path, md_row):
    tasks = [Task.make(f"p{i}", f"# {i}\n", level=1, problem_id=i) for i in range(1, 5)]
    results = [
        _result(tasks[0], Status.OK, {"instances": [_inst("ok")], "passed": True}),
        # correct at its own shape, wrong at the resized one
        _result(tasks[1], Status.INCORRECT, {"instances": [_inst("incorrect")], "passed": False}),
        _result(tasks[2], Status.OK, {"instances": [], "skipped": "the task cannot be resized"}),
        _result(tasks[3], Status.INCORRECT, None),  # wrong at its own shape: never re-verified
    ]
    doc, md = _report(tmp_path, tasks, results)
    overall = doc["levels"][-1]
    assert overall["level"] == "overall" and overall["pass_rate"] == 0.5
    assert overall["correct_at_task_shape"] == 3
    assert overall["passes_at_resized_shapes"] == 1
    assert overall["passes_at_resized_shapes_rate"] == 0.25
    assert overall["not_resizable"] == 1
    assert [p["shape_check"] for p in doc["problems"]] == ["passed", "failed", "skipped", None]
    assert doc["settings"]["shape check"] == "on"
    assert "passes at resized shapes" in md
    assert md_row(md, "overall", "4", "3 (75.0%)", "1 (25.0%)", "1")
    assert md_row(md, "level 1", "4", "3 (75.0%)", "1 (25.0%)", "1")


def test_without_the_shape_check_the_report_is_unchanged(tmp_path):
    tasks = [Task.make("p1", "# 1\n", level=1, problem_id=1)]
    doc, md = _report(tmp_path, tasks, [_result(tasks[0], Status.OK, None)])
    assert doc["levels"][-1]["passes_at_resized_shapes"] is None
    assert "shape check" not in doc["settings"]
    assert "Shape generalisation" not in md  # no table (the definitions still say what it is)
