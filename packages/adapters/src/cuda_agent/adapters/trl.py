"""The kernel environment for TRL's ``GRPOTrainer`` (trl >= 1.16): a reward function, a dataset
builder and a multi-turn workspace environment.

Single turn (the PPO warm-up stage of the paper, as GRPO)::

    dataset = build_dataset(tasks, backend="cpu")          # conversational `prompt` + `task`
    reward = KernelReward(SandboxPool(SandboxConfig(backend="cpu")))
    GRPOTrainer(model, reward_funcs=[reward], train_dataset=dataset, ...)

``KernelReward`` parses each completion as the agent's single-turn mode does (fenced blocks
naming ``model_new.py`` and ``kernels/*``), submits every parsed candidate of the batch at once to
an evaluator (a local ``SandboxPool`` / ``SandboxEnv``, or the HTTP service through
:class:`ServiceEvaluator`), waits for all of them, and scores each ``EvalResult`` with
``cuda_agent.reward`` (the paper's -1/1/2/3 by default).

Multi turn: TRL's ``environment_factory`` (one environment instance per rollout; its public
methods are the tools the model calls through its chat template's tool-calling format)::

    envs = WorkspaceEnvFactory.local(SandboxEnv(SandboxConfig(backend="cpu")), workdir)
    dataset = build_dataset(tasks, mode="multi-turn", backend="cpu")
    GRPOTrainer(model, reward_funcs=[envs.reward()], environment_factory=envs, ...)

Each rollout gets a fresh agent workspace for its row's task; ``Bash`` runs in it confined by the
sandbox (``Read``/``Write``/``Edit`` too for a local workspace), ``Submit`` ends the episode; the
reward evaluates every rollout's workspace together in fresh processes (never the workspace's own
scripts), after generation has stopped.

No import of ``trl`` happens here; :func:`build_dataset` imports ``datasets``.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec

from cuda_agent.records import (
    Candidate,
    EvalResult,
    RecordWriter,
    Solution,
    Status,
    Task,
    decode,
    encode,
    load_records,
)
from cuda_agent.reward import RewardConfig, score

if TYPE_CHECKING:
    from cuda_agent.agent.env import SandboxEnv
    from cuda_agent.service.client import ServiceClient

__all__ = [
    "Evaluator",
    "KernelReward",
    "KernelWorkspaceEnv",
    "Scored",
    "ServiceEvaluator",
    "ServiceWorkspaceEnv",
    "WorkspaceEnvFactory",
    "WorkspaceReward",
    "build_dataset",
    "completion_text",
    "load_tasks",
    "multi_turn_messages",
    "parse_completion",
    "single_turn_messages",
    "task_from_column",
    "task_to_column",
    "tool_calls_of",
    "workspace_of",
]

Mode = Literal["single-turn", "multi-turn"]
# the system prompt without SKILL.md (the agent's --no-skill ablation; short prompts for tests)
NO_SKILL_SYSTEM = "You write fast kernels for PyTorch programs."


class Evaluator(Protocol):
    """What the reward functions evaluate with: ``SandboxPool``, ``SandboxEnv`` (its pool) and
    :class:`ServiceEvaluator` all fit."""

    def submit(self, candidate: Candidate) -> Future[EvalResult]: ...


# ---------------------------------------------------------------------------- tasks and prompts


def task_to_column(task: Task) -> str:
    """The ``task`` column's value for ``task``: its record as one JSON string (datasets keeps
    it as is; :func:`task_from_column` reads it back exactly)."""
    return encode(task).decode().rstrip("\n")


def task_from_column(value: Any) -> Task:
    """The ``Task`` of a ``task`` column value (a JSON string or bytes, a dict, or a ``Task``);
    raises ``ValueError`` naming the problem for anything else."""
    if isinstance(value, Task):
        return value
    try:
        if isinstance(value, dict):
            return msgspec.convert({"kind": "task", **value}, Task)
        if isinstance(value, str | bytes):
            return decode(value, Task)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ValueError(f"task column: not a task record: {e}") from e
    raise ValueError(f"task column: expected a task record as JSON, got {type(value).__name__}")


def load_tasks(source: Iterable[Task] | str | Path) -> list[Task]:
    """Tasks from a tasks JSONL path, or from an iterable of ``Task`` records (kept in order)."""
    if isinstance(source, str | Path):
        return list(load_records(source, Task))
    tasks = list(source)
    for t in tasks:
        if not isinstance(t, Task):
            raise TypeError(f"expected Task records, got {type(t).__name__}")
    return tasks


def _skill(backend: str, guard_policy: str, include_skill: bool, model_mode: str = "eval") -> str:
    if not include_skill:
        return NO_SKILL_SYSTEM
    from cuda_agent.sandbox.workspace import skill_text

    return skill_text(backend, guard_policy, model_mode)


def single_turn_messages(
    task: Task, backend: str = "cuda", guard_policy: str = "strict", include_skill: bool = True
) -> list[dict[str, str]]:
    """The agent's single-turn chat for ``task`` (``agent.prompts.single_turn_prompt`` with the
    workspace's SKILL.md for ``backend`` and ``guard_policy`` as the system message)."""
    from cuda_agent.agent.prompts import single_turn_prompt

    skill = _skill(backend, guard_policy, include_skill, task.model_mode)
    return single_turn_prompt(task.name, task.ref_code, skill, backend)


