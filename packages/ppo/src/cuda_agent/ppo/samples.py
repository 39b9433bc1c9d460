"""Training samples from trajectories, and per-token log-probs / values from the trainer's models.

A *sample* is a prefix of one trajectory with the policy tokens it trains: the whole trajectory
(default), or one assistant turn with everything before it as context (``per_turn_samples``: a
100-turn episode becomes 100 bounded-length samples). Log-probs and values are computed per
sample and scattered back to the trajectory's positions, so GAE always runs over whole episodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cuda_agent.records import Trajectory


@dataclass
class Sample:
    traj: int  # index of the trajectory
    end: int  # the sample is token_ids[:end]
    positions: list[int]  # policy-token positions (< end) it trains


def turn_spans(mask: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each maximal run of policy tokens."""
    spans, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


def build_samples(trajs: list[Trajectory], per_turn: bool) -> list[Sample]:
    """Samples of every trajectory that has policy tokens (see the module doc)."""
    out = []
    for k, t in enumerate(trajs):
        spans = turn_spans(t.loss_mask)
        if not spans:
            continue
        if per_turn:
            out += [Sample(k, e, list(range(s, e))) for s, e in spans]
        else:
            out.append(Sample(k, spans[-1][1], [i for s, e in spans for i in range(s, e)]))
    return out


def fp32_logits_at(model: Any, ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """fp32 logits of the positions ``rows`` of ``ids`` ([1, T]) from the LM head applied in fp32
    to the final hidden states (no full-vocabulary logits for the other positions)."""
    hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state[0]
    h = hidden[rows]
    head = model.get_output_embeddings()
    with torch.autocast(h.device.type, enabled=False):
        logits = torch.nn.functional.linear(
            h.float(), head.weight.float(), None if head.bias is None else head.bias.float()
        )
    return logits


def sample_logprobs(
    model: Any, ids: list[int], positions: list[int], device: Any, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``ids[p]`` given ``ids[:p]`` for each ``p`` in ``positions`` (fp32), and the
    per-position entropy when asked."""
    t = torch.tensor([ids], dtype=torch.long, device=device)
    pos = torch.tensor(positions, dtype=torch.long, device=device)
    logits = fp32_logits_at(model, t, pos - 1)
    logp_all = torch.log_softmax(logits, dim=-1)
    lp = logp_all.gather(-1, t[0, pos].unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return lp, ent


def sample_values(critic: Any, ids: list[int], positions: list[int], device: Any) -> torch.Tensor:
    """V(s_p) for each policy position ``p`` (the critic's values are aligned to tokens)."""
    t = torch.tensor([ids], dtype=torch.long, device=device)
    v = critic(t)[0]
    return v[torch.tensor(positions, dtype=torch.long, device=device)].float()


def micro_batches(samples: list[Sample], token_budget: int) -> list[list[Sample]]:
    """Consecutive groups of samples whose padded size (rows x longest) stays within the budget
    (a sample longer than the budget goes alone)."""
    groups: list[list[Sample]] = []
    cur: list[Sample] = []
    longest = 0
    for s in samples:
        new_longest = max(longest, s.end)
        if cur and new_longest * (len(cur) + 1) > token_budget:
            groups.append(cur)
            cur, new_longest = [], s.end
        cur.append(s)
        longest = new_longest
    if cur:
        groups.append(cur)
    return groups


def _zero3_partitioned(model: Any) -> bool:
    """Whether DeepSpeed ZeRO-3 holds ``model``'s weights partitioned (``ds_id`` on parameters)."""
    return hasattr(next(model.parameters()), "ds_id")


def _padded(seqs: list[list[int]], device: Any) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    t = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        t[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return t.to(device)


def batch_logprobs(
    model: Any,
    seqs: list[list[int]],
    positions: list[list[int]],
    device: Any,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """:func:`sample_logprobs` for several right-padded sequences in one forward pass (causal
    attention never looks at the padding that follows a sequence). With ``temperature`` the
    log-probs (and entropies) are those of ``softmax(logits / temperature)``: the distribution a
    rollout at that temperature sampled from (``HFPolicy`` reports the same)."""
    ids = _padded(seqs, device)
    rows = torch.cat(
        [torch.full((len(p),), i, dtype=torch.long) for i, p in enumerate(positions)]
    ).to(device)
    cols = torch.cat([torch.tensor(p, dtype=torch.long) for p in positions]).to(device)
    if _zero3_partitioned(model):
        # ZeRO-3 gathers each weight in its module's own forward: run the whole model (its
        # lm_head in the training dtype) and upcast the logits of the positions needed
        logits = model(input_ids=ids, use_cache=False).logits[rows, cols - 1].float()
    else:
        hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
        h = hidden[rows, cols - 1]
        head = model.get_output_embeddings()
        with torch.autocast(h.device.type, enabled=False):
            logits = torch.nn.functional.linear(
                h.float(), head.weight.float(), None if head.bias is None else head.bias.float()
            )
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    lp = logp_all.gather(-1, ids[rows, cols].unsqueeze(-1)).squeeze(-1)
    sizes = [len(p) for p in positions]
    ent = list((-(logp_all.exp() * logp_all).sum(-1)).split(sizes)) if with_entropy else None
    return list(lp.split(sizes)), ent


def batch_values(
    critic: Any, seqs: list[list[int]], positions: list[list[int]], device: Any
) -> list[torch.Tensor]:
    """:func:`sample_values` for several right-padded sequences in one forward pass."""
    v = critic(_padded(seqs, device))
    return [
        v[i, torch.tensor(p, dtype=torch.long, device=device)].float()
        for i, p in enumerate(positions)
    ]
