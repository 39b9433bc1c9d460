"""`tasks` and `solutions` on the miniature KernelBench tree shipped with the tests."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.kernelbench_eval.solutions import import_solutions, scan_dir, scan_jsonl
from cuda_agent.kernelbench_eval.tree import ProblemIssue, TreeError, iter_problems, parse_ranges
from cuda_agent.records import Task
from cuda_agent.records.jsonl import DecodeError

ROOT = Path(__file__).parent / "fixtures"
CLI = [sys.executable, "-m", "cuda_agent.kernelbench_eval.cli"]


def run(args, stdin=b""):
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, timeout=120)


def test_parse_ranges():
    assert parse_ranges("1-3,7") == {1, 2, 3, 7}
    assert parse_ranges(None) is None
    with pytest.raises(ValueError):
        parse_ranges("3-1")
    with pytest.raises(ValueError):
        parse_ranges("x")


def test_iter_problems_reads_levels_and_reports_broken():
    items = list(iter_problems(ROOT))
    tasks = [t for t in items if isinstance(t, Task)]
    issues = [t for t in items if isinstance(t, ProblemIssue)]
    assert [(t.level, t.problem_id, t.name) for t in tasks] == [
        (1, 1, "ReLU"),
        (1, 2, "Softmax"),
        (1, 3, "Sum_reduction_over_a_dimension"),
        (2, 1, "Gemm_ReLU"),
        (2, 2, "Scale_Add_Tanh"),
        (3, 1, "MLP"),
    ]
    assert len(issues) == 1 and "get_inputs" in issues[0].message
    assert (
        tasks[0].source == "kernelbench" and tasks[0].meta["path"] == "KernelBench/level1/1_ReLU.py"
    )
    # the KernelBench/ folder itself works too, and filters apply
    sub = [t for t in iter_problems(ROOT / "KernelBench", {1}, {2, 3}) if isinstance(t, Task)]
    assert [t.problem_id for t in sub] == [2, 3]


def test_not_a_checkout(tmp_path):
    with pytest.raises(TreeError, match="no KernelBench"):
        list(iter_problems(tmp_path))


def test_tasks_cli():
    p = run(["tasks", "--root", str(ROOT)])
    assert p.returncode == 0, p.stderr
    recs = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(recs) == 6 and all(r["kind"] == "task" for r in recs)
    assert b"4_Broken_no_inputs.py: does not define get_inputs" in p.stderr
    assert run(["tasks", "--root", str(ROOT), "--strict"]).returncode == 2
    p = run(["tasks", "--root", str(ROOT), "--levels", "2", "--problems", "2"])
    assert [json.loads(x)["name"] for x in p.stdout.splitlines()] == ["Scale_Add_Tanh"]


def _tasks():
    return [t for t in iter_problems(ROOT) if isinstance(t, Task)]


def test_scan_dir_all_name_styles(tmp_path):
    (tmp_path / "level_1_problem_1_sample_0_kernel.py").write_text("# a\n")
    (tmp_path / "level_1_problem_1_sample_1_kernel.py").write_text("# b\n")
    (tmp_path / "level2").mkdir()
    (tmp_path / "level2" / "1_Gemm_ReLU.py").write_text("# c\n")
    wd = tmp_path / "level3" / "1_MLP"
    (wd / "kernels").mkdir(parents=True)
    (wd / "model_new.py").write_text("# d\n")
    (wd / "kernels" / "mlp.cu").write_text("// e\n")
    (wd / "kernels" / "notes.txt").write_text("ignored\n")
    (tmp_path / "level1" / "2_empty").mkdir(parents=True)  # a folder without model_new.py
    found, bad = scan_dir(tmp_path)
    assert sorted((f.level, f.problem_id, f.sample, f.solution.format) for f in found) == [
        (1, 1, 0, "kernelbench"),
        (1, 1, 1, "kernelbench"),
        (2, 1, 0, "kernelbench"),
        (3, 1, 0, "workdir"),
    ]
    wdsol = next(f.solution for f in found if f.solution.format == "workdir")
    assert set(wdsol.files) == {"model_new.py", "kernels/mlp.cu"}
    assert bad == ["level1/2_empty: a folder without model_new.py"]
    rep = import_solutions(_tasks(), found)
    assert len(rep.candidates) == 4
    assert [(t.level, t.problem_id) for t in rep.missing] == [(1, 2), (1, 3), (2, 2)]
    assert rep.candidates[0].meta == {"level": 1, "problem_id": 1, "sample": 0}


def test_scan_jsonl_and_orphans(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_text(
        json.dumps({"level": 1, "problem_id": 2, "code": "# x"})
        + "\n"
        + json.dumps(
            {"level": 9, "problem_id": 9, "files": {"model_new.py": "", "kernels/a.cu": ""}}
        )
        + "\n"
    )
    found, _ = scan_jsonl(p)
    assert [f.solution.format for f in found] == ["kernelbench", "workdir"]
    rep = import_solutions(_tasks(), found)
    assert len(rep.candidates) == 1 and rep.orphans == ["level 9 problem 9 (jsonl)"]
    p.write_text('{"level": 1, "problem_id": 2}\n')
    with pytest.raises(DecodeError, match="line 1: give exactly one"):
        scan_jsonl(p)


def test_solutions_cli(tmp_path):
    (tmp_path / "level_2_problem_1_sample_0_kernel.py").write_text("# k\n")
    tasks = run(["tasks", "--root", str(ROOT)]).stdout
    p = run(["solutions", "--dir", str(tmp_path)], tasks)
    assert p.returncode == 0, p.stderr
    cands = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(cands) == 1 and cands[0]["kind"] == "candidate"
    assert cands[0]["task"]["name"] == "Gemm_ReLU"
    assert b"5 tasks have no solution" in p.stderr
    assert run(["solutions"], tasks).returncode == 2


def _problem(init: str, forward: str = "return self.m(x)") -> str:
    return (
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
        f"    def __init__(self):\n        super().__init__()\n        self.m = {init}\n"
        f"    def forward(self, x):\n        {forward}\n\n"
        "def get_inputs():\n    return [torch.randn(8, 16)]\n\ndef get_init_inputs():\n    return []\n"
    )


def test_tasks_get_kernelbenchs_module_mode(tmp_path):
    level = tmp_path / "KernelBench" / "level2"
    level.mkdir(parents=True)
    (level / "1_Gemm_BatchNorm.py").write_text(_problem("nn.BatchNorm1d(16)"))
    (level / "2_Gemm_Dropout.py").write_text(_problem("nn.Dropout(0.2)"))
    (level / "3_Gemm_ReLU.py").write_text(_problem("nn.ReLU()"))
    p = run(["tasks", "--root", str(tmp_path)])
    assert p.returncode == 0, p.stderr
    tasks = [json.loads(line) for line in p.stdout.decode().splitlines()]
    # train mode where BatchNorm's batch statistics matter (KernelBench's harness never calls
    # .eval()), eval where the modes agree and where train mode is random
    assert [t.get("model_mode", "eval") for t in tasks] == ["train", "eval", "eval"]
    assert "BatchNorm1d" in tasks[0]["meta"]["model_mode_why"][0]
    assert "random" in tasks[1]["meta"]["model_mode_why"][0]
    assert "model_mode_why" not in tasks[2]["meta"]
    p = run(["tasks", "--root", str(tmp_path), "--model-mode", "eval"])
    assert p.returncode == 0, p.stderr
    assert {
        json.loads(line).get("model_mode", "eval") for line in p.stdout.decode().splitlines()
    } == {"eval"}