def multi_turn_messages(
    task: Task, backend: str = "cuda", guard_policy: str = "strict", include_skill: bool = True
) -> list[dict[str, str]]:
    """The agent's multi-turn opening for ``task`` as TRL needs it: SKILL.md as the system
    message and ``agent.prompts.task_prompt`` as the user message. The tools are not written into
    the text: TRL renders the environment's tools through the model's chat template."""
    from cuda_agent.agent.prompts import task_prompt

    return [
        {
            "role": "system",
            "content": _skill(backend, guard_policy, include_skill, task.model_mode).strip(),
        },
        {"role": "user", "content": task_prompt(task.name, task.ref_code)},
    ]


def build_dataset(
    tasks: Iterable[Task] | str | Path,
    *,
    mode: Mode = "single-turn",
    backend: str = "cuda",
    guard_policy: str = "strict",
    include_skill: bool = True,
    repeat: int = 1,
) -> Any:
    """A ``datasets.Dataset`` with one row per task (``repeat`` times over): a conversational
    ``prompt`` (:func:`single_turn_messages` or :func:`multi_turn_messages`), ``task`` (the
    record as JSON, what :class:`KernelReward` and the environments read), ``task_id`` and
    ``task_name``. ``backend`` (``cuda``, ``cpu`` or ``auto``) picks the prompt's kernel language
    and SKILL.md; it should be the evaluator's."""
    from datasets import Dataset

    from cuda_agent.sandbox.config import resolve_backend

    backend = resolve_backend(backend)
    if mode not in ("single-turn", "multi-turn"):
        raise ValueError(f"mode {mode!r}: expected single-turn or multi-turn")
    messages = single_turn_messages if mode == "single-turn" else multi_turn_messages
    rows: dict[str, list[Any]] = {"prompt": [], "task": [], "task_id": [], "task_name": []}
    for task in load_tasks(tasks) * max(1, repeat):
        rows["prompt"].append(messages(task, backend, guard_policy, include_skill))
        rows["task"].append(task_to_column(task))
        rows["task_id"].append(task.id)
        rows["task_name"].append(task.name)
    if not rows["task"]:
        raise ValueError("no tasks")
    return Dataset.from_dict(rows)


# ---------------------------------------------------------------------------- completions


