"""PPO loss terms, one small class or function each (every number they log is defined here).

Shapes: ``[B, T]`` token tensors with a ``mask`` of policy tokens. Aggregation is the token mean
over the *global* number of policy tokens of the optimisation step (``global_tokens``: all
micro-batches on all ranks), so gradient accumulation and data parallelism give the same update
as one large batch and long responses are not down-weighted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum()


def masked_mean(
    x: torch.Tensor, mask: torch.Tensor, count: float | torch.Tensor | None = None
) -> torch.Tensor:
    """Sum of ``x`` over ``mask`` divided by ``count`` (default: the mask's own count, min 1)."""
    if count is None:
        count = mask.sum().clamp(min=1)
    return masked_sum(x, mask) / count


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, shift_mean: bool = True
) -> torch.Tensor:
    """``(x - mean) / std`` over masked entries (local statistics; the trainer all-reduces them
    first when running distributed, see :func:`whiten_with`)."""
    n = mask.sum().clamp(min=1)
    mean = masked_sum(x, mask) / n
    var = masked_sum((x - mean) ** 2, mask) / n
    return whiten_with(x, mean, var, eps, shift_mean)


def whiten_with(
    x: torch.Tensor,
    mean: torch.Tensor,
    var: torch.Tensor,
    eps: float = 1e-8,
    shift_mean: bool = True,
) -> torch.Tensor:
    out = (x - mean) * torch.rsqrt(var + eps)
    return out if shift_mean else out + mean


@dataclass
class PolicyLossOutput:
    loss: torch.Tensor
    clipfrac: float  # fraction of policy tokens whose ratio was clipped (either side)
    approx_kl: float  # mean of (ratio - 1) - log(ratio) (k3 estimator of KL(old || new))
    ratio_mean: float
    ratio_min: float
    ratio_max: float
    tis_capped_frac: float  # fraction of tokens whose importance weight hit the cap
    dual_clipped_frac: float


class PolicyLoss:
    """Clipped surrogate with asymmetric clipping (eps_low, eps_high), optional dual clip, and
    truncated importance sampling (TIS) between the rollout engine's and the trainer's log-probs.

    Per token: ``r = exp(logp - old_logp)``;
    ``l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``;
    dual clip (``A < 0`` only): ``l = min(l, -c A)``;
    TIS: ``l *= min(exp(old_logp - rollout_logp), cap)`` (a constant: no gradient).
    """

    def __init__(
        self,
        eps_low: float = 0.2,
        eps_high: float = 0.28,
        dual_clip: float | None = None,
        tis_cap: float | None = 2.0,
    ):
        if dual_clip is not None and dual_clip <= 1.0:
            raise ValueError("dual_clip must be > 1")
        self.eps_low, self.eps_high = eps_low, eps_high
        self.dual_clip, self.tis_cap = dual_clip, tis_cap

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        rollout_logp: torch.Tensor | None = None,
        global_tokens: float | torch.Tensor | None = None,
    ) -> PolicyLossOutput:
        mask = mask.to(logp.dtype)
        log_ratio = logp - old_logp
        ratio = torch.exp(log_ratio)
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1.0 - self.eps_low, 1.0 + self.eps_high) * advantages
        loss_tok = -torch.minimum(surr1, surr2)
        dual = torch.zeros_like(loss_tok, dtype=torch.bool)
        if self.dual_clip is not None:
            bound = -self.dual_clip * advantages
            dual = (advantages < 0) & (loss_tok > bound)
            loss_tok = torch.where(advantages < 0, torch.minimum(loss_tok, bound), loss_tok)
        capped = torch.zeros_like(dual)
        if self.tis_cap is not None and rollout_logp is not None:
            w = torch.exp(old_logp - rollout_logp).detach()
            capped = w > self.tis_cap
            loss_tok = loss_tok * w.clamp(max=self.tis_cap)
        loss = masked_mean(loss_tok, mask, global_tokens)
        with torch.no_grad():
            n = mask.sum().clamp(min=1)
            clipped = ((ratio < 1.0 - self.eps_low) | (ratio > 1.0 + self.eps_high)).to(mask.dtype)
            sel = mask.bool()
            rsel = ratio[sel] if sel.any() else ratio.new_ones(1)
            out = PolicyLossOutput(
                loss=loss,
                clipfrac=float(masked_sum(clipped, mask) / n),
                approx_kl=float(masked_sum((ratio - 1) - log_ratio, mask) / n),
                ratio_mean=float(rsel.mean()),
                ratio_min=float(rsel.min()),
                ratio_max=float(rsel.max()),
                tis_capped_frac=float(masked_sum(capped.to(mask.dtype), mask) / n),
                dual_clipped_frac=float(masked_sum(dual.to(mask.dtype), mask) / n),
            )
        return out


class ValueLoss:
    """Clipped value loss: ``1/2 max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)``,
    token mean over ``global_tokens``. ``clip_eps=None`` gives the plain squared error."""

    def __init__(self, clip_eps: float | None = 0.2):
        self.clip_eps = clip_eps

    def __call__(
        self,
        values: torch.Tensor,
        old_values: torch.Tensor,
        returns: torch.Tensor,
        mask: torch.Tensor,
        *,
        global_tokens: float | torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, float]:
        mask = mask.to(values.dtype)
        err = (values - returns) ** 2
        if self.clip_eps is not None:
            v_clip = old_values + (values - old_values).clamp(-self.clip_eps, self.clip_eps)
            err_clip = (v_clip - returns) ** 2
            clipped = (err_clip > err).to(mask.dtype)
            err = torch.maximum(err, err_clip)
        else:
            clipped = torch.zeros_like(err)
        loss = 0.5 * masked_mean(err, mask, global_tokens)
        frac = float(masked_sum(clipped, mask) / mask.sum().clamp(min=1))
        return loss, frac


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from sampled tokens: ``k1`` = log r, ``k2`` =
    (log r)^2 / 2, ``k3`` = exp(-log r) - 1 + log r (non-negative, unbiased), with r = pi/ref."""
    lr = logp - ref_logp
    if kind == "k1":
        return lr
    if kind == "k2":
        return 0.5 * lr**2
    if kind == "k3":
        return torch.exp(-lr) - 1 + lr
    raise ValueError(f"unknown KL estimator {kind!r}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the categorical distribution (computed in fp32)."""
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var[R - V] / Var[R] over masked tokens (nan when Var[R] is 0)."""
    m = mask.bool()
    v, r = values[m].float(), returns[m].float()
    if r.numel() < 2:
        return float("nan")
    var_r = r.var(unbiased=False)
    if var_r == 0:
        return float("nan")
    return float(1 - (r - v).var(unbiased=False) / var_r)
