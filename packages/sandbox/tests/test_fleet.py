"""RayPool (``cuda_agent.sandbox.fleet``) on a Ray cluster of two local nodes (Ray's own
``ray.cluster_utils.Cluster``), cpu backend, the real sandbox: a batch runs on workers on both
nodes with the verdicts of the local SandboxPool (through `sandbox eval --ray`, so eval_stream
too); a node killed mid-batch loses no job and duplicates none. Skipped where Ray is not installed
(`uv sync --extra ray`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest

# set before Ray is imported (and inherited by the nodes and the CLI started here): the workers
# use this environment (not Ray's `uv run` integration), and every address Ray picks for itself
# is the loopback one (not the host's interface: the test's traffic stays on 127.0.0.1)
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")

from cuda_agent.records.jsonl import encode  # noqa: E402
from cuda_agent.sandbox import SandboxConfig, SandboxPool  # noqa: E402
from cuda_agent.sandbox.fleet import RayPool  # noqa: E402

from .conftest import kb_candidate, workdir_candidate  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

# PyTorch only: the strict guard policy rejects it before any process runs
TORCH_OPS = (
    "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
    "    def forward(self, x):\n        return torch.relu(x)\n"
)
OPS_HEAD = (
    'extern "C" int kernel_run(float* out, const float* x, const float* w, const float* b, '
    "long rows, long cols) {\n"
)
WRONG = OPS_HEAD + "  for (long i = 0; i < rows * cols; ++i) out[i] = x[i];\n  return 0;\n}\n"
BROKEN = OPS_HEAD + "  return 0 +;\n}\n"


def _slow(tag: str) -> str:
    """Correct, and a fifth of a second a call (busy: the strict guards refuse threads and
    sleeps), so that each worker is still evaluating one when the first results are in."""
    return (
        "#include <chrono>\n"
        + OPS_HEAD
        + f"  auto t0 = std::chrono::steady_clock::now();  // {tag}\n"
        "  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(200)) {}\n"
        "  for (long i = 0; i < rows * cols; ++i) out[i] = x[i] * w[i % cols] + b[i % cols];\n"
        "  return 0;\n}\n"
    )


# one CPU a node: one worker each; a small object store (the results are small records)
NODE = {"num_cpus": 1, "object_store_memory": 100 * 1024**2, "node_ip_address": "127.0.0.1"}


def _batch(task, files):
    """Four that are built (two slow ok ones first: one for each worker, then an incorrect and a
    compile_error), then four static rejects."""
    built = [
        (workdir_candidate(task, files, **{"kernels/ops.cpp": _slow("a")}), "ok"),
        (workdir_candidate(task, files, **{"kernels/ops.cpp": _slow("b")}), "ok"),
        (workdir_candidate(task, files, **{"kernels/ops.cpp": WRONG}), "incorrect"),
        (workdir_candidate(task, files, **{"kernels/ops.cpp": BROKEN}), "compile_error"),
    ]
    rejects = [
        (kb_candidate(task, TORCH_OPS + f"\n# fleet {i}\n"), "guard_violation") for i in range(4)
    ]
    return built + rejects


def _config(cache_dir) -> SandboxConfig:
    return SandboxConfig(
        backend="cpu",
        cache_dir=str(cache_dir),
        guard_policy="strict",
        timing=False,
        baselines=False,
    )


@pytest.fixture
def cluster(cache_dir, warm_build):
    """A head node and a worker node on this machine (loopback), this process connected."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    worker = c.add_node(**NODE)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c, worker
    finally:
        ray.shutdown()
        c.shutdown()


