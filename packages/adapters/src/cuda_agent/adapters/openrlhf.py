"""The kernel environment as an `OpenRLHF <https://github.com/OpenRLHF/OpenRLHF>`_ (>= 0.11)
multi-turn agent: the file given to ``--train.agent_func_path`` defines ``AgentExecutor``.

OpenRLHF's ``MultiTurnAgentExecutor`` makes one ``AgentInstance()`` per prompt (no arguments),
calls ``await reset({"observation": prompt, "label": label})`` and then, after every generation,
``await step({"observation_text", "action_text", "label", "sampling_params"})``, which returns
``rewards`` (a tensor: summed over the steps), ``scores``, ``environment_feedback`` (text appended
to the context, tokens outside the action mask), ``done``, ``sampling_params`` and
``extra_logs``. Here an episode is this toolkit's multi-turn episode:

- the ``label`` is the ``Task`` record as JSON (:func:`write_dataset` writes the rows);
  ``reset`` makes a fresh agent workspace for it (:class:`~cuda_agent.adapters.trl.
  WorkspaceEnvFactory`'s environments, local or on a ``kernel-service``);
- each action is parsed for ``<tool_call>`` blocks (``agent.toolcalls``: Hermes JSON or
  Qwen3-Coder XML); each call runs as the TRL environment's tool (``Bash`` confined by the
  sandbox, ``Read``/``Write``/``Edit``, ``Submit``); the results come back as
  ``<tool_response>`` blocks in a user turn (``turn_template``);
- ``Submit`` or ``max_turns`` ends the episode: the workspace is evaluated in fresh processes and
  scored as :class:`~cuda_agent.adapters.trl.WorkspaceReward` scores a TRL rollout.

The steps' rewards sum to the failure reward until the episode is evaluated, then to the
sandbox's reward, so an episode OpenRLHF cuts off at its token budget counts as a failure.

Settings: :class:`AgentSettings`, read from ``CUDA_AGENT_OPENRLHF_*`` variables (OpenRLHF
instantiates the agent itself). Nothing of OpenRLHF is imported until ``AgentInstance`` or
``AgentExecutor`` is asked for.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cuda_agent.records import Task

__all__ = [
    "CHATML_TURN",
    "AgentSettings",
    "KernelAgent",
    "ScriptedEngine",
    "dataset_rows",
    "tool_schemas",
    "write_dataset",
]

# the text between an assistant turn's end-of-turn token and the next assistant turn's content
CHATML_TURN = "\n<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n"
NO_TOOL_CALL = (
    "Error: no tool call in your message. Act through tools: write each call as "
    '<tool_call>{"name": "...", "arguments": {...}}</tool_call>; call Submit when done.'
)
ENV_PREFIX = "CUDA_AGENT_OPENRLHF_"


@dataclass(frozen=True)
class AgentSettings:
    """An agent's settings; :meth:`from_env` reads each as ``CUDA_AGENT_OPENRLHF_<NAME>``."""

    envs: str = ""  # a factory registered with common.register_workspace_envs
    service: str = ""  # a kernel-service URL (its workspaces), token from $token_env
    token_env: str = "CUDA_AGENT_SERVICE_TOKEN"  # the variable holding the service's token
    backend: str = "auto"  # local workspaces: the sandbox backend (cuda | cpu | auto)
    guard_policy: str = "strict"  # local workspaces: strict | kernelbench | off
    timing: bool = True  # local workspaces: time correct kernels (rewards above 1 need it)
    workdir: str = ""  # local workspaces' directory ($TMPDIR/cuda-agent-workspaces)
    max_turns: int = 30  # the episode is evaluated after this many actions
    reward_scheme: str = "paper"  # paper | speedup | log-speedup (cuda_agent.reward)
    results: str = ""  # a JSONL file that each evaluated episode's EvalResult is appended to
    turn_template: str = CHATML_TURN  # {observation}: the tool responses
    tokenizer: str = ""  # an HF tokenizer path: its chat template's turn boundary instead

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AgentSettings:
        environ = os.environ if environ is None else environ
        known = {ENV_PREFIX + f.name.upper() for f in fields(cls)}
        unknown = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in known)
        if unknown:  # a misspelt setting must not be ignored
            raise ValueError(
                f"unknown setting(s) {', '.join(unknown)}: the known ones are "
                f"{', '.join(sorted(known))}"
            )
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is None:
                continue
            if f.type == "bool":
                values[f.name] = raw.strip().lower() not in ("0", "false", "no", "off", "")
            elif f.type == "int":
                values[f.name] = int(raw)
            else:
                values[f.name] = raw
        return cls(**values)

    def factory(self) -> Any:
        from cuda_agent.adapters.common import workspace_envs_for

        return workspace_envs_for(
            name=self.envs,
            service_url=self.service,
            token_env=self.token_env,
            backend=self.backend,
            guard_policy=self.guard_policy,
            timing=self.timing,
            workdir=self.workdir,
        )


