"""The one model loader (``cuda_agent.agent.models``) on a plain Hugging Face checkpoint directory.

The embedded GGUF default (``smollm2``) goes through the same functions; it is loaded end to end
by ``test_smollm2_episodes.py`` (slow), not a second time here.
"""

import shutil

import pytest

from cuda_agent.agent.models import (
    CHATML_TEMPLATE,
    ModelSpecError,
    load_causal_lm,
    load_tokenizer,
    resolve_model,
)


@pytest.fixture(scope="module")
def plain_ckpt(tmp_path_factory):
    """A 2-layer random Llama saved with ``save_pretrained``: weights and config, no tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    d = tmp_path_factory.mktemp("plain")
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(d)
    return d, model.state_dict()


def test_loads_a_local_checkpoint_directory(plain_ckpt):
    import torch

    d, saved = plain_ckpt
    model = load_causal_lm(str(d), dtype=torch.float32)
    assert model.config.num_hidden_layers == 2 and model.config.use_cache is True
    assert next(model.parameters()).device.type == "cpu"
    got = model.state_dict()
    assert set(got) == set(saved) and all(torch.equal(got[k], saved[k]) for k in saved)
    # the trainers' form: KV cache off, another dtype, moved to a device
    trained = load_causal_lm(d, "cpu", dtype=torch.bfloat16, use_cache=False)
    assert trained.config.use_cache is False
    assert next(trained.parameters()).dtype == torch.bfloat16


def test_tokenizer_is_optional_only_when_asked(plain_ckpt, tiny_model_dir, tmp_path):
    d, _ = plain_ckpt
    assert load_tokenizer(d, required=False) is None
    with pytest.raises((OSError, ValueError)):
        load_tokenizer(d)
    # a tokenizer saved without chat template or pad token gets ChatML and EOS padding
    raw = load_tokenizer(tiny_model_dir)
    raw.chat_template = None
    raw.pad_token = None
    shutil.copytree(d, tmp_path / "m")
    raw.save_pretrained(tmp_path / "m")
    tok = load_tokenizer(tmp_path / "m", required=False)
    assert tok.chat_template == CHATML_TEMPLATE and tok.pad_token == tok.eos_token


def test_specs_that_name_no_model_are_refused(tmp_path):
    with pytest.raises(ModelSpecError, match="not a directory"):
        resolve_model(tmp_path / "missing")
    with pytest.raises(ModelSpecError, match="no config.json"):
        load_causal_lm(tmp_path)
    assert issubclass(ModelSpecError, ValueError)  # what the CLIs catch
