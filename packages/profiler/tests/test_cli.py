"""The ``profiler`` CLI, run as real subprocesses on tiny CPU programs."""

import json
import subprocess
import sys
from pathlib import Path

from cuda_agent.records import Task, encode

EXPL = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "KernelBench" / "exploits"
DATA = Path(__file__).parent / "data"
FAST = ["--device", "cpu", "--time-cap", "0.3", "--warmup-ms", "5"]


def _cli(*args, input=None, env=None, timeout=180):
    return subprocess.run(
        [sys.executable, "-m", "cuda_agent.profiler.cli", *map(str, args)],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_help_lists_commands():
    p = _cli("--help")
    assert p.returncode == 0
    for c in ("time", "baseline", "ncu", "ceilings", "sol"):
        assert c in p.stdout


def test_time_file_with_new(tiny_src, tmp_path):
    ref = tmp_path / "ref.py"
    ref.write_text(tiny_src)
    new = tmp_path / "new.py"
    new.write_text(
        "import torch\nimport torch.nn as nn\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self, scale):\n        super().__init__()\n        self.scale = scale\n"
        "    def forward(self, x):\n        return torch.relu(x @ x.T) * self.scale\n"
    )
    p = _cli("time", ref, "--new", new, *FAST)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1  # stdout: the record only; the table went to stderr
    d = json.loads(lines[0])
    assert d["protocol_version"].startswith("ca-timing-")
    assert d["eager"]["median_ms"] > 0 and d["candidate"]["median_ms"] > 0
    lo, hi = d["speedup_vs_eager_ci"]
    assert lo <= hi
    assert "median" in p.stderr


def test_time_missing_file_fails_cleanly(tmp_path):
    p = _cli("time", tmp_path / "nope.py", *FAST)
    assert p.returncode == 2 and "no such file" in p.stderr


def test_baseline_stream_errors_and_skip(tiny_src, tmp_path):
    env = {**__import__("os").environ, "CUDA_AGENT_CACHE": str(tmp_path / "cache")}
    good = encode(Task.make("tiny", tiny_src)).decode()
    bad_first = "{this is not json\n" + good
    p = _cli("baseline", "--compile-mode", "none", *FAST, input=bad_first, env=env)
    assert p.returncode == 2 and "line 1" in p.stderr and p.stdout == ""
    p = _cli(
        "baseline", "--compile-mode", "none", "--on-error", "skip", *FAST, input=bad_first, env=env
    )
    assert p.returncode == 0, p.stderr
    (line,) = p.stdout.strip().splitlines()
    d = json.loads(line)
    assert d["kind"] == "task" and d["baseline"]["eager"]["median_ms"] > 0
    assert d["baseline"]["compile_mode"] == "none" and d["baseline"]["error"] is None
    assert list((tmp_path / "cache" / "baselines").glob("*.json"))
    # one task queue shared by several processes: the first takes the task, a later one skips it
    q = tmp_path / "queue"
    first = _cli("baseline", "--compile-mode", "none", "--claim", q, *FAST, input=good, env=env)
    again = _cli("baseline", "--compile-mode", "none", "--claim", q, *FAST, input=good, env=env)
    assert first.returncode == 0 and len(first.stdout.strip().splitlines()) == 1, first.stderr
    assert again.returncode == 0 and again.stdout == "", again.stderr
    assert "1 taken by other processes or done" in again.stderr


def test_ncu_fallback_and_from_csv(tiny_src, tmp_path):
    ref = tmp_path / "ref.py"
    ref.write_text(tiny_src)
    p = _cli("ncu", ref, "--no-ncu", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("torch.profiler:") and "aten::mm" in p.stdout
    p = _cli("ncu", ref, "--from-csv", DATA / "ncu_gemm_raw.csv", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["tool"] == "ncu" and d["kernels"][0]["registers"] == 254


def test_sol_flags_impossible_time(tiny_src, tmp_path, fixtures_dir):
    ref = tmp_path / "ref.py"
    ref.write_text(tiny_src)
    p = _cli("sol", ref, "--copy-gbps", "1000", "--tflops", "10", "--measured-ms", "1e-6")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["work"]["flops"] == 2 * 96**3
    # far under the roofline, but a 36 KB output fits in a cache: no time is impossible
    assert d["fraction"] > 1 and d["floor_ms"] == 0.0 and d["below_bound"] is False
    relu = fixtures_dir / "level1/1_ReLU.py"  # a 2 GiB output: 1e-3 ms would be 2 PB/s
    p = _cli("sol", relu, "--copy-gbps", "1000", "--tflops", "10", "--measured-ms", "1e-3")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["floor_ms"] > 1 and d["below_bound"] is True


def test_ceilings_needs_cuda():
    p = _cli("ceilings", "--device", "cpu")
    assert p.returncode == 2


def test_time_candidates_jsonl(tiny_src, tmp_path):
    from cuda_agent.records import Candidate, Solution

    new_src = (
        "import torch\nimport torch.nn as nn\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self, scale):\n        super().__init__()\n        self.scale = scale\n"
        "    def forward(self, x):\n        return torch.relu(x @ x.T) * self.scale\n"
    )
    c = Candidate(
        task=Task.make("tiny", tiny_src),
        solution=Solution.make("kernelbench", {"model_new.py": new_src}),
    )
    wd = Candidate(
        task=Task.make("tiny", tiny_src),
        solution=Solution.make("workdir", {"kernel.cu": "// nothing"}),
    )
    p = _cli("time", "-", *FAST, "--on-error", "skip", input=(encode(c) + encode(wd)).decode())
    assert p.returncode == 0, p.stderr
    (line,) = p.stdout.strip().splitlines()  # the workdir candidate was skipped, with a message
    d = json.loads(line)
    assert d["kind"] == "eval_result" and d["meta"]["timing_only"] is True
    assert d["timing"]["candidate"]["median_ms"] > 0 and d["speedup_vs_eager"] > 0
    assert "sandbox eval" in p.stderr
