"""The fault suite in ONE `sandbox eval` stream (cpu backend): every hostile or broken candidate
gets the right status, and the valid candidates around them still evaluate correctly."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from cuda_agent.records import Task
from cuda_agent.records.jsonl import encode

from .conftest import kb_candidate, workdir_candidate

OPS_HEAD = 'extern "C" int kernel_run(float* out, const float* x, const float* w, const float* b, long rows, long cols) {\n'
OPS_OK = "  for (long i = 0; i < rows * cols; ++i) out[i] = x[i] * w[i % cols] + b[i % cols];\n  return 0;\n}\n"

BOMB = textwrap.dedent(
    """
    template <long N, long K> struct F { static constexpr long v = F<N - 1, 2 * K>::v + F<N - 1, 2 * K + 1>::v; };
    template <long K> struct F<0, K> { static constexpr long v = K; };
    extern "C" long compile_bomb() { return F<40, 1>::v; }
    """
)


def _kb(body: str) -> str:
    """A kernelbench-format ModelNew for scale_add whose forward runs ``body`` first."""
    return textwrap.dedent(
        """
        import os, socket, time
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def __init__(self, cols):
                super().__init__()
                self.w = nn.Parameter(torch.empty(cols))
                self.b = nn.Parameter(torch.empty(cols))

            def forward(self, x):
        {body}
                return x * self.w + self.b
        """
    ).format(body=textwrap.indent(textwrap.dedent(body), " " * 8))


SMALL_TASK = textwrap.dedent(
    """
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            return x * 1e-3


    def get_inputs():
        return [torch.randn(128, 64)]


    def get_init_inputs():
        return []
    """
)


@pytest.mark.slow
def test_fault_suite_one_stream(warm_build, cache_dir, tmp_path, scale_add_task, scale_add_files):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    canary = tmp_path / "outside" / "pwned"
    canary.parent.mkdir()
    t, f = scale_add_task, scale_add_files
    small = Task.make("small_values", SMALL_TASK)
    cases = [
        ("valid", workdir_candidate(t, f), {"ok"}),
        (
            "compile error",
            workdir_candidate(t, f, **{"kernels/ops.cpp": OPS_HEAD + "  return 0 +;\n}\n"}),
            {"compile_error"},
        ),
        (
            "compile bomb",
            workdir_candidate(t, f, **{"kernels/ops.cpp": BOMB + OPS_HEAD + OPS_OK}),
            {"compile_error"},
        ),
        (
            "segfault",
            workdir_candidate(
                t, f, **{"kernels/ops.cpp": OPS_HEAD + "  *(volatile int*)0 = 1;\n  return 0;\n}\n"}
            ),
            {"runtime_error"},
        ),
        (
            "never ends",
            workdir_candidate(
                t,
                f,
                **{
                    "kernels/ops.cpp": OPS_HEAD
                    + "  volatile int spin = 1; while (spin) {}\n  return 0;\n}\n"
                },
            ),
            {"timeout"},
        ),
        (
            "memory bomb",
            kb_candidate(t, _kb("hog = []\nwhile True:\n    hog.append(torch.ones(64 << 20))")),
            {"runtime_error"},
        ),
        (
            "fork bomb",
            kb_candidate(
                t,
                _kb("while True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
            ),
            {"runtime_error", "timeout"},
        ),
        (
            "write outside",
            kb_candidate(t, _kb(f"open({str(canary)!r}, 'w').write('x')")),
            {"runtime_error"},
        ),
        (
            "network",
            kb_candidate(t, _kb(f"socket.create_connection(('127.0.0.1', {port}), timeout=3)")),
            {"runtime_error"},
        ),
        (
            "kill parent group",
            kb_candidate(
                t,
                _kb(
                    "os.killpg(os.getpgid(os.getppid()), 9)\nos.kill(os.getppid(), 9)\nos.kill(-1, 9)"
                ),
            ),
            {"runtime_error"},
        ),
        (
            "all zeros, small values",
            kb_candidate(
                small,
                "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.zeros_like(x)\n",
            ),
            {"incorrect"},
        ),
        (
            "valid again",
            workdir_candidate(t, f, **{"kernels/ops.cpp": "// again\n" + OPS_HEAD + OPS_OK}),
            {"ok"},
        ),
    ]
    inp = tmp_path / "cands.jsonl"
    inp.write_bytes(b"".join(encode(c) for _, c, _ in cases))
    out = tmp_path / "results.jsonl"
    env = dict(os.environ, CUDA_AGENT_SANDBOX_CACHE=str(cache_dir))
    cmd = [
        sys.executable,
        "-m",
        "cuda_agent.sandbox.cli",
        "eval",
        str(inp),
        "-o",
        str(out),
        "--backend",
        "cpu",
        "--guard-policy",
        "off",
        "--compile-timeout",
        "10",
        "--verify-timeout",
        "20",  # the never-ending candidate waits this long; honest ones need ~5 s here
        "--host-mem-mb",
        "2048",
        "--max-procs",
        "64",
        "--compile-jobs",
        "2",
        "--cpu-workers",
        "2",
        "--cache-dir",
        str(cache_dir),
        # what is checked is each verdict, not the timing's precision (default: up to 10 s of
        # samples and 5 s of warm-up per measurement)
        "--timing-config",
        '{"time_cap_s": 1.0, "warmup_max_s": 0.5, "min_samples": 3}',
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    written = {
        json.loads(line)["solution_id"]: json.loads(line) for line in out.read_text().splitlines()
    }
    assert sorted(written) == sorted(c.solution.id for _, c, _ in cases)  # each once
    results = [written[c.solution.id] for _, c, _ in cases]
    for (name, _, want), r in zip(cases, results, strict=True):
        assert r["status"] in want, f"{name}: {r['status']} {r['message']}\n{json.dumps(r)[:3000]}"
    by = {name: r for (name, _, _), r in zip(cases, results, strict=True)}
    for name, r in by.items():  # 2 workers: a runtime error met while sharing was re-run alone
        if r["status"] == "runtime_error" and r["meta"].get("rerun_alone"):
            assert r["meta"]["rerun_alone"]["status"] == "runtime_error", name
            assert not r["meta"]["overlapped"], name
        elif r["status"] == "runtime_error" and r["meta"]["overlapped"]:
            # only memory failures are a neighbour's doing; anything else stands as it was
            assert "memory" not in r["message"].lower(), name
    for name in ("valid", "valid again"):
        r = by[name]
        assert r["correctness"]["passed"] and len(r["correctness"]["trials"]) >= 5
        assert {t["variant"] for t in r["correctness"]["trials"]} >= {"base", "shift", "scale"}
        assert r["timing"]["candidate"]["median_ms"] > 0 and r["speedup_vs_eager"] > 0
    assert "time limit" in by["compile bomb"]["message"]
    assert "SIGSEGV" in by["segfault"]["message"]
    assert not canary.exists()
    with pytest.raises(TimeoutError):
        srv.accept()
    assert "relative error norm" in by["all zeros, small values"]["message"]
    # resume: everything is already there, nothing is evaluated again
    p2 = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=300, env=env)
    assert p2.returncode == 0 and len(out.read_text().splitlines()) == len(cases), p2.stderr[-2000:]
    assert "12 skipped" in p2.stderr
