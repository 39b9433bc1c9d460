"""The reference inference server: any local Hugging Face checkpoint behind the wire protocol
of :mod:`cuda_agent.agent.server_policy`, with transformers on the CPU (or a GPU), standard
library HTTP, loopback by default. For tests and for machines without vLLM / SGLang, which
replace it on GPU machines (same requests, same answers, much faster).

    python -m cuda_agent.agent.serve --model smollm2 --port 8000
    python -m cuda_agent.agent.serve --model runs/ppo/final --port 0   # a free port, printed

Endpoints (the subset of vLLM's and SGLang's servers that the toolkit uses):

- ``POST /v1/completions``: token-id prompts only (a list of ints, or a list of lists);
  ``max_tokens``, ``temperature`` (0: greedy), ``top_p``, ``seed``, ``stop_token_ids``,
  ``ignore_eos``, ``logprobs`` (k: the sampled token's log-prob and the top k in
  ``top_logprobs``), ``return_tokens_as_token_ids`` (tokens as ``"token_id:N"``),
  ``return_token_ids`` (``token_ids`` / ``prompt_token_ids`` in each choice),
  ``skip_special_tokens`` (for ``text``). Fields it cannot honour (``n`` > 1, ``stream``,
  ``echo``, ``stop`` strings, ``top_k``, penalties, ``min_tokens``) are a 400, other unknown
  fields are ignored (as vLLM does). Requests that arrive together are generated in one batch
  (left padding, a KV cache, per-row sampling settings and seeds).
- ``POST /v1/chat/completions``: the OpenAI-compatible chat subset vLLM serves, through the
  same generation path: ``messages`` (system / user / assistant; string content or a list of
  text parts) rendered by the tokenizer's chat template with the generation prompt;
  ``max_tokens`` / ``max_completion_tokens`` (default: up to the context limit, as vLLM),
  ``temperature``, ``top_p``, ``seed``, ``stop_token_ids``, ``ignore_eos``, ``logprobs`` /
  ``top_logprobs`` (``choices[0].logprobs.content[i].{token, logprob, bytes, top_logprobs}``);
  the reply is ``choices[0].message = {"role": "assistant", "content": ...}`` with
  ``finish_reason`` ``stop`` / ``length`` and ``usage``. ``stream`` is accepted but not
  incremental: the reply is generated whole, then sent as ``chat.completion.chunk`` events
  (role, content, finish, usage with ``stream_options.include_usage``, ``[DONE]``), which is
  what streaming clients such as verifiers' harnesses need. ``tools`` / ``functions`` /
  ``tool_choice`` other than ``none`` / ``auto``, tool messages, non-text parts, ``n`` > 1,
  ``stop`` strings, ``response_format`` other than text, ``top_k``, penalties and
  ``min_tokens`` are a 400.
- ``POST /update_weights_from_disk`` ``{"model_path": DIR}`` (SGLang's): load ``DIR`` and serve
  it from the next batch on; ``{"success", "message", "num_paused_requests"}``, 400 on failure.
- ``GET /get_model_info`` (SGLang's): ``model_path`` (the directory served now),
  ``weight_version``, ``reloads`` (how many reloads succeeded).
- ``GET /v1/models``, ``GET /health`` (200 once the model is loaded: the port opens after).

Sampling: each prompt draws from its own ``torch.Generator``; a seeded request seeds every one of
its prompts with its ``seed`` (as vLLM does), so it reproduces exactly; log-probs are of the distribution
sampled from (logits / temperature, then top-p renormalised; raw logits when greedy), in fp32.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import queue
import secrets
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec

MAX_BODY = 64 * 2**20
SAMPLING_EPS = 1e-5  # vLLM: a temperature below this is greedy
READY = "cuda-agent serve: ready on "


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` with ``message``."""

    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError"):
        super().__init__(message)
        self.status = status
        self.kind = kind


