"""The OpenRLHF agent on the strict cpu pool: real workspaces, tools and sandbox evaluations.

Without openrlhf, the agent is driven through the call sequence of OpenRLHF 0.11's
``MultiTurnAgentExecutor`` (``reset`` with observation and label, then ``step`` per action until
``done``); with it, through OpenRLHF's own executor (loaded from the example file as
``--train.agent_func_path`` loads it) with a scripted engine in place of vLLM.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from cuda_agent.adapters.common import register_workspace_envs
from cuda_agent.adapters.openrlhf import KernelAgent, ScriptedEngine, dataset_rows
from cuda_agent.adapters.trl import WorkspaceEnvFactory, task_to_column

from .conftest import fixture_files

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "openrlhf_agent.py"


def call(name: str, **arguments: str) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def solution_actions(files: dict[str, str]) -> list[str]:
    return [call("Write", path=p, content=t) for p, t in files.items()] + [call("Submit")]


@pytest.fixture
def envs(strict_pool, ws_root, monkeypatch):
    """Workspace environments on the strict cpu pool, named in the agent's settings variable."""
    from cuda_agent.agent.env import SandboxEnv

    senv = SandboxEnv(strict_pool.config, pool=strict_pool)
    factory = WorkspaceEnvFactory.local(senv, ws_root / "openrlhf")
    register_workspace_envs("openrlhf-test", factory)
    monkeypatch.setenv("CUDA_AGENT_OPENRLHF_ENVS", "openrlhf-test")
    monkeypatch.setenv("CUDA_AGENT_OPENRLHF_MAX_TURNS", "8")
    yield factory
    factory.close()


async def run_steps(agent, prompt: str, label: str, actions: list[str]) -> list[dict]:
    """OpenRLHF's executor loop, less the tokens: reset, then one step per action until done."""
    reset = await agent.reset({"observation": prompt, "label": label})
    assert reset["observation"] == prompt
    text, out = prompt, []
    for action in actions:
        states = {"observation_text": text, "action_text": action, "label": label}
        states["sampling_params"] = SimpleNamespace(max_tokens=100)
        res = await agent.step(states)
        out.append(res)
        text += action + res["environment_feedback"]
        if res["done"]:
            break
    return out


def test_call_sequence_tools_malformed_actions_and_reward(envs, scale_add_task):
    label = task_to_column(scale_add_task)
    agent = KernelAgent()
    actions = [
        call("Bash", command="ls; cat model.py | head -3"),
        "I think the kernel should be fast.",  # no tool call
        '<tool_call>{"name": "Bash", "arguments": {"command": </tool_call>',  # bad JSON
        call("Fly", to="moon") + call("Bash", cmd="ls"),  # unknown tool, wrong argument
        *solution_actions(fixture_files("scale_add")),
    ]
    steps = asyncio.run(run_steps(agent, "PROMPT", label, actions))
    assert len(steps) == len(actions)
    keys = {"rewards", "scores", "environment_feedback", "done", "sampling_params", "extra_logs"}
    assert all(set(s) == keys for s in steps)
    assert all(set(s["extra_logs"]) == set(steps[0]["extra_logs"]) for s in steps)

    bash = steps[0]["environment_feedback"]
    assert bash.startswith("\n<|im_start|>user\n<tool_response>\n")
    assert bash.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert "model.py" in bash and "SKILL.md" in bash and "import torch" in bash
    assert "[exit code 0]" in bash
    assert "no tool call in your message" in steps[1]["environment_feedback"]
    assert "Error: tool call is not valid JSON" in steps[2]["environment_feedback"]
    fb = steps[3]["environment_feedback"]
    assert "Error: unknown tool 'Fly'; available: Bash, Edit, Read, Submit, Write" in fb
    assert "Error: Bash: missing a required argument: 'command'" in fb
    assert [s["done"] for s in steps] == [False] * (len(steps) - 1) + [True]
    assert steps[-1]["environment_feedback"] == ""

    # the rewards sum to the failure reward until the evaluation, then to the sandbox's reward
    rewards = [s["rewards"].item() for s in steps]
    assert rewards[0] == -1.0 and rewards[1:-1] == [0.0] * (len(steps) - 2)
    assert sum(rewards) == 1.0
    assert steps[-1]["scores"].item() == 1.0
    assert agent.scored.status == "ok" and agent.scored.result.status == "ok"
    assert steps[-1]["extra_logs"]["kernel_ok"] == 1.0
    assert steps[-1]["extra_logs"]["kernel_tool_errors"] == 4.0
    assert envs.envs == []  # the workspace was removed once evaluated


