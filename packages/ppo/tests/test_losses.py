"""Every loss term against hand-computed numbers."""

import math

import pytest
import torch

from cuda_agent.ppo.losses import (
    PolicyLoss,
    ValueLoss,
    entropy_from_logits,
    explained_variance,
    kl_estimate,
    masked_whiten,
)


def T(*xs):
    return torch.tensor([list(xs)], dtype=torch.float64)


def logs(*ratios):
    return T(*[math.log(r) for r in ratios])


def test_asymmetric_clip_positive_advantage():
    # ratios 0.5, 1.0, 1.2, 1.5 with A = +1: clip at 1 + 0.28 = 1.28 for large ratios only;
    # for A > 0 small ratios are not clipped (min picks r A)
    pl = PolicyLoss(eps_low=0.2, eps_high=0.28, tis_cap=None)
    out = pl(logs(0.5, 1.0, 1.2, 1.5), T(0, 0, 0, 0), T(1, 1, 1, 1), T(1, 1, 1, 1))
    expected = -(0.5 + 1.0 + 1.2 + 1.28) / 4
    assert out.loss.item() == pytest.approx(expected)
    assert out.clipfrac == pytest.approx(2 / 4)  # 0.5 and 1.5 are outside [0.8, 1.28]
    assert out.ratio_min == pytest.approx(0.5) and out.ratio_max == pytest.approx(1.5)


def test_asymmetric_clip_negative_advantage():
    # A = -1: -min(-r, -clip(r)) = max(r, clip(r)); ratio 0.5 -> 0.8 (low clip), 1.5 -> 1.5
    pl = PolicyLoss(eps_low=0.2, eps_high=0.28, tis_cap=None)
    out = pl(logs(0.5, 1.0, 1.5), T(0, 0, 0), T(-1, -1, -1), T(1, 1, 1))
    assert out.loss.item() == pytest.approx((0.8 + 1.0 + 1.5) / 3)


def test_dual_clip_caps_negative_advantage_only():
    pl = PolicyLoss(dual_clip=3.0, tis_cap=None)
    out = pl(logs(10.0, 10.0), T(0, 0), T(-1, 2), T(1, 1))
    # A=-1: plain loss 10, dual bound 3 -> 3; A=+2: -min(20, 1.28*2) = -2.56
    assert out.loss.item() == pytest.approx((3.0 - 2.56) / 2)
    assert out.dual_clipped_frac == pytest.approx(0.5)
    with pytest.raises(ValueError):
        PolicyLoss(dual_clip=0.5)


def test_token_mean_over_global_count_and_mask():
    pl = PolicyLoss(tis_cap=None)
    lp = logs(1.0, 1.0, 1.0)
    out = pl(lp, T(0, 0, 0), T(1, 2, 100), T(1, 1, 0))  # masked token ignored
    assert out.loss.item() == pytest.approx(-(1 + 2) / 2)
    out = pl(
        lp, T(0, 0, 0), T(1, 2, 100), T(1, 1, 0), global_tokens=6
    )  # e.g. 6 tokens on all ranks
    assert out.loss.item() == pytest.approx(-(1 + 2) / 6)


def test_tis_weight_and_cap():
    pl = PolicyLoss(tis_cap=2.0)
    # old (trainer) vs rollout log-probs: weights exp(0)=1, exp(log 1.5)=1.5, exp(log 5)=5 -> capped 2
    old = T(0.0, math.log(1.5), math.log(5.0))
    rollout = T(0.0, 0.0, 0.0)
    out = pl(old.clone(), old, T(1, 1, 1), T(1, 1, 1), rollout_logp=rollout)
    assert out.loss.item() == pytest.approx(-(1 * 1 + 1 * 1.5 + 1 * 2.0) / 3)
    assert out.tis_capped_frac == pytest.approx(1 / 3)


def test_policy_gradient_flows_only_through_policy_tokens():
    lp = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    out = PolicyLoss(tis_cap=None)(
        lp, torch.zeros(1, 3, dtype=torch.float64), T(1, 1, 1), T(1, 0, 1)
    )
    out.loss.backward()
    assert lp.grad[0, 1].item() == 0.0 and lp.grad[0, 0].item() == pytest.approx(-0.5)


def test_approx_kl():
    out = PolicyLoss(tis_cap=None)(logs(2.0), T(0), T(1), T(1))
    assert out.approx_kl == pytest.approx((2 - 1) - math.log(2))


def test_value_loss_clipping():
    vl = ValueLoss(clip_eps=0.2)
    # V=1.0, V_old=0.0, R=1.0: unclipped err 0; clipped V = 0.2 -> err 0.64; max -> 0.64
    loss, frac = vl(T(1.0, 0.5), T(0.0, 0.5), T(1.0, 0.0), T(1, 1))
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.25) / 2)
    assert frac == pytest.approx(0.5)
    loss, _ = ValueLoss(clip_eps=None)(T(1.0, 0.5), T(0.0, 0.5), T(1.0, 0.0), T(1, 1))
    assert loss.item() == pytest.approx(0.5 * (0 + 0.25) / 2)
    loss, _ = vl(T(1.0, 0.5), T(0.0, 0.5), T(1.0, 0.0), T(1, 1), global_tokens=4)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.25) / 4)


def test_kl_estimators():
    lp, ref = T(math.log(0.5)), T(math.log(0.25))
    lr = math.log(2)
    assert kl_estimate(lp, ref, "k1").item() == pytest.approx(lr)
    assert kl_estimate(lp, ref, "k2").item() == pytest.approx(0.5 * lr**2)
    assert kl_estimate(lp, ref, "k3").item() == pytest.approx(0.5 - 1 + lr)
    with pytest.raises(ValueError):
        kl_estimate(lp, ref, "k9")


def test_entropy_and_whiten_and_ev():
    h = entropy_from_logits(torch.zeros(1, 4))
    assert h.item() == pytest.approx(math.log(4))
    x = T(1.0, 2.0, 3.0, 100.0)
    w = masked_whiten(x, T(1, 1, 1, 0))
    sel = w[0, :3]
    assert sel.mean().item() == pytest.approx(0.0, abs=1e-9)
    assert sel.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-6)
    r = T(1.0, 2.0, 3.0)
    assert explained_variance(r, r, T(1, 1, 1)) == pytest.approx(1.0)
    assert explained_variance(torch.zeros_like(r), r, T(1, 1, 1)) == pytest.approx(0.0)