def completion_text(completion: Any) -> str:
    """The text of one TRL completion: the string itself (standard format), or the assistant
    messages' contents joined by blank lines (conversational: ``[{"role": "assistant",
    "content": ...}, ...]``, content a string or a list of ``{"type": "text"}`` parts)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    parts: list[str] = []
    for msg in completion or []:
        if not isinstance(msg, dict) or msg.get("role", "assistant") != "assistant":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [
                p.get("text", "")
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            ]
    return "\n\n".join(p for p in parts if p)


def parse_completion(text: str, origin: str = "trl") -> tuple[Solution | None, list[str]]:
    """``(solution, problems)``: the files of ``text`` as the agent's single-turn mode reads them
    (``agent.solution_parse.parse_files``) as a ``workdir`` Solution, or ``None`` when there is no
    ``model_new.py`` block (then ``problems`` says why). Never raises."""
    from cuda_agent.agent.solution_parse import parse_files

    try:
        files, problems = parse_files(text)
    except Exception as e:  # noqa: BLE001 - a completion never raises
        return None, [f"parse error: {type(e).__name__}: {e}"]
    if "model_new.py" not in files:
        return None, problems or ["no model_new.py block"]
    return Solution.make("workdir", files, origin=origin), problems


# ---------------------------------------------------------------------------- scoring


@dataclass
class Scored:
    """One completion's outcome: its reward and why, and the evaluation behind it (``None``: not
    evaluated, e.g. it did not parse)."""

    index: int
    reward: float
    reason: str
    status: str  # an EvalResult status, or "unparsed" / "no_task"
    result: EvalResult | None = None


def _infra_result(task: Task, solution_id: str, backend: str, exc: BaseException) -> EvalResult:
    """An evaluation that raised, as the agent records it: ``infra_error``, ``meta.raised``."""
    return EvalResult(
        task_id=task.id,
        solution_id=solution_id,
        backend="cuda" if backend == "cuda" else "cpu",
        device="",
        status=Status.INFRA_ERROR,
        message=f"evaluator error: {type(exc).__name__}: {exc}"[:2000],
        meta={"raised": True},
    )


class _Scorer:
    """Scores results and appends them to the results file (thread-safe)."""

    def __init__(self, reward: RewardConfig, results_path: str | Path | None, name: str):
        self.reward = reward
        self.name = name
        self._writer = RecordWriter(results_path) if results_path is not None else None
        self._lock = threading.Lock()
        self.results_path = Path(results_path) if results_path is not None else None
        self.calls = 0
        self.last: list[Scored] = []

    def unevaluated(self, index: int, reason: str, status: str) -> Scored:
        return Scored(index, score(None, self.reward).value, reason, status)

    def evaluated(self, index: int, result: EvalResult, meta: dict[str, Any]) -> Scored:
        r = score(result, self.reward)
        rec = msgspec.structs.replace(
            result, reward=r.value, reward_reason=r.reason, meta={**result.meta, "trl": meta}
        )
        return Scored(index, r.value, r.reason, str(result.status), rec)

    def report(self, scored: list[Scored], kwargs: dict[str, Any], seconds: float) -> list[float]:
        """The rewards, in completion order; appends the evaluated completions' records (in
        completion order) and logs metrics and table columns to TRL when it passes
        ``log_metric`` / ``log_extra``."""
        scored.sort(key=lambda s: s.index)
        if self._writer is not None:
            with self._lock:
                for s in scored:
                    if s.result is not None:
                        self._writer.write(s.result)
        self.last = scored
        self.calls += 1
        n = max(1, len(scored))
        log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
        if callable(log_metric):
            log_metric(f"{self.name}/evaluated", sum(s.result is not None for s in scored) / n)
            log_metric(f"{self.name}/ok", sum(s.status == "ok" for s in scored) / n)
            log_metric(f"{self.name}/eval_seconds", seconds)
        if callable(log_extra):
            log_extra(f"{self.name}_status", [s.status for s in scored])
            log_extra(f"{self.name}_reason", [s.reason for s in scored])
        return [s.reward for s in scored]

    def close(self) -> None:
        if self._writer is not None:
            with self._lock:
                self._writer.close()
                self._writer = None


def _step(kwargs: dict[str, Any]) -> int | None:
    state = kwargs.get("trainer_state")
    return getattr(state, "global_step", None)


def _gather(
    started: dict[int, tuple[Future[EvalResult], Task, str]], backend: Callable[[], str]
) -> dict[int, EvalResult]:
    """Each future's result; one that raised becomes an ``infra_error`` result (on the
    evaluator's ``backend()``, asked only then)."""
    out: dict[int, EvalResult] = {}
    for i, (fut, task, sol_id) in started.items():
        try:
            out[i] = fut.result()
        except Exception as e:  # noqa: BLE001 - the sandbox's failure, recorded as infra_error
            out[i] = _infra_result(task, sol_id, backend(), e)
    return out


def _backend_of(source: Any) -> str:
    """``source.backend`` when it can be had (a service that does not answer: ``cuda``)."""
    try:
        backend = getattr(source, "backend", None)
    except Exception:  # noqa: BLE001 - only a record's label
        return "cuda"
    return backend if isinstance(backend, str) else "cuda"


