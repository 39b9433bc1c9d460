"""The kernel tasks as a `verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ (>= 0.4,
its ``verifiers.v1`` stack) taskset and environment: single turn, scored by the sandbox.

::

    env = load_environment("tasks.jsonl", backend="cuda")       # a vf.SingleAgentEnv
    # or, through verifiers' own loader:
    vf.load_environment(vf.SingleAgentEnvConfig(taskset=KernelTasksetConfig(tasks="tasks.jsonl")))

Each task's prompt is the agent's single-turn chat (SKILL.md as the system prompt, the task as
the user prompt: what ``trl.build_dataset`` puts in a row); :class:`KernelTask`'s ``@vf.reward``
``kernel_reward`` parses the trace's assistant replies as the agent's single-turn answer and
scores them with the sandbox and the paper's reward (``common.score_completion``: the TRL
adapter's ``KernelReward`` for one completion). Evaluation runs on a process-wide evaluator named
by the task config (a local ``SandboxPool``, the HTTP service, or one given to
:func:`load_environment`).

verifiers finds a taskset by an importable *top-level* module name (its ``taskset.id``): this
module registers itself as ``cuda_agent_kernels`` when imported (:data:`TASKSET_ID`).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import verifiers.v1 as vf
from verifiers.v1.types import content_text

from cuda_agent.adapters.common import evaluator_for, register_evaluator, score_completion
from cuda_agent.adapters.trl import (
    Evaluator,
    Scored,
    load_tasks,
    single_turn_messages,
    task_from_column,
    task_to_column,
)
from cuda_agent.records import Task
from cuda_agent.reward import RewardConfig

__all__ = [
    "TASKSET_ID",
    "KernelTask",
    "KernelTaskConfig",
    "KernelTaskData",
    "KernelTaskset",
    "KernelTasksetConfig",
    "load_environment",
    "trace_text",
]

TASKSET_ID = "cuda_agent_kernels"
sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])
_names = itertools.count()


class KernelTaskConfig(vf.TaskConfig):
    """How a kernel task is scored (``--env.taskset.task.*``): the evaluator and the reward."""

    backend: str = "auto"  # cuda | cpu | auto: the prompt's kernel language and the local pool's
    guard_policy: str = "strict"  # strict | kernelbench | off
    timing: bool = True  # a local pool's timing (the speed-up rewards need it)
    service_url: str = ""  # evaluate on this kernel-service instead of a local pool
    token_env: str = "CUDA_AGENT_SERVICE_TOKEN"  # the service's bearer token's variable
    evaluator: str = ""  # an evaluator given to load_environment / common.register_evaluator
    reward_scheme: str = "paper"  # paper | speedup | log-speedup (cuda_agent.reward)


class KernelTaskData(vf.TaskData):
    """One kernel task's row: the verifiers prompt plus the ``Task`` record as JSON."""

    task: str


class KernelTask(vf.Task[KernelTaskData, vf.State, KernelTaskConfig]):
    """A kernel task; its reward ``kernel_reward`` is the sandbox's verdict scored by
    ``cuda_agent.reward`` (-1/1/2/3 under ``paper``)."""

    @property
    def key(self) -> str:
        return f"{task_from_column(self.data.task).id}:{self.data.idx}"

    def evaluator(self) -> Evaluator:
        """The process-wide evaluator of this task's config."""
        c = self.config
        return evaluator_for(
            name=c.evaluator,
            service_url=c.service_url,
            token_env=c.token_env,
            backend=c.backend,
            guard_policy=c.guard_policy,
            timing=c.timing,
        )

    def evaluate(self, text: str) -> Scored:
        """``text`` (a single-turn answer) scored for this task; never raises for the text."""
        return score_completion(
            self.evaluator(),
            self.data.task,
            text,
            reward=RewardConfig(scheme=self.config.reward_scheme),
            origin="verifiers",
        )

    @vf.reward
    async def kernel_reward(self, trace: vf.Trace) -> float:
        """The reward of the trace's answer (evaluated off the event loop); records metrics
        ``kernel_evaluated`` and ``kernel_ok`` and ``trace.info["kernel"]`` (status, reason,
        the ``EvalResult`` as a dict)."""
        scored = await asyncio.to_thread(self.evaluate, trace_text(trace))
        trace.record_metric("kernel_evaluated", float(scored.result is not None))
        trace.record_metric("kernel_ok", float(scored.status == "ok"))
        import msgspec

        trace.info["kernel"] = {
            "status": scored.status,
            "reason": scored.reason,
            "result": msgspec.to_builtins(scored.result) if scored.result is not None else None,
        }
        return scored.reward


