"""A policy behind any OpenAI-compatible chat endpoint (a vLLM or SGLang server, a hosted model).

Text in, text out, with native tool calls: the trajectory keeps messages and tool calls but no
token ids (it is for evaluation and data collection, not for PPO). Uses only the standard library.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from .tools import TOOL_SCHEMAS


@dataclass
class ChatReply:
    content: str
    tool_calls: list[dict[str, Any]]  # [{"id", "name", "arguments" (dict) or "error" (str)}]
    finish: str
    usage: dict[str, int]


class OpenAIPolicy:
    """``openai:URL#MODEL``; the API key comes from ``OPENAI_API_KEY`` (optional for local servers)."""

    token_level = False

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        temperature: float = 1.0,
        max_tokens: int = 4096,
        timeout: float = 600.0,
        retries: int = 3,
        api_key: str | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.retries = retries
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.name = f"openai:{model}"
        self.tokenizer = None

    @classmethod
    def from_spec(cls, spec: str, **kw: Any) -> OpenAIPolicy:
        """``URL#MODEL`` (e.g. ``http://localhost:8000/v1#Qwen/Qwen3-8B``)."""
        if "#" not in spec:
            raise ValueError(f"openai policy spec must be URL#MODEL, got {spec!r}")
        url, model = spec.rsplit("#", 1)
        return cls(url, model, **kw)

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(f"{self.base_url}/chat/completions", data, headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:
                body = e.read().decode(errors="replace")[:500]
                if e.code < 500 and e.code != 429:
                    raise RuntimeError(f"{self.base_url}: HTTP {e.code}: {body}") from None
                last = RuntimeError(f"HTTP {e.code}: {body}")
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last = e
            if attempt < self.retries:  # no wait after the last try
                time.sleep(min(2**attempt, 30))
        raise RuntimeError(f"{self.base_url}: no answer after {self.retries + 1} tries: {last}")

    def chat(self, messages: list[dict[str, Any]]) -> ChatReply:
        """One assistant turn for ``messages`` with the agent's tools offered natively."""
        out = self._post(
            {
                "model": self.model,
                "messages": messages,
                "tools": TOOL_SCHEMAS,
                "temperature": self.temperature,
                "max_tokens": self.max_tokens,
            }
        )
        choice = out["choices"][0]
        msg = choice.get("message", {})
        calls = []
        for i, tc in enumerate(msg.get("tool_calls") or []):
            fn = tc.get("function", {})
            entry: dict[str, Any] = {"id": tc.get("id") or f"call_{i}", "name": fn.get("name", "")}
            try:
                args = json.loads(fn.get("arguments") or "{}")
                if not isinstance(args, dict):
                    raise ValueError("arguments must be a JSON object")
                entry["arguments"] = args
            except (json.JSONDecodeError, ValueError) as e:
                entry["error"] = f"arguments of {entry['name']} are not a JSON object: {e}"
            calls.append(entry)
        return ChatReply(
            content=msg.get("content") or "",
            tool_calls=calls,
            finish=choice.get("finish_reason") or "stop",
            usage=out.get("usage") or {},
        )