def test_a_batch_runs_on_both_nodes_with_the_local_verdicts(
    cluster, cache_dir, scale_add_task, scale_add_files, tmp_path
):
    c, worker = cluster
    batch = _batch(scale_add_task, scale_add_files)
    cands = [cand for cand, _ in batch]
    want = {cand.key: status for cand, status in batch}
    with SandboxPool(_config(cache_dir), compile_workers=2, cpu_workers=2) as local:
        here = {r.key: r.status.value for r in local.map(cands)}
    assert here == want
    # `sandbox eval --ray ADDRESS`: another driver on the running cluster, eval_stream unchanged
    inp, out = tmp_path / "c.jsonl", tmp_path / "r.jsonl"
    inp.write_bytes(b"".join(encode(x) for x in cands))
    cmd = [
        *(sys.executable, "-m", "cuda_agent.sandbox.cli", "eval", str(inp), "-o", str(out)),
        *("--ray", c.address, "--backend", "cpu", "--cache-dir", str(cache_dir)),
        *("--guard-policy", "strict", "--no-timing", "--no-baselines"),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    keys = Counter(f"{r['task_id']}:{r['solution_id']}" for r in rows)
    assert keys == Counter(list(want)), keys  # one result each
    assert {f"{r['task_id']}:{r['solution_id']}": r["status"] for r in rows} == here
    nodes = {r["meta"]["ray"]["node"] for r in rows}
    assert nodes == {c.head_node.node_id, worker.node_id}, nodes  # workers on both nodes
    assert "backend=cpu" in p.stderr and "8 written" in p.stderr, p.stderr[-2000:]
    # `kernelbench-eval run --ray ADDRESS`: the same pool flags (stream.open_pool)
    out2 = tmp_path / "r2.jsonl"
    cmd = [
        *(sys.executable, "-m", "cuda_agent.kernelbench_eval.cli", "run", str(inp), "-o"),
        *(str(out2), "--ray", c.address, "--backend", "cpu"),
        *("--guard-policy", "strict", "--no-timing", "--no-compile-baseline"),
    ]
    env = {**os.environ, "CUDA_AGENT_SANDBOX_CACHE": str(cache_dir)}  # run has no --cache-dir
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    rows = [json.loads(line) for line in out2.read_text().splitlines()]
    assert {f"{r['task_id']}:{r['solution_id']}": r["status"] for r in rows} == here
    assert all("ray" in r["meta"] for r in rows if r["status"] != "guard_violation"), rows


@pytest.mark.parametrize("attempts", [3, 1])
def test_a_node_killed_mid_batch_loses_no_job_and_duplicates_none(
    cluster, cache_dir, scale_add_task, scale_add_files, attempts
):
    """The jobs on the node that died run again on the other (``max_attempts`` 3), or, with
    no attempt left (1), are ``infra_error`` results naming the loss; either way one each."""
    c, worker = cluster
    batch = _batch(scale_add_task, scale_add_files)
    want = {cand.key: status for cand, status in batch}
    got = []
    cfg = _config(cache_dir)
    with RayPool(cfg, workers=2, max_restarts=1, max_attempts=attempts) as pool:
        info = pool.workers_info()
        assert {w["node"] for w in info} == {c.head_node.node_id, worker.node_id}, info
        assert pool.backend == "cpu" and len(pool.devices) == 2
        for cand, r in pool.map_unordered(cand for cand, _ in batch):
            got.append((cand, r))
            if len(got) == 1:  # the first result is in: the worker node dies, jobs on it too
                there = next(w for w in pool.workers_info() if w["node"] == worker.node_id)
                assert there["running"] > 0, there
                # as when a machine goes: its processes die at once (remove_node kills Ray's
                # own; a worker would notice that and end only a moment later)
                os.kill(there["pid"], signal.SIGKILL)
                c.remove_node(worker, allow_graceful=False)
        stats = pool.stats
    keys = Counter(r.key for _, r in got)
    assert keys == Counter(list(want)), keys  # every candidate once: none lost, none twice
    assert all(cand.key == r.key for cand, r in got)
    assert stats.workers_lost == 1 and stats.finished == len(batch), stats
    if attempts > 1:
        assert {r.key: r.status.value for _, r in got} == want, [
            (r.key, r.status.value, r.message[:200]) for _, r in got
        ]
        again = [r for _, r in got if r.meta["ray"]["attempt"] > 1]
        assert again and stats.retried == len(again) and stats.given_up == 0, stats
        # what was lost with the node ran again on the head node
        assert all(r.meta["ray"]["node"] == c.head_node.node_id for r in again)
        return
    lost = [r for _, r in got if r.status.value == "infra_error"]
    assert lost and stats.given_up == len(lost) and stats.retried == 0, stats
    for r in lost:  # each names the worker, its node and what Ray said
        assert r.device == "ray" and r.meta["ray"]["attempts"] == 1, r.meta
        assert f"on node {worker.node_id[:8]}" in r.message and "Actor" in r.message, r.message
    assert all(r.status.value == want[r.key] for _, r in got if r.status.value != "infra_error"), [
        (r.key, r.status.value) for _, r in got
    ]
