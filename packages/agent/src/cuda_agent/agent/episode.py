"""Episodes: the ReAct loop (multi-turn) and one-shot generation (single-turn), token-exact.

The trajectory is assembled as token ids, never re-tokenised from text: the prompt's ids, then
per turn the policy's sampled ids (``loss_mask`` 1, rollout log-probs kept) and the observation's
ids (mask 0, log-prob 0). Observation text is rendered with the tokenizer's own chat template, by
rendering the turn boundary once around a sentinel, so any ChatML-like template works.

Episodes of one batch run in lock-step: one batched generation (token-level policies) or one
concurrent request per live episode (API policies) per turn; then the tool calls of the different
episodes run in parallel (``EpisodeConfig.tool_workers`` threads; one episode's calls stay in
order); the final evaluations are submitted together once the batch has stopped (through the
environment's ``submit``, i.e. one shared ``SandboxPool``) and collected as they finish. A failure
of one episode (its policy request, a tool, its workspace or its evaluation raising) ends that
episode only: it is recorded in ``meta["error"]`` (see :func:`episode_error`) and the others go on.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from cuda_agent.records import (
    Candidate,
    EvalResult,
    Message,
    Solution,
    Status,
    Task,
    ToolCall,
    Trajectory,
    content_id,
)

from .openai_policy import ChatReply
from .policy import Generation, TokenPolicy
from .prompts import single_turn_prompt, system_prompt, task_prompt, tool_response
from .solution_parse import parse_files
from .toolcalls import ParsedCall, ToolCallError, parse_tool_calls
from .tools import TOOL_SCHEMAS, BashOutput, Toolbox, check_tool_names


class Environment(Protocol):
    """What an episode needs from the sandbox. An environment may also have
    ``submit(candidate) -> Future[EvalResult]`` (``SandboxEnv`` does: its shared ``SandboxPool``);
    the runner then evaluates a batch's episodes concurrently, else one ``evaluate`` at a time.
    ``bash`` may be called from several threads at once (different workspaces)."""

    backend: str
    protected: tuple[str, ...]

    def make_workspace(self, task: Task, root: Path) -> Path: ...

    def bash(self, root: Path, command: str, timeout: float) -> BashOutput: ...

    def evaluate(self, candidate: Candidate) -> EvalResult: ...


@dataclass
class EpisodeConfig:
    mode: Literal["multi-turn", "single-turn"] = "multi-turn"
    max_turns: int = 200
    max_context_tokens: int = 131_072
    max_new_tokens: int = 4096  # per turn
    max_policy_tokens: int | None = None  # per episode
    bash_timeout: float = 300.0  # seconds a Bash tool call may run
    max_idle_turns: int = 3  # consecutive turns with no tool call before stopping
    evaluate: bool = True
    include_skill: bool = (
        True  # SKILL.md in the prompt (False: an ablation, and short test prompts)
    )
    tool_workers: int = 8  # threads running the tool calls of different episodes (1: serially)
    request_workers: int = 16  # concurrent requests of an API policy (one per live episode)
    tools: tuple[str, ...] | None = None  # the tools offered (prompt and calls); None: all

    def __post_init__(self) -> None:
        if self.tools is not None:
            self.tools = check_tool_names(self.tools, "EpisodeConfig.tools")


@dataclass
class _Ep:
    task: Task
    sample: int
    root: Path
    toolbox: Toolbox
    messages: list[Message]
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    calls: list[ToolCall] = field(default_factory=list)
    counters: Counter = field(default_factory=Counter)
    timings: Counter = field(default_factory=Counter)
    stop: str = ""
    last_action: str | None = None
    idle: int = 0
    turn: int = 0
    api_messages: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, str] | None = None  # what ended the episode by raising (episode_error)

    def add(
        self, ids: Sequence[int], policy: bool, logprobs: Sequence[float] | None = None
    ) -> None:
        self.ids.extend(ids)
        self.mask.extend([1 if policy else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


@dataclass
class _Turn:
    """One episode's turn between its generation and its observation."""

    calls: list[ParsedCall | ToolCallError]
    native: set[str] = field(default_factory=set)  # ids of native tool calls (API policies)
    results: list[tuple[str, str]] = field(default_factory=list)  # (call id, result text)


def turn_boundary(tokenizer: Any, observation: str) -> str:
    """Text between an assistant turn's end-of-turn token and the next assistant turn's content,
    with ``observation`` as the user/tool message in between (rendered by the chat template)."""
    sentinel = "\x00SENTINEL\x00"
    msgs = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": sentinel},
        {"role": "user", "content": observation},
    ]
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    after = text[text.index(sentinel) + len(sentinel) :]
    eot = tokenizer.decode([_eot_id(tokenizer)])
    if not after.startswith(eot):
        raise ValueError("chat template does not end an assistant turn with its end-of-turn token")
    return after[len(eot) :]