class _Sampling(msgspec.Struct, kw_only=True):
    """The sampling fields vLLM's completion and chat requests share (the ones read here)."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stream: bool | None = False
    echo: bool | None = False
    min_tokens: int = 0
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None


class CompletionRequest(_Sampling, kw_only=True):
    """The fields of vLLM's ``CompletionRequest`` this server reads (others are ignored)."""

    prompt: Any = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    n: int = 1


class ChatRequest(_Sampling, kw_only=True):
    """The fields of vLLM's ``ChatCompletionRequest`` this server reads (others are ignored)."""

    messages: Any = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    n: int | None = 1
    stream_options: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    continue_final_message: bool = False


class ReloadRequest(msgspec.Struct, kw_only=True):
    """SGLang's ``UpdateWeightFromDiskReqInput`` (the fields read here)."""

    model_path: str
    weight_version: str | None = None


@dataclass
class _Row:
    """One prompt's generation state."""

    prompt: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    stop_ids: frozenset[int]
    eos_ids: frozenset[int]
    n_top: int
    gen: Any
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: str = "length"
    stop_reason: int | None = None
    done: bool = False


@dataclass
class _Job:
    rows: list[_Row]
    event: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


def _pick(row: _Row, logits: Any) -> None:
    """Sample (or take the argmax of) one token for ``row`` from its fp32 ``logits`` [V]."""
    import torch

    logits = logits.float().cpu()
    if row.temperature < SAMPLING_EPS:
        logp = torch.log_softmax(logits, dim=-1)
        tok = int(torch.argmax(logits))
    else:
        scaled = logits / row.temperature
        if row.top_p < 1.0:
            probs = torch.softmax(scaled, dim=-1)
            sp, si = torch.sort(probs, descending=True)
            drop = (torch.cumsum(sp, dim=-1) - sp) > row.top_p  # keeps at least the first
            scaled = scaled.clone()
            scaled[si[drop]] = float("-inf")
        logp = torch.log_softmax(scaled, dim=-1)
        tok = int(torch.multinomial(logp.exp(), 1, generator=row.gen))
    row.ids.append(tok)
    row.logprobs.append(float(logp[tok]))
    if row.n_top > 0:
        v, i = torch.topk(logp, min(row.n_top, logp.numel()))
        row.top.append([(int(a), float(b)) for a, b in zip(i, v, strict=True)])
    else:
        row.top.append([])
    if tok in row.stop_ids:
        row.finish, row.stop_reason, row.done = "stop", tok, True
    elif tok in row.eos_ids:
        row.finish, row.done = "stop", True
    elif len(row.ids) >= row.max_tokens:
        row.done = True