def trace_text(trace: vf.Trace) -> str:
    """The answer of a trace: its sampled assistant messages' text joined by blank lines (one
    message for a single-turn rollout)."""
    parts = [content_text(m.content) for m in trace.assistant_messages]
    return "\n\n".join(p for p in parts if p)


class KernelTasksetConfig(vf.TasksetConfig):
    """Which kernel tasks load (``--env.taskset.*``)."""

    id: str = TASKSET_ID  # the taskset's name in verifiers
    tasks: str | list[str] = []  # a tasks JSONL path, or Task records as JSON strings
    include_skill: bool = True  # SKILL.md as the system prompt (False: one short line)
    task: KernelTaskConfig = KernelTaskConfig()  # how each task is scored (below)


class KernelTaskset(vf.Taskset[KernelTask, KernelTasksetConfig]):
    """The kernel tasks of the config, each with the agent's single-turn prompt for the task
    config's backend and guard policy."""

    def records(self) -> list[Task]:
        """The config's ``Task`` records, in order."""
        src = self.config.tasks
        if isinstance(src, str):
            return load_tasks(Path(src)) if src else []
        return [task_from_column(v) for v in src]

    def load(self) -> Iterator[KernelTask]:
        from cuda_agent.sandbox.config import resolve_backend

        tc = self.config.task
        backend = resolve_backend(tc.backend)
        for task in self.records():
            system, user = single_turn_messages(
                task, backend, tc.guard_policy, self.config.include_skill
            )
            data = KernelTaskData(
                id=task.id,
                name=task.name,
                prompt=user["content"],
                system_prompt=system["content"],
                task=task_to_column(task),
            )
            yield KernelTask(data, tc)


def load_environment(
    tasks: Iterable[Task] | str | Path,
    *,
    backend: str = "auto",
    guard_policy: str = "strict",
    include_skill: bool = True,
    timing: bool = True,
    service_url: str = "",
    token_env: str = "CUDA_AGENT_SERVICE_TOKEN",
    evaluator: Evaluator | None = None,
    reward_scheme: str = "paper",
    agent: vf.AgentConfig | None = None,
) -> vf.Env:
    """A ``vf.SingleAgentEnv`` over ``tasks`` (``Task`` records or a tasks JSONL path), made by
    ``vf.load_environment``. Scoring uses ``evaluator`` when given (registered process-wide under
    a fresh name), else the service at ``service_url``, else a local ``SandboxPool``. ``agent``
    defaults to verifiers' ``null`` harness (a chat loop that executes no code) in the
    ``subprocess`` runtime; ``backend`` ``auto`` is resolved here (the prompt must match the
    evaluator's backend)."""
    from verifiers.v1.harnesses.null import NullHarnessConfig

    from cuda_agent.sandbox.config import resolve_backend

    name = ""
    if evaluator is not None:
        name = f"verifiers-{next(_names)}"
        register_evaluator(name, evaluator)
    if isinstance(tasks, str | Path):
        source: str | list[str] = str(tasks)
    else:
        source = [task_to_column(t) for t in load_tasks(tasks)]
    task_cfg = KernelTaskConfig(
        backend=resolve_backend(backend),
        guard_policy=guard_policy,
        timing=timing,
        service_url=service_url,
        token_env=token_env,
        evaluator=name,
        reward_scheme=reward_scheme,
    )
    taskset = KernelTasksetConfig(tasks=source, include_skill=include_skill, task=task_cfg)
    agent = agent or vf.AgentConfig(
        harness=NullHarnessConfig(id="null"), runtime=vf.SubprocessConfig()
    )
    return vf.load_environment(vf.SingleAgentEnvConfig(taskset=taskset, agent=agent))
