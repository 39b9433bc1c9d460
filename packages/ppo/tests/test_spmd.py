"""PPO SPMD over two ranks on the CPU (torchrun, gloo, the torch backend's all-reduce): the same
code path as DeepSpeed on GPUs minus ZeRO, run for real with the sandbox's cpu backend: each
rank's candidates are verified and timed by that rank's own pool, the ranks never time at once
(the host-wide gate), and the 2-rank update is the 1-rank update of the same batch."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.records import RecordWriter, Task, Trajectory
from cuda_agent.records.jsonl import load_records

REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
"""

CONFIG = """
[model]
tiny = true
[data]
tasks = "{tasks}"
tasks_per_step = 2
samples_per_task = 1
[rollout]
mode = "single-turn"
max_new_tokens = 8
include_skill = false
[sandbox]
backend = "cpu"
guard_policy = "off"
timing = true
[ppo]
steps = {steps}
epochs = 2
minibatches = 1
actor_lr = 1e-3
critic_lr = 1e-3
[train]
out = "{out}"
device = "cpu"
tensorboard = false
"""


def _launch(cfg_path, *extra, env=None):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "cuda_agent.ppo.cli", "train", "--config", str(cfg_path), *extra]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return r


def _weights(d: Path) -> dict:
    from safetensors.torch import load_file

    return {
        f"{f.name}:{k}": v for f in sorted(d.glob("*.safetensors")) for k, v in load_file(f).items()
    }


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _dist(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return sum(float(((a[k].float() - b[k].float()) ** 2).sum()) for k in a) ** 0.5


def _overlaps(a: dict, b: dict) -> bool:
    return a["t0"] < b["t1"] and b["t0"] < a["t1"]


@pytest.mark.slow
def test_two_ranks_steps_and_checkpoints(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    with RecordWriter(tasks) as w:
        for i in range(4):
            w.write(Task.make(f"Scale_{i}", REF + f"# {i}\n"))
    out = tmp_path / "run"
    cfg = tmp_path / "ppo.toml"
    cfg.write_text(CONFIG.format(tasks=tasks, out=out, steps=2))
    gates = tmp_path / "gates"  # the ranks' host-wide gate (not the other test processes')
    env = {"CUDA_AGENT_GATE_DIR": str(gates), "CUDA_AGENT_CACHE": str(tmp_path / "prof-cache")}
    r = _launch(cfg, "--set", "train.keep_checkpoints=3", env=env)
    assert "world 2" in r.stderr
    for step in (1, 2):
        assert (out / f"checkpoint-{step}" / "rng-rank1.pt").exists()
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]  # rank 0 logs, once per step
    # global: 2 tasks x 1 sample over 2 ranks
    assert all(x["episodes"] == 2 for x in lines)
    trajs: dict[int, list[Trajectory]] = {}
    for rank in (0, 1):
        trajs[rank] = load_records(out / f"trajectories.rank{rank}.jsonl", Trajectory)
        assert len(trajs[rank]) == 2  # its task x 1 sample x 2 steps
        assert {t.meta["rank"] for t in trajs[rank]} == {rank}
    assert (out / "final" / "config.json").exists()

    # each rank says where it evaluates; its candidates were evaluated there: by the pool of its
    # own process (on cuda: meta["worker"] is the rank's GPU), in its own workspaces, timed
    said = {
        int(m[1]): (int(m[2]), m[3])
        for m in re.finditer(r"ppo: rank (\d+) \(pid (\d+)\) evaluates on (.*)", r.stderr)
    }
    assert sorted(said) == [0, 1] and said[0][0] != said[1][0], said
    phases: dict[int, list[dict]] = {0: [], 1: []}
    for rank in (0, 1):
        pid, where = said[rank]
        assert where == f"the cpu backend (host-wide gate in {gates})"
        for t in trajs[rank]:
            e = t.eval_result
            assert e is not None and str(e.status) == "ok", (e.status, e.message)
            assert e.meta["pool_pid"] == pid and e.meta["worker"] == "cpu0"
            step = t.meta["ppo_step"]
            assert (
                Path(t.meta["workspace"]).parent == out / "workspaces" / f"step-{step}-rank{rank}"
            )
            phases[rank] += e.meta["device_phases"]
        assert any(p["mode"] == "exclusive" for p in phases[rank])  # it was timed
    # the host-wide gate: nothing of one rank overlapped anything the other held exclusive
    for mine, theirs in ((phases[0], phases[1]), (phases[1], phases[0])):
        for p in mine:
            if p["mode"] == "exclusive":
                assert not [q for q in theirs if _overlaps(p, q)], p
    assert (gates / "host.lock").exists()

    # the same batches replayed in one process: the same updates (gradients summed over ranks,
    # token means over the global batch), up to the order of float sums. AdamW's first steps
    # are about lr * sign(gradient) per weight, so the rounding of a near-zero gradient can move
    # a weight by a fraction of lr (1e-3): the updates agree in norm, each weight within 5e-4
    from cuda_agent.ppo.config import load_config
    from cuda_agent.ppo.trainer import PPOError, train

    replay = tmp_path / "replay"
    replay.mkdir()
    shutil.copytree(out / "tiny-actor", replay / "tiny-actor")  # the same initial weights
    batch = {
        s: [t for rank in (0, 1) for t in trajs[rank] if t.meta["ppo_step"] == s + 1]
        for s in (0, 1)
    }
    cfg1 = tmp_path / "ppo1.toml"
    cfg1.write_text(CONFIG.format(tasks=tasks, out=replay, steps=2))
    train(load_config(cfg1), rollout_fn=lambda s: batch[s])
    for part in ("actor", "critic"):
        two = {s: _weights(out / f"checkpoint-{s}" / part) for s in (1, 2)}
        one = {s: _weights(replay / f"checkpoint-{s}" / part) for s in (1, 2)}
        update = _dist(two[2], two[1])  # the second step's update
        assert update > 0.1, (part, update)
        for s in (1, 2):
            assert _dist(two[s], one[s]) < 1e-3 * update, (part, s, _dist(two[s], one[s]))
            assert _max_diff(two[s], one[s]) < 5e-4, (part, s, _max_diff(two[s], one[s]))
    # and the same gradients before the optimizer (a gradient scaled on every rank alike would
    # leave AdamW's step as it was, not the norm)
    replayed = [json.loads(x) for x in (replay / "metrics.jsonl").read_text().splitlines()]
    for two_m, one_m in zip(lines, replayed, strict=True):
        for k in ("actor_grad_norm", "critic_grad_norm", "reward_mean", "episodes"):
            assert two_m[k] == pytest.approx(one_m[k], rel=1e-4), (k, two_m, one_m)

    # a checkpoint of two ranks does not resume in one process
    cfg.write_text(CONFIG.format(tasks=tasks, out=out, steps=3))
    with pytest.raises(PPOError, match="2 rank"):
        train(load_config(cfg), resume=True)
