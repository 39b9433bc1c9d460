"""The drift probe (benchmarks/drift_probe.py) rehearsed on the CPU: a corpus-shaped folder with
a reference and a solution, every CPU condition (the host-load one starts real busy processes),
the JSON and the summary table."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
BENCH = HERE.parent / "benchmarks" / "drift_probe.py"
RELU_REF = HERE / "fixtures" / "KernelBench" / "level1" / "1_ReLU.py"
SOLUTION = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return torch.clamp_min(x, 0.0)
"""


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    (tmp_path / "KernelBench" / "level1").mkdir(parents=True)
    shutil.copy(RELU_REF, tmp_path / "KernelBench" / "level1" / "1_ReLU.py")
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "level_1_problem_1_sample_0_kernel.py").write_text(SOLUTION)
    return tmp_path


def test_probe_times_each_condition_and_writes_its_table(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "drift.json"
    cmd = [sys.executable, str(BENCH), "--root", str(corpus), "--device", "cpu", "--reps", "2"]
    cmd += ["--solutions", "level_1_problem_1_sample_0_kernel.py", "--out", str(out)]
    cmd += ["--conditions", "idle,cpu_load,fresh_inputs"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    rows = doc["solutions"][0]["conditions"]
    assert list(rows) == ["idle", "cpu_load", "fresh_inputs"]
    for cond, rs in rows.items():
        assert len(rs) == 2, cond
        for r in rs:
            assert r["cand_ms"] > 0 and r["eager_ms"] > 0
            assert r["speedup"] == pytest.approx(r["eager_ms"] / r["cand_ms"])
    assert "| level_1_problem_1_sample_0_kernel.py | cpu_load |" in p.stdout


def test_probe_refuses_what_it_cannot_do(corpus: Path, tmp_path: Path) -> None:
    base = [sys.executable, str(BENCH), "--root", str(corpus), "--out", str(tmp_path / "x.json")]
    p = subprocess.run(
        [
            *base,
            "--device",
            "cpu",
            "--solutions",
            "level_1_problem_1_sample_0_kernel.py",
            "--conditions",
            "gpu_memory",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode != 0 and "needs --device cuda" in p.stderr
    p = subprocess.run(
        [*base, "--device", "cpu", "--solutions", "relu.py"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode != 0 and "not a level_L_problem_P_sample_S_kernel.py name" in p.stderr
