"""A token-level policy behind an inference server: token ids in, token ids and per-token
log-probs out, weights reloaded from disk after each PPO update. Standard library only.

Wire protocol (the subset both vLLM's OpenAI-compatible server and the reference server
:mod:`cuda_agent.agent.serve` speak; field names from vLLM's ``CompletionRequest`` /
``CompletionResponse`` in ``vllm/entrypoints/openai/completion/protocol.py``):

``POST /v1/completions`` with ``prompt`` a list of token ids (one prompt) or a list of lists
(a batch), ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop_token_ids``,
``skip_special_tokens``, ``logprobs`` (``1``: the sampled token's log-prob plus the top one),
``return_tokens_as_token_ids: true`` (each entry of ``choices[i].logprobs.tokens`` is
``"token_id:N"``) and ``return_token_ids: true`` (vLLM >= 0.10.2 also puts ``token_ids`` in each
choice). Choices come back in prompt order; ``logprobs.token_logprobs[k]`` is the log-prob of the
k-th generated token. A generated stop token (end of turn) is the last id of its choice.

Weight refresh: SGLang's ``POST /update_weights_from_disk`` with ``{"model_path": DIR}``, answered
``{"success": bool, "message": str, ...}`` (HTTP 400 on failure). SGLang and the reference server
speak it; vLLM's stock server does not (README "Rollout engines").

Log-probs are those of the distribution the token was sampled from (temperature and top-p
applied): the reference server's, and vLLM's with ``--logprobs-mode processed_logprobs`` (vLLM's
default ``raw_logprobs`` ignores the temperature).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .policy import Generation, SamplingPolicy

TOKEN_ID_PREFIX = "token_id:"
RETRY_STATUS = (502, 503, 504)


class ServerError(RuntimeError):
    """A request the server refused or failed (``status``: its HTTP status; 0 when no answer)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


def _error_text(body: bytes) -> str:
    """The message of an error body (vLLM: ``{"error": {"message"}}`` or ``{"message"}``; SGLang:
    ``{"message"}``; FastAPI: ``{"detail"}``), else the body itself, shortened."""
    text = body.decode(errors="replace")
    try:
        obj = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        for k in ("message", "detail", "error"):
            if obj.get(k):
                return str(obj[k])[:500]
    return text[:500]


class ServerClient:
    """HTTP calls to one inference server at ``base_url`` (its root; a trailing ``/v1`` is
    dropped). Connection errors, timeouts and HTTP 502/503/504 are retried ``retries`` times with
    exponential backoff (``backoff`` s, doubled each time, at most 30 s); any other HTTP error
    raises :class:`ServerError` at once with the server's message."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 600.0,
        retries: int = 5,
        backoff: float = 0.5,
        api_key: str | None = None,
    ):
        url = base_url.rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        self.base_url = url
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")

    def request(
        self, method: str, path: str, payload: Any = None, *, timeout: float | None = None
    ) -> Any:
        """The decoded JSON answer (``None`` for an empty body) of ``method path``."""
        url = f"{self.base_url}{path}"
        data = None if payload is None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(url, data, headers, method=method)
            try:
                with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                    body = r.read()
                return json.loads(body) if body.strip() else None
            except urllib.error.HTTPError as e:
                msg = _error_text(e.read())
                if e.code not in RETRY_STATUS:
                    raise ServerError(f"{method} {url}: HTTP {e.code}: {msg}", e.code) from None
                last = f"HTTP {e.code}: {msg}"
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            if attempt < self.retries:
                time.sleep(min(self.backoff * 2**attempt, 30.0))
        raise ServerError(f"{method} {url}: no answer after {self.retries + 1} tries: {last}")

    def models(self) -> list[str]:
        """The served model names (``GET /v1/models``)."""
        out = self.request("GET", "/v1/models")
        return [m["id"] for m in (out or {}).get("data", [])]

    def completions(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/completions`` (non-streaming)."""
        return self.request("POST", "/v1/completions", payload)

    def update_weights_from_disk(self, path: str | os.PathLike[str], **extra: Any) -> str:
        """Ask the server to load the checkpoint directory ``path`` (SGLang's protocol); returns
        its message, raises :class:`ServerError` unless it answered ``success: true``."""
        body = {"model_path": str(Path(path).resolve()), **extra}
        out = self.request(
            "POST", "/update_weights_from_disk", body, timeout=max(self.timeout, 1800)
        )
        if not isinstance(out, dict) or out.get("success") is not True:
            raise ServerError(f"{self.base_url}: weight reload from {path} failed: {out!r}", 200)
        return str(out.get("message", ""))

    def model_info(self) -> dict[str, Any]:
        """``GET /get_model_info`` (SGLang and the reference server): ``model_path`` is the
        checkpoint directory the server serves now."""
        return self.request("GET", "/get_model_info") or {}


def _seed_for(seed: int, call: int, key: Any) -> int:
    """A 63-bit seed for one context of one call, distinct across calls and episode keys."""
    h = hashlib.blake2b(f"{seed}:{call}:{key!r}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") >> 1


