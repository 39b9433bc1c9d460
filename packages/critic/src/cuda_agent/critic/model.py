"""The value model: a causal-LM backbone and a scalar head in fp32, one value per token.

``values[:, t]`` is V(s_t), the value of the state *before* token t, read from the hidden state
of position t - 1 (which has seen tokens < t); it lines up with ``logprobs[t]`` and
``loss_mask[t]`` of a trajectory. Position 0 has no state before it and gets 0.

Saved as a Hugging Face directory of the backbone (``config.json``, ``model.safetensors``) plus
``value_head.safetensors`` and ``critic.json``. Loading a causal-LM checkpoint (the actor)
initialises a fresh head.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

HEAD_FILE = "value_head.safetensors"
META_FILE = "critic.json"


class FP32Linear(nn.Linear):
    """A linear layer computed in fp32 whatever the dtype of its input or stored weights (under
    DeepSpeed bf16 the weights are stored in bf16; the fp32 master copy is the optimizer's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.bias.float() if self.bias is not None else None
        return torch.nn.functional.linear(x.float(), self.weight.float(), b)


class ValueModel(nn.Module):
    """Backbone (e.g. ``LlamaModel``) + ``nn.Linear(hidden, 1)`` computed in fp32."""

    def __init__(self, backbone: nn.Module, hidden_size: int, head_init_std: float | None = None):
        super().__init__()
        self.backbone = backbone
        self.value_head = FP32Linear(hidden_size, 1, dtype=torch.float32)
        std = head_init_std if head_init_std is not None else 1.0 / (hidden_size + 1) ** 0.5
        nn.init.normal_(self.value_head.weight, std=std)
        nn.init.zeros_(self.value_head.bias)

    @property
    def config(self) -> Any:
        return self.backbone.config

    @classmethod
    def from_pretrained(
        cls, spec: str | os.PathLike[str], dtype: Any = torch.float32, seed: int = 0
    ) -> ValueModel:
        """A critic from a critic directory, or a fresh head on an actor's backbone."""
        from transformers import AutoModel

        from cuda_agent.agent.models import avoid_cudnn_attention, resolve_model

        avoid_cudnn_attention()
        path = resolve_model(spec)
        backbone = AutoModel.from_pretrained(path, local_files_only=True, dtype=dtype)
        backbone.config.use_cache = False
        hidden = backbone.config.hidden_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = cls(backbone, hidden)
        head = path / HEAD_FILE
        if head.is_file():
            from safetensors.torch import load_file

            sd = load_file(head)
            model.value_head.load_state_dict(
                {k.removeprefix("value_head."): v.float() for k, v in sd.items()}
            )
        return model

    def activation_checkpointing_enable(self, **kw: Any) -> None:
        from cuda_agent.training.trainer import enable_checkpointing

        enable_checkpointing(self.backbone)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Any:
        """``[B, T]`` fp32 values aligned to tokens (see the module doc).

        Right padding needs no attention mask (causal attention never looks ahead), so none is
        passed unless given.
        """
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        h = out.last_hidden_state
        with torch.autocast(h.device.type, enabled=False):
            v = self.value_head(h).squeeze(-1)
        return torch.nn.functional.pad(v[:, :-1], (1, 0))

    def save_pretrained(self, out_dir: str | Path, state_dict: dict | None = None) -> None:
        """Backbone in HF format + fp32 head; ``state_dict`` (of this module) when given."""
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        sd = state_dict if state_dict is not None else self.state_dict()
        bb = {k.removeprefix("backbone."): v for k, v in sd.items() if k.startswith("backbone.")}
        head = {
            k: v.detach().float().cpu().contiguous()
            for k, v in sd.items()
            if k.startswith("value_head.")
        }
        self.backbone.save_pretrained(out, state_dict=bb)
        save_file(head, str(out / HEAD_FILE))
        (out / META_FILE).write_text(
            json.dumps({"kind": "value_model", "hidden_size": self.config.hidden_size}, indent=1)
        )
