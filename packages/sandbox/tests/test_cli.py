"""CLI conventions of `sandbox eval`: shards split a stream, malformed lines, --help fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from cuda_agent.records.jsonl import encode

from .conftest import kb_candidate

TORCH_OPS = (
    "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
    "    def __init__(self, cols):\n        super().__init__()\n"
    "        self.w = nn.Parameter(torch.empty(cols))\n        self.b = nn.Parameter(torch.empty(cols))\n"
    "    def forward(self, x):\n        return torch.addcmul(self.b, x, self.w)\n"
)


def _eval(args, inp, cache_dir):
    cmd = [
        sys.executable,
        "-m",
        "cuda_agent.sandbox.cli",
        "eval",
        str(inp),
        "--backend",
        "cpu",
        "--cache-dir",
        str(cache_dir),
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_shards_partition_the_stream_and_bad_lines_are_emitted(tmp_path, cache_dir, scale_add_task):
    # statically rejected candidates: no process runs, so this is fast
    cands = [kb_candidate(scale_add_task, TORCH_OPS + f"\n# {i}\n") for i in range(6)]
    inp = tmp_path / "c.jsonl"
    inp.write_bytes(b"".join(encode(c) for c in cands))
    keys = []
    for i in range(2):
        p = _eval(["--shard", f"{i}/2"], inp, cache_dir)
        assert p.returncode == 0, p.stderr[-2000:]
        keys.append({json.loads(x)["solution_id"] for x in p.stdout.splitlines()})
    assert keys[0].isdisjoint(keys[1]) and keys[0] | keys[1] == {c.solution.id for c in cands}
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(encode(cands[0]) + b"{not json\n" + encode(cands[1]))
    p = _eval(["--on-error", "emit", "--no-early-start"], bad, cache_dir)
    kinds = [json.loads(x)["kind"] for x in p.stdout.splitlines()]
    # written as each is done: the malformed line's error record need not wait for the others
    assert p.returncode == 0, p.stderr[-2000:]
    assert sorted(kinds) == ["error", "eval_result", "eval_result"]
    p = _eval([], bad, cache_dir)
    assert p.returncode == 2 and "line 2" in p.stderr
    assert len(p.stdout.splitlines()) == 1  # the record before the bad line is not lost


def test_processes_sharing_a_claim_queue_evaluate_each_candidate_once(
    tmp_path, cache_dir, scale_add_task
):
    """Two `sandbox eval --claim DIR` processes over one stream: every candidate evaluated by
    exactly one of them; a third, later, finds nothing left."""
    cands = [kb_candidate(scale_add_task, TORCH_OPS + f"\n# q{i}\n") for i in range(6)]
    inp = tmp_path / "c.jsonl"
    inp.write_bytes(b"".join(encode(c) for c in cands))
    q = str(tmp_path / "queue")
    cmd = [sys.executable, "-m", "cuda_agent.sandbox.cli", "eval", str(inp), "--backend", "cpu"]
    cmd += ["--cache-dir", str(cache_dir), "--claim", q]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    ids = [json.loads(x)["solution_id"] for o, _ in outs for x in o.splitlines()]
    assert sorted(ids) == sorted(c.solution.id for c in cands)  # each once, none lost
    p = _eval(["--claim", q], inp, cache_dir)
    assert p.returncode == 0 and p.stdout == "" and "6 skipped" in p.stderr, p.stderr[-2000:]


def test_help_is_fast():
    p = subprocess.run(
        [sys.executable, "-m", "cuda_agent.sandbox.cli", "eval", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and "--gpus" in p.stdout and "--resume" in p.stdout


def test_gpu_selection_is_relative_to_visible_devices(monkeypatch):
    from cuda_agent.sandbox.pool import parse_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert parse_gpus("all") == ["2", "3"]
    assert parse_gpus("1") == ["3"]
    assert parse_gpus(None) is None
    import pytest

    with pytest.raises(ValueError):
        parse_gpus("5")


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "cuda_agent.sandbox.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def test_workspace_and_flags_commands(tmp_path, scale_add_task):
    """`sandbox workspace` makes a workspace once (never over a non-empty directory); `sandbox
    flags` prints the flags and tool versions of the cache key."""
    tasks = tmp_path / "t.jsonl"
    tasks.write_bytes(encode(scale_add_task) + b"\n")
    ws = tmp_path / "ws"
    r = _cli("workspace", str(tasks), str(ws), "--backend", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(ws) and (ws / "utils" / "compile.py").is_file()
    assert (ws / "model.py").read_text() == scale_add_task.ref_code
    r = _cli("workspace", str(tasks), str(ws), "--backend", "cpu")
    assert r.returncode != 0 and "not empty" in r.stderr
    r = _cli("workspace", str(tasks), str(tmp_path / "ws2"), "--task-id", "nope")
    assert r.returncode != 0 and "no task" in r.stderr
    r = _cli("flags", "--backend", "cpu")
    assert r.returncode == 0, r.stderr
    f = json.loads(r.stdout)
    assert f["backend"] == "cpu" and len(f["key"]) == 16 and f["tool_versions"]["cxx"]
    assert "nvcc_split" not in f
    r = _cli("flags", "--backend", "cuda", env={**os.environ, "CUDA_AGENT_NVCC_SPLIT": "0"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["nvcc_split"] == "off (CUDA_AGENT_NVCC_SPLIT=0)"
    # a backend name that is not one is a usage error, not another backend's flags or 'auto'
    for cmd in (("flags",), ("workspace", str(tasks), str(tmp_path / "ws3"))):
        r = _cli(*cmd, "--backend", "gpu")
        assert r.returncode == 2 and "expected" in r.stderr and not r.stdout, (cmd, r.stderr)
    assert not (tmp_path / "ws3").exists()


def test_an_unknown_backend_is_refused_not_taken_for_auto():
    import pytest

    from cuda_agent.sandbox.config import resolve_backend

    assert resolve_backend("cpu") == "cpu" and resolve_backend("cuda") == "cuda"
    with pytest.raises(ValueError, match="expected cuda, cpu or auto"):
        resolve_backend("gpu")


def test_caps_says_whether_a_fork_server_starts_here():
    """`sandbox caps` starts a fork server (importing a small module) and says "ok" or why
    phases will start cold; on Linux with /proc it starts."""
    r = subprocess.run(
        [sys.executable, "-m", "cuda_agent.sandbox.cli", "caps"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert {"root", "drop_user", "network_ns", "cgroup_base"} <= set(got)
    assert got["fork_server"] == "ok", got["fork_server"]


def test_unknown_timing_config_keys_are_errors(tmp_path):
    import pytest

    from cuda_agent.sandbox import SandboxConfig

    with pytest.raises(ValueError, match="time_cap"):
        SandboxConfig(timing_config={"time_cap": 3.0})  # a typo of time_cap_s
    assert SandboxConfig(timing_config={"time_cap_s": 3.0}).timing_config == {"time_cap_s": 3.0}
    with pytest.raises(ValueError, match="verfy_timeout_s"):
        SandboxConfig.from_dict({"verfy_timeout_s": 3})
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cuda_agent.sandbox.cli",
            "eval",
            "--backend",
            "cpu",
            "--timing-config",
            '{"time_cap": 3}',
            str(tmp_path / "none.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "unknown key(s) time_cap" in r.stderr, r.stderr[-2000:]


def test_the_baseline_compile_mode_is_a_checked_setting(tmp_path, scale_add_task):
    """`baseline_compile_mode` picks the torch.compile mode speedup_vs_compile compares with: a
    task record's baseline of another mode is not used for it; an unknown mode is an error."""
    import pytest

    from cuda_agent.profiler import PROTOCOL_VERSION
    from cuda_agent.profiler.baseline import device_name
    from cuda_agent.records import Baseline, Candidate, Solution, TimingStats
    from cuda_agent.sandbox import SandboxConfig
    from cuda_agent.sandbox.evaluate import _known_baseline

    with pytest.raises(ValueError, match="baseline_compile_mode='fast'"):
        SandboxConfig(baseline_compile_mode="fast")
    cfg = SandboxConfig.from_dict(
        {"baseline_compile_mode": "max-autotune", "compile_baseline": True}
    )
    rec = Baseline(
        device=device_name("cpu"),
        torch_version="x",
        protocol_version=PROTOCOL_VERSION,
        eager=TimingStats(median_ms=2.0, n=10),
        compile=TimingStats(median_ms=1.0, n=10),
        compile_mode="default",
        backend="cpu",
    )
    import msgspec

    task = msgspec.structs.replace(scale_add_task, baseline=rec)
    c = Candidate(task=task, solution=Solution.make("kernelbench", {"model_new.py": ""}))
    os.environ.setdefault("CUDA_AGENT_CACHE", str(tmp_path / "cache"))  # an empty cache
    assert _known_baseline(c, cfg.with_(baseline_compile_mode="default"), "cpu", None) == rec
    assert _known_baseline(c, cfg, "cpu", None) is None  # default-mode figures: not max-autotune's
    for cli in ("cuda_agent.sandbox.cli", "cuda_agent.kernelbench_eval.cli"):
        cmd = "eval" if "sandbox" in cli else "run"
        r = subprocess.run(
            [sys.executable, "-m", cli, cmd, "--backend", "cpu", "--baseline-compile-mode",
             "fast", str(tmp_path / "none.jsonl")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert r.returncode == 2 and "baseline_compile_mode='fast'" in r.stderr, r.stderr[-2000:]