class KernelReward:
    """A reward function for TRL's ``GRPOTrainer`` (``reward_funcs=[KernelReward(...)]``), called
    as ``f(prompts, completions, task=[...], **kwargs) -> list[float]`` (one reward per completion,
    in order). ``task`` is the dataset's task column (:func:`build_dataset`).

    Guarantees: every completion gets a float and nothing raises for a completion: one without a
    ``model_new.py`` block gets the reward package's failure reward (-1 under ``paper``) without
    being evaluated; the others are submitted together to ``evaluator`` and then waited for
    (identical candidates of one call are evaluated once); an evaluator that raises gives an
    ``infra_error`` result (failure reward). With ``results_path`` each evaluation's ``EvalResult``
    (reward filled, ``meta.trl``: step, completion index) is appended to that JSONL file, one
    line per evaluated completion. ``__name__`` (``name``) is what TRL logs the reward under."""

    def __init__(
        self,
        evaluator: Evaluator,
        *,
        reward: RewardConfig | None = None,
        results_path: str | Path | None = None,
        task_column: str = "task",
        name: str = "kernel_reward",
        origin: str = "trl",
        backend: str | None = None,
    ):
        """``backend`` labels the ``infra_error`` records of evaluations that raised (default: the
        evaluator's ``backend``)."""
        self.evaluator = evaluator
        self.task_column = task_column
        self.origin = origin
        self.__name__ = name
        self._scorer = _Scorer(reward or RewardConfig(), results_path, name)
        self._backend = backend
        self._tasks: dict[str, Task] = {}

    @property
    def last(self) -> list[Scored]:
        """The outcomes of the latest call, in completion order."""
        return self._scorer.last

    @property
    def calls(self) -> int:
        return self._scorer.calls

    def _task(self, value: Any) -> Task:
        key = value if isinstance(value, str) else None
        if key is not None and key in self._tasks:
            return self._tasks[key]
        task = task_from_column(value)
        if key is not None:
            self._tasks[key] = task
        return task

    def __call__(
        self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] = (), **kwargs: Any
    ) -> list[float]:
        t0 = time.monotonic()
        tasks = kwargs.get(self.task_column)
        if tasks is None or len(tasks) != len(completions):
            raise ValueError(
                f"{self.__name__}: the dataset needs a {self.task_column!r} column (build_dataset "
                f"makes one): got {None if tasks is None else len(tasks)} values for "
                f"{len(completions)} completions"
            )
        scored: list[Scored] = []
        started: dict[int, tuple[Future[EvalResult], Task, str]] = {}
        same: dict[str, int] = {}  # candidate key -> the completion index evaluating it
        copies: dict[int, int] = {}
        for i, (completion, tv) in enumerate(zip(completions, tasks, strict=True)):
            task = self._task(tv)
            sol, problems = parse_completion(completion_text(completion), self.origin)
            if sol is None:
                why = "; ".join(problems)
                scored.append(self._scorer.unevaluated(i, f"not evaluated: {why}", "unparsed"))
                continue
            cand = Candidate(task=task, solution=sol)
            if cand.key in same:
                copies[i] = same[cand.key]
                continue
            same[cand.key] = i
            try:
                fut = self.evaluator.submit(cand)
            except Exception as e:  # noqa: BLE001 - recorded as infra_error
                fut = Future()
                fut.set_exception(e)
            started[i] = (fut, task, sol.id)
        results = _gather(started, lambda: self._backend or _backend_of(self.evaluator))
        step = _step(kwargs)
        for i, res in results.items():
            scored.append(self._scorer.evaluated(i, res, {"step": step, "completion": i}))
        for i, j in copies.items():
            meta = {"step": step, "completion": i, "same_as": j}
            scored.append(self._scorer.evaluated(i, results[j], meta))
        return self._scorer.report(scored, kwargs, time.monotonic() - t0)

    def close(self) -> None:
        """Close the results file (the evaluator is the caller's to close)."""
        self._scorer.close()


