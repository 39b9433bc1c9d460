"""The kernel tasks for `verl <https://github.com/volcengine/verl>`_: a custom reward function and
its parquet dataset. Nothing here imports verl (it cannot join this workspace's lock: verl 0.9
requires transformers < 5.11, the lock holds 5.24); written against verl 0.9.1 and exercised
through its own code in a scratch environment (``tests/test_verl_real.py``, the README).

::

    write_parquet("tasks.jsonl", "data/kernels.parquet", backend="cuda")
    python -m verl.trainer.main_ppo data.train_files=data/kernels.parquet \\
        reward.custom_reward_function.path=pkg://cuda_agent.adapters.verl \\
        reward.custom_reward_function.name=compute_score ...

(verl 0.9.1's trainer reads ``reward.custom_reward_function``; the legacy top-level
``custom_reward_function``, still in its config, is migrated only by its fully-async entry point.)
A row's ``reward_model.ground_truth`` is the ``Task`` record as JSON; :func:`compute_score` parses
the response as the agent's single-turn answer (verl's default ``single_turn_agent`` loop) and
scores the sandbox's verdict with the paper's reward (``common.score_completion``: the TRL
adapter's ``KernelReward`` on one completion).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cuda_agent.adapters.common import evaluator_for, score_completion
from cuda_agent.adapters.trl import load_tasks, single_turn_messages, task_to_column
from cuda_agent.records import Task
from cuda_agent.reward import RewardConfig

__all__ = ["DATA_SOURCE", "compute_score", "verl_rows", "write_parquet"]

DATA_SOURCE = "cuda_agent/kernels"


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() not in ("0", "false", "no", "")


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str | dict[str, Any],
    extra_info: dict[str, Any] | None = None,
    *,
    service_url: str | None = None,
    backend: str | None = None,
    guard_policy: str | None = None,
    timing: bool | None = None,
    evaluator: str = "",
    reward_scheme: str = "paper",
    **_: Any,
) -> dict[str, Any]:
    """verl's custom reward function (``reward.custom_reward_function.name=compute_score``; the
    keyword settings come from ``reward.custom_reward_function.reward_kwargs``, else from the
    variables ``CUDA_AGENT_VERL_SERVICE`` (a kernel-service URL, token
    ``$CUDA_AGENT_SERVICE_TOKEN``), ``CUDA_AGENT_VERL_BACKEND``, ``CUDA_AGENT_VERL_GUARD_POLICY``,
    ``CUDA_AGENT_VERL_TIMING``). ``ground_truth`` is the task record (JSON or a dict); other
    keywords verl passes (``reward_router_address``, ``reward_model_tokenizer``) are ignored.
    Returns ``{"score", "ok", "evaluated", "status"}`` (verl takes ``score`` as the reward, the
    rest as reward extra info, same keys for every sample); never raises for the response:
    unparsable or a failed evaluation is the failure reward. Blocking, on one process-wide
    evaluator per setting: verl 0.9.1's reward-loop managers call it in their event loop's thread
    pool, every sample of a worker's share at once, in each of ``reward.num_workers`` Ray actors
    (8 by default), each with its own evaluator."""
    ev = evaluator_for(
        name=evaluator,
        service_url=service_url
        if service_url is not None
        else os.environ.get("CUDA_AGENT_VERL_SERVICE", ""),
        backend=backend or os.environ.get("CUDA_AGENT_VERL_BACKEND", "auto"),
        guard_policy=guard_policy or os.environ.get("CUDA_AGENT_VERL_GUARD_POLICY", "strict"),
        timing=timing if timing is not None else _env_flag("CUDA_AGENT_VERL_TIMING", True),
    )
    scored = score_completion(
        ev, ground_truth, solution_str, reward=RewardConfig(scheme=reward_scheme), origin="verl"
    )
    return {
        "score": scored.reward,
        "ok": float(scored.status == "ok"),
        "evaluated": float(scored.result is not None),
        "status": scored.status,
    }


def verl_rows(
    tasks: Iterable[Task] | str | Path,
    *,
    backend: str = "cuda",
    guard_policy: str = "strict",
    include_skill: bool = True,
    split: str = "train",
) -> list[dict[str, Any]]:
    """One verl RL-dataset row per task: ``data_source`` (:data:`DATA_SOURCE`), ``prompt`` (the
    agent's single-turn chat messages, as ``trl.build_dataset``), ``ability``, ``reward_model``
    ``{"style": "rule", "ground_truth": <the Task as JSON>}`` and ``extra_info`` (split, index,
    task id and name)."""
    from cuda_agent.sandbox.config import resolve_backend

    backend = resolve_backend(backend)
    rows = []
    for i, task in enumerate(load_tasks(tasks)):
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": single_turn_messages(task, backend, guard_policy, include_skill),
                "ability": "cuda-kernel",
                "reward_model": {"style": "rule", "ground_truth": task_to_column(task)},
                "extra_info": {"split": split, "index": i, "task_id": task.id, "name": task.name},
            }
        )
    if not rows:
        raise ValueError("no tasks")
    return rows


def write_parquet(tasks: Iterable[Task] | str | Path, path: str | Path, **kwargs: Any) -> Path:
    """:func:`verl_rows` written as the parquet file verl's ``data.train_files`` reads (needs
    pandas and pyarrow); returns ``path``."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(verl_rows(tasks, **kwargs)).to_parquet(path)
    return path
