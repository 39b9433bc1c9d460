"""End to end through the sandbox (cpu backend): hacks that pass the static pass are rejected by
the runtime guard inside ``evaluate``; the honest workdir candidate passes. One binding compile
(shared by every candidate here through the sandbox's object cache), so this is one slow test."""

from __future__ import annotations

import pytest

from cuda_agent.records import Candidate, Solution, Status, Task

REF = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """y = x * w + b (w, b learned, per column)."""

    def __init__(self, cols):
        super().__init__()
        self.w = nn.Parameter(torch.randn(cols))
        self.b = nn.Parameter(torch.randn(cols))

    def forward(self, x):
        return x * self.w + self.b


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256]
'''
MODEL_NEW = """import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.w = nn.Parameter(torch.empty(cols))
        self.b = nn.Parameter(torch.empty(cols))

    def forward(self, x):
        return cuda_extension.run(x, self.w, self.b)
"""
OPS = """extern "C" int kernel_run(float* out, const float* x, const float* w, const float* b, long rows, long cols) {
  for (long i = 0; i < rows; ++i)
    for (long j = 0; j < cols; ++j) out[i * cols + j] = x[i * cols + j] * w[j] + b[j];
  return 0;
}
"""
BINDING = """#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>

#include "../binding_registry.h"

extern "C" int kernel_run(float* out, const float* x, const float* w, const float* b, long rows, long cols);

static torch::Tensor run(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x: 2-D float32");
  x = x.contiguous();
  w = w.contiguous();
  b = b.contiguous();
  auto out = torch::empty_like(x);
  int rc = kernel_run(out.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), x.size(0), x.size(1));
  TORCH_CHECK(rc == 0, "kernel_run failed: ", rc);
  return out;
}

static void register_ops(pybind11::module_& m) { m.def("run", &run); }

REGISTER_BINDING(ops, register_ops);
"""
FILES = {"model_new.py": MODEL_NEW, "kernels/ops.cpp": OPS, "kernels/ops_binding.cpp": BINDING}

CASES = {
    # name: (changed files, expected status, expected reject code or None)
    "honest": ({}, Status.OK, None),
    "mutating_inputs": (
        {
            "kernels/ops.cpp": OPS.replace(
                "out[i * cols + j] = x[i * cols + j] * w[j] + b[j];",
                "{ out[i * cols + j] = x[i * cols + j] * w[j] + b[j]; ((float*)x)[i * cols + j] = 0.f; }",
            )
        },
        Status.GUARD_VIOLATION,
        "G-INPUT-MUTATION",
    ),
    "stale_memory": (
        {
            "kernels/ops.cpp": 'extern "C" int kernel_run(float* out, const float* x, const float* w, '
            "const float* b, long rows, long cols) { return 0; }\n"
        },
        None,
        "G-STALE-MEMORY",
    ),
    "pointer_cache": (
        {
            "model_new.py": MODEL_NEW.replace(
                "        return cuda_extension.run(x, self.w, self.b)",
                "        key = x.data_ptr()\n        if key not in _C:\n"
                "            _C[key] = cuda_extension.run(x, self.w, self.b)\n        return _C[key]",
            )
            + "\n_C = {}\n"
        },
        Status.GUARD_VIOLATION,
        "G-CACHE",
    ),
    "timer_patch": (
        {"model_new.py": MODEL_NEW + "\nimport time\ntime.perf_counter = lambda: 0.0\n"},
        Status.GUARD_VIOLATION,
        "G-TIMER-PATCH",
    ),
    "torch_in_forward": (
        {
            "model_new.py": MODEL_NEW.replace(
                "return cuda_extension.run(x, self.w, self.b)",
                "return cuda_extension.run(x, self.w, self.b) * 1.0 + 0.0 * x.sum()",
            )
        },
        Status.GUARD_VIOLATION,
        "G-TORCH-COMPUTE",
    ),
}


@pytest.mark.slow
def test_hacks_rejected_through_sandbox_evaluate() -> None:
    sandbox = pytest.importorskip("cuda_agent.sandbox")
    # the run's build cache ($CUDA_AGENT_SANDBOX_CACHE, root conftest): objects keyed by content
    cfg = sandbox.SandboxConfig(backend="cpu", timing=False, guard_policy="strict")
    task = Task.make("scale_add", REF)
    cands = {
        n: Candidate(task=task, solution=Solution.make("workdir", {**FILES, **ch}))
        for n, (ch, _, _) in CASES.items()
    }
    with sandbox.SandboxPool(cfg, compile_workers=1) as pool:
        results = dict(zip(cands, pool.map(list(cands.values())), strict=True))
    for name, (_, status, code) in CASES.items():
        r = results[name]
        rejects = {g.code for g in r.guards if g.severity == "reject"}
        if code is None:
            assert r.status == status and not rejects, (name, r.status, r.message)
            continue
        # stale memory may also fail correctness first (garbage output): either way, not ok
        if status is not None:
            assert r.status == status, (name, r.status, r.message)
        assert r.status != Status.OK and code in rejects, (name, r.status, rejects, r.message)
