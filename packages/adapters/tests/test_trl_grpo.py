"""One real ``trl.GRPOTrainer`` step on the CPU per mode, with a tiny random-weight model that is
first taught (a few seconds of next-token training) to give known answers, so that its sampled
completions reach the sandbox: single turn (``KernelReward`` over a local cpu pool) and multi
turn (``environment_factory=WorkspaceEnvFactory``: TRL parses the model's tool call and runs it
through the environment's ``Bash`` in a confined workspace, and ``WorkspaceReward`` evaluates the
workspaces). Skipped where TRL is not installed (``uv sync --extra trl``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

trl = pytest.importorskip("trl", reason="TRL is not installed (uv sync --extra trl)")
pytest.importorskip("datasets", reason="datasets is not installed (uv sync --extra trl)")

import torch  # noqa: E402

from cuda_agent.adapters.trl import (  # noqa: E402
    KernelReward,
    WorkspaceEnvFactory,
    build_dataset,
    tool_calls_of,
    workspace_of,
)
from cuda_agent.agent.models import load_causal_lm, load_tokenizer, make_tiny_model  # noqa: E402
from cuda_agent.records import EvalResult, load_records  # noqa: E402
from cuda_agent.sandbox import SandboxConfig, SandboxPool  # noqa: E402

from .conftest import FAST  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

# the multi-turn model's scripted tool call: it turns the starter ModelNew (the reference under
# another name, correct with the guards off) into the identity, which is incorrect
COMMAND = "sed -i 's/torch.relu(x)/x/' model_new.py"
TOOL_CALL = (
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "' + COMMAND + '"}}\n</tool_call>'
)


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory's warning


def _args(out: Path, **kw):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out),
        max_steps=1,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-3,
        seed=0,
        **kw,
    )


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_grpo_step_single_turn(tmp_path, relu_task, relu_answers, teach_model):
    from trl import GRPOTrainer

    d = make_tiny_model(tmp_path / "tiny", seed=0)
    tok, model = load_tokenizer(str(d)), load_causal_lm(str(d))
    dataset = build_dataset([relu_task], backend="cpu", include_skill=False)
    prompt = tok.apply_chat_template(
        dataset[0]["prompt"], add_generation_prompt=True, tokenize=False
    )
    # half of its answers a working kernel, half a wrong one: the group's rewards differ
    loss = teach_model(model, tok, prompt, [relu_answers["good"], relu_answers["bad"]], 100, 5e-3)
    assert loss < 0.1
    tok.padding_side = "left"
    before = _params(model)
    results = tmp_path / "results.jsonl"
    with SandboxPool(SandboxConfig(**FAST, guard_policy="strict")) as pool:
        reward = KernelReward(pool, results_path=results)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=_args(
                tmp_path / "out",
                per_device_train_batch_size=8,
                num_generations=8,
                max_completion_length=420,
                temperature=0.5,
            ),
            train_dataset=dataset,
            processing_class=tok,
        )
        trainer.train()
        reward.close()
    assert trainer.state.global_step == 1
    assert reward.calls == 1 and len(reward.last) == 8
    log = trainer.state.log_history[0]
    # the rewards TRL trained on are the sandbox's verdicts, scored by the reward package
    assert log["rewards/kernel_reward/mean"] == pytest.approx(
        sum(s.reward for s in reward.last) / 8
    )
    evaluated = [s for s in reward.last if s.result is not None]
    recs = load_records(results, EvalResult)
    assert len(recs) == len(evaluated) >= 6  # one record per evaluated completion
    assert [r.meta["trl"]["completion"] for r in recs] == [s.index for s in evaluated]
    assert {r.backend for r in recs} == {"cpu"}
    assert all(r.reward == s.reward for r, s in zip(recs, evaluated, strict=True))
    statuses = {s.status for s in evaluated}
    assert statuses & {"ok", "incorrect"}, statuses  # verdicts of correctness, run in the sandbox
    assert all(s.reward == 1.0 for s in evaluated if s.status == "ok")
    if log["reward_std"] > 0:  # the usual case: good and bad answers in the group
        after = _params(model)
        assert any(not torch.equal(before[k], after[k]) for k in before), "no update"


def test_grpo_step_multi_turn_environment(tmp_path, relu_task, teach_model, ws_root):
    from trl import GRPOTrainer
    from trl.chat_template_utils import (
        get_training_chat_template,
        is_chat_template_prefix_preserving,
    )

    from cuda_agent.agent.env import SandboxEnv

    d = make_tiny_model(tmp_path / "tiny", seed=0)
    tok = load_tokenizer(str(d))
    # a chat template TRL knows how to parse tool calls of (Qwen2.5's, shipped with TRL)
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    tok.save_pretrained(d)
    tok, model = load_tokenizer(str(d)), load_causal_lm(str(d))
    dataset = build_dataset(
        [relu_task], mode="multi-turn", backend="cpu", include_skill=False, guard_policy="off"
    )
    cfg = SandboxConfig(**FAST, guard_policy="off")
    workdir = ws_root / "grpo-mt"
    shutil.rmtree(workdir, ignore_errors=True)
    results = tmp_path / "mt.jsonl"
    with SandboxPool(cfg) as pool, SandboxEnv(cfg, pool=pool) as senv:
        envs = WorkspaceEnvFactory.local(senv, workdir)
        # the prompt as TRL renders it: the environment's tools (TRL lists an environment's
        # methods by name) in the chat template's tool block
        probe = envs()
        tools = [probe.Bash, probe.Edit, probe.Read, probe.Submit, probe.Write]
        template = (
            None if is_chat_template_prefix_preserving(tok) else get_training_chat_template(tok)
        )
        prompt = tok.apply_chat_template(
            dataset[0]["prompt"],
            tools=tools,
            chat_template=template,
            add_generation_prompt=True,
            tokenize=False,
        )
        assert '"name": "Bash"' in prompt and '"name": "Write"' in prompt
        assert teach_model(model, tok, prompt, [TOOL_CALL], 80, 5e-3) < 0.1
        tok.padding_side = "left"
        reward = envs.reward(results_path=results)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=_args(
                tmp_path / "out",
                per_device_train_batch_size=2,
                num_generations=2,
                max_completion_length=128,
                temperature=0.5,
                max_tool_calling_iterations=1,
            ),
            train_dataset=dataset,
            processing_class=tok,
            environment_factory=envs,
        )
        trainer.train()
        reward.close()
        assert trainer.state.global_step == 1
        log = trainer.state.log_history[0]
        used = [e for e in envs.envs if workspace_of(e) is not None]
        assert len(used) == 2
        calls = [tool_calls_of(e) for e in used]
        ran = [c for c in calls if c and c[0][:2] == ("Bash", {"command": COMMAND})]
        assert ran, calls  # TRL parsed the model's call and ran it through the environment
        assert log["tools/call_frequency"] > 0
        for env, c in zip(used, calls, strict=True):
            text = (workspace_of(env) / "model_new.py").read_text()
            assert ("torch.relu(x)" not in text) == bool(c)
        envs.close()
        assert not any(p.name.startswith("env") for p in workdir.iterdir())
    # a workspace the command ran in is incorrect (-1); one left alone keeps the correct starter
    by_env = {s.index: s for s in reward.last}
    for i, c in enumerate(calls):
        assert by_env[i].status == ("incorrect" if c else "ok"), by_env[i].reason
    assert log["rewards/kernel_workspace_reward/mean"] == pytest.approx(
        sum(s.reward for s in reward.last) / 2
    )
    recs = load_records(results, EvalResult)
    assert len(recs) == 2 and all(r.meta["trl"]["tool_calls"] for r in recs if r.status != "ok")
