"""PPO SPMD over two ranks on the CPU (torchrun, gloo, the torch backend's all-reduce): the same
code path as DeepSpeed on GPUs minus ZeRO, run for real with the sandbox's cpu backend."""

import json
import os
import subprocess
import sys

import pytest

from cuda_agent.records import RecordWriter, Task

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
timing = false
[ppo]
steps = {steps}
epochs = 1
minibatches = 2
[train]
out = "{out}"
device = "cpu"
tensorboard = false
"""


def _launch(cfg_path, *extra):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "cuda_agent.ppo.cli", "train", "--config", str(cfg_path), *extra]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return r


@pytest.mark.slow
def test_two_ranks_steps_and_checkpoints(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    with RecordWriter(tasks) as w:
        for i in range(4):
            w.write(Task.make(f"Scale_{i}", REF + f"# {i}\n"))
    out = tmp_path / "run"
    cfg = tmp_path / "ppo.toml"
    cfg.write_text(CONFIG.format(tasks=tasks, out=out, steps=2))
    r = _launch(cfg, "--set", "train.keep_checkpoints=3")
    assert "world 2" in r.stderr
    for step in (1, 2):
        assert (out / f"checkpoint-{step}" / "rng-rank1.pt").exists()
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]  # rank 0 logs, once per step
    # global: 2 tasks x 1 sample over 2 ranks (each rank's second minibatch is empty: the
    # ranks still step in lockstep)
    assert all(x["episodes"] == 2 for x in lines)
    for rank in (0, 1):
        trajs = (out / f"trajectories.rank{rank}.jsonl").read_text().splitlines()
        assert len(trajs) == 2  # its task x 1 sample x 2 steps
        assert {json.loads(t)["meta"]["rank"] for t in trajs} == {rank}
    assert (out / "final" / "config.json").exists()

    # a checkpoint of two ranks does not resume in one process
    from cuda_agent.ppo.config import load_config
    from cuda_agent.ppo.trainer import PPOError, train

    cfg.write_text(CONFIG.format(tasks=tasks, out=out, steps=3))
    with pytest.raises(PPOError, match="2 rank"):
        train(load_config(cfg), resume=True)
