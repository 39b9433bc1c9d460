"""Token-level generalised advantage estimation (GAE) over multi-turn trajectories.

The actions are the policy's tokens (``mask`` = 1). Observation tokens (prompts, tool outputs,
``mask`` = 0) are not steps of the MDP: the recursion skips them, so the value bootstrapped
and the advantage accumulated carry across a tool output unchanged, with no discount for its
length. Over the policy tokens p_0 < p_1 < ... < p_{K-1} of a sequence:

    delta_k = r_{p_k} + gamma * V(p_{k+1}) - V(p_k)          (V(p_K) = 0: the episode ends)
    A_k     = delta_k + gamma * lambda * A_{k+1}               (A_K = 0)
    R_k     = A_k + V(p_k)                                     (the value target)

With the reward on the last policy token and gamma = lambda = 1 (the defaults),
``R_k`` is the final reward for every policy token and ``A_k = R - V(p_k)``.
Positions with ``mask`` = 0 get advantage 0 and return 0.

Shared by ``critic pretrain`` and ``ppo``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def gae_1d(
    values: Sequence[float],
    rewards: Sequence[float],
    mask: Sequence[int],
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[list[float], list[float]]:
    """``(advantages, returns)`` of one sequence, lists of its length (see the module doc).

    Rewards on positions with ``mask`` = 0 are an error (they would be lost silently).
    """
    n = len(values)
    if not (len(rewards) == len(mask) == n):
        raise ValueError(f"lengths differ: values {n}, rewards {len(rewards)}, mask {len(mask)}")
    adv = [0.0] * n
    ret = [0.0] * n
    next_value = 0.0
    last = 0.0
    for t in range(n - 1, -1, -1):
        if not mask[t]:
            if rewards[t]:
                raise ValueError(
                    f"reward {rewards[t]} at position {t}, which is not a policy token"
                )
            continue
        v = float(values[t])
        delta = float(rewards[t]) + gamma * next_value - v
        last = delta + gamma * lam * last
        adv[t] = last
        ret[t] = last + v
        next_value = v
    return adv, ret


def terminal_rewards(mask: Any, rewards: Any) -> Any:
    """A ``[B, T]`` float tensor with ``rewards[b]`` on the last policy token of each row."""
    import torch

    m = mask.bool()
    T = m.shape[1]
    pos = torch.arange(T, device=m.device).expand_as(m)
    last = torch.where(m, pos, torch.full_like(pos, -1)).max(dim=1).values
    out = torch.zeros(m.shape, dtype=torch.float32, device=m.device)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] = rewards.to(out.device, torch.float32)[rows]
    return out


def gae(
    values: Any, rewards: Any, mask: Any, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Any, Any]:
    """Batched :func:`gae_1d` on ``[B, T]`` tensors; returns float32 ``(advantages, returns)``
    on the device of ``values``. Computed in float64 on the CPU (no gradient)."""
    import torch

    v = values.detach().to("cpu", torch.float64)
    r = rewards.detach().to("cpu", torch.float64)
    m = mask.detach().to("cpu")
    advs, rets = [], []
    for b in range(v.shape[0]):
        a, rt = gae_1d(v[b].tolist(), r[b].tolist(), m[b].tolist(), gamma, lam)
        advs.append(a)
        rets.append(rt)
    dev = values.device
    return (
        torch.tensor(advs, dtype=torch.float32, device=dev),
        torch.tensor(rets, dtype=torch.float32, device=dev),
    )
