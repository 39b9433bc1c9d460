"""LLM-written compositions (the paper's way) through an OpenAI-compatible chat endpoint.

The programmatic composer chooses the seeds and a shape-consistent draft; the model is asked to
write the fused module itself. Its answer is validated exactly like a programmatic one (contract,
a meta-device run of ``Model(*get_init_inputs())(*get_inputs())`` returning a tensor); a failed
answer is retried, then the programmatic draft is used and the error recorded.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from dataclasses import dataclass
from typing import Any

PROMPT = """Write one PyTorch module in KernelBench format that applies these operators in order,
as a single fused task: {ops}.

Rules: define `class Model(nn.Module)` with `__init__` and `forward`, module-level size
constants, `get_inputs()` and `get_init_inputs()`; use only torch, torch.nn and
torch.nn.functional; no randomness in forward (no dropout, no randn_like); realistic sizes.
A shape-consistent draft you may improve on:

```python
{draft}
```

Answer with the complete module in one ```python block and nothing else."""

_BLOCK = re.compile(r"```(?:python)?\n(.*?)```", re.S)


@dataclass
class LLMConfig:
    url: str  # base URL (…/v1) or the full …/chat/completions endpoint
    model: str = "default"
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.7
    timeout_s: float = 120.0
    retries: int = 2


def _endpoint(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def chat(cfg: LLMConfig, prompt: str) -> str:
    """One chat completion; the assistant message's text (raises on HTTP/format errors)."""
    body = json.dumps(
        {
            "model": cfg.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": cfg.temperature,
        }
    ).encode()
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(cfg.api_key_env)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(_endpoint(cfg.url), data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=cfg.timeout_s) as resp:  # noqa: S310 - user's URL
        data = json.loads(resp.read())
    return data["choices"][0]["message"]["content"]


def extract_code(text: str) -> str:
    """The (last) fenced python block of a reply, or the reply itself."""
    blocks = _BLOCK.findall(text)
    return (blocks[-1] if blocks else text).strip() + "\n"


def validate(source: str) -> list[int]:
    """Output shape of one meta-device forward; raises ``ValueError`` naming what is wrong."""
    import torch

    from cuda_agent.profiler.program import Program, ProgramError

    try:
        prog = Program.from_source(source, name="opsynth_llm_probe")
        model = prog.make_model(device="meta")
        with torch.no_grad():
            out = model(*prog.make_inputs(device="meta"))
    except ProgramError as e:
        raise ValueError(f"contract: {e}") from None
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"does not run: {type(e).__name__}: {e}") from None
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"forward returned {type(out).__name__}, not a tensor")
    return list(out.shape)


def llm_compose(cfg: LLMConfig, ops: list[str], draft: str) -> tuple[str | None, dict[str, Any]]:
    """``(validated source or None, info)``; info has attempts and the last error."""
    info: dict[str, Any] = {"attempts": 0}
    prompt = PROMPT.format(ops=", ".join(ops), draft=draft.strip())
    for _ in range(cfg.retries + 1):
        info["attempts"] += 1
        try:
            code = extract_code(chat(cfg, prompt))
            info["output_shape"] = validate(code)
            return code, info
        except Exception as e:  # noqa: BLE001 - recorded; the caller falls back
            info["error"] = f"{type(e).__name__}: {e}"[:500]
    return None, info