class ServerPolicy(SamplingPolicy):
    """``server:URL#MODEL[@TOKENIZER]``: generation by an inference server over the wire
    protocol of the module docstring; the tokenizer (for the chat template) is local.

    Guarantees: one :class:`Generation` per context, in order, whose ``token_ids`` are the
    server's sampled ids (the end-of-turn token included when generated) and ``logprobs`` one
    float per id. Without a ``seed`` (or at temperature 0) contexts go in batched requests
    (``prompt`` a list of lists, ``batch_size`` at most); with a ``seed`` every context is its own
    request (in parallel, ``request_workers``) with a seed derived from (``seed``, call number,
    episode key), so that equal contexts still get different samples and the same calls on a
    fresh policy reproduce them."""

    def __init__(
        self,
        base_url: str,
        tokenizer: Any,
        model: str | None = None,
        *,
        name: str | None = None,
        timeout: float = 600.0,
        retries: int = 5,
        backoff: float = 0.5,
        batch_size: int = 256,
        request_workers: int = 32,
        api_key: str | None = None,
        **kw: Any,
    ):
        self.client = ServerClient(
            base_url, timeout=timeout, retries=retries, backoff=backoff, api_key=api_key
        )
        if model is None:
            served = self.client.models()
            if not served:
                raise ServerError(f"{self.client.base_url}: /v1/models lists no model")
            model = served[0]
        self.model = model
        super().__init__(tokenizer, name=name or f"server:{model}", **kw)
        self.batch_size = batch_size
        self.request_workers = request_workers
        self._calls = 0

    @classmethod
    def from_spec(cls, spec: str, **kw: Any) -> ServerPolicy:
        """``URL#MODEL[@TOKENIZER_DIR]``; the tokenizer is ``TOKENIZER_DIR`` or else ``MODEL``
        (a local checkpoint directory or ``smollm2``); an empty ``MODEL`` is the server's first."""
        from .models import ModelSpecError, load_tokenizer

        url, _, tail = spec.partition("#")
        if not url:
            raise ValueError(f"server policy spec must be URL#MODEL[@TOKENIZER_DIR], got {spec!r}")
        model, _, tok_dir = tail.partition("@")
        source = tok_dir or model
        if not source:
            raise ValueError(f"server policy {spec!r}: name the tokenizer, URL#MODEL@TOKENIZER_DIR")
        try:
            tok = load_tokenizer(source)
        except (ModelSpecError, OSError) as e:
            raise ValueError(
                f"server policy {spec!r}: no local tokenizer at {source!r} ({e}); "
                "give one: server:URL#MODEL@TOKENIZER_DIR"
            ) from None
        return cls(url, tok, model or None, **kw)

    def _payload(self, prompt: Any, max_new_tokens: int, seed: int | None) -> dict[str, Any]:
        p: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "stop_token_ids": list(self.eot),
            "skip_special_tokens": False,
        }
        if seed is not None:
            p["seed"] = seed
        return p

    def _parse(self, choice: dict[str, Any]) -> Generation:
        lp = choice.get("logprobs") or {}
        toks = lp.get("tokens")
        vals = lp.get("token_logprobs")
        ids = choice.get("token_ids")
        if toks is not None:
            bad = [t for t in toks if not str(t).startswith(TOKEN_ID_PREFIX)]
            if bad and ids is None:
                raise ServerError(
                    f"{self.client.base_url}: tokens are not token ids ({bad[0]!r}); the server "
                    "ignored return_tokens_as_token_ids"
                )
            if not bad:
                from_toks = [int(str(t)[len(TOKEN_ID_PREFIX) :]) for t in toks]
                if ids is not None and list(ids) != from_toks:
                    raise ServerError(f"{self.client.base_url}: token_ids and tokens disagree")
                ids = from_toks
        if ids is None:
            raise ServerError(f"{self.client.base_url}: the answer carries no token ids")
        if vals is None or len(vals) != len(ids) or any(v is None for v in vals):
            raise ServerError(
                f"{self.client.base_url}: no log-prob for every generated token "
                f"({0 if vals is None else len(vals)} for {len(ids)} ids)"
            )
        ids = [int(t) for t in ids]
        finish = "stop" if ids and ids[-1] in self.eot else "length"
        return Generation(ids, [float(v) for v in vals], finish)

    def _complete(self, prompts: list[list[int]], max_new_tokens: int, seed: int | None) -> list:
        prompt: Any = prompts[0] if len(prompts) == 1 else prompts
        out = self.client.completions(self._payload(prompt, max_new_tokens, seed))
        choices = sorted(out.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts):
            raise ServerError(
                f"{self.client.base_url}: {len(choices)} choices for {len(prompts)} prompts"
            )
        return [self._parse(c) for c in choices]

    def generate(
        self,
        contexts: Sequence[Sequence[int]],
        max_new_tokens: int,
        keys: Sequence[Any] | None = None,
    ) -> list[Generation]:
        if not contexts:
            return []
        self._calls += 1
        prompts = [[int(t) for t in c] for c in contexts]
        if self.seed is None or self.temperature == 0:
            parts = [
                prompts[i : i + self.batch_size] for i in range(0, len(prompts), self.batch_size)
            ]
            jobs = [(part, None) for part in parts]
        else:
            ks = list(keys) if keys is not None else list(range(len(prompts)))
            jobs = [
                ([p], _seed_for(self.seed, self._calls, k))
                for p, k in zip(prompts, ks, strict=True)
            ]
        if len(jobs) == 1:
            results = [self._complete(jobs[0][0], max_new_tokens, jobs[0][1])]
        else:
            workers = max(1, min(len(jobs), self.request_workers))
            with ThreadPoolExecutor(workers, thread_name_prefix="server-policy") as pool:
                futs = [pool.submit(self._complete, p, max_new_tokens, s) for p, s in jobs]
                results = [f.result() for f in futs]
        return [g for part in results for g in part]

    def update_weights(self, path: str | os.PathLike[str]) -> str:
        """Make the server serve the checkpoint directory ``path`` (a Hugging Face directory the
        server can read) before the next request; returns the server's message."""
        return self.client.update_weights_from_disk(path)
