"""Synthetic trajectories: token-exact, with the policy mask exactly on the assistant's tokens."""

from __future__ import annotations

from cuda_agent.agent.models import load_tokenizer
from cuda_agent.training.synthetic import tiny_training_setup


def test_synthetic_trajectories_mask_exactly_the_assistant_tokens(tmp_path):
    tiny_model, trajectories, _ = tiny_training_setup(
        tmp_path, 1, turns=3, tool_output_lines=4, reward=1.0
    )
    tok = load_tokenizer(tiny_model)
    t = trajectories[0]
    assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
    policy = tok.decode([i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m])
    other = tok.decode([i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if not m])
    for m in t.messages:
        where = policy if m.role == "assistant" else other
        assert m.content in where, (m.role, m.content[:40])
    # several policy spans separated by tool outputs
    spans = sum(1 for a, b in zip(t.loss_mask, t.loss_mask[1:], strict=False) if a == 0 and b == 1)
    assert spans == 4 and t.tool_calls and all(c.result for c in t.tool_calls)
