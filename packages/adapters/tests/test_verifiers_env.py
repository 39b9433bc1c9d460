"""The verifiers adapter with real verifiers (>= 0.4, ``verifiers.v1``) objects: the taskset and
environment made by verifiers' own loader, and ``Task.score`` (verifiers' scoring path: it finds
the ``@vf.reward`` method and records its value on the trace) on traces holding known answers,
evaluated by a real strict cpu pool and by a real service; and one real verifiers rollout (its
``null`` harness program, its interception proxy, its eval client) against the reference server's
``/v1/chat/completions`` with a tiny random model, scored by the sandbox."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest

vf = pytest.importorskip(
    "verifiers.v1", reason="verifiers not installed (uv sync --extra verifiers)"
)

from verifiers.v1.trace import TraceTask  # noqa: E402

from cuda_agent.adapters import verifiers as kv  # noqa: E402
from cuda_agent.adapters.common import evaluator_for  # noqa: E402
from cuda_agent.adapters.trl import ServiceEvaluator  # noqa: E402
from cuda_agent.agent.models import make_tiny_model  # noqa: E402
from cuda_agent.agent.serve import launch  # noqa: E402
from cuda_agent.records import RecordWriter  # noqa: E402

from .conftest import TOKEN  # noqa: E402


def trace_for(task, answer: str) -> vf.Trace:
    """A finished single-turn trace of ``task``: its prompt, then ``answer`` as the sampled reply."""
    nodes = [
        vf.MessageNode(message=vf.SystemMessage(content=task.data.system_prompt)),
        vf.MessageNode(parent=0, message=vf.UserMessage(content=task.data.prompt)),
        vf.MessageNode(parent=1, message=vf.AssistantMessage(content=answer), sampled=True),
    ]
    return vf.Trace(
        task=TraceTask(type=type(task).__name__, data=task.data, key=task.key),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        nodes=nodes,
    )


def test_environment_and_rubric_on_a_local_pool(scale_add_task, answers, strict_pool):
    env = kv.load_environment(
        [scale_add_task], backend="cpu", include_skill=False, evaluator=strict_pool
    )
    assert isinstance(env, vf.SingleAgentEnv)
    assert type(env.taskset).__name__ == "KernelTaskset"
    (task,) = list(env.taskset)
    assert isinstance(task, kv.KernelTask)
    assert "scale_add" in task.data.prompt and "model_new.py" in task.data.prompt
    assert task.data.system_prompt
    assert [f.__name__ for f in task.hooks("reward")] == ["kernel_reward"]

    names = ["correct", "wrong", "torch_only", "unparsable"]
    traces = {n: trace_for(task, answers[n]) for n in names}

    async def score_all() -> None:  # the four together, as verifiers scores a group
        await asyncio.gather(*(task.score(t) for t in traces.values()))

    asyncio.run(score_all())
    got = {n: t.rewards["kernel_reward"].score for n, t in traces.items()}
    assert got == {"correct": 1.0, "wrong": -1.0, "torch_only": -1.0, "unparsable": -1.0}
    status = {n: t.info["kernel"]["status"] for n, t in traces.items()}
    assert status == {
        "correct": "ok",
        "wrong": "incorrect",
        "torch_only": "guard_violation",
        "unparsable": "unparsed",
    }
    assert traces["correct"].metrics == {"kernel_evaluated": 1.0, "kernel_ok": 1.0}
    assert traces["unparsable"].metrics == {"kernel_evaluated": 0.0, "kernel_ok": 0.0}
    assert traces["unparsable"].info["kernel"]["result"] is None
    assert traces["correct"].info["kernel"]["result"]["task_id"] == scale_add_task.id


def test_verifiers_loader_over_the_service(
    scale_add_task, relu_task, answers, service_url, tmp_path, monkeypatch
):
    """The taskset named by id and config alone (a tasks file, the service's URL and token
    variable), as ``vf eval`` / prime-rl load it."""
    monkeypatch.setenv("KERNEL_TEST_TOKEN", TOKEN)
    path = tmp_path / "tasks.jsonl"
    with RecordWriter(path) as w:
        w.write(scale_add_task)
        w.write(relu_task)
    cfg = vf.SingleAgentEnvConfig(
        taskset={
            "id": kv.TASKSET_ID,
            "tasks": str(path),
            "task": {
                "backend": "cpu",
                "service_url": service_url,
                "token_env": "KERNEL_TEST_TOKEN",
            },
        },
    )
    env = vf.load_environment(vf.resolve_env_config(cfg.model_dump()))
    tasks = list(env.taskset)
    assert [t.data.name for t in tasks] == ["scale_add", "relu"]
    assert isinstance(tasks[0].evaluator(), ServiceEvaluator)
    assert tasks[0].evaluator() is evaluator_for(
        service_url=service_url, token_env="KERNEL_TEST_TOKEN"
    )
    good, broken = trace_for(tasks[0], answers["correct"]), trace_for(tasks[0], answers["wrong"])

    async def score_both() -> None:
        await asyncio.gather(tasks[0].score(good), tasks[0].score(broken))

    asyncio.run(score_both())
    assert good.rewards["kernel_reward"].score == 1.0
    assert broken.rewards["kernel_reward"].score == -1.0
    assert broken.info["kernel"]["status"] == "incorrect"


def test_rollout_against_the_reference_server_chat_endpoint(
    scale_add_task, strict_pool, tmp_path, monkeypatch
):
    """One real verifiers episode: ``env.serving()`` + ``env.run_slot`` (what ``vf eval`` runs
    per rollout) with verifiers' eval client on the reference server's chat endpoint; the null
    harness (a ``uv run --script`` chat program) streams its request through the interception
    proxy, the tiny random model answers greedily, the sandbox scores it (-1, ``unparsed``)."""
    from verifiers.v1.clients import ModelContext

    monkeypatch.delenv("KERNEL_TEST_NO_KEY", raising=False)  # "EMPTY", as for a local vLLM
    d = make_tiny_model(tmp_path / "tiny", seed=1)
    env = kv.load_environment(
        [scale_add_task], backend="cpu", include_skill=False, evaluator=strict_pool
    )
    with launch(d, log=tmp_path / "server.log", served_model_name="tiny") as srv:
        client = vf.EvalClientConfig(base_url=f"{srv.url}/v1", api_key_var="KERNEL_TEST_NO_KEY")
        sampling = vf.SamplingConfig(max_tokens=16, temperature=0.0)
        ctx = ModelContext(model="tiny", client=client, sampling=sampling)
        (task,) = list(env.taskset)

        async def one_rollout() -> vf.Episode:
            async with env.serving():
                (slot,) = env.slots(task, 1)
                return await env.run_slot(slot, ctx)

        t0 = time.monotonic()
        episode = asyncio.run(one_rollout())
        took = time.monotonic() - t0
        # the same conversation asked of the server directly: the rollout's reply is its reply
        msgs = [
            {"role": "system", "content": task.data.system_prompt},
            {"role": "user", "content": task.data.prompt},
        ]
        body = {"model": "tiny", "messages": msgs, "max_tokens": 16, "temperature": 0}
        req = urllib.request.Request(
            f"{srv.url}/v1/chat/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            direct = json.loads(r.read())["choices"][0]["message"]["content"]
    assert episode.ok and not episode.errors, episode.errors
    assert took < 120
    (trace,) = episode.traces
    assert [n.message.role for n in trace.nodes] == ["system", "user", "assistant"]
    assert trace.nodes[1].message.content == task.data.prompt
    assert kv.trace_text(trace) == direct and direct
    assert 0 < trace.num_output_tokens <= 16
    # scored by the sandbox through the @vf.reward: a random model's text has no file blocks
    assert trace.rewards["kernel_reward"].score == -1.0
    assert trace.info["kernel"]["status"] == "unparsed"
    assert trace.info["kernel"]["result"] is None
    assert trace.metrics == {"kernel_evaluated": 0.0, "kernel_ok": 0.0}