def tool_schemas(env: Any) -> list[dict[str, Any]]:
    """The agent's tool schemas (``agent.tools.TOOL_SCHEMAS``) of the tools ``env`` (a workspace
    environment or its class) offers, with the arguments its methods take."""
    from cuda_agent.agent.tools import TOOL_SCHEMAS

    out = []
    for schema in TOOL_SCHEMAS:
        fn = schema["function"]
        method = getattr(env, fn["name"], None)
        if not callable(method):
            continue
        takes = set(inspect.signature(method).parameters) - {"self"}
        params = fn["parameters"]
        props = {k: v for k, v in params["properties"].items() if k in takes}
        required = [k for k in params["required"] if k in takes]
        params = {**params, "properties": props, "required": required}
        out.append({**schema, "function": {**fn, "parameters": params}})
    return out


def dataset_rows(
    tasks: Iterable[Task] | str | Path,
    *,
    backend: str = "cuda",
    guard_policy: str = "strict",
    include_skill: bool = True,
    service: bool = False,
) -> list[dict[str, Any]]:
    """One row per task: ``prompt`` (system: SKILL.md with the tools and their calling
    convention, ``agent.prompts.system_prompt``; user: the agent's task prompt) and ``label``
    (the ``Task`` record as JSON). ``service``: the tools of a service workspace (Bash, Submit)."""
    from cuda_agent.adapters.trl import (
        KernelWorkspaceEnv,
        ServiceWorkspaceEnv,
        load_tasks,
        multi_turn_messages,
        task_to_column,
    )
    from cuda_agent.agent.prompts import system_prompt
    from cuda_agent.sandbox.config import resolve_backend

    backend = resolve_backend(backend)
    tools = tool_schemas(ServiceWorkspaceEnv if service else KernelWorkspaceEnv)
    rows = []
    for task in load_tasks(tasks):
        system, user = multi_turn_messages(task, backend, guard_policy, include_skill)
        system = {**system, "content": system_prompt(system["content"], tools)}
        rows.append({"prompt": [system, user], "label": task_to_column(task)})
    if not rows:
        raise ValueError("no tasks")
    return rows


def write_dataset(tasks: Iterable[Task] | str | Path, path: str | Path, **kwargs: Any) -> Path:
    """:func:`dataset_rows` as a JSONL file for ``--data.prompt_dataset`` (with
    ``--data.input_key prompt --data.label_key label --data.apply_chat_template``)."""
    import json

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for row in dataset_rows(tasks, **kwargs):
            f.write(json.dumps(row) + "\n")
    return out


@functools.lru_cache(maxsize=8)
def _boundary(tokenizer: str, template: str) -> tuple[str, str]:
    """``template`` split around ``{observation}``, or the tokenizer's chat-template boundary."""
    if tokenizer:
        from transformers import AutoTokenizer

        from cuda_agent.agent.episode import turn_boundary

        template = turn_boundary(AutoTokenizer.from_pretrained(tokenizer), "{observation}")
    before, sep, after = template.partition("{observation}")
    if not sep:
        raise ValueError("the turn template has no {observation}")
    return before, after


