"""GAE over policy tokens, checked against values computed by hand."""

from __future__ import annotations

import pytest
import torch

from cuda_agent.critic.gae import gae, gae_1d, terminal_rewards

# four policy tokens p0..p3 with values 0.5, 0.2, 0.7, 0.9; reward 2 on p3


def _seq(obs_between: int = 0, obs_value: float = 9.0):
    """prompt (2 tokens), p0, p1, <tool output>, p2, p3."""
    values = [obs_value, obs_value, 0.5, 0.2] + [obs_value] * obs_between + [0.7, 0.9]
    mask = [0, 0, 1, 1] + [0] * obs_between + [1, 1]
    rewards = [0.0] * (len(mask) - 1) + [2.0]
    pol = [i for i, m in enumerate(mask) if m]
    return values, rewards, mask, pol


def test_defaults_make_every_target_the_final_reward():
    values, rewards, mask, pol = _seq(obs_between=5)
    adv, ret = gae_1d(values, rewards, mask)
    assert [ret[i] for i in pol] == pytest.approx([2.0, 2.0, 2.0, 2.0])
    assert [adv[i] for i in pol] == pytest.approx([1.5, 1.8, 1.3, 1.1])
    # observation positions carry nothing of their own
    assert all(adv[i] == 0.0 and ret[i] == 0.0 for i, m in enumerate(mask) if not m)


def test_lambda_below_one_across_a_long_tool_output():
    """lambda = 0.5: by hand over the compressed sequence V = [.5, .2, .7, .9], R = 2.

    k=3: delta = 2 - .9 = 1.1             A = 1.1      R = 2.0
    k=2: delta = .9 - .7 = .2             A = .2 + .5 * 1.1 = .75       R = 1.45
    k=1: delta = .7 - .2 = .5             A = .5 + .5 * .75 = .875      R = 1.075
    k=0: delta = .2 - .5 = -.3            A = -.3 + .5 * .875 = .1375   R = .6375
    The 200-token tool output between p1 and p2 neither discounts nor adds anything; if its
    tokens were steps, lambda^200 would wipe out p1's advantage from p2 onwards.
    """
    values, rewards, mask, pol = _seq(obs_between=200)
    adv, ret = gae_1d(values, rewards, mask, gamma=1.0, lam=0.5)
    assert [adv[i] for i in pol] == pytest.approx([0.1375, 0.875, 0.75, 1.1])
    assert [ret[i] for i in pol] == pytest.approx([0.6375, 1.075, 1.45, 2.0])
    # same answer without the tool output: observation tokens are skipped entirely
    v0, r0, m0, p0 = _seq(obs_between=0)
    adv0, ret0 = gae_1d(v0, r0, m0, gamma=1.0, lam=0.5)
    assert [adv0[i] for i in p0] == pytest.approx([adv[i] for i in pol])


def test_gamma_discounts_per_policy_token():
    """gamma = 0.9, lambda = 1: R_k = 0.9^(3-k) * 2 = 1.458, 1.62, 1.8, 2.0."""
    values, rewards, mask, pol = _seq(obs_between=50)
    adv, ret = gae_1d(values, rewards, mask, gamma=0.9, lam=1.0)
    assert [ret[i] for i in pol] == pytest.approx([1.458, 1.62, 1.8, 2.0])
    assert [adv[i] for i in pol] == pytest.approx([0.958, 1.42, 1.1, 1.1])


def test_lambda_zero_is_one_step_td():
    values, rewards, mask, pol = _seq(obs_between=3)
    adv, ret = gae_1d(values, rewards, mask, gamma=1.0, lam=0.0)
    assert [ret[i] for i in pol] == pytest.approx([0.2, 0.7, 0.9, 2.0])


def test_reward_on_an_observation_token_is_an_error():
    values, rewards, mask, _ = _seq()
    rewards[0] = 1.0
    with pytest.raises(ValueError, match="not a policy token"):
        gae_1d(values, rewards, mask)


def test_terminal_rewards_and_batched_gae_match_the_1d_form():
    v1, _, m1, _ = _seq(obs_between=4)
    v2, _, m2, _ = _seq(obs_between=0)
    T = len(m1)
    pad = T - len(m2)
    values = torch.tensor([v1, v2 + [0.0] * pad, [0.0] * T])
    mask = torch.tensor([m1, m2 + [0] * pad, [0] * T])
    r = terminal_rewards(mask, torch.tensor([2.0, -1.0, 3.0]))
    assert r[0, T - 1] == 2.0 and r[1, len(m2) - 1] == -1.0 and r.sum() == 1.0  # row 3: none
    adv, ret = gae(values, r, mask, gamma=0.95, lam=0.9)
    for b in range(3):
        a1, r1 = gae_1d(values[b].tolist(), r[b].tolist(), mask[b].tolist(), 0.95, 0.9)
        assert adv[b].tolist() == pytest.approx(a1, abs=1e-6)
        assert ret[b].tolist() == pytest.approx(r1, abs=1e-6)
    assert adv.dtype == torch.float32 and adv.shape == values.shape