class ServiceEvaluator:
    """An :class:`Evaluator` over the HTTP service (``kernel-service serve``): ``submit`` sends the
    candidate to ``POST /v1/evaluate`` from one of ``workers`` threads and returns a future of its
    ``EvalResult``. A ``busy`` answer is retried after its ``Retry-After`` (for at most
    ``busy_wait_s`` in all); any other refusal or a dead service makes the future raise
    ``ServiceError`` (an ``infra_error`` result in the reward functions)."""

    def __init__(
        self,
        client: ServiceClient | str,
        token: str | None = None,
        *,
        workers: int = 8,
        busy_wait_s: float = 600.0,
    ):
        from cuda_agent.service.client import ServiceClient

        self.client = client if isinstance(client, ServiceClient) else ServiceClient(client, token)
        self.busy_wait_s = busy_wait_s
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="trl-service")
        self._backend: str | None = None
        self.busy_retries = 0  # `busy` answers retried so far
        self._count = threading.Lock()

    @property
    def backend(self) -> str:
        """The service's backend (``cuda`` or ``cpu``), asked once from ``/v1/health``."""
        if self._backend is None:
            self._backend = str(self.client.health().backend)
        return self._backend

    def _retrying(self, call: Callable[[], EvalResult]) -> EvalResult:
        from cuda_agent.service.client import ServiceError

        deadline = time.monotonic() + self.busy_wait_s
        while True:
            try:
                return call()
            except ServiceError as e:
                if e.code != "busy" or time.monotonic() >= deadline:
                    raise
                with self._count:
                    self.busy_retries += 1
                time.sleep(min(e.retry_after or 1.0, max(0.0, deadline - time.monotonic())))

    def submit(self, candidate: Candidate) -> Future[EvalResult]:
        """Start evaluating ``candidate`` on the service."""
        return self._pool.submit(self._retrying, lambda: self.client.evaluate(candidate))

    def submit_workspace(self, ws: str) -> Future[EvalResult]:
        """Start evaluating the service workspace ``ws`` (``POST /v1/workspaces/{id}/evaluate``)."""
        return self._pool.submit(self._retrying, lambda: self.client.evaluate_workspace(ws))

    def close(self) -> None:
        """Wait for what was submitted, then stop the threads."""
        self._pool.shutdown(wait=True)

    def __enter__(self) -> ServiceEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------- multi-turn


@dataclass
class WorkspaceEnvConfig:
    """Settings of the workspace environments."""

    bash_timeout_s: float = 300.0  # a Bash call's limit
    max_output_chars: int = 12_000  # a tool result's cap (head and tail kept)
    keep_workspaces: bool = False  # leave finished local workspaces on disk


@dataclass
class _Episode:
    task: Task
    workspace: Any  # a local path, or a service workspace id
    submitted: bool = False
    tool_calls: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)


class _WorkspaceEnv:
    """What both environments share. TRL makes every public method of the class a tool (its
    name, type hints and docstring are the schema), except ``reset`` and ``get_reward``: helpers
    here are private. The reward is not the environment's: :class:`WorkspaceReward` evaluates all
    rollouts' workspaces together."""

    def __init__(self, factory: WorkspaceEnvFactory, index: int):
        self._factory = factory
        self._index = index
        self._episodes = 0
        self._ep: _Episode | None = None
        self._lock = threading.Lock()

    # --------------------------------------------------------------- TRL's hooks
    def reset(self, **row: Any) -> str | None:
        """Start a rollout on the row's task: the previous workspace is removed and a fresh one
        made. Returns ``None``: the task is already in the row's prompt."""
        value = row.get(self._factory.task_column)
        if value is None:
            raise ValueError(
                f"the dataset needs a {self._factory.task_column!r} column (build_dataset makes one)"
            )
        task = task_from_column(value)
        with self._lock:
            self._drop()
            self._episodes += 1
            self._ep = _Episode(task, self._make(task))
        return None

    # --------------------------------------------------------------- helpers (not tools)
    def _episode(self) -> _Episode:
        if self._ep is None:
            raise RuntimeError("reset() was not called: no workspace")
        return self._ep

    def _cap(self, text: str) -> str:
        from cuda_agent.agent.tools import cap_text

        return cap_text(text, self._factory.config.max_output_chars)

    def _record(self, name: str, args: dict[str, Any], out: str) -> str:
        self._episode().tool_calls.append((name, args, out))
        return out

    def _refuse_after_submit(self) -> str | None:
        if self._episode().submitted:
            return "Error: the solution was submitted; the episode is over."
        return None

    def _submit(self, summary: str) -> str:
        ep = self._episode()
        if ep.submitted:
            return self._record("Submit", {"summary": summary}, "already submitted")
        ep.submitted = True
        return self._record("Submit", {"summary": summary}, "submitted; your solution is evaluated")

    def _make(self, task: Task) -> Any:
        raise NotImplementedError

    def _drop(self) -> None:
        raise NotImplementedError

    def _evaluation(self) -> Future[EvalResult] | None:
        raise NotImplementedError

    def Submit(self, summary: str = "") -> str:
        """End the episode: the workspace's model_new.py and kernels/ are evaluated as the solution.

        Args:
            summary: A one-line summary of the solution.

        Returns:
            A confirmation.
        """
        return self._submit(summary)


