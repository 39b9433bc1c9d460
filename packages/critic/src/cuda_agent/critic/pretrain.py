"""Value pretraining: L = 1/2 E_traj[ 1/T sum_{t policy} (V(s_t) - V_targ_t)^2 ].

Targets are GAE returns (:mod:`cuda_agent.critic.gae`) computed from the critic's own detached
values of the same forward pass, with the trajectory's reward on its last policy token; with the
default gamma = lambda = 1 every target is the final reward. The squared error is averaged over
the policy tokens of each trajectory, then over the trajectories of the global batch (the unit
of normalisation is a trajectory).

Reported: ``value_loss`` and ``explained_variance`` = 1 - Var(target - V) / Var(target) over the
policy tokens of the step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cuda_agent.training.data import Example

from .gae import gae, terminal_rewards
from .model import ValueModel


def policy_mask(batch: dict[str, Any]) -> Any:
    """Policy tokens that have a state before them (position 0 never does)."""
    m = (batch["loss_mask"] * batch["attention_mask"]).clone()
    m[:, 0] = 0
    return m


def value_loss(
    model: Any, batch: dict[str, Any], gamma: float = 1.0, lam: float = 1.0
) -> tuple[Any, dict[str, float]]:
    """``(sum over trajectories of 1/2 mean-token squared error, metric sums)``."""
    import torch

    mask = policy_mask(batch)
    values = model(batch["input_ids"])
    with torch.no_grad():
        _, targets = gae(values, terminal_rewards(mask, batch["rewards"]), mask, gamma, lam)
    mf = mask.float()
    err = (values - targets) * mf
    n_tok = mf.sum(dim=1)
    has = n_tok > 0
    per_traj = 0.5 * (err**2).sum(dim=1) / n_tok.clamp(min=1)
    loss_sum = per_traj[has].sum()
    with torch.no_grad():
        resid = (targets - values) * mf
        tg = targets * mf
        sums = {
            "vl_sum": float(loss_sum.detach()),
            "n_tok": float(mf.sum()),
            "t_sum": float(tg.sum()),
            "t_sq": float((tg**2).sum()),
            "r_sum": float(resid.sum()),
            "r_sq": float((resid**2).sum()),
            "v_sum": float((values * mf).sum()),
        }
    return loss_sum, sums


def explained_variance(sums: dict[str, float]) -> float:
    """1 - Var(resid)/Var(target) from the sums of :func:`value_loss` (nan when Var = 0)."""
    n = sums.get("n_tok", 0.0)
    if n < 2:
        return float("nan")
    var_t = sums["t_sq"] / n - (sums["t_sum"] / n) ** 2
    var_r = sums["r_sq"] / n - (sums["r_sum"] / n) ** 2
    return 1.0 - var_r / var_t if var_t > 1e-12 else float("nan")


class ValueObjective:
    """The ``critic pretrain`` objective for :func:`cuda_agent.training.trainer.train`."""

    name = "critic-value"

    def __init__(self, gamma: float = 1.0, lam: float = 1.0, seed: int = 0):
        self.gamma, self.lam, self.seed = gamma, lam, seed

    def build_model(self, source: str | Path, dtype: Any) -> Any:
        return ValueModel.from_pretrained(source, dtype=dtype, seed=self.seed)

    def units(self, examples: list[Example]) -> float:
        return float(sum(1 for e in examples if any(e.loss_mask[1:])))

    def loss(self, model: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, float]]:
        return value_loss(model, batch, self.gamma, self.lam)

    def summarize(self, sums: dict[str, float], units: float) -> dict[str, float]:
        n = max(sums.get("n_tok", 0.0), 1.0)
        return {
            "value_loss": sums.get("vl_sum", 0.0) / max(units, 1.0),
            "explained_variance": explained_variance(sums),
            "value_mean": sums.get("v_sum", 0.0) / n,
            "target_mean": sums.get("t_sum", 0.0) / n,
            "policy_tokens": sums.get("n_tok", 0.0),
        }

    def save(self, model: Any, out_dir: Path, state_dict: dict | None = None) -> None:
        model.save_pretrained(out_dir, state_dict=state_dict)


def evaluate(
    model: Any,
    examples: list[Example],
    gamma: float = 1.0,
    lam: float = 1.0,
    batch_tokens: int = 16384,
) -> dict[str, float]:
    """Value loss (per-trajectory mean) and explained variance of ``model`` on ``examples``."""
    import torch

    from cuda_agent.training.data import bucket, collate

    device = next(model.parameters()).device
    total: dict[str, float] = {}
    units = 0.0
    was = model.training
    model.eval()
    with torch.no_grad():
        for mb in bucket(examples, batch_tokens):
            exs = [examples[i] for i in mb]
            batch = {k: v.to(device) for k, v in collate(exs).items()}
            _, s = value_loss(model, batch, gamma, lam)
            for k, v in s.items():
                total[k] = total.get(k, 0.0) + v
            units += sum(1 for e in exs if any(e.loss_mask[1:]))
    model.train(was)
    return {
        "value_loss": total.get("vl_sum", 0.0) / max(units, 1.0),
        "explained_variance": explained_variance(total),
    }