def _eot_id(tokenizer: Any) -> int:
    from .policy import end_of_turn_ids

    return end_of_turn_ids(tokenizer)[0]


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def trajectory_id(task: Task, policy_name: str, sample: int, mode: str) -> str:
    """The id (and ``--resume`` key) of one episode."""
    return content_id(task.id, policy_name, str(sample), mode)


class EpisodeRunner:
    """Runs batches of episodes of one policy in one environment."""

    def __init__(self, policy: TokenPolicy, env: Environment, cfg: EpisodeConfig, workdir: Path):
        self.policy = policy
        self.env = env
        self.cfg = cfg
        self.workdir = Path(workdir)
        self.tok = policy.tokenizer
        self.token_level = getattr(policy, "token_level", True)

    # ------------------------------------------------------------------ setup
    def _tool_schemas(self) -> list[dict[str, Any]] | None:
        """The schemas of the offered tools (``None``: all of them)."""
        if self.cfg.tools is None:
            return None
        return [s for s in TOOL_SCHEMAS if s["function"]["name"] in self.cfg.tools]

    def _start(self, task: Task, sample: int, index: int) -> _Ep:
        root = self.workdir / f"{index:04d}-{task.id}-{sample}"
        root = self.env.make_workspace(task, root)
        skill = (root / "SKILL.md").read_text() if (root / "SKILL.md").is_file() else ""
        if not self.cfg.include_skill:
            skill = "You write fast kernels for PyTorch programs."
        if self.cfg.mode == "single-turn":
            chat = single_turn_prompt(task.name, task.ref_code, skill, self.env.backend)
        else:
            chat = [
                {"role": "system", "content": system_prompt(skill, self._tool_schemas())},
                {"role": "user", "content": task_prompt(task.name, task.ref_code)},
            ]
        tb = Toolbox(
            root,
            bash=self.env.bash,
            protected=self.env.protected,
            bash_timeout=self.cfg.bash_timeout,
            allowed=self.cfg.tools,
        )
        msgs = [Message(role=m["role"], content=m["content"]) for m in chat]
        ep = _Ep(task, sample, root, tb, msgs, [], [], [], api_messages=[dict(m) for m in chat])
        if self.token_level:
            text = self.tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            ids = _encode(self.tok, text)
            ep.add(ids, policy=False)
            ep.counters["prompt_tokens"] = len(ids)
        return ep

    # ------------------------------------------------------------------ turns
    def _budget_stop(self, ep: _Ep) -> str | None:
        if ep.turn >= (1 if self.cfg.mode == "single-turn" else self.cfg.max_turns):
            return "max_turns"
        if self.token_level and len(ep.ids) + self.cfg.max_new_tokens > self.cfg.max_context_tokens:
            return "context_overflow"
        if self.cfg.max_policy_tokens is not None and sum(ep.mask) >= self.cfg.max_policy_tokens:
            return "policy_token_limit"
        return None

    def _begin(self, ep: _Ep, gen: Generation) -> _Turn | None:
        """A token-level turn, up to its tool calls: record the policy's tokens and parse its calls
        (``None``: no calls to run, the single-turn mode)."""
        ep.turn += 1
        ep.counters["turns"] += 1
        ep.add(gen.token_ids, policy=True, logprobs=gen.logprobs)
        ep.counters["policy_tokens"] += len(gen.token_ids)
        text = self.tok.decode(gen.token_ids, skip_special_tokens=True)
        ep.messages.append(Message(role="assistant", content=text))
        if gen.finish != "stop":
            # the turn was cut by the per-turn limit: close it (not a policy token)
            ep.add([_eot_id(self.tok)], policy=False)
            ep.counters["truncated_turns"] += 1
        if self.cfg.mode == "single-turn":
            self._write_single_turn(ep, text)
            return None
        return _Turn(parse_tool_calls(text).calls)

    def _end(self, ep: _Ep, turn: _Turn) -> None:
        """The rest of a token-level turn: append the observation of its calls' results."""
        if ep.stop:
            return
        obs = tool_response([r for _, r in turn.results])
        ep.messages.append(Message(role="user", content=obs))
        obs_ids = _encode(self.tok, turn_boundary(self.tok, obs))
        ep.add(obs_ids, policy=False)
        ep.counters["observation_tokens"] += len(obs_ids)

    def _begin_text(self, ep: _Ep, reply: ChatReply) -> _Turn | None:
        """A turn of a text-level policy (native tool calls, no token ids), up to its calls."""
        ep.turn += 1
        ep.counters["turns"] += 1
        for k in ("prompt_tokens", "completion_tokens"):
            ep.counters[f"api_{k}"] += int(reply.usage.get(k, 0))
        ep.messages.append(Message(role="assistant", content=reply.content))
        if self.cfg.mode == "single-turn":
            ep.api_messages.append({"role": "assistant", "content": reply.content})
            self._write_single_turn(ep, reply.content)
            return None
        calls: list[ParsedCall | ToolCallError] = []
        for c in reply.tool_calls:
            if "error" in c:
                calls.append(ToolCallError(c["error"], json.dumps(c), id=c["id"]))
            else:
                calls.append(ParsedCall(c["name"], c["arguments"], json.dumps(c), id=c["id"]))
        if not calls:  # models without native tool calling may still write them as text
            calls = parse_tool_calls(reply.content).calls
        api_calls = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}))},
            }
            for c in reply.tool_calls
        ]
        amsg: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if api_calls:
            amsg["tool_calls"] = api_calls
        ep.api_messages.append(amsg)
        return _Turn(calls, native={c["id"] for c in reply.tool_calls})

    def _end_text(self, ep: _Ep, turn: _Turn) -> None:
        """The rest of a text-level turn: the calls' results as tool (or user) messages."""
        if ep.stop:
            return
        loose = []
        for cid, text in turn.results:
            if cid in turn.native:
                ep.api_messages.append({"role": "tool", "tool_call_id": cid, "content": text})
                ep.messages.append(Message(role="tool", content=text, tool_call_id=cid))
            else:
                loose.append(text)
        if loose:
            obs = tool_response(loose)
            ep.api_messages.append({"role": "user", "content": obs})
            ep.messages.append(Message(role="user", content=obs))

    def _write_single_turn(self, ep: _Ep, text: str) -> None:
        files, problems = parse_files(text)
        for f, body in files.items():
            p = ep.root / f
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(body)
        ep.counters["files_written"] += len(files)
        ep.counters["format_problems"] += len(problems)
        ep.stop = "single_turn"

    def _run_calls(self, ep: _Ep, calls: list[ParsedCall | ToolCallError]) -> list[tuple[str, str]]:
        """Execute one turn's calls in order; ``[(call id, result text)]``. Sets ``ep.stop`` on
        Submit or after too many turns without a call."""
        results: list[tuple[str, str]] = []
        if not calls:
            ep.idle += 1
            ep.counters["turns_without_tool_call"] += 1
            if ep.idle >= self.cfg.max_idle_turns:
                ep.stop = "no_tool_call"
                return results
            results.append(
                ("", "No tool call found. Call a tool (see the format above), or Submit.")
            )
        else:
            ep.idle = 0
        for k, call in enumerate(calls):
            t0 = time.monotonic()
            if not isinstance(call, ParsedCall):
                ep.counters["schema_violations"] += 1
                ep.calls.append(
                    ToolCall(turn=ep.turn, name="?", result=call.message, ok=False, error="parse")
                )
                results.append((call.id or f"bad_{k}", f"Error: {call.message}"))
                continue
            action = json.dumps([call.name, call.arguments], sort_keys=True)
            if action == ep.last_action:
                ep.counters["repeated_actions"] += 1
            ep.last_action = action
            try:
                res = ep.toolbox.call(call.name, call.arguments)
            except Exception as e:
                dt = time.monotonic() - t0
                ep.timings[f"tool_{call.name}_s"] += dt
                ep.counters["tool_calls"] += 1
                ep.counters[f"tool_{call.name}"] += 1
                ep.calls.append(
                    ToolCall(
                        turn=ep.turn,
                        name=call.name,
                        arguments=call.arguments,
                        result=f"{type(e).__name__}: {e}"[:4000],
                        ok=False,
                        error="raised",
                        seconds=round(dt, 3),
                    )
                )
                raise
            dt = time.monotonic() - t0
            ep.timings[f"tool_{call.name}_s"] += dt
            ep.counters["tool_calls"] += 1
            ep.counters[f"tool_{call.name}"] += 1
            if res.error == "schema":
                ep.counters["schema_violations"] += 1
            if not res.ok:
                ep.counters["tool_failures"] += 1
            ep.calls.append(
                ToolCall(
                    turn=ep.turn,
                    name=call.name,
                    arguments=call.arguments,
                    result=res.text[:4000],
                    ok=res.ok,
                    error=res.error,
                    seconds=round(dt, 3),
                )
            )
            results.append((call.id, res.text if res.ok else f"Error: {res.text}"))
            if res.submit:
                ep.stop = "submit"
                break
        return results

    # ------------------------------------------------------------------ end
    def _fail(self, ep: _Ep, stage: str, exc: BaseException) -> None:
        """End ``ep`` because ``stage`` raised ``exc`` (the first failure is the one kept)."""
        ep.counters["errors"] += 1
        if ep.error is None:
            ep.error = {"stage": stage, "type": type(exc).__name__, "message": str(exc)[:2000]}
        if stage != "eval":
            ep.stop = "error"

    def _evaluate_all(self, eps: list[_Ep], sols: list[Solution]) -> list[EvalResult | None]:
        """The final evaluations of ``eps``, submitted together and collected as each finishes; one
        that raised becomes an ``infra_error`` result and the episode's error (stage ``eval``)."""
        results: list[EvalResult | None] = [None] * len(eps)
        submit: Callable[[Candidate], Future[EvalResult]] | None = getattr(self.env, "submit", None)
        serial: ThreadPoolExecutor | None = None
        started: dict[Future[EvalResult], tuple[int, float]] = {}
        try:
            for i, (ep, sol) in enumerate(zip(eps, sols, strict=True)):
                if not self.cfg.evaluate or ep.error or "model_new.py" not in sol.files:
                    continue
                cand = Candidate(task=ep.task, solution=sol)
                t0 = time.monotonic()
                try:
                    if submit is not None:
                        fut = submit(cand)
                    else:  # an environment without a pool: one evaluation at a time
                        serial = serial or ThreadPoolExecutor(1, thread_name_prefix="agent-eval")
                        fut = serial.submit(self.env.evaluate, cand)
                except Exception as e:  # noqa: BLE001 - recorded on the episode
                    fut = Future()
                    fut.set_exception(e)
                started[fut] = (i, t0)
            for fut in as_completed(started):
                i, t0 = started[fut]
                eps[i].timings["eval_s"] += time.monotonic() - t0
                try:
                    results[i] = fut.result()
                except Exception as e:  # noqa: BLE001 - recorded on the episode
                    self._fail(eps[i], "eval", e)
                    results[i] = EvalResult(
                        task_id=eps[i].task.id,
                        solution_id=sols[i].id,
                        backend="cuda" if self.env.backend == "cuda" else "cpu",
                        device="",
                        status=Status.INFRA_ERROR,
                        message=f"sandbox error: {type(e).__name__}: {e}"[:2000],
                        meta={"raised": True},
                    )
        finally:
            if serial is not None:
                serial.shutdown(wait=True)
        return results

    def _finish_all(self, eps: list[_Ep]) -> list[Trajectory]:
        from cuda_agent.reward import apply
        from cuda_agent.sandbox.workspace import solution_from_workspace

        origin = f"agent:{self.policy.name}"
        sols = []
        for ep in eps:
            try:
                sols.append(solution_from_workspace(ep.root, origin=origin))
            except Exception as e:  # noqa: BLE001 - recorded on the episode
                self._fail(ep, "workspace", e)
                sols.append(Solution.make("workdir", {}, origin=origin))
        results = self._evaluate_all(eps, sols)
        out = []
        for ep, sol, result in zip(eps, sols, results, strict=True):
            tid = trajectory_id(ep.task, self.policy.name, ep.sample, self.cfg.mode)
            meta: dict[str, Any] = {
                "token_exact": self.token_level,
                "mode": self.cfg.mode,
                "policy": self.policy.name,
                "sample": ep.sample,
                "seconds": {k: round(v, 3) for k, v in ep.timings.items()},
                "workspace": str(ep.root),
            }
            if ep.error is not None:
                meta["error"] = ep.error
            traj = apply(
                Trajectory(
                    id=tid,
                    task=ep.task,
                    messages=ep.messages,
                    token_ids=ep.ids,
                    loss_mask=ep.mask,
                    logprobs=ep.logprobs,
                    tool_calls=ep.calls,
                    solution=sol if sol.files else None,
                    eval_result=result,
                    stop_reason=ep.stop,
                    counters=dict(ep.counters),
                    meta=meta,
                )
            )
            if ep.error is not None and ep.error["stage"] != "eval":
                traj.reward_reason = f"episode error ({ep.error['stage']}): not evaluated"
            out.append(traj)
        return out

    def _start_or_fail(self, task: Task, sample: int, index: int) -> _Ep:
        try:
            return self._start(task, sample, index)
        except Exception as e:  # noqa: BLE001 - recorded on the episode
            root = self.workdir / f"{index:04d}-{task.id}-{sample}"
            ep = _Ep(task, sample, root, Toolbox(root), [], [], [], [])
            self._fail(ep, "workspace", e)
            return ep

    def _generate(self, eps: list[_Ep], live: list[int]) -> dict[int, Any]:
        """One turn's generation for the ``live`` episodes: ``{index: Generation | ChatReply |
        the exception that its request raised}``. A batched generation that raises fails every
        episode of the batch; an API request fails only its own episode."""
        t0 = time.monotonic()
        out: dict[int, Any] = {}
        if self.token_level:
            try:
                gens = self.policy.generate(
                    [eps[i].ids for i in live], self.cfg.max_new_tokens, keys=list(live)
                )
                out = dict(zip(live, gens, strict=True))
            except Exception as e:  # noqa: BLE001 - recorded on each episode
                out = dict.fromkeys(live, e)
        else:
            workers = max(1, min(len(live), self.cfg.request_workers))
            with ThreadPoolExecutor(workers, thread_name_prefix="agent-request") as pool:
                futs = {i: pool.submit(self.policy.chat, eps[i].api_messages) for i in live}
            for i, f in futs.items():
                e = f.exception()
                out[i] = e if e is not None else f.result()
        dt = time.monotonic() - t0
        for i in live:
            eps[i].timings["generate_s"] += dt / len(live)
        return out

    def _run_tools(
        self, eps: list[_Ep], turns: dict[int, _Turn], pool: ThreadPoolExecutor | None
    ) -> None:
        """Run each episode's calls (in order within it), different episodes' calls in parallel;
        a call that raises ends its episode (stage ``tool``)."""

        def work(i: int) -> None:
            turns[i].results = self._run_calls(eps[i], turns[i].calls)

        if pool is None or len(turns) < 2:
            for i in turns:
                try:
                    work(i)
                except Exception as e:  # noqa: BLE001 - recorded on the episode
                    self._fail(eps[i], "tool", e)
            return
        futs = {i: pool.submit(work, i) for i in turns}
        for i, f in futs.items():
            e = f.exception()
            if e is not None:
                self._fail(eps[i], "tool", e)

    def run(self, jobs: Sequence[tuple[Task, int]]) -> list[Trajectory]:
        """Run the episodes of ``jobs`` ((task, sample index) pairs) in lock-step: one batched
        generation per turn for all live episodes, their tool calls in parallel, their final
        evaluations submitted together at the end. Returns one trajectory per job, in job order,
        also for episodes that failed (``meta["error"]``); raises only for a bug of the runner."""
        eps = [self._start_or_fail(t, s, k) for k, (t, s) in enumerate(jobs)]
        live = [i for i, ep in enumerate(eps) if not ep.stop]
        begin = self._begin if self.token_level else self._begin_text
        end = self._end if self.token_level else self._end_text
        workers = max(1, min(self.cfg.tool_workers, len(eps)))
        pool = ThreadPoolExecutor(workers, thread_name_prefix="agent-tool") if workers > 1 else None
        try:
            while live:
                for i in list(live):
                    why = self._budget_stop(eps[i])
                    if why:
                        eps[i].stop = eps[i].stop or why
                        live.remove(i)
                if not live:
                    break
                turns: dict[int, _Turn] = {}
                for i, g in self._generate(eps, live).items():
                    if isinstance(g, BaseException):
                        self._fail(eps[i], "policy", g)
                        continue
                    try:
                        turn = begin(eps[i], g)
                    except Exception as e:  # noqa: BLE001 - an episode error ends that episode
                        self._fail(eps[i], "turn", e)
                        continue
                    if turn is not None and not eps[i].stop:
                        turns[i] = turn
                self._run_tools(eps, turns, pool)
                for i, turn in turns.items():
                    if eps[i].stop:
                        continue
                    try:
                        end(eps[i], turn)
                    except Exception as e:  # noqa: BLE001 - an episode error ends that episode
                        self._fail(eps[i], "turn", e)
                live = [i for i in live if not eps[i].stop]
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
        return self._finish_all(eps)


def episode_error(t: Trajectory) -> dict[str, str] | None:
    """What ended ``t``'s episode by raising: ``{"stage", "type", "message"}`` with stage one of
    ``workspace`` (its workspace could not be made or read), ``policy`` (the model request or
    generation), ``tool`` (a tool raised), ``turn`` (parsing or encoding the turn), ``eval`` (the
    final evaluation raised; ``eval_result`` is then an ``infra_error``); ``None`` for an episode
    that did not fail. A failed episode other than at ``eval`` has ``stop_reason == "error"`` and
    is not evaluated."""
    err = t.meta.get("error")
    return err if isinstance(err, dict) else None
