"""Policy-token SFT: L = -sum_t m_t log p(x_t | x_<t) / sum_t m_t over the global batch.

``m_t`` is the trajectory's ``loss_mask`` (1 on tokens the policy generated, 0 on prompts and
tool outputs); the logits are only computed where ``m_t = 1``, so tool outputs cost no LM-head
compute and cannot leak gradient through the loss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cuda_agent.agent.models import load_causal_lm
from cuda_agent.training.data import Example


def masked_nll(logits: Any, input_ids: Any, loss_mask: Any) -> tuple[Any, int]:
    """Reference form: ``(sum of -log p over masked next tokens, count)`` from full logits.

    ``logits[:, t]`` predicts ``input_ids[:, t + 1]``, which counts when ``loss_mask[:, t + 1]``.
    """
    import torch.nn.functional as F

    sel = loss_mask[:, 1:].bool()
    lg = logits[:, :-1][sel].float()
    nll = F.cross_entropy(lg, input_ids[:, 1:][sel], reduction="sum")
    return nll, int(sel.sum())


def _plain_head(model: Any) -> bool:
    cfg = model.config
    return not (getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None))


def policy_nll(model: Any, batch: dict[str, Any]) -> tuple[Any, int]:
    """``(summed NLL, number of policy tokens)`` of a right-padded batch.

    Padding sits after every real token, so causal attention never sees it and no attention
    mask is passed (the fast causal kernels stay usable).
    """
    import torch.nn.functional as F

    ids = batch["input_ids"]
    mask = batch["loss_mask"] * batch["attention_mask"]
    if not _plain_head(model):
        logits = model(input_ids=ids, use_cache=False).logits
        return masked_nll(logits, ids, mask)
    sel = mask[:, 1:].bool()
    hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
    h = hidden[:, :-1][sel]
    logits = model.get_output_embeddings()(h).float()
    nll = F.cross_entropy(logits, ids[:, 1:][sel], reduction="sum")
    return nll, int(sel.sum())


class SFTObjective:
    """The ``rft train`` objective for :func:`cuda_agent.training.trainer.train`."""

    name = "rft-sft"

    def build_model(self, source: str | Path, dtype: Any) -> Any:
        return load_causal_lm(source, dtype=dtype, use_cache=False)

    def units(self, examples: list[Example]) -> float:
        return float(sum(sum(e.loss_mask[1:]) for e in examples))

    def loss(self, model: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, float]]:
        nll, n = policy_nll(model, batch)
        return nll, {"nll_sum": float(nll.detach()), "policy_tokens": float(n)}

    def summarize(self, sums: dict[str, float], units: float) -> dict[str, float]:
        return {
            "loss": sums.get("nll_sum", 0.0) / max(units, 1.0),
            "policy_tokens": sums.get("policy_tokens", 0.0),
        }

    def save(self, model: Any, out_dir: Path, state_dict: dict | None = None) -> None:
        model.save_pretrained(out_dir, state_dict=state_dict)


def mean_nll(model: Any, examples: list[Example], batch_tokens: int = 16384) -> float:
    """Token-mean NLL of ``model`` over the policy tokens of ``examples`` (no gradient)."""
    import torch

    from cuda_agent.training.data import bucket, collate

    device = next(model.parameters()).device
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for mb in bucket(examples, batch_tokens):
            batch = {k: v.to(device) for k, v in collate([examples[i] for i in mb]).items()}
            nll, n = policy_nll(model, batch)
            total += float(nll)
            count += n
    model.train(was_training)
    return total / max(count, 1)