class KernelAgent:
    """One OpenRLHF episode on a kernel task (the logic of ``AgentInstance``, which adds
    OpenRLHF's base class). ``settings`` default: :meth:`AgentSettings.from_env`."""

    def __init__(self, settings: AgentSettings | None = None):
        from cuda_agent.reward import RewardConfig, score

        self.settings = settings or AgentSettings.from_env()
        self._reward = RewardConfig(scheme=self.settings.reward_scheme)
        self._failure = score(None, self._reward).value
        self._boundary = _boundary(self.settings.tokenizer, self.settings.turn_template)
        self._factory = self.settings.factory()
        self.env = self._factory()
        self._tools = {s["function"]["name"] for s in tool_schemas(self.env)}
        self.turns = 0
        self.tool_errors = 0
        self.paid = 0.0  # the rewards returned so far (OpenRLHF sums them)
        self.scored: Any = None  # the episode's Scored once evaluated
        weakref.finalize(self, self._factory.release, self.env)

    async def reset(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """A fresh workspace for the label's task; the observation is the prompt unchanged."""
        if not states.get("label"):
            raise ValueError(
                "the OpenRLHF label must be the Task record as JSON (--data.label_key label; "
                "cuda_agent.adapters.openrlhf.write_dataset writes it)"
            )
        row = {self._factory.task_column: states["label"]}
        await asyncio.to_thread(self.env.reset, **row)
        self.turns, self.tool_errors, self.paid, self.scored = 0, 0, 0.0, None
        return {"observation": states["observation"]}

    async def step(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Run the action's tool calls; evaluate the workspace after Submit or ``max_turns``."""
        import torch

        from cuda_agent.agent.prompts import tool_response
        from cuda_agent.agent.toolcalls import ParsedCall, parse_tool_calls

        self.turns += 1
        calls = parse_tool_calls(states["action_text"]).calls
        results, submitted = [], False
        for call in calls:
            if isinstance(call, ParsedCall):
                results.append(await asyncio.to_thread(self._run, call.name, call.arguments))
            else:
                results.append(f"Error: {call.message}")
            failed = results[-1].startswith("Error:")
            self.tool_errors += failed
            submitted |= isinstance(call, ParsedCall) and call.name == "Submit" and not failed
        if not calls:
            self.tool_errors += 1
            results.append(NO_TOOL_CALL)
        done = submitted or self.turns >= self.settings.max_turns
        if done:
            self.scored = await asyncio.to_thread(self._evaluate)
        target = self.scored.reward if self.scored is not None else self._failure
        reward, self.paid = target - self.paid, target
        ok = self.scored is not None and self.scored.status == "ok"
        before, after = self._boundary
        return {
            "rewards": torch.tensor(reward),
            "scores": torch.tensor(float(ok)),
            "environment_feedback": "" if done else before + tool_response(results) + after,
            "done": done,
            "sampling_params": states.get("sampling_params"),
            "extra_logs": {
                "kernel_evaluated": float(
                    self.scored is not None and self.scored.result is not None
                ),
                "kernel_ok": float(ok),
                "kernel_turns": float(self.turns),
                "kernel_tool_errors": float(self.tool_errors),
            },
        }

    def _run(self, name: str, args: dict[str, Any]) -> str:
        if name not in self._tools:
            return f"Error: unknown tool {name!r}; available: {', '.join(sorted(self._tools))}"
        method = getattr(self.env, name)
        try:
            inspect.signature(method).bind(**args)
        except TypeError as e:
            return f"Error: {name}: {e}"
        wrong = [k for k, v in args.items() if not isinstance(v, str)]
        if wrong:
            return f"Error: {name}: argument(s) {', '.join(wrong)} must be strings"
        return method(**args)

    def _evaluate(self) -> Any:
        wr = self._factory.reward(
            reward=self._reward,
            results_path=self.settings.results or None,
            name="kernel_openrlhf_reward",
        )
        try:
            wr([None], [""], environments=[self.env])
        finally:
            wr.close()
        self._factory.release(self.env)
        return wr.last[0]


@functools.cache
def _openrlhf_classes() -> tuple[type, type]:
    from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

    class AgentInstance(KernelAgent, AgentInstanceBase):
        """OpenRLHF's agent instance: a :class:`KernelAgent` with the settings from the
        environment."""

        def __init__(self, *args: Any, **kwargs: Any):
            KernelAgent.__init__(self)

    class AgentExecutor(MultiTurnAgentExecutor):
        """What ``--train.agent_func_path`` loads: OpenRLHF's multi-turn executor over
        :class:`AgentInstance`."""

        def __init__(self) -> None:
            super().__init__(AgentInstance)

    return AgentInstance, AgentExecutor


def __getattr__(name: str) -> Any:
    if name in ("AgentInstance", "AgentExecutor"):
        try:
            instance, executor = _openrlhf_classes()
        except ImportError as e:
            raise AttributeError(
                f"{name} needs OpenRLHF (>= 0.11; pip install openrlhf): {e}"
            ) from e
        return instance if name == "AgentInstance" else executor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ScriptedEngine:
    """An engine with the interface OpenRLHF's executors call (``await generate(token_ids,
    sampling_params, multi_modal_data=None)``, vLLM's ``RequestOutput`` fields) that answers with
    the given texts in turn, each ended by the tokenizer's EOS token and cut to
    ``sampling_params.max_tokens``: the rollout loop checked without vLLM or a GPU."""

    def __init__(self, tokenizer: Any, actions: Iterable[str]):
        self.tokenizer = tokenizer
        self.actions = list(actions)
        self.prompts: list[list[int]] = []  # the token ids each generation was given

    async def generate(self, token_ids: list[int], sampling_params: Any, **kwargs: Any) -> Any:
        from types import SimpleNamespace

        if not self.actions:
            raise RuntimeError("the scripted engine has no action left")
        self.prompts.append(list(token_ids))
        text = self.actions.pop(0)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = [*ids, self.tokenizer.eos_token_id]
        budget = sampling_params.max_tokens
        reason = "length" if len(ids) > budget else "stop"
        ids = ids[:budget]
        out = self.tokenizer.decode(ids, skip_special_tokens=True)
        return SimpleNamespace(
            outputs=[SimpleNamespace(token_ids=ids, text=out, finish_reason=reason, logprobs=None)]
        )
