"""Episodes against the real sandbox (cpu backend): tools, compile, verify, evaluation, reward."""

import json
import os

import pytest

from cuda_agent.agent.env import SandboxEnv
from cuda_agent.agent.episode import EpisodeConfig, EpisodeRunner
from cuda_agent.agent.models import load_tokenizer
from cuda_agent.agent.policy import ScriptedPolicy
from cuda_agent.agent.toolcalls import format_tool_call
from cuda_agent.records import Task
from cuda_agent.sandbox import SandboxConfig

REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


batch_size = 16
dim = 1024


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
"""

KERNEL = """extern "C" int relu_launch(float* out, const float* x, long n) {
  for (long i = 0; i < n; ++i) out[i] = x[i] > 0.f ? x[i] : 0.f;
  return 0;
}
"""

BINDING = """#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>

#include "../binding_registry.h"

extern "C" int relu_launch(float* out, const float* x, long n);

static torch::Tensor relu(torch::Tensor x) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "relu: float32 expected");
  x = x.contiguous();
  auto out = torch::empty_like(x);
  relu_launch(out.data_ptr<float>(), x.data_ptr<float>(), (long)x.numel());
  return out;
}

static void register_relu(pybind11::module_& m) { m.def("relu", &relu, "relu"); }

REGISTER_BINDING(relu, register_relu);
"""

MODEL_NEW = """import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return cuda_extension.relu(x)
"""

CHEAT = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
"""


def W(path, content):
    return format_tool_call("Write", {"path": path, "content": content})


SOLVE = [
    "I will read the skill file and the example first.\n"
    + format_tool_call("Read", {"path": "SKILL.md", "limit": 20})
    + format_tool_call("Glob", {"pattern": "kernels/*"}),
    "Writing the kernel, its binding and ModelNew.\n"
    + W("kernels/relu.cpp", KERNEL)
    + W("kernels/relu_binding.cpp", BINDING)
    + W("model_new.py", MODEL_NEW),
    # the worked example is not part of the answer (and would be compiled twice more)
    format_tool_call("Bash", {"command": "rm kernels/example_axpby* && python utils/compile.py"}),
    format_tool_call("Bash", {"command": "python utils/verify.py"}),
    "Verified. " + format_tool_call("Submit", {"summary": "relu kernel"}),
]

CHEATING = [
    "Trying to edit the checker. "
    + format_tool_call("Write", {"path": "utils/verify.py", "content": "print('ok')"}),
    W("model_new.py", CHEAT),
    format_tool_call("Submit", {}),
]


@pytest.fixture(scope="module")
def env():
    # timed, but briefly: the reward's tiers need a speed-up, not a precise one
    cfg = SandboxConfig(
        backend="cpu",
        timing=True,
        timing_config={"time_cap_s": 1.0, "warmup_max_s": 0.5, "min_samples": 3},
    )
    return SandboxEnv(cfg)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.mark.slow
def test_scripted_policy_solves_cpu_task(tmp_path, env, tok):
    task = Task.make("ReLU", REF, level=1)
    runner = EpisodeRunner(ScriptedPolicy(tok, SOLVE), env, EpisodeConfig(), tmp_path)
    (t,) = runner.run([(task, 0)])
    calls = {c.name: c for c in t.tool_calls}
    bash = [c for c in t.tool_calls if c.name == "Bash"]
    assert t.stop_reason == "submit", t.tool_calls
    assert all(c.ok for c in bash), [c.result for c in bash]
    assert "Submit" in calls
    assert t.eval_result is not None and str(t.eval_result.status) == "ok", t.eval_result
    assert t.reward >= 1.0, t.reward_reason
    assert t.eval_result.meta.get("worker") == "cpu0"  # evaluated in the environment's pool
    assert set(t.solution.files) >= {"model_new.py", "kernels/relu.cpp", "kernels/relu_binding.cpp"}
    assert not any("example_axpby" in f for f in t.solution.files)  # what the agent removed
    # the record is valid JSONL and replays
    from cuda_agent.agent.cli import render
    from cuda_agent.records import Trajectory, decode, encode

    back = decode(encode(t), Trajectory)
    assert "Submit" in render(back) and json.loads(encode(t))["kind"] == "trajectory"


@pytest.mark.slow
def test_rule_breaking_policy_is_rejected(tmp_path, env, tok):
    task = Task.make("ReLU", REF, level=1)
    runner = EpisodeRunner(ScriptedPolicy(tok, CHEATING), env, EpisodeConfig(), tmp_path)
    (t,) = runner.run([(task, 0)])
    assert t.tool_calls[0].error == "protected"
    assert t.eval_result is not None
    assert str(t.eval_result.status) == "guard_violation", (
        t.eval_result.status,
        t.eval_result.message,
    )
    assert t.reward == -1.0
    # evaluated in the environment's pool; a static rejection needs no device worker
    assert t.eval_result.meta.get("pool_pid") == os.getpid()
    assert "worker" not in t.eval_result.meta


def test_a_timed_section_waits_for_a_running_command(tmp_path, env, reach_for_other_users):
    """A workspace command can run anything on the device, so it holds the device's gate shared
    while it runs: a timed (exclusive) section asked for meanwhile starts only once it has
    ended. The workspace's own profile.py, timing inside a command, does not wait for it."""
    import threading
    import time

    from cuda_agent.sandbox.gate import Occupant, device_gate

    reach_for_other_users(tmp_path)
    task = Task.make("ReLU", REF, level=1)
    ws = env.make_workspace(task, tmp_path / "ws")
    out: list = []
    cmd = threading.Thread(
        target=lambda: out.append(env.bash(ws, "touch started; sleep 2; date +%s.%N > ended", 60))
    )
    cmd.start()
    deadline = time.monotonic() + 60
    while not (ws / "started").exists():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.02)
    occ = Occupant("timed")
    with device_gate("host").exclusive(occ, "time"):
        began = time.time()
    cmd.join(60)
    assert out and out[0].exit_code == 0, out
    assert began >= float((ws / "ended").read_text())
    # a tool that times inside a command (exclusive, in its own scratch directory's lock) does
    # not wait for the command it runs in
    (ws / "kernels" / "relu.cpp").write_text(KERNEL)
    (ws / "kernels" / "relu_binding.cpp").write_text(BINDING)
    (ws / "model_new.py").write_text(MODEL_NEW)
    r = env.bash(ws, "rm kernels/example_axpby* && python utils/profile.py", 300)
    # it came to a verdict well within its limit (where the test run's own $CUDA_AGENT_CACHE is
    # read-only to the command, that verdict is the baseline cache's infra_error: still an end)
    assert not r.timed_out and "status:" in r.output, r.output[-2000:]