class ModelHost:
    """The served model: loading, reloading and batched generation (one batch at a time)."""

    def __init__(
        self, spec: str, *, name: str | None, device: str, dtype: str, max_model_len: int | None
    ):
        import torch

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        if dtype == "auto":
            dtype = "float32" if device == "cpu" else "bfloat16"
        self.dtype = getattr(torch, dtype)
        self.name = name or spec
        self._max_len_opt = max_model_len
        self.lock = threading.Lock()
        self.reloads = 0
        self.weight_version: str | None = None
        self.model, self.tok, self.path = self._load(spec, None)
        self.max_model_len = self._max_len(self.model)

    def _max_len(self, model: Any) -> int:
        cfg_len = getattr(model.config, "max_position_embeddings", None) or 2048
        return min(self._max_len_opt or cfg_len, cfg_len)

    def _load(self, spec: str, old_tok: Any) -> tuple[Any, Any, Path]:
        from .models import load_causal_lm, load_tokenizer, resolve_model

        path = resolve_model(spec)
        model = load_causal_lm(path, device=self.device, dtype=self.dtype).eval()
        tok = load_tokenizer(path, required=old_tok is None) or old_tok
        return model, tok, path

    def reload(self, spec: str, weight_version: str | None) -> str:
        """Load ``spec`` and serve it from the next batch on (the running batch finishes on the
        old weights). Raises on a directory that does not load."""
        model, tok, path = self._load(spec, self.tok)
        with self.lock:
            self.model, self.tok, self.path = model, tok, path
            self.max_model_len = self._max_len(model)
            self.reloads += 1
            self.weight_version = weight_version
        return f"loaded {path}"

    def eos_ids(self) -> frozenset[int]:
        ids = set()
        if self.tok.eos_token_id is not None:
            ids.add(int(self.tok.eos_token_id))
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, list | tuple):
            ids.update(int(x) for x in gen_eos)
        return frozenset(ids)

    def vocab_size(self) -> int:
        return int(self.model.get_input_embeddings().weight.shape[0])

    def generate(self, rows: list[_Row]) -> None:
        """Fill every row (left-padded batch, KV cache; per-row sampling)."""
        import torch

        with self.lock, torch.no_grad():
            model = self.model
            dev = next(model.parameters()).device
            pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
            width = max(len(r.prompt) for r in rows)
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, r in enumerate(rows):
                ids[i, width - len(r.prompt) :] = torch.tensor(r.prompt, dtype=torch.long)
                mask[i, width - len(r.prompt) :] = 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            params = inspect.signature(model.forward).parameters
            cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers >= 5.2x
            extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
            out = model(
                input_ids=ids.to(dev),
                attention_mask=mask.to(dev),
                position_ids=pos.to(dev),
                use_cache=True,
                **extra,
            )
            past, logits = getattr(out, cache_kw), out.logits[:, -1, :]
            nxt_pos = pos[:, -1] + 1
            while True:
                nxt = torch.full((len(rows),), pad, dtype=torch.long)
                for i, r in enumerate(rows):
                    if not r.done:
                        _pick(r, logits[i])
                        nxt[i] = r.ids[-1]
                if all(r.done for r in rows):
                    return
                mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], dim=1)
                out = model(
                    input_ids=nxt[:, None].to(dev),
                    attention_mask=mask.to(dev),
                    position_ids=nxt_pos[:, None].to(dev),
                    use_cache=True,
                    **{cache_kw: past},
                    **extra,
                )
                past, logits = getattr(out, cache_kw), out.logits[:, -1, :]
                nxt_pos = nxt_pos + 1


class Batcher:
    """Collects the rows of requests that arrive together into one generation batch."""

    def __init__(self, host: ModelHost, max_batch: int = 64):
        self.host = host
        self.max_batch = max_batch
        self.q: queue.Queue[_Job] = queue.Queue()
        threading.Thread(target=self._loop, name="serve-batcher", daemon=True).start()

    def run(self, rows: list[_Row]) -> None:
        job = _Job(rows)
        self.q.put(job)
        job.event.wait()
        if job.error is not None:
            raise job.error

    def _loop(self) -> None:
        while True:
            jobs = [self.q.get()]
            n = len(jobs[0].rows)
            while n < self.max_batch:
                try:
                    j = self.q.get_nowait()
                except queue.Empty:
                    break
                jobs.append(j)
                n += len(j.rows)
            try:
                self.host.generate([r for j in jobs for r in j.rows])
            except BaseException as e:  # noqa: BLE001 - reported to every waiting request
                for j in jobs:
                    j.error = e
            for j in jobs:
                j.event.set()


def _prompts(prompt: Any, vocab: int) -> list[list[int]]:
    def ids(p: Any) -> list[int]:
        if not isinstance(p, list) or not p or not all(type(t) is int for t in p):
            raise RequestError("prompt must be a non-empty list of token ids or a list of them")
        for t in p:
            if not 0 <= t < vocab:
                raise RequestError(f"Token id {t} is out of vocabulary (size {vocab})")
        return p

    if isinstance(prompt, str) or (
        isinstance(prompt, list) and prompt and isinstance(prompt[0], str)
    ):
        raise RequestError("this server takes token-id prompts only (a list of ints)")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        return [ids(p) for p in prompt]
    return [ids(prompt)]


