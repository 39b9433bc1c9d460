"""GPU variants (skipped without CUDA): a workdir and a kernelbench solution of one fused task
pass and are timed, and the cuda faults (illegal address, never-ending kernel, GPU OOM) give the
right status in one stream with a valid candidate after them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.records import Candidate, Solution, Task
from cuda_agent.records.jsonl import encode

FIX = Path(__file__).parent / "fixtures" / "gpu_fused"


def _task() -> Task:
    return Task.make("fused_add_scale_clamp_exp", (FIX / "model.py").read_text())


def _wd(**changes: str) -> Candidate:
    files = {
        "model_new.py": (FIX / "model_new.py").read_text(),
        "kernels/fused.cu": (FIX / "kernels" / "fused.cu").read_text(),
        "kernels/fused_binding.cpp": (FIX / "kernels" / "fused_binding.cpp").read_text(),
    }
    files.update(changes)
    return Candidate(task=_task(), solution=Solution.make("workdir", files))


def _kb(src: str) -> Candidate:
    return Candidate(task=_task(), solution=Solution.make("kernelbench", {"model_new.py": src}))


@pytest.mark.gpu
@pytest.mark.slow
def test_cuda_stream_valid_and_faults(tmp_path, cache_dir):
    cu = (FIX / "kernels" / "fused.cu").read_text()
    illegal = cu.replace("out[i] = o;", "out[i + (1L << 36)] = o;")
    hang = cu.replace(
        "  for (long i = blockIdx.x",
        "  long long t0 = clock64(); while (clock64() - t0 >= 0) {}\n  for (long i = blockIdx.x",
        1,
    )
    oom = (
        "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self, scale):\n        super().__init__()\n"
        "    def forward(self, x, y):\n"
        "        hog = [torch.empty(16 << 30, dtype=torch.uint8, device='cuda') for _ in range(64)]\n"
        "        return x\n"
    )
    cases = [
        (_wd(), "ok"),
        (_kb((FIX / "kb_model_new.py").read_text()), "ok"),
        (_wd(**{"kernels/fused.cu": illegal}), "runtime_error"),
        (_wd(**{"kernels/fused.cu": hang}), "timeout"),
        (_kb(oom), "runtime_error"),
        (_wd(**{"kernels/fused.cu": cu + "\n// after the faults\n"}), "ok"),
    ]
    inp = tmp_path / "c.jsonl"
    inp.write_bytes(b"".join(encode(c) for c, _ in cases))
    out = tmp_path / "r.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "cuda_agent.sandbox.cli",
        "eval",
        str(inp),
        "-o",
        str(out),
        "--backend",
        "cuda",
        "--guard-policy",
        "off",
        "--verify-timeout",
        "60",
        "--timing-config",
        '{"time_cap_s": 2}',
        "--cache-dir",
        str(cache_dir),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=dict(os.environ))
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    for (c, want), r in zip(cases, rows, strict=True):
        assert r["solution_id"] == c.solution.id
        assert r["status"] == want, (want, r["status"], r["message"])
    for r in (rows[0], rows[1]):
        assert (
            r["speedup_vs_eager"]
            and r["speedup_vs_compile"]
            and r["timing"]["candidate"]["median_ms"] > 0
        )
