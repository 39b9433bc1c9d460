"""Policy backends behind one interface: token ids in, sampled token ids and log-probs out.

- :class:`HFPolicy`: transformers, batched sampling on CPU or GPU; log-probs are computed in fp32
  from the raw logits divided by the temperature (the distribution actually sampled when
  ``top_p == 1``, and the one the PPO trainer recomputes).
- :class:`ScriptedPolicy`: a fixed sequence of assistant texts (for tests and demos): the same
  token-level interface, log-probs 0.
- ``openai`` (text in, text out) lives in :mod:`cuda_agent.agent.openai_policy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish: str  # "stop" (end-of-turn token generated) | "length"


class TokenPolicy(Protocol):
    tokenizer: Any
    name: str

    def generate(
        self,
        contexts: Sequence[Sequence[int]],
        max_new_tokens: int,
        keys: Sequence[Any] | None = None,
    ) -> list[Generation]:
        """One continuation per context, ending at (and including) the end-of-turn token.
        ``keys`` identify the episodes (stateful policies such as a script use them)."""
        ...


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """Token ids that end an assistant turn (``<|im_end|>`` for ChatML, else EOS)."""
    ids = []
    for tok in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0:
            ids.append(tid)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


class ScriptedPolicy:
    """Replays fixed assistant turns, in order, separately for each episode key."""

    def __init__(self, tokenizer: Any, turns: Sequence[str], name: str = "scripted"):
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self.name = name
        self._next: dict[Any, int] = {}
        self._eot = end_of_turn_ids(tokenizer)[0]

    def generate(
        self,
        contexts: Sequence[Sequence[int]],
        max_new_tokens: int,
        keys: Sequence[Any] | None = None,
    ) -> list[Generation]:
        out = []
        for i, _ in enumerate(contexts):
            key = keys[i] if keys is not None else i
            k = self._next.get(key, 0)
            self._next[key] = k + 1
            text = self.turns[k] if k < len(self.turns) else "I have nothing more to do."
            ids = self.tokenizer.encode(text, add_special_tokens=False)[: max_new_tokens - 1]
            ids.append(self._eot)
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out

    def reset(self) -> None:
        self._next.clear()


class SamplingPolicy:
    """What every sampling backend shares: tokenizer, sampling settings, end-of-turn ids."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        name: str = "policy",
        seed: int | None = None,
    ):
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.name = name
        self.seed = seed
        self.eot = end_of_turn_ids(tokenizer)


class HFPolicy(SamplingPolicy):
    """Sampling from a transformers causal LM, batched with left padding."""

    def __init__(self, model: Any, tokenizer: Any, *, name: str = "hf", **kw: Any):
        super().__init__(tokenizer, name=name, **kw)
        self.model = model

    @classmethod
    def load(cls, spec: str, device: str = "cpu", dtype: Any = None, **kw: Any) -> HFPolicy:
        """Load ``spec`` (a local checkpoint directory or ``smollm2``)."""
        from .models import load_causal_lm, load_tokenizer, resolve_model

        path = resolve_model(spec)
        model = load_causal_lm(path, device=device, dtype=dtype)
        model.eval()
        return cls(model, load_tokenizer(path), name=cls.name_for(spec), **kw)

    @staticmethod
    def name_for(spec: str) -> str:
        """The name (and trajectory-id part) a policy loaded from ``spec`` gets."""
        return f"hf:{spec}"

    def generate(
        self,
        contexts: Sequence[Sequence[int]],
        max_new_tokens: int,
        keys: Sequence[Any] | None = None,
    ) -> list[Generation]:
        import torch

        if not contexts:
            return []
        dev = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.eot[0]
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, c in enumerate(contexts):
            ids[i, width - len(c) :] = torch.tensor(list(c), dtype=torch.long)
            mask[i, width - len(c) :] = 1
        if self.seed is not None and not getattr(self, "_seeded", False):
            torch.manual_seed(self.seed)  # once: later turns continue the same random stream
            self._seeded = True
        do_sample = self.temperature > 0
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(dev),
                attention_mask=mask.to(dev),
                max_new_tokens=max_new_tokens,
                do_sample=do_sample,
                temperature=self.temperature if do_sample else None,
                top_p=self.top_p if do_sample else None,
                top_k=0 if do_sample else None,
                eos_token_id=self.eot,
                pad_token_id=pad,
                return_dict_in_generate=True,
                output_logits=True,
            )
        new = out.sequences[:, width:].cpu()
        logits = torch.stack(out.logits, dim=1).float()  # [B, T, V]
        if do_sample:
            logits = logits / self.temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, new.to(logits.device).unsqueeze(-1))
        logp = logp.squeeze(-1).cpu()
        gens = []
        for i in range(len(contexts)):
            toks: list[int] = []
            lps: list[float] = []
            finish = "length"
            for t in range(new.shape[1]):
                tid = int(new[i, t])
                toks.append(tid)
                lps.append(float(logp[i, t]))
                if tid in self.eot:
                    finish = "stop"
                    break
            gens.append(Generation(toks, lps, finish))
        return gens