def _sampling_unsupported(req: _Sampling) -> list[tuple[bool, str]]:
    """The sampling settings neither endpoint honours, as (asked for, name) pairs."""
    return [
        (bool(req.stop), "stop strings (use stop_token_ids)"),
        (bool(req.echo), "echo"),
        (req.top_k not in (None, 0, -1), "top_k"),
        (req.min_tokens != 0, "min_tokens"),
        (req.presence_penalty not in (None, 0.0), "presence_penalty"),
        (req.frequency_penalty not in (None, 0.0), "frequency_penalty"),
        (req.repetition_penalty not in (None, 1.0), "repetition_penalty"),
    ]


def _refused(checks: list[tuple[bool, str]]) -> str | None:
    bad = [name for cond, name in checks if cond]
    return ", ".join(bad) if bad else None


def _unsupported(req: CompletionRequest) -> str | None:
    return _refused(
        [(req.n != 1, "n > 1"), (bool(req.stream), "stream"), *_sampling_unsupported(req)]
    )


def _generate(
    host: ModelHost,
    batcher: Batcher,
    prompts: list[list[int]],
    *,
    max_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    seed: int | None,
    n_top: int | None,
    stop_token_ids: list[int] | None,
    ignore_eos: bool,
) -> list[_Row]:
    """Generate for ``prompts`` (token ids) with one request's sampling settings: the one
    decoding / sampling path of ``/v1/completions`` and ``/v1/chat/completions``.
    ``max_tokens`` None: up to the context limit (vLLM's chat default). Raises
    :class:`RequestError` for invalid settings or an over-long prompt."""
    import torch

    temperature = 1.0 if temperature is None else temperature
    top_p = 1.0 if top_p is None else top_p
    if (max_tokens is not None and max_tokens < 1) or temperature < 0 or not 0 < top_p <= 1:
        raise RequestError("max_tokens >= 1, temperature >= 0 and 0 < top_p <= 1 are required")
    if n_top is not None and n_top < 0:
        raise RequestError("logprobs must be >= 0")
    rows = []
    eos = frozenset() if ignore_eos else host.eos_ids()
    stop = frozenset(stop_token_ids or ())
    for p in prompts:
        if len(p) >= host.max_model_len:
            raise RequestError(
                f"This model's maximum context length is {host.max_model_len} tokens; "
                f"the prompt has {len(p)}"
            )
        # seeded: every prompt from the request's seed (vLLM's semantics); else its own stream
        s = seed if seed is not None else secrets.randbits(63)
        gen = torch.Generator().manual_seed(s & (2**63 - 1))
        room = host.max_model_len - len(p)
        rows.append(
            _Row(
                prompt=p,
                max_tokens=room if max_tokens is None else min(max_tokens, room),
                temperature=temperature,
                top_p=top_p,
                stop_ids=stop,
                eos_ids=eos,
                n_top=n_top or 0,
                gen=gen,
            )
        )
    batcher.run(rows)
    return rows