class KernelWorkspaceEnv(_WorkspaceEnv):
    """A local agent workspace per rollout (the agent's ``SandboxEnv``): ``Bash`` runs in it under
    the sandbox's confinement, ``Read``/``Write``/``Edit`` are the agent's file tools (paths
    confined to the workspace, infrastructure and ``model.py`` read-only), ``Submit`` ends it."""

    def _toolbox(self) -> Any:
        from cuda_agent.agent.tools import Toolbox

        env = self._factory.sandbox_env
        assert env is not None
        return Toolbox(
            Path(self._episode().workspace),
            bash=env.bash,
            protected=env.protected,
            bash_timeout=self._factory.config.bash_timeout_s,
        )

    def _tool(self, name: str, args: dict[str, Any]) -> str:
        refused = self._refuse_after_submit()
        if refused:
            return self._record(name, args, refused)
        res = self._toolbox().call(name, args)
        text = res.text if res.ok else f"Error: {res.text}"
        return self._record(name, args, self._cap(text))

    def Bash(self, command: str) -> str:
        """Run a shell command in the kernel workspace (e.g. python utils/compile.py).

        Args:
            command: The shell command line, run in the workspace directory.

        Returns:
            The command's output (stdout, then stderr; long output cut in the middle) and its exit code.
        """
        return self._tool("Bash", {"command": command})

    def Read(self, path: str) -> str:
        """Read a workspace file, with line numbers.

        Args:
            path: The file's path relative to the workspace, e.g. model.py.

        Returns:
            The file's lines, numbered.
        """
        return self._tool("Read", {"path": path})

    def Write(self, path: str, content: str) -> str:
        """Create or overwrite a workspace file (model_new.py or a file under kernels/).

        Args:
            path: The file's path relative to the workspace.
            content: The whole new text of the file.

        Returns:
            What was written, or why nothing was.
        """
        return self._tool("Write", {"path": path, "content": content})

    def Edit(self, path: str, old_string: str, new_string: str) -> str:
        """Replace one occurrence of old_string by new_string in a workspace file.

        Args:
            path: The file's path relative to the workspace.
            old_string: The exact text to replace; it must occur exactly once.
            new_string: The text to put in its place.

        Returns:
            What was changed, or why nothing was.
        """
        return self._tool(
            "Edit", {"path": path, "old_string": old_string, "new_string": new_string}
        )

    def _make(self, task: Task) -> Path:
        env = self._factory.sandbox_env
        assert env is not None
        root = self._factory.workdir / f"env{self._index:03d}-{self._episodes:05d}-{task.id}"
        if root.exists():
            shutil.rmtree(root)
        return env.make_workspace(task, root)

    def _drop(self) -> None:
        if self._ep is not None and not self._factory.config.keep_workspaces:
            shutil.rmtree(self._ep.workspace, ignore_errors=True)
        self._ep = None

    def _evaluation(self) -> Future[EvalResult] | None:
        from cuda_agent.sandbox.workspace import solution_from_workspace

        ep = self._episode()
        sol = solution_from_workspace(ep.workspace, origin="trl:workspace")
        if "model_new.py" not in sol.files:
            return None
        env = self._factory.sandbox_env
        assert env is not None
        return env.submit(Candidate(task=ep.task, solution=sol))


