"""The module mode of a task: which programs depend on it, its place in the baseline cache key,
and a baseline measured in it (real worker processes on the cpu)."""

import pytest

from cuda_agent.profiler import quick_config
from cuda_agent.profiler.baseline import (
    BaselineCache,
    baseline_for_task,
    cached_baseline,
    task_hash,
)
from cuda_agent.profiler.program import mode_dependence
from cuda_agent.records import Task
from cuda_agent.records.types import content_id

CFG = quick_config(time_cap_s=0.3, warmup_ms=5.0)


def program(init: str, forward: str = "return self.m(x)", args: str = "") -> str:
    return (
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
        f"    def __init__(self):\n        super().__init__()\n        {init}\n"
        f"    def forward(self, x):\n        {forward}\n\n"
        "def get_inputs():\n    return [torch.randn(8, 16)]\n\n"
        f"def get_init_inputs():\n    return [{args}]\n"
    )


@pytest.mark.parametrize(
    ("source", "statistics", "random"),
    [
        (program("self.m = nn.BatchNorm1d(16)"), True, False),
        (program("self.m = nn.BatchNorm1d(16, track_running_stats=False)"), False, False),
        (program("self.m = nn.InstanceNorm1d(16)"), False, False),
        (program("self.m = nn.InstanceNorm1d(16, track_running_stats=True)"), True, False),
        (program("self.m = nn.Dropout(0.2)"), False, True),
        (program("self.m = nn.Dropout(0.0)"), False, False),
        (program("self.m = nn.LSTM(16, 16, num_layers=2, dropout=0.1)"), False, True),
        (program("self.m = nn.LSTM(16, 16, num_layers=2)"), False, False),
        (program("self.m = nn.ReLU()", "return x * 2 if self.training else x"), True, False),
        (program("self.m = nn.ReLU()", "return nn.functional.dropout(x, 0.1)"), False, True),
        # a model that cannot be built on the meta device: judged by the classes its source names
        (program("self.k = int(torch.ones(1).item()); self.m = nn.BatchNorm1d(16)"), True, False),
        (program("self.k = int(torch.ones(1).item()); self.m = nn.ReLU()"), False, False),
        (program("self.m = nn.Sequential(nn.Linear(16, 16), nn.GELU())"), False, False),
    ],
)
def test_mode_dependence_finds_what_reads_the_mode(source, statistics, random):
    dep = mode_dependence(source)
    assert (bool(dep.statistics), bool(dep.random)) == (statistics, random), dep
    assert dep.matters == (statistics or random)


def test_the_mode_is_in_the_cache_key_only_when_it_is_train():
    src = program("self.m = nn.BatchNorm1d(16)")
    assert task_hash(Task.make("bn", src)) == task_hash(src) == content_id(src)
    assert task_hash(Task.make("bn", src, model_mode="train")) != task_hash(src)


def test_a_baseline_is_measured_in_the_tasks_mode_and_cached_apart(tmp_path):
    # a reference that runs in train mode only
    src = program("self.m = nn.ReLU()", "assert self.training, 'eval mode'; return self.m(x)")
    cache = BaselineCache(tmp_path)
    train, evaluation = Task.make("t", src, model_mode="train"), Task.make("t", src)
    b = baseline_for_task(train, device="cpu", compile_mode=None, config=CFG, cache=cache)
    assert b.error is None and b.eager is not None, b.error
    assert cached_baseline(train, device="cpu", compile_mode=None, cache=cache) == b
    assert cached_baseline(evaluation, device="cpu", compile_mode=None, cache=cache) is None
    e = baseline_for_task(evaluation, device="cpu", compile_mode=None, config=CFG, cache=cache)
    assert e.eager is None and "eval mode" in (e.error or ""), e


def test_a_train_mode_task_is_another_task():
    src = program("self.m = nn.BatchNorm1d(16)")
    evaluation, train = Task.make("bn", src), Task.make("bn", src, model_mode="train")
    assert evaluation.id == content_id(src) and train.id != evaluation.id
    assert task_hash(train) == train.id