def complete(host: ModelHost, batcher: Batcher, body: bytes) -> dict[str, Any]:
    """The answer to one ``/v1/completions`` body (raises :class:`RequestError`)."""
    try:
        req = msgspec.json.decode(body, type=CompletionRequest)
    except msgspec.DecodeError as e:
        raise RequestError(f"invalid request: {e}") from None
    if req.model is not None and req.model != host.name:
        raise RequestError(f"The model `{req.model}` does not exist.", 404, "NotFoundError")
    bad = _unsupported(req)
    if bad:
        raise RequestError(f"not supported by the reference server: {bad}")
    prompts = _prompts(req.prompt, host.vocab_size())
    rows = _generate(
        host,
        batcher,
        prompts,
        max_tokens=16 if req.max_tokens is None else req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        n_top=req.logprobs,
        stop_token_ids=req.stop_token_ids,
        ignore_eos=req.ignore_eos,
    )
    tok = host.tok

    def name(t: int) -> str:
        return f"token_id:{t}" if req.return_tokens_as_token_ids else tok.decode([t])

    choices = []
    for i, r in enumerate(rows):
        logprobs = None
        if req.logprobs is not None:
            tokens = [name(t) for t in r.ids]
            offsets, at = [], 0
            for s in tokens:
                offsets.append(at)
                at += len(s)
            top = []
            for t, lp, alts in zip(r.ids, r.logprobs, r.top, strict=True):
                d = {name(t): max(lp, -9999.0)}
                for a, v in alts:
                    d.setdefault(name(a), max(v, -9999.0))
                top.append(d)
            logprobs = {
                "text_offset": offsets,
                "token_logprobs": [max(v, -9999.0) for v in r.logprobs],
                "tokens": tokens,
                "top_logprobs": top,
            }
        choice: dict[str, Any] = {
            "index": i,
            "text": tok.decode(r.ids, skip_special_tokens=req.skip_special_tokens),
            "logprobs": logprobs,
            "finish_reason": r.finish,
            "stop_reason": r.stop_reason,
        }
        if req.return_token_ids:
            choice["token_ids"] = r.ids
            choice["prompt_token_ids"] = r.prompt
        choices.append(choice)
    n_prompt = sum(len(r.prompt) for r in rows)
    n_gen = sum(len(r.ids) for r in rows)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": host.name,
        "choices": choices,
        "usage": {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_gen,
            "total_tokens": n_prompt + n_gen,
        },
    }


CHAT_ROLES = ("system", "user", "assistant")


def _chat_unsupported(req: ChatRequest) -> str | None:
    fmt = (req.response_format or {}).get("type", "text")
    return _refused(
        [
            (bool(req.tools), "tools / function calling"),
            (bool(req.functions), "functions / function calling"),
            (req.tool_choice not in (None, "none", "auto"), "tool_choice"),
            (req.n not in (None, 1), "n > 1"),
            (fmt != "text", f"response_format {fmt}"),
            (req.continue_final_message, "continue_final_message"),
            *_sampling_unsupported(req),
        ]
    )


def _chat_messages(messages: Any) -> list[dict[str, str]]:
    """``messages`` as ``{"role", "content"}`` with string content (text parts joined)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise RequestError(
                f"messages[{i}]: role {role!r} is not supported by the reference server "
                f"(only {', '.join(CHAT_ROLES)}; no tool messages)"
            )
        if m.get("tool_calls") or m.get("function_call"):
            raise RequestError(
                f"messages[{i}]: tool calls are not supported by the reference server"
            )
        content = m.get("content")
        if content is None and m["role"] == "assistant":
            content = ""
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise RequestError(
                        f"messages[{i}]: content part {kind!r} is not supported by the "
                        "reference server (text parts only)"
                    )
                parts.append(str(part.get("text", "")))
            content = "".join(parts)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}]: content must be a string or a list of text parts")
        out.append({"role": m["role"], "content": content})
    return out


def chat_prompt(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of ``messages`` rendered by the tokenizer's chat template with the
    generation prompt (no extra special tokens: the template has them, as vLLM does)."""
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def chat_complete(host: ModelHost, batcher: Batcher, body: bytes) -> dict[str, Any]:
    """The answer to one ``/v1/chat/completions`` body (raises :class:`RequestError`); a
    ``stream`` request gets the same answer, sent by the handler as server-sent events."""
    try:
        req = msgspec.json.decode(body, type=ChatRequest)
    except msgspec.DecodeError as e:
        raise RequestError(f"invalid request: {e}") from None
    if req.model is not None and req.model != host.name:
        raise RequestError(f"The model `{req.model}` does not exist.", 404, "NotFoundError")
    bad = _chat_unsupported(req)
    if bad:
        raise RequestError(f"not supported by the reference server: {bad}")
    if req.top_logprobs is not None and (not req.logprobs or not 0 <= req.top_logprobs <= 20):
        raise RequestError("top_logprobs needs logprobs true and must be in 0..20")
    tok = host.tok
    if getattr(tok, "chat_template", None) is None:
        raise RequestError("the served tokenizer has no chat template")
    prompt = chat_prompt(tok, _chat_messages(req.messages))
    (row,) = _generate(
        host,
        batcher,
        [prompt],
        max_tokens=req.max_completion_tokens if req.max_tokens is None else req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        n_top=(req.top_logprobs or 0) if req.logprobs else None,
        stop_token_ids=req.stop_token_ids,
        ignore_eos=req.ignore_eos,
    )

    def entry(t: int, lp: float) -> dict[str, Any]:
        s = tok.decode([t])
        return {"token": s, "logprob": max(lp, -9999.0), "bytes": list(s.encode())}

    logprobs = None
    if req.logprobs:
        content = []
        for t, lp, alts in zip(row.ids, row.logprobs, row.top, strict=True):
            d = entry(t, lp)
            d["top_logprobs"] = [entry(a, v) for a, v in alts]
            content.append(d)
        logprobs = {"content": content}
    text = tok.decode(row.ids, skip_special_tokens=req.skip_special_tokens)
    n_prompt, n_gen = len(row.prompt), len(row.ids)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": host.name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": logprobs,
                "finish_reason": row.finish,
                "stop_reason": row.stop_reason,
            }
        ],
        "usage": {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_gen,
            "total_tokens": n_prompt + n_gen,
        },
        **({"stream": True, "include_usage": _include_usage(req)} if req.stream else {}),
    }


