"""Token-exactness of episodes: ids decode to the transcript; the mask covers exactly the policy."""

import pytest

from cuda_agent.agent.episode import EpisodeConfig, EpisodeRunner, turn_boundary
from cuda_agent.agent.models import load_tokenizer
from cuda_agent.agent.policy import HFPolicy, ScriptedPolicy
from cuda_agent.agent.toolcalls import format_tool_call
from cuda_agent.records import Task

REF = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


SCRIPT = [
    "Let me look.\n" + format_tool_call("Read", {"path": "model.py"}),
    "Broken call <tool_call>{oops}</tool_call>",
    "Writing.\n"
    + format_tool_call("Write", {"path": "model_new.py", "content": "class ModelNew: pass\n"}),
    format_tool_call("Submit", {"summary": "done"}),
]


@pytest.fixture
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def test_scripted_episode_is_token_exact(tmp_path, tok, dir_env):
    task = Task.make("Identity", REF)
    runner = EpisodeRunner(
        ScriptedPolicy(tok, SCRIPT), dir_env, EpisodeConfig(evaluate=False), tmp_path
    )
    (traj,) = runner.run([(task, 0)])
    assert traj.stop_reason == "submit"
    assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs)
    # the ids decode to the chat template's rendering of the transcript
    msgs = [{"role": m.role, "content": m.content} for m in traj.messages]
    rendered = tok.apply_chat_template(msgs, tokenize=False)
    assert tok.decode(traj.token_ids) + "\n" == rendered
    # the mask covers exactly the policy's turns (text + end-of-turn), nothing else
    policy_ids = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
    expected = []
    for text in SCRIPT:
        expected += tok.encode(text, add_special_tokens=False) + [
            tok.convert_tokens_to_ids("<|im_end|>")
        ]
    assert policy_ids == expected
    # counters
    c = traj.counters
    assert c["turns"] == 4 and c["schema_violations"] == 1 and c["tool_Read"] == 1
    assert c["tool_calls"] == 3  # Read, Write, Submit
    assert traj.solution is not None and traj.solution.files == {
        "model_new.py": "class ModelNew: pass\n"
    }
    assert traj.reward == -1.0 and traj.reward_reason == "no solution evaluated"
    assert "not valid JSON" in traj.tool_calls[1].result


def test_turn_boundary_chatml(tok):
    b = turn_boundary(tok, "OBS")
    assert b == "\n<|im_start|>user\nOBS<|im_end|>\n<|im_start|>assistant\n"


def test_limits_stop_episodes(tmp_path, tok, dir_env):
    task = Task.make("Identity", REF)
    loop = [format_tool_call("Glob", {"pattern": "*"})] * 10
    cfg = EpisodeConfig(evaluate=False, max_turns=3)
    (t,) = EpisodeRunner(ScriptedPolicy(tok, loop), dir_env, cfg, tmp_path / "a").run([(task, 0)])
    assert t.stop_reason == "max_turns" and t.counters["turns"] == 3
    assert t.counters["repeated_actions"] == 2
    cfg = EpisodeConfig(evaluate=False, max_context_tokens=len(t.token_ids) - 50, max_new_tokens=64)
    (t2,) = EpisodeRunner(ScriptedPolicy(tok, loop), dir_env, cfg, tmp_path / "b").run([(task, 0)])
    assert t2.stop_reason == "context_overflow" and t2.counters["turns"] < 3
    # stopped because the next turn would not fit, never past the budget
    assert len(t2.token_ids) <= cfg.max_context_tokens < len(t2.token_ids) + cfg.max_new_tokens
    idle = ["thinking"] * 5
    cfg = EpisodeConfig(evaluate=False, max_idle_turns=2)
    (t3,) = EpisodeRunner(ScriptedPolicy(tok, idle), dir_env, cfg, tmp_path / "c").run([(task, 0)])
    assert t3.stop_reason == "no_tool_call" and t3.counters["turns"] == 2


def test_hf_policy_logprobs_match_a_forward_pass(tmp_path, tiny_model_dir, dir_env):
    import torch

    policy = HFPolicy.load(str(tiny_model_dir), temperature=1.0, seed=0)
    task = Task.make("Identity", REF)
    cfg = EpisodeConfig(evaluate=False, max_turns=2, max_new_tokens=24)
    runner = EpisodeRunner(policy, dir_env, cfg, tmp_path)
    trajs = runner.run([(task, 0), (task, 1)])  # a batch of two, left-padded
    for t in trajs:
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            logits = policy.model(ids).logits.float()
        lp = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        pos = [i for i, m in enumerate(t.loss_mask) if m]
        assert pos, "the policy generated nothing"
        for i in pos:
            assert abs(lp[i - 1].item() - t.logprobs[i]) < 2e-3, (
                i,
                lp[i - 1].item(),
                t.logprobs[i],
            )
        assert all(t.logprobs[i] == 0.0 for i, m in enumerate(t.loss_mask) if not m)


def test_loaded_models_attend_without_cudnn(tiny_model_dir, monkeypatch):
    """Every model we load takes cuDNN out of torch's attention backends (a per-shape plan build
    made the H200's first generations 15x slower); the user can keep it."""
    import torch

    from cuda_agent.agent.models import avoid_cudnn_attention, load_causal_lm

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        monkeypatch.setenv("CUDA_AGENT_CUDNN_SDPA", "1")
        avoid_cudnn_attention()
        assert torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.delenv("CUDA_AGENT_CUDNN_SDPA")
        load_causal_lm(str(tiny_model_dir))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_tools_subset_in_prompt_and_calls(tmp_path, tok, dir_env):
    """EpisodeConfig.tools: only those tools' schemas are in the system prompt, and a call to
    another tool is refused (it runs nothing); an unknown name is an error."""
    task = Task.make("Identity", REF)
    cfg = EpisodeConfig(evaluate=False, tools=("Write", "Submit"), max_turns=3)
    (t,) = EpisodeRunner(ScriptedPolicy(tok, SCRIPT), dir_env, cfg, tmp_path).run([(task, 0)])
    system = t.messages[0].content
    assert '"name": "Write"' in system and '"name": "Submit"' in system
    assert '"name": "Read"' not in system and '"name": "Bash"' not in system
    calls = {c.name: c for c in t.tool_calls}
    read, write = calls["Read"], calls["Write"]
    assert read.name == "Read" and not read.ok and "not offered" in read.result
    assert write.name == "Write" and write.ok
    assert (tmp_path / f"0000-{task.id}-0" / "model_new.py").exists()
    with pytest.raises(ValueError, match="unknown tool"):
        EpisodeConfig(tools=("Write", "Compile"))
