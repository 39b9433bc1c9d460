"""The TRL reward functions and workspace environments on the real sandbox (cpu backend), through
a local pool and through a real service on loopback; TRL itself is not needed here (see
test_trl_grpo.py for the trainer)."""

from __future__ import annotations

import threading
import time

import pytest

from cuda_agent.adapters.trl import (
    KernelReward,
    ServiceEvaluator,
    WorkspaceEnvFactory,
    completion_text,
    parse_completion,
    task_from_column,
    task_to_column,
    tool_calls_of,
    workspace_of,
)
from cuda_agent.records import load_records
from cuda_agent.records.types import EvalResult
from cuda_agent.reward import RewardConfig, score

from .conftest import TOKEN, fixture_files

pytestmark = pytest.mark.timeout(300)

FAILURE = score(None, RewardConfig()).value  # the reward package's failure reward (-1)


class CountingPool:
    """The real pool, its submissions counted (to show what was evaluated and what was not)."""

    def __init__(self, pool):
        self.pool = pool
        self.backend = pool.backend
        self.submitted = []
        self._lock = threading.Lock()

    def submit(self, candidate):
        with self._lock:
            self.submitted.append(candidate)
        return self.pool.submit(candidate)


def _check_verdicts(scored, rewards, answers_order):
    by = dict(zip(answers_order, scored, strict=True))
    assert by["correct"].status == "ok" and by["correct"].reward == 1.0, by["correct"].reason
    assert by["wrong"].status == "incorrect" and by["wrong"].reward == FAILURE
    assert by["torch_only"].status == "guard_violation" and by["torch_only"].reward == FAILURE
    assert by["unparsable"].status == "unparsed" and by["unparsable"].result is None
    assert by["unparsable"].reward == FAILURE
    assert rewards == [s.reward for s in scored]
    assert all(isinstance(r, float) for r in rewards)


ORDER = ["correct", "wrong", "torch_only", "unparsable"]


def test_task_column_round_trip(scale_add_task):
    col = task_to_column(scale_add_task)
    assert isinstance(col, str) and "\n" not in col
    assert task_from_column(col) == scale_add_task
    with pytest.raises(ValueError, match="task column"):
        task_from_column('{"kind": "candidate"}')


def test_completion_formats_and_parsing(answers):
    conv = [{"role": "assistant", "content": answers["correct"]}]
    assert completion_text(conv) == completion_text(answers["correct"]) == answers["correct"]
    parts = [{"role": "assistant", "content": [{"type": "text", "text": answers["correct"]}]}]
    assert completion_text(parts) == answers["correct"]
    sol, problems = parse_completion(answers["correct"])
    assert sol is not None and set(sol.files) == set(fixture_files("scale_add"))
    assert sol.format == "workdir" and not problems
    sol, problems = parse_completion(answers["unparsable"])
    assert sol is None and problems == ["no model_new.py block"]
    assert parse_completion("")[0] is None


def test_reward_through_a_local_pool(strict_pool, scale_add_task, answers, tmp_path):
    pool = CountingPool(strict_pool)
    results = tmp_path / "results.jsonl"
    f = KernelReward(pool, results_path=results)
    assert f.__name__ == "kernel_reward"
    col = task_to_column(scale_add_task)
    # conversational completions for two, standard (plain text) for the others; the correct one
    # twice: identical candidates of one call are evaluated once
    completions = [
        [{"role": "assistant", "content": answers["correct"]}],
        answers["wrong"],
        [{"role": "assistant", "content": answers["torch_only"]}],
        answers["unparsable"],
        answers["correct"],
    ]
    logged_metrics, logged_columns = {}, {}
    rewards = f(
        prompts=[[{"role": "user", "content": "..."}]] * 5,
        completions=completions,
        task=[col] * 5,
        log_metric=lambda k, v: logged_metrics.setdefault(k, v),
        log_extra=lambda k, v: logged_columns.setdefault(k, v),
    )
    assert len(rewards) == 5
    _check_verdicts(f.last[:4], rewards[:4], ORDER)
    assert rewards[4] == 1.0 and f.last[4].status == "ok"
    assert len(pool.submitted) == 3  # correct (once), wrong, torch_only; never the unparsable
    f.close()
    recs = load_records(results, EvalResult)
    assert [r.meta["trl"]["completion"] for r in recs] == [0, 1, 2, 4]
    assert recs[-1].meta["trl"]["same_as"] == 0
    assert [r.reward for r in recs] == [1.0, FAILURE, FAILURE, 1.0]
    assert all(r.reward_reason and r.task_id == scale_add_task.id for r in recs)
    assert logged_metrics["kernel_reward/ok"] == pytest.approx(2 / 5)
    assert logged_metrics["kernel_reward/evaluated"] == pytest.approx(4 / 5)
    assert logged_columns["kernel_reward_status"] == [
        "ok",
        "incorrect",
        "guard_violation",
        "unparsed",
        "ok",
    ]


