"""Finding and loading causal LMs for training (no hub access, ever)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def resolve_model_dir(spec: str | os.PathLike[str]) -> Path:
    """A local Hugging Face checkpoint directory for ``spec``.

    ``spec`` is a directory, or a name the agent package knows (``"smollm2"``, the embedded
    default policy). Raises ``ValueError`` with a clear message otherwise.
    """
    try:
        from cuda_agent.agent.models import resolve_model
    except ImportError:  # the agent's model helpers are not there: plain directories only
        resolve_model = None
    if resolve_model is not None:
        return Path(resolve_model(spec))
    p = Path(spec).expanduser()
    if not (p / "config.json").is_file():
        raise ValueError(f"model {str(spec)!r}: not a Hugging Face checkpoint directory")
    return p


def attention_setup() -> None:
    """Process-wide attention settings of every model we load (see
    ``cuda_agent.agent.models.avoid_cudnn_attention``)."""
    try:
        from cuda_agent.agent.models import avoid_cudnn_attention
    except ImportError:
        return
    avoid_cudnn_attention()


def load_causal_lm(spec: str | os.PathLike[str], dtype: Any = None) -> Any:
    """A ``transformers`` causal LM from a local directory, KV cache off (training); attention
    set up by :func:`attention_setup`."""
    from transformers import AutoModelForCausalLM

    attention_setup()

    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_dir(spec), local_files_only=True, dtype=dtype if dtype is not None else "auto"
    )
    model.config.use_cache = False
    return model


def load_tokenizer(spec: str | os.PathLike[str]) -> Any | None:
    """The tokenizer saved with the checkpoint, or ``None`` when it has none."""
    from transformers import AutoTokenizer

    d = resolve_model_dir(spec)
    if not any((d / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    return AutoTokenizer.from_pretrained(d, local_files_only=True)
