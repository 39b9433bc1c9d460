"""Real KernelBench shapes on the GPU (skipped without CUDA): a multi-GB problem verified on the
device, and an honest default-stream kernel on a short program timed at its true cost."""

from __future__ import annotations

import pytest

from cuda_agent.records import Candidate, Solution, Status, Task
from cuda_agent.sandbox import SandboxConfig, SandboxPool, evaluate

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _ref(batch: int, dim: int, op: str) -> str:
    # KernelBench level 1, problems 19 (ReLU) and 30 (Softsign), at the given sizes
    return f"""import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return {op}

batch_size = {batch}
dim = {dim}

def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]

def get_init_inputs():
    return []
"""


# the style of most model-written solutions: default stream, no error check, empty_like
ELEMENTWISE = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = """
#include <torch/extension.h>

__global__ void op_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long stride = (long)blockDim.x * gridDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        y[i] = EXPR;
    }
}

torch::Tensor op_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    int threads = 256;
    long blocks = (n + threads - 1) / threads;
    if (blocks > 65535L * 16) blocks = 65535L * 16;
    op_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(
    name="NAME",
    cpp_sources="torch::Tensor op_cuda(torch::Tensor x);",
    cuda_sources=cuda_src,
    functions=["op_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x):
        return ext.op_cuda(x)
'''


def _cand(name: str, ref: str, expr: str) -> Candidate:
    src = ELEMENTWISE.replace("EXPR", expr).replace("NAME", name)
    return Candidate(
        task=Task.make(name, ref, source="kernelbench"),
        solution=Solution.make("kernelbench", {"model_new.py": src}),
    )


def test_multi_gb_relu_is_verified_on_the_device(cache_dir):
    # 4096 x 393216 fp32: 6.4 GB of input and 6.4 GB of output per call
    c = _cand("sandbox_gpu_relu_6gb", _ref(4096, 393216, "torch.relu(x)"), "v > 0.f ? v : 0.f")
    r = evaluate(c, SandboxConfig(backend="cuda", cache_dir=str(cache_dir), guard_policy="strict"))
    assert r.status == Status.OK, r.message
    assert r.correctness is not None and len(r.correctness.trials) == 5
    assert all(t.passed for t in r.correctness.trials)
    assert r.speedup_vs_eager is not None and 0.5 < r.speedup_vs_eager < 2.0


def test_multi_gb_problems_share_the_gpu_with_small_ones_under_a_large_share(cache_dir):
    # four workers: a 0.225 share each, too small for the 6.4 GB ReLU (six working sets: 0.52 of
    # the H200); it runs under a large share next to three small ones instead of alone
    big = _cand(
        "sandbox_gpu_relu_6gb_shared", _ref(4096, 393216, "torch.relu(x)"), "v > 0.f ? v : 0.f"
    )
    small = [
        _cand(
            f"sandbox_gpu_relu_small_{i}",
            _ref(64, 4096 * (i + 1), "torch.relu(x)"),
            "v > 0.f ? v : 0.f",
        )
        for i in range(3)
    ]
    cfg = SandboxConfig(backend="cuda", cache_dir=str(cache_dir), guard_policy="strict")
    with SandboxPool(cfg, workers_per_device=4) as pool:
        results = list(pool.map([big, *small]))
    for r in results:
        assert r.status == Status.OK, r.message
        assert "ran_alone" not in r.meta and "rerun_alone" not in r.meta, r.meta
    assert results[0].meta.get("large_share", "").startswith("working set"), results[0].meta
    assert results[0].meta.get("mem_fraction", 0) > 0.5
    assert all("large_share" not in r.meta for r in results[1:])
    assert any(r.meta.get("overlapped") for r in results)  # they did share the GPU


def test_default_stream_kernel_on_a_short_program_is_timed_not_rejected(cache_dir):
    ref = _ref(16, 1024, "x / (1 + torch.abs(x))")
    c = _cand("sandbox_gpu_softsign_small", ref, "v / (1.f + fabsf(v))")
    r = evaluate(c, SandboxConfig(backend="cuda", cache_dir=str(cache_dir), guard_policy="strict"))
    assert r.status == Status.OK, r.message
    assert not any(g.code == "G-CACHE" for g in r.guards)
    assert r.timing is not None and r.timing.candidate is not None
    # a 16 K-element kernel with its launch: a few us at the very least, never ~1 us replays
    assert r.timing.candidate.median_ms > 0.002
    assert r.speedup_vs_eager is not None and r.speedup_vs_eager < 10