class ServiceWorkspaceEnv(_WorkspaceEnv):
    """A workspace of the HTTP service per rollout: ``Bash`` (``POST /v1/workspaces/{id}/bash``)
    and ``Submit``; the file tools are not offered (the workspace is on the service's host: read
    and write files with shell commands)."""

    def Bash(self, command: str) -> str:
        """Run a shell command in the kernel workspace (e.g. python utils/compile.py).

        Args:
            command: The shell command line, run in the workspace directory.

        Returns:
            The command's output (stdout, then stderr; long output cut in the middle) and its exit code.
        """
        args = {"command": command}
        refused = self._refuse_after_submit()
        if refused:
            return self._record("Bash", args, refused)
        ev = self._factory.service
        assert ev is not None
        out = ev.client.bash(
            self._episode().workspace, command, timeout_s=self._factory.config.bash_timeout_s
        )
        status = "timed out" if out.timed_out else f"exit code {out.exit_code}"
        return self._record("Bash", args, f"{self._cap(out.output)}\n[{status}]")

    def _make(self, task: Task) -> str:
        ev = self._factory.service
        assert ev is not None
        return ev.client.create_workspace(task)

    def _drop(self) -> None:
        if self._ep is not None and self._factory.service is not None:
            # gone already, or the service stopped: nothing left to remove
            with contextlib.suppress(Exception):
                self._factory.service.client.delete_workspace(self._ep.workspace)
        self._ep = None

    def _evaluation(self) -> Future[EvalResult] | None:
        ev = self._factory.service
        assert ev is not None
        return ev.submit_workspace(self._episode().workspace)


class WorkspaceEnvFactory:
    """TRL's ``environment_factory``: ``factory()`` makes one environment (TRL makes one per
    concurrent rollout and reuses them, calling ``reset`` per rollout). Make it with
    :meth:`local` (workspaces on this host, evaluated by the ``SandboxEnv``'s pool) or
    :meth:`over_service` (workspaces of a ``kernel-service``). :meth:`reward` is the reward
    function that scores the rollouts' workspaces; :meth:`close` removes every workspace made."""

    def __init__(
        self,
        *,
        sandbox_env: SandboxEnv | None = None,
        workdir: str | Path | None = None,
        service: ServiceEvaluator | None = None,
        config: WorkspaceEnvConfig | None = None,
        task_column: str = "task",
    ):
        if (sandbox_env is None) == (service is None):
            raise ValueError("give either sandbox_env (with workdir) or service")
        if sandbox_env is not None and workdir is None:
            raise ValueError("a local environment needs a workdir for its workspaces")
        self.sandbox_env = sandbox_env
        self.service = service
        self.workdir = Path(workdir) if workdir is not None else Path()
        self.config = config or WorkspaceEnvConfig()
        self.task_column = task_column
        self.envs: list[_WorkspaceEnv] = []
        self._made = 0  # environments made so far (their indexes name their workspaces)
        self._lock = threading.Lock()
        if sandbox_env is not None:
            from cuda_agent.sandbox.execute import check_workspace_reachable

            self.workdir.mkdir(parents=True, exist_ok=True)
            check_workspace_reachable(self.workdir / "probe")
        weakref.finalize(self, WorkspaceEnvFactory._close_envs, self.envs)

    @classmethod
    def local(
        cls, sandbox_env: SandboxEnv, workdir: str | Path, config: WorkspaceEnvConfig | None = None
    ) -> WorkspaceEnvFactory:
        """Environments whose workspaces live under ``workdir`` (it must be reachable by the
        sandbox's unprivileged uids when run as root), with ``sandbox_env``'s confinement and
        evaluation pool."""
        return cls(sandbox_env=sandbox_env, workdir=workdir, config=config)

    @classmethod
    def over_service(
        cls, service: ServiceEvaluator | ServiceClient, config: WorkspaceEnvConfig | None = None
    ) -> WorkspaceEnvFactory:
        """Environments whose workspaces are the service's (at most its ``--max-workspaces`` at
        once: TRL holds one per rollout of a generation batch)."""
        ev = service if isinstance(service, ServiceEvaluator) else ServiceEvaluator(service)
        return cls(service=ev, config=config)

    @property
    def backend(self) -> str:
        if self.sandbox_env is not None:
            return self.sandbox_env.backend
        assert self.service is not None
        return self.service.backend

    def __call__(self) -> _WorkspaceEnv:
        with self._lock:
            cls = KernelWorkspaceEnv if self.sandbox_env is not None else ServiceWorkspaceEnv
            env = cls(self, self._made)
            self._made += 1
            self.envs.append(env)
            return env

    def release(self, env: _WorkspaceEnv) -> None:
        """Remove ``env``'s workspace and forget ``env`` (for trainers that make one environment
        per rollout and never reuse it, e.g. OpenRLHF's agent instances)."""
        with env._lock:
            env._drop()
        with self._lock:
            if env in self.envs:
                self.envs.remove(env)

    def reward(
        self,
        *,
        reward: RewardConfig | None = None,
        results_path: str | Path | None = None,
        name: str = "kernel_workspace_reward",
    ) -> WorkspaceReward:
        """The reward function for these environments' rollouts."""
        return WorkspaceReward(self, reward=reward, results_path=results_path, name=name)

    @staticmethod
    def _close_envs(envs: list[_WorkspaceEnv]) -> None:
        for env in envs:
            with env._lock:
                env._drop()

    def close(self) -> None:
        """Remove every workspace these environments hold (the sandbox env / service is the
        caller's to close)."""
        self._close_envs(self.envs)