def _include_usage(req: ChatRequest) -> bool:
    return bool((req.stream_options or {}).get("include_usage"))


def chat_events(answer: dict[str, Any]) -> bytes:
    """A finished chat answer as OpenAI's ``chat.completion.chunk`` server-sent events: the
    role, the whole content in one delta, the finish reason, the usage when asked, ``[DONE]``
    (generated whole, then sent: no token-by-token streaming)."""
    head = {k: answer[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    (c,) = answer["choices"]

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**head, "choices": [choice | extra]}

    events = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": c["message"]["content"]}, logprobs=c["logprobs"]),
        chunk({}, c["finish_reason"], stop_reason=c["stop_reason"]),
    ]
    if answer.get("include_usage"):
        events.append({**head, "choices": [], "usage": answer["usage"]})
    data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return data + b"data: [DONE]\n\n"


def make_server(
    host: ModelHost, bind: str = "127.0.0.1", port: int = 0, *, verbose: bool = False
) -> ThreadingHTTPServer:
    """An HTTP server for ``host`` bound to ``bind:port`` (0: a free port), not yet serving."""
    batcher = Batcher(host)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, obj: Any = None, *, raw: bytes | None = None) -> None:
            data = raw if raw is not None else b"" if obj is None else json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/event-stream" if raw else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, kind: str) -> None:
            err = {"message": message, "type": kind, "param": None, "code": status}
            self._send(status, {"error": err})

        def _body(self) -> bytes:
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_BODY:
                raise RequestError(f"request body over {MAX_BODY} bytes", 413)
            return self.rfile.read(n)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                self._send(200)
            elif self.path == "/v1/models":
                card = {
                    "id": host.name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "cuda-agent",
                    "root": str(host.path),
                    "max_model_len": host.max_model_len,
                }
                self._send(200, {"object": "list", "data": [card]})
            elif self.path == "/get_model_info":
                self._send(
                    200,
                    {
                        "model_path": str(host.path),
                        "tokenizer_path": str(host.path),
                        "is_generation": True,
                        "weight_version": host.weight_version,
                        "reloads": host.reloads,
                    },
                )
            else:
                self._error(404, f"no route GET {self.path}", "NotFoundError")

        def do_POST(self) -> None:  # noqa: N802
            try:
                body = self._body()
                if self.path == "/v1/completions":
                    self._send(200, complete(host, batcher, body))
                elif self.path == "/v1/chat/completions":
                    answer = chat_complete(host, batcher, body)
                    if answer.pop("stream", False):
                        self._send(200, raw=chat_events(answer))
                    else:
                        self._send(200, answer)
                elif self.path == "/update_weights_from_disk":
                    self._reload(body)
                else:
                    self._error(404, f"no route POST {self.path}", "NotFoundError")
            except RequestError as e:
                self._error(e.status, str(e), e.kind)
            except Exception as e:  # noqa: BLE001 - a bug or a failed generation: a 500, logged
                print(f"cuda-agent serve: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                self._error(500, f"{type(e).__name__}: {e}", "InternalServerError")

        def _reload(self, body: bytes) -> None:
            try:
                req = msgspec.json.decode(body, type=ReloadRequest)
            except msgspec.DecodeError as e:
                raise RequestError(f"invalid request: {e}") from None
            try:
                msg = host.reload(req.model_path, req.weight_version)
            except Exception as e:  # noqa: BLE001 - the client is told why
                content = {"success": False, "message": f"{type(e).__name__}: {e}"}
                self._send(400, {**content, "num_paused_requests": 0})
                return
            self._send(200, {"success": True, "message": msg, "num_paused_requests": 0})

        def log_message(self, fmt: str, *args: Any) -> None:
            if verbose:
                super().log_message(fmt, *args)

    srv = ThreadingHTTPServer((bind, port), Handler)
    srv.daemon_threads = True
    return srv


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m cuda_agent.agent.serve",
        description="Serve a local checkpoint over the completions / weight-reload protocol.",
    )
    ap.add_argument("--model", default="smollm2", help="checkpoint directory, or smollm2")
    ap.add_argument("--served-model-name", default=None, help="name in requests (default --model)")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    ap.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    ap.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    ap.add_argument("--max-model-len", type=int, default=None, help="context limit in tokens")
    ap.add_argument("--verbose", action="store_true", help="log every request")
    a = ap.parse_args(argv)
    from .models import ModelSpecError

    try:
        host = ModelHost(
            a.model,
            name=a.served_model_name,
            device=a.device,
            dtype=a.dtype,
            max_model_len=a.max_model_len,
        )
    except (ModelSpecError, OSError) as e:
        print(f"cuda-agent serve: --model {a.model}: {e}", file=sys.stderr)
        return 2
    srv = make_server(host, a.host, a.port, verbose=a.verbose)
    bind, port = srv.server_address[:2]
    print(
        f"{READY}http://{bind}:{port} (model {host.name}: {host.path}, {host.device})",
        file=sys.stderr,
        flush=True,
    )
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


