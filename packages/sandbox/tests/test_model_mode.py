"""Task.model_mode: the reference and the candidate run in the task's module mode (cpu backend).

A BatchNorm layer normalises with the batch's statistics in train mode (KernelBench's harness
never calls ``.eval()``) and with its running statistics in eval mode: each of the two honest
solutions below is correct in exactly one of the modes."""

import pytest

from cuda_agent.records import Status, Task
from cuda_agent.sandbox import SandboxConfig, evaluate

from .conftest import kb_candidate

BN_REFERENCE = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.bn = nn.BatchNorm1d(features)

    def forward(self, x):
        return self.bn(x)

def get_inputs():
    return [torch.randn(64, 16) * 2.0 + 3.0]

def get_init_inputs():
    return [16]
"""

# the same parameter and buffer names as the reference (they receive its state_dict)
_HEAD = """import torch
import torch.nn as nn

class Norm(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_var", torch.ones(features))
        self.register_buffer("num_batches_tracked", torch.tensor(0))

class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.bn = Norm(features)

    def forward(self, x):
        bn = self.bn
"""
BATCH_STATS = _HEAD + (
    "        mean, var = x.mean(0), x.var(0, unbiased=False)\n"
    "        return (x - mean) / torch.sqrt(var + 1e-5) * bn.weight + bn.bias\n"
)
RUNNING_STATS = _HEAD + (
    "        return (x - bn.running_mean) / torch.sqrt(bn.running_var + 1e-5) * bn.weight + bn.bias\n"
)


@pytest.mark.parametrize(
    ("mode", "correct", "wrong"),
    [("train", BATCH_STATS, RUNNING_STATS), ("eval", RUNNING_STATS, BATCH_STATS)],
)
def test_the_candidate_is_judged_in_the_tasks_module_mode(cache_dir, mode, correct, wrong):
    task = Task.make("batchnorm", BN_REFERENCE, model_mode=mode)
    cfg = SandboxConfig(backend="cpu", cache_dir=str(cache_dir), timing=False, guard_policy="off")
    ok = evaluate(kb_candidate(task, correct), cfg)
    assert ok.status == Status.OK, ok.message
    bad = evaluate(kb_candidate(task, wrong), cfg)
    assert bad.status == Status.INCORRECT, bad.message
