"""What the trainer adapters share beyond :mod:`cuda_agent.adapters.trl`'s reward pieces: one
completion scored on its own (the per-sample reward interfaces of verifiers and verl), and
process-wide evaluators and workspace environments named by settings (what a trainer that loads a
reward function or an agent by path can reach: it cannot be handed a pool object).

Both are built from the TRL adapter's ``KernelReward`` (parsing, evaluation, infra errors,
scoring), so every adapter scores a completion exactly as the TRL one does.
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Any

from cuda_agent.adapters.trl import (
    Evaluator,
    KernelReward,
    Scored,
    ServiceEvaluator,
    WorkspaceEnvFactory,
)
from cuda_agent.records import Task
from cuda_agent.reward import RewardConfig

__all__ = [
    "evaluator_for",
    "register_evaluator",
    "register_workspace_envs",
    "score_completion",
    "workspace_envs_for",
]

_LOCK = threading.RLock()
_EVALUATORS: dict[tuple[Any, ...], Evaluator] = {}
_NAMED: dict[str, Evaluator] = {}
_ENVS: dict[tuple[Any, ...], WorkspaceEnvFactory] = {}
_NAMED_ENVS: dict[str, WorkspaceEnvFactory] = {}


def _named(table: dict[str, Any], name: str, register: str) -> Any:
    if name not in table:
        raise KeyError(f"nothing registered as {name!r} ({register})")
    return table[name]


def register_evaluator(name: str, evaluator: Evaluator) -> None:
    """Make ``evaluator`` the one :func:`evaluator_for` returns for ``name=name`` (replacing an
    earlier one of that name; the caller keeps closing it)."""
    with _LOCK:
        _NAMED[name] = evaluator


def register_workspace_envs(name: str, factory: WorkspaceEnvFactory) -> None:
    """Make ``factory`` the one :func:`workspace_envs_for` returns for ``name=name`` (replacing
    an earlier one of that name; the caller keeps closing it)."""
    with _LOCK:
        _NAMED_ENVS[name] = factory


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
            return _named(_NAMED, name, "register_evaluator")
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


def workspace_envs_for(
    *, name: str = "", workdir: str | os.PathLike[str] = "", **settings: Any
) -> WorkspaceEnvFactory:
    """The process-wide multi-turn workspace environments for these settings, made on first use:
    the registered factory for ``name`` (``KeyError`` when none is), else environments over
    :func:`evaluator_for`'s evaluator for ``settings`` (its keywords): the service's workspaces
    for a ``service_url``, else local workspaces under ``workdir`` (default
    ``$TMPDIR/cuda-agent-workspaces``) with the sandbox's confinement and that local pool."""
    with _LOCK:
        if name:
            return _named(_NAMED_ENVS, name, "register_workspace_envs")
        where = os.fspath(workdir) or os.path.join(tempfile.gettempdir(), "cuda-agent-workspaces")
        key = (*sorted(settings.items()), where)
        envs = _ENVS.get(key)
        if envs is None:
            evaluator = evaluator_for(**settings)
            if isinstance(evaluator, ServiceEvaluator):
                envs = WorkspaceEnvFactory.over_service(evaluator)
            else:
                from cuda_agent.agent.env import SandboxEnv

                senv = SandboxEnv(evaluator.config, pool=evaluator)
                envs = WorkspaceEnvFactory.local(senv, where)
            _ENVS[key] = envs
        return envs


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
