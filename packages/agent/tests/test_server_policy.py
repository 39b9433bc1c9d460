"""The server rollout engine against a real HTTP server serving a real model: the reference
server (``cuda_agent.agent.serve``) in a subprocess on a loopback port, with the embedded
SmolLM2-135M-Instruct and with a tiny random Llama, compared with the same models in process."""

import socket
import subprocess
import sys
import time

import pytest
import torch

from cuda_agent.agent.models import load_causal_lm, load_tokenizer, make_tiny_model
from cuda_agent.agent.policy import HFPolicy
from cuda_agent.agent.serve import launch
from cuda_agent.agent.server_policy import ServerClient, ServerError, ServerPolicy

TOL = 1e-4  # fp32 on both sides: the same model, the same kernels, other batch shapes


def fresh_logprobs(model, prompt, gen, temperature=1.0):
    """Log-probs of ``gen`` after ``prompt`` from one teacher-forced forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(gen)])).logits[0].float()
    logits = logits[len(prompt) - 1 : len(prompt) + len(gen) - 1]
    if temperature > 0:
        logits = logits / temperature
    lp = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(gen)[:, None])
    return lp.squeeze(-1).tolist()


def close(a, b, tol=TOL):
    return (
        len(a) == len(b) and max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0) < tol
    )


def chat(tok, text):
    msgs = [{"role": "user", "content": text}]
    s = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return tok.encode(s, add_special_tokens=False)


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """The reference server with SmolLM2 (loaded once for the module) and the same model here."""
    log = tmp_path_factory.mktemp("smol") / "server.log"
    with launch("smollm2", log=log) as srv:
        tok = load_tokenizer("smollm2")
        model = load_causal_lm("smollm2", dtype=torch.float32).eval()
        yield srv, tok, model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = make_tiny_model(tmp_path_factory.mktemp("tiny-srv") / "model", seed=1)
    with launch(d, log=d.parent / "server.log", served_model_name="tiny") as srv:
        yield srv, load_tokenizer(d), load_causal_lm(d, dtype=torch.float32).eval(), d


PROMPTS = [
    "Write a CUDA kernel that adds two vectors.",
    "What is a warp?",
    "Explain shared memory in one sentence, then say goodbye.",
]


def test_greedy_ids_and_logprobs_match_in_process(smol):
    srv, tok, model = smol
    pol = ServerPolicy(srv.url, tok, temperature=0.0)
    assert pol.model == "smollm2" and pol.name == "server:smollm2"
    hf = HFPolicy(model, tok, temperature=0.0)
    for text in PROMPTS[:2]:
        ctx = chat(tok, text)
        (g,) = pol.generate([ctx], 24)
        (h,) = hf.generate([ctx], 24)
        assert g.token_ids == h.token_ids, (tok.decode(g.token_ids), tok.decode(h.token_ids))
        assert len(g.token_ids) > 5 and g.finish == h.finish
        assert close(g.logprobs, h.logprobs), (g.logprobs, h.logprobs)
        assert close(g.logprobs, fresh_logprobs(model, ctx, g.token_ids, 0.0))


def test_batched_request_equals_single_requests(smol):
    srv, tok, _ = smol
    ctxs = [chat(tok, t) for t in PROMPTS]
    assert len({len(c) for c in ctxs}) == 3  # left padding is exercised
    client = ServerClient(srv.url)
    base = {"max_tokens": 12, "temperature": 0, "logprobs": 0, "return_tokens_as_token_ids": True}
    out = client.completions({**base, "prompt": ctxs})
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert out["usage"]["prompt_tokens"] == sum(len(c) for c in ctxs)
    for ctx, choice in zip(ctxs, out["choices"], strict=True):
        (single,) = client.completions({**base, "prompt": ctx})["choices"]
        assert choice["logprobs"]["tokens"] == single["logprobs"]["tokens"]
        assert all(t.startswith("token_id:") for t in choice["logprobs"]["tokens"])
        assert close(choice["logprobs"]["token_logprobs"], single["logprobs"]["token_logprobs"])
    # the policy sends unseeded contexts as one batched request, in order
    gens = ServerPolicy(srv.url, tok, temperature=0.0).generate(ctxs, 12)
    for g, choice in zip(gens, out["choices"], strict=True):
        assert [f"token_id:{t}" for t in g.token_ids] == choice["logprobs"]["tokens"]


def test_stop_token_ids_end_the_choice_inclusively(smol):
    srv, tok, _ = smol
    ctx = chat(tok, PROMPTS[0])
    client = ServerClient(srv.url)
    base = {"prompt": ctx, "max_tokens": 20, "temperature": 0, "return_token_ids": True}
    free = client.completions(base)["choices"][0]
    ids = free["token_ids"]
    assert free["finish_reason"] == "length" and len(ids) == 20
    j = next(k for k in range(3, len(ids)) if ids[k] not in ids[:k])
    stopped = client.completions({**base, "stop_token_ids": [ids[j]]})["choices"][0]
    assert stopped["token_ids"] == ids[: j + 1]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == ids[j]
    # the policy stops at its end-of-turn ids and reports it
    pol = ServerPolicy(srv.url, tok, temperature=0.0)
    pol.eot = [ids[j]]
    (g,) = pol.generate([ctx], 20)
    assert g.token_ids == ids[: j + 1] and g.finish == "stop"


def test_sampled_logprobs_are_of_the_sampling_distribution(tiny):
    srv, tok, model, _ = tiny
    ctx = tok.encode("__global__ void relu_kernel", add_special_tokens=False)
    client = ServerClient(srv.url)
    for temperature in (1.0, 0.7):
        req = {"prompt": ctx, "max_tokens": 10, "temperature": temperature, "seed": 5}
        req |= {"logprobs": 2, "return_token_ids": True}
        (c,) = client.completions(req)["choices"]
        lp = c["logprobs"]
        assert close(lp["token_logprobs"], fresh_logprobs(model, ctx, c["token_ids"], temperature))
        assert all(len(d) == 3 or len(d) == 2 for d in lp["top_logprobs"])  # sampled + top 2
        assert all(v <= 0 for d in lp["top_logprobs"] for v in d.values())


def test_seeds_reproduce(tiny):
    srv, tok, _, _ = tiny
    ctx = tok.encode("The kernel compiles", add_special_tokens=False)
    client = ServerClient(srv.url)
    req = {"prompt": ctx, "max_tokens": 12, "temperature": 1.0, "return_token_ids": True}
    a = client.completions({**req, "seed": 11})["choices"][0]["token_ids"]
    b = client.completions({**req, "seed": 11})["choices"][0]["token_ids"]
    c = client.completions({**req, "seed": 12})["choices"][0]["token_ids"]
    assert a == b and a != c
    # the policy: equal contexts get different samples, a fresh policy reproduces them
    p1 = ServerPolicy(srv.url, tok, temperature=1.0, seed=3).generate([ctx, ctx], 12, keys=[0, 1])
    p2 = ServerPolicy(srv.url, tok, temperature=1.0, seed=3).generate([ctx, ctx], 12, keys=[0, 1])
    p3 = ServerPolicy(srv.url, tok, temperature=1.0, seed=4).generate([ctx, ctx], 12, keys=[0, 1])
    assert p1[0].token_ids != p1[1].token_ids
    assert [g.token_ids for g in p1] == [g.token_ids for g in p2]
    # the server may batch the two concurrent requests together or not: padding changes the
    # float rounding of the log-probs, not the samples
    assert all(close(g.logprobs, h.logprobs) for g, h in zip(p1, p2, strict=True))
    assert [g.token_ids for g in p1] != [g.token_ids for g in p3]
    # unseeded: one batched request, and its equal prompts still get their own samples
    u = ServerPolicy(srv.url, tok, temperature=1.0).generate([ctx, ctx], 12)
    assert u[0].token_ids != u[1].token_ids


def test_weight_update_from_disk_serves_the_new_checkpoint(tmp_path):
    orig = make_tiny_model(tmp_path / "orig", seed=2)
    tok = load_tokenizer(orig)
    m0 = load_causal_lm(orig, dtype=torch.float32).eval()
    m1 = load_causal_lm(orig, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m1.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    new = tmp_path / "perturbed"
    m1.save_pretrained(new)
    tok.save_pretrained(new)
    ctxs = [tok.encode(s, add_special_tokens=False) for s in ("import torch", "class ModelNew")]
    with launch(orig, log=tmp_path / "server.log") as srv:
        pol = ServerPolicy(srv.url, tok, temperature=0.0)
        before = pol.generate(ctxs, 16)
        for c, b in zip(ctxs, before, strict=True):
            (h,) = HFPolicy(m0, tok, temperature=0.0).generate([c], 16)
            assert b.token_ids == h.token_ids and close(b.logprobs, h.logprobs)
        assert pol.client.model_info()["reloads"] == 0
        assert "loaded" in pol.update_weights(new)
        info = pol.client.model_info()
        assert info["model_path"] == str(new.resolve()) and info["reloads"] == 1
        after = pol.generate(ctxs, 16)
        for c, a in zip(ctxs, after, strict=True):
            (h,) = HFPolicy(m1, tok, temperature=0.0).generate([c], 16)
            assert a.token_ids == h.token_ids and close(a.logprobs, h.logprobs)
            assert close(a.logprobs, fresh_logprobs(m1, c, a.token_ids, 0.0))
        assert [a.logprobs for a in after] != [b.logprobs for b in before]
        # a directory that does not load is a clear error, and the old weights stay
        with pytest.raises(
            ServerError, match="update_weights_from_disk: HTTP 400: .*not a directory"
        ):
            pol.update_weights(tmp_path / "missing")
        assert pol.client.model_info()["model_path"] == str(new.resolve())
        assert [g.token_ids for g in pol.generate(ctxs, 16)] == [a.token_ids for a in after]


def test_server_errors_are_clear_exceptions(tiny):
    srv, tok, _, _ = tiny
    with pytest.raises(ServerError, match="HTTP 404: The model `nope` does not exist") as e:
        ServerPolicy(srv.url, tok, "nope", temperature=0.0).generate([[1, 2, 3]], 4)
    assert e.value.status == 404
    pol = ServerPolicy(srv.url, tok, temperature=0.0)
    assert pol.model == "tiny"  # the first served model when none is named
    with pytest.raises(ServerError, match="HTTP 400: Token id 999999 is out of vocabulary"):
        pol.generate([[1, 999999]], 4)
    with pytest.raises(ServerError, match="token-id prompts only"):
        pol.client.completions({"prompt": "hello", "max_tokens": 2})
    with pytest.raises(ServerError, match="not supported by the reference server: n > 1"):
        pol.client.completions({"prompt": [1, 2], "n": 2})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="no answer after 2 tries"):
        ServerClient(f"http://127.0.0.1:{dead}", retries=1, backoff=0.01).models()
    assert time.monotonic() - t0 < 10


def test_requests_wait_for_a_server_that_is_starting(tmp_path, tiny_model_dir):
    """Connection refused is retried with backoff until the server listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - closed below
    cmd = [sys.executable, "-m", "cuda_agent.agent.serve", "--model", str(tiny_model_dir)]
    proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        with pytest.raises(ServerError, match="no answer after 1 tries.*refused"):
            ServerClient(f"http://127.0.0.1:{port}", retries=0).models()  # not listening yet
        client = ServerClient(f"http://127.0.0.1:{port}/v1", retries=10, backoff=0.2)
        assert client.models() == [str(tiny_model_dir)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_episode_through_the_cli_policy_spec(tiny, tmp_path, dir_env):
    """``server:URL#MODEL@TOKENIZER`` from the agent CLI runs a token-exact episode whose
    policy log-probs are the served model's."""
    from cuda_agent.agent.cli import make_policy
    from cuda_agent.agent.episode import EpisodeConfig, EpisodeRunner
    from cuda_agent.records import Task

    srv, _, model, d = tiny
    pol = make_policy(
        f"server:{srv.url}#tiny@{d}", device="cpu", temperature=1.0, seed=0, max_new_tokens=8
    )
    assert isinstance(pol, ServerPolicy) and pol.model == "tiny" and pol.seed == 0
    task = Task.make("Identity", "class Model: pass\n")
    cfg = EpisodeConfig(evaluate=False, max_turns=2, max_new_tokens=8, mode="single-turn")
    (t,) = EpisodeRunner(pol, dir_env, cfg, tmp_path / "ws").run([(task, 0)])
    assert t.meta["token_exact"] and t.meta["policy"] == "server:tiny"
    pos = [i for i, m in enumerate(t.loss_mask) if m]
    assert 0 < len(pos) <= 8
    first, n = pos[0], len(pos)
    want = fresh_logprobs(model, t.token_ids[:first], t.token_ids[first : first + n])
    assert close([t.logprobs[i] for i in pos], want)
    with pytest.raises(ValueError, match="no local tokenizer"):
        make_policy(f"server:{srv.url}#tiny", device="cpu", temperature=1, seed=0, max_new_tokens=8)


def chat_post(srv, payload):
    return ServerClient(srv.url, retries=0).request("POST", "/v1/chat/completions", payload)


def test_chat_greedy_equals_in_process_generation(smol):
    """``/v1/chat/completions``: the chat template with the generation prompt, then the same
    greedy decoding as in process; per-token log-probs in OpenAI's chat format."""
    srv, tok, model = smol
    hf = HFPolicy(model, tok, temperature=0.0)
    cases = [
        [{"role": "user", "content": PROMPTS[0]}],
        [
            {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is "},
                    {"type": "text", "text": "a warp?"},
                ],
            },
        ],
    ]
    for msgs in cases:
        flat = [
            {
                "role": m["role"],
                "content": m["content"]
                if isinstance(m["content"], str)
                else "".join(p["text"] for p in m["content"]),
            }
            for m in msgs
        ]
        s = tok.apply_chat_template(flat, tokenize=False, add_generation_prompt=True)
        ctx = tok.encode(s, add_special_tokens=False)
        (h,) = hf.generate([ctx], 24)
        out = chat_post(
            srv,
            {
                "model": "smollm2",
                "messages": msgs,
                "max_tokens": 24,
                "temperature": 0,
                "logprobs": True,
                "top_logprobs": 2,
            },
        )
        assert out["object"] == "chat.completion" and out["model"] == "smollm2"
        (c,) = out["choices"]
        assert c["message"]["role"] == "assistant"
        assert c["message"]["content"] == tok.decode(h.token_ids, skip_special_tokens=True)
        assert len(h.token_ids) > 5 and c["finish_reason"] == h.finish
        assert out["usage"] == {
            "prompt_tokens": len(ctx),
            "completion_tokens": len(h.token_ids),
            "total_tokens": len(ctx) + len(h.token_ids),
        }
        content = c["logprobs"]["content"]
        assert [e["token"] for e in content] == [tok.decode([t]) for t in h.token_ids]
        assert close([e["logprob"] for e in content], h.logprobs)
        for e in content:  # the sampled (argmax) token heads its top 2
            assert len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"]
            assert e["bytes"] == list(e["token"].encode())
    # max_completion_tokens is max_tokens; without logprobs there are none
    out = chat_post(srv, {"messages": cases[0], "max_completion_tokens": 4, "temperature": 0})
    (c,) = out["choices"]
    assert c["logprobs"] is None and c["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 4


def test_chat_stream_is_the_whole_reply_as_events(tiny):
    """``stream``: generated whole, sent as ``chat.completion.chunk`` events that the OpenAI
    SDK assembles into the non-streamed reply (what verifiers' harnesses read)."""
    openai = pytest.importorskip("openai")
    srv, _, _, _ = tiny
    msgs = [{"role": "user", "content": "__global__ void relu_kernel"}]
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="EMPTY", max_retries=0)
    whole = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 8
    stream = client.chat.completions.create(
        model="tiny",
        messages=msgs,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8 and not chunks[-1].choices
    # seeded sampling reproduces through the chat endpoint too
    req = {"messages": msgs, "max_tokens": 8, "temperature": 1.0, "seed": 3}
    a, b = chat_post(srv, req), chat_post(srv, req)
    assert a["choices"][0]["message"] == b["choices"][0]["message"]


def test_chat_unsupported_fields_are_clear_400s(tiny):
    srv, _, _, _ = tiny
    msgs = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    cases = [
        ({"tools": [tool]}, "not supported by the reference server: tools / function calling"),
        ({"n": 2}, "not supported by the reference server: n > 1"),
        ({"stop": ["\n"]}, r"not supported by the reference server: stop strings"),
        ({"tool_choice": "required"}, "not supported by the reference server: tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format json_object"),
        ({"top_k": 5, "presence_penalty": 0.5}, "top_k, presence_penalty"),
        ({"top_logprobs": 2}, "top_logprobs needs logprobs true"),
        ({"temperature": -1}, "temperature >= 0"),
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "role 'tool' is not supported"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "content part 'image_url' is not supported",
        ),
    ]
    for extra, match in cases:
        with pytest.raises(ServerError, match=match) as e:
            chat_post(srv, {"messages": msgs, "max_tokens": 2, **extra})
        assert e.value.status == 400
    with pytest.raises(ServerError, match="HTTP 404: The model `nope` does not exist"):
        chat_post(srv, {"model": "nope", "messages": msgs})
    # an empty tools list (what some clients send) and tool_choice none are no tools at all
    out = chat_post(srv, {"messages": msgs, "max_tokens": 2, "tools": [], "tool_choice": "none"})
    assert out["choices"][0]["message"]["role"] == "assistant"