class WorkspaceReward:
    """The reward function of a :class:`WorkspaceEnvFactory`'s rollouts, called by TRL with the
    rollouts' ``environments``: every workspace's solution (``model_new.py`` and ``kernels/``) is
    submitted for evaluation at once and waited for, then scored as :class:`KernelReward` does.
    A workspace without ``model_new.py`` gets the failure reward without evaluation; an evaluation
    that raises is an ``infra_error`` (failure reward). Records as :class:`KernelReward` writes
    them (``meta.trl``: step, completion index, tool calls, submitted)."""

    def __init__(
        self,
        factory: WorkspaceEnvFactory,
        *,
        reward: RewardConfig | None = None,
        results_path: str | Path | None = None,
        name: str = "kernel_workspace_reward",
    ):
        self.factory = factory
        self.__name__ = name
        self._scorer = _Scorer(reward or RewardConfig(), results_path, name)

    @property
    def last(self) -> list[Scored]:
        """The outcomes of the latest call, in completion order."""
        return self._scorer.last

    @property
    def calls(self) -> int:
        return self._scorer.calls

    def __call__(
        self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] = (), **kwargs: Any
    ) -> list[float]:
        t0 = time.monotonic()
        envs = kwargs.get("environments")
        if envs is None or len(envs) != len(completions):
            raise ValueError(
                f"{self.__name__}: needs TRL's `environments` (GRPOTrainer(environment_factory="
                f"<the WorkspaceEnvFactory>)), one per completion"
            )
        scored: list[Scored] = []
        started: dict[int, tuple[Future[EvalResult], Task, str]] = {}
        for i, env in enumerate(envs):
            ep = getattr(env, "_ep", None)
            if not isinstance(env, _WorkspaceEnv) or ep is None:
                scored.append(self._scorer.unevaluated(i, "not evaluated: no workspace", "no_task"))
                continue
            try:
                fut = env._evaluation()
            except Exception as e:  # noqa: BLE001 - recorded as infra_error
                fut = Future()
                fut.set_exception(e)
            if fut is None:
                why = "not evaluated: the workspace has no model_new.py"
                scored.append(self._scorer.unevaluated(i, why, "unparsed"))
                continue
            started[i] = (fut, ep.task, "workspace")
        step = _step(kwargs)
        for i, res in _gather(started, lambda: _backend_of(self.factory)).items():
            ep = envs[i]._ep
            meta = {
                "step": step,
                "completion": i,
                "submitted": ep.submitted,
                "tool_calls": [name for name, _, _ in ep.tool_calls],
            }
            scored.append(self._scorer.evaluated(i, res, meta))
        return self._scorer.report(scored, kwargs, time.monotonic() - t0)

    def close(self) -> None:
        """Close the results file."""
        self._scorer.close()


def tool_calls_of(env: Any) -> list[tuple[str, dict[str, Any], str]]:
    """The tool calls of an environment's current rollout: ``[(tool, arguments, result)]``."""
    ep = getattr(env, "_ep", None)
    return list(ep.tool_calls) if ep is not None else []


def workspace_of(env: Any) -> Any:
    """The workspace of an environment's current rollout: a local ``Path`` or a service
    workspace id; ``None`` before ``reset`` and after :meth:`WorkspaceEnvFactory.close`."""
    ep = getattr(env, "_ep", None)
    return ep.workspace if ep is not None else None