def test_turn_limit_evaluates_the_workspace(envs, scale_add_task, monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_OPENRLHF_MAX_TURNS", "2")
    files = fixture_files("scale_add")
    files["kernels/ops.cpp"] = files["kernels/ops.cpp"].replace("+ b[j]", "- b[j]")
    agent = KernelAgent()
    label = task_to_column(scale_add_task)
    actions = [call("Write", path="kernels/ops.cpp", content=files["kernels/ops.cpp"])] * 3
    steps = asyncio.run(run_steps(agent, "P", label, actions))
    assert [s["done"] for s in steps] == [False, True]  # max_turns, no Submit
    assert sum(s["rewards"].item() for s in steps) == -1.0
    assert agent.scored.result is not None  # evaluated: the starter with the wrong ops.cpp
    assert agent.scored.status != "ok"


def test_reset_needs_the_task_label(envs):
    with pytest.raises(ValueError, match="label must be the Task record"):
        asyncio.run(KernelAgent().reset({"observation": "p", "label": ""}))


def test_dataset_rows_carry_the_tools_of_the_workspace(scale_add_task):
    (row,) = dataset_rows([scale_add_task], backend="cpu", include_skill=False)
    system, user = row["prompt"]
    assert json.loads(row["label"])["id"] == scale_add_task.id
    assert '"name": "Bash"' in system["content"] and '"name": "Submit"' in system["content"]
    assert '"name": "Glob"' not in system["content"]  # not a tool of the environment
    assert '"timeout"' not in system["content"]  # Bash(command) takes no timeout here
    assert "scale_add" in user["content"]
    (svc,) = dataset_rows([scale_add_task], backend="cpu", include_skill=False, service=True)
    assert '"name": "Write"' not in svc["prompt"][0]["content"]


def test_through_openrlhfs_multi_turn_executor(envs, scale_add_task, tmp_path):
    """OpenRLHF's own ``MultiTurnAgentExecutor.execute`` (token in, token out) over the agent,
    the agent file loaded as OpenRLHF's ``_load_agent_executor`` loads it."""
    agent_mod = pytest.importorskip(
        "openrlhf.utils.agent", reason="openrlhf is not installed (README: not an extra)"
    )
    from cuda_agent.agent.models import load_tokenizer, make_tiny_model

    spec = importlib.util.spec_from_file_location("agent_module", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert issubclass(module.AgentExecutor, agent_mod.AgentExecutorBase)
    executor = module.AgentExecutor()

    tok = load_tokenizer(str(make_tiny_model(tmp_path / "tiny")))
    (row,) = dataset_rows([scale_add_task], backend="cpu", include_skill=False)
    prompt = tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    actions = [call("Bash", command="ls"), "no call", *solution_actions(fixture_files("scale_add"))]
    engine = ScriptedEngine(tok, actions)
    params = SimpleNamespace(max_tokens=None, logprobs=None)
    out = asyncio.run(executor.execute(prompt, row["label"], params, 32768, tok, engine))

    assert out["reward"] == 1.0 and out["scores"] == 1.0
    assert out["extra_logs"]["kernel_ok"] == 1.0
    assert len(out["action_ranges"]) == len(actions) and not engine.actions
    text = tok.decode(out["observation_tokens"])
    assert text.startswith(prompt) and "<tool_response>" in text and "SKILL.md" in text
    assert "no tool call in your message" in text
    # each generation saw the whole context so far: prompt, actions and feedback
    for (start, _), seen in zip(out["action_ranges"], engine.prompts, strict=True):
        assert out["observation_tokens"][:start] == seen


def test_settings_from_env_reject_an_unknown_variable():
    from cuda_agent.adapters.openrlhf import AgentSettings

    s = AgentSettings.from_env({"CUDA_AGENT_OPENRLHF_MAX_TURNS": "3", "OTHER": "x"})
    assert s.max_turns == 3
    with pytest.raises(ValueError, match="CUDA_AGENT_OPENRLHF_MAXTURNS"):
        AgentSettings.from_env({"CUDA_AGENT_OPENRLHF_MAXTURNS": "3"})