@dataclass
class ServerProcess:
    """A reference server running in a subprocess (:func:`launch`)."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def launch(
    model: str | os.PathLike[str],
    *,
    log: str | os.PathLike[str],
    served_model_name: str | None = None,
    device: str = "cpu",
    startup_timeout: float = 900.0,
    extra: list[str] | None = None,
) -> Iterator[ServerProcess]:
    """Start ``python -m cuda_agent.agent.serve`` on a free loopback port, wait until it is
    ready (its log, ``log``, says where), yield it, and stop it. Raises ``RuntimeError`` with the
    end of the log if it exits or is not ready within ``startup_timeout`` seconds."""
    logp = Path(log)
    cmd = [sys.executable, "-m", "cuda_agent.agent.serve", "--model", str(model), "--port", "0"]
    cmd += [
        "--device",
        device,
        *(["--served-model-name", served_model_name] if served_model_name else []),
        *(extra or []),
    ]
    with open(logp, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + startup_timeout
        url = None
        while url is None:
            text = logp.read_text(errors="replace")
            for line in text.splitlines():
                if line.startswith(READY):
                    url = line[len(READY) :].split()[0]
            if url is None:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"reference server did not start: {text[-3000:]}")
                time.sleep(0.1)
        yield ServerProcess(proc, url, logp)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    raise SystemExit(main())