def test_reward_never_raises_for_an_evaluator_that_does(scale_add_task, answers):
    class Broken:
        backend = "cpu"

        def submit(self, candidate):
            raise RuntimeError("pool is gone")

    f = KernelReward(Broken())
    rewards = f(None, [answers["correct"], answers["unparsable"]], task=[scale_add_task] * 2)
    assert rewards == [FAILURE, FAILURE]
    assert f.last[0].status == "infra_error" and "pool is gone" in f.last[0].result.message
    with pytest.raises(ValueError, match="'task' column"):
        f(None, [answers["correct"]])


def test_reward_through_the_service(service_url, scale_add_task, answers, tmp_path):
    results = tmp_path / "svc.jsonl"
    with ServiceEvaluator(service_url, TOKEN, workers=4) as ev:
        assert ev.backend == "cpu"
        f = KernelReward(ev, results_path=results, name="kernel_reward_http")
        col = task_to_column(scale_add_task)
        # a second wrong variant makes three requests at once against max_concurrent=2: the
        # service answers one of them `busy` and the evaluator comes back after Retry-After
        wrong2 = answers["wrong"].replace("- b[j]", "- 2 * b[j]")
        comps = [answers[k] for k in ORDER] + [wrong2]
        t0 = time.monotonic()
        rewards = f(None, comps, task=[col] * len(comps))
        assert time.monotonic() - t0 < 200
        _check_verdicts(f.last[:4], rewards[:4], ORDER)
        assert f.last[4].status == "incorrect"
        assert ev.busy_retries >= 1  # the service refused one at first; it was sent again
        f.close()
    recs = load_records(results, EvalResult)
    assert sorted(r.meta["trl"]["completion"] for r in recs) == [0, 1, 2, 4]
    assert {r.backend for r in recs} == {"cpu"}


def test_service_evaluator_failure_is_an_infra_error(scale_add_task, answers):
    # nothing listens there: every evaluation fails, each completion gets the failure reward
    with ServiceEvaluator("http://127.0.0.1:9", TOKEN, workers=2) as ev:
        f = KernelReward(ev)  # made without asking the service anything
        rewards = f(None, [answers["correct"]], task=[scale_add_task])
    assert rewards == [FAILURE]
    assert f.last[0].status == "infra_error"


# ---------------------------------------------------------------------------- workspaces


def _write_fixture_with_tools(env):
    for path, text in fixture_files("scale_add").items():
        out = env.Write(path, text)
        assert out.startswith("wrote"), out


def test_local_workspace_env(strict_pool, scale_add_task, ws_root, tmp_path):
    from cuda_agent.agent.env import SandboxEnv

    results = tmp_path / "ws.jsonl"
    with SandboxEnv(strict_pool.config, pool=strict_pool) as senv:
        envs = WorkspaceEnvFactory.local(senv, ws_root / "local")
        reward = envs.reward(results_path=results)
        a, b = envs(), envs()
        assert a.reset(task=task_to_column(scale_add_task), prompt=[]) is None
        b.reset(task=task_to_column(scale_add_task))
        out = a.Bash("ls; cat model.py | head -3")
        assert "model.py" in out and "SKILL.md" in out and "[exit code 0]" in out
        assert "Error" in a.Write("model.py", "tampered")  # read-only reference
        assert "outside the workspace" in a.Read("../../etc/passwd")
        _write_fixture_with_tools(a)
        assert "applied" in a.Edit("kernels/ops.cpp", "return 0;", "return 0;  // done")
        comp = a.Bash("python utils/compile.py")
        assert "[exit code 0]" in comp, comp
        assert a.Submit("scale_add on the cpu") == "submitted; your solution is evaluated"
        assert "episode is over" in a.Bash("ls")
        # b keeps the starter model_new.py (the reference under another name): strict rejects it
        rewards = reward(None, [[], []], environments=[a, b])
        assert rewards == [1.0, FAILURE]
        assert reward.last[0].status == "ok" and reward.last[1].status == "guard_violation"
        assert [c[0] for c in tool_calls_of(a)][:2] == ["Bash", "Write"]
        ws_a = workspace_of(a)
        assert ws_a.is_dir()
        a.reset(task=task_to_column(scale_add_task))  # next rollout: a fresh workspace
        assert not ws_a.exists() and workspace_of(a).is_dir() and not tool_calls_of(a)
        envs.close()
        assert workspace_of(a) is None and workspace_of(b) is None
    reward.close()
    recs = load_records(results, EvalResult)
    assert [r.status for r in recs] == ["ok", "guard_violation"]
    assert recs[0].meta["trl"]["submitted"] is True
    assert "Submit" in recs[0].meta["trl"]["tool_calls"]


def test_service_workspace_env(service_url, scale_add_task):
    with ServiceEvaluator(service_url, TOKEN) as ev:
        envs = WorkspaceEnvFactory.over_service(ev)
        env = envs()
        env.reset(task=task_to_column(scale_add_task))
        assert "model.py" in env.Bash("ls")
        for path, text in fixture_files("scale_add").items():
            out = env.Bash(f"mkdir -p kernels && cat > {path} <<'EOF'\n{text}EOF")
            assert "[exit code 0]" in out, out
        reward = envs.reward()
        assert reward(None, [[]], environments=[env]) == [1.0], reward.last[0].reason
        ws = workspace_of(env)
        envs.close()
        from cuda_agent.service.client import ServiceError

        with pytest.raises(ServiceError):  # deleted on the service
            ev.client.bash(ws, "ls")
