"""What the trainer adapters share beyond :mod:`cuda_agent.adapters.trl`'s reward pieces: one
completion scored on its own (the per-sample reward interfaces of verifiers and verl), and
process-wide evaluators named by settings (what a trainer that loads a reward function by path
can reach: it cannot be handed a pool object).

Both are built from the TRL adapter's ``KernelReward`` (parsing, evaluation, infra errors,
scoring), so every adapter scores a completion exactly as the TRL one does.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from cuda_agent.adapters.trl import Evaluator, KernelReward, Scored, ServiceEvaluator
from cuda_agent.records import Task
from cuda_agent.reward import RewardConfig

__all__ = ["evaluator_for", "register_evaluator", "score_completion"]

_LOCK = threading.Lock()
_EVALUATORS: dict[tuple[Any, ...], Evaluator] = {}
_NAMED: dict[str, Evaluator] = {}


def register_evaluator(name: str, evaluator: Evaluator) -> None:
    """Make ``evaluator`` the one :func:`evaluator_for` returns for ``name=name`` (replacing an
    earlier one of that name; the caller keeps closing it)."""
    with _LOCK:
        _NAMED[name] = evaluator


def evaluator_for(
    *,
    name: str = "",
    service_url: str = "",
    token_env: str = "CUDA_AGENT_SERVICE_TOKEN",
    backend: str = "auto",
    guard_policy: str = "strict",
    timing: bool = True,
) -> Evaluator:
    """The process-wide evaluator for these settings, made on first use and reused after:
    the registered one for ``name`` (``KeyError`` when none is), else a ``ServiceEvaluator`` for
    ``service_url`` (bearer token from ``$token_env``), else a local ``SandboxPool`` with
    ``backend``, ``guard_policy`` and ``timing``."""
    with _LOCK:
        if name:
            if name not in _NAMED:
                raise KeyError(f"no evaluator registered as {name!r} (register_evaluator)")
            return _NAMED[name]
        key = (service_url, token_env) if service_url else (backend, guard_policy, timing)
        ev = _EVALUATORS.get(key)
        if ev is None:
            if service_url:
                ev = ServiceEvaluator(service_url, os.environ.get(token_env) or None)
            else:
                from cuda_agent.sandbox import SandboxConfig, SandboxPool

                cfg = SandboxConfig(backend=backend, guard_policy=guard_policy, timing=timing)
                ev = SandboxPool(cfg)
            _EVALUATORS[key] = ev
        return ev


def score_completion(
    evaluator: Evaluator,
    task: Task | str | dict[str, Any],
    text: str,
    *,
    reward: RewardConfig | None = None,
    origin: str = "adapter",
) -> Scored:
    """One completion's outcome, exactly as :class:`KernelReward` scores it in a batch of one:
    parsed as the agent's single-turn answer, evaluated by ``evaluator`` (blocking), scored by
    ``cuda_agent.reward``. Never raises for the completion: unparsable gives the failure reward
    unevaluated, an evaluator that raises gives ``infra_error``. Safe to call from many threads
    at once (each call has its own scorer)."""
    from cuda_agent.adapters.trl import task_to_column

    column = task_to_column(task) if isinstance(task, Task) else task
    kr = KernelReward(evaluator, reward=reward, origin=origin, name=f"{origin}_reward")
    kr([None], [text], task=[column])
    return kr.last[0]
