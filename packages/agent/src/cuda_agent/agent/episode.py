"""Episodes: the ReAct loop (multi-turn) and one-shot generation (single-turn), token-exact.

The trajectory is assembled as token ids, never re-tokenised from text: the prompt's ids, then
per turn the policy's sampled ids (``loss_mask`` 1, rollout log-probs kept) and the observation's
ids (mask 0, log-prob 0). Observation text is rendered with the tokenizer's own chat template, by
rendering the turn boundary once around a sentinel, so any ChatML-like template works.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from cuda_agent.records import (
    Candidate,
    EvalResult,
    Message,
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
from .tools import BashOutput, Toolbox


class Environment(Protocol):
    """What an episode needs from the sandbox."""

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
    bash_timeout: float = 300.0
    max_idle_turns: int = 3  # consecutive turns with no tool call before stopping
    evaluate: bool = True
    include_skill: bool = (
        True  # SKILL.md in the prompt (False: an ablation, and short test prompts)
    )


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

    def add(
        self, ids: Sequence[int], policy: bool, logprobs: Sequence[float] | None = None
    ) -> None:
        self.ids.extend(ids)
        self.mask.extend([1 if policy else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


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
                {"role": "system", "content": system_prompt(skill)},
                {"role": "user", "content": task_prompt(task.name, task.ref_code)},
            ]
        tb = Toolbox(
            root,
            bash=self.env.bash,
            protected=self.env.protected,
            bash_timeout=self.cfg.bash_timeout,
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

    def _act(self, ep: _Ep, gen: Generation) -> None:
        """A token-level turn: record the policy's tokens, run its calls, append the observation."""
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
            return
        results = self._run_calls(ep, parse_tool_calls(text).calls)
        if ep.stop:
            return
        obs = tool_response([r for _, r in results])
        ep.messages.append(Message(role="user", content=obs))
        obs_ids = _encode(self.tok, turn_boundary(self.tok, obs))
        ep.add(obs_ids, policy=False)
        ep.counters["observation_tokens"] += len(obs_ids)

    def _act_text(self, ep: _Ep, reply: ChatReply) -> None:
        """A turn of a text-level policy (native tool calls, no token ids)."""
        ep.turn += 1
        ep.counters["turns"] += 1
        for k in ("prompt_tokens", "completion_tokens"):
            ep.counters[f"api_{k}"] += int(reply.usage.get(k, 0))
        ep.messages.append(Message(role="assistant", content=reply.content))
        if self.cfg.mode == "single-turn":
            ep.api_messages.append({"role": "assistant", "content": reply.content})
            self._write_single_turn(ep, reply.content)
            return
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
        results = self._run_calls(ep, calls)
        if ep.stop:
            return
        native = {c["id"] for c in reply.tool_calls}
        loose = []
        for cid, text in results:
            if cid in native:
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
            res = ep.toolbox.call(call.name, call.arguments)
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
    def _finish(self, ep: _Ep) -> Trajectory:
        from cuda_agent.reward import apply
        from cuda_agent.sandbox.workspace import solution_from_workspace

        sol = solution_from_workspace(ep.root, origin=f"agent:{self.policy.name}")
        result = None
        t0 = time.monotonic()
        if self.cfg.evaluate and "model_new.py" in sol.files:
            result = self.env.evaluate(Candidate(task=ep.task, solution=sol))
        ep.timings["eval_s"] += time.monotonic() - t0
        tid = trajectory_id(ep.task, self.policy.name, ep.sample, self.cfg.mode)
        traj = Trajectory(
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
            meta={
                "token_exact": self.token_level,
                "mode": self.cfg.mode,
                "policy": self.policy.name,
                "sample": ep.sample,
                "seconds": {k: round(v, 3) for k, v in ep.timings.items()},
                "workspace": str(ep.root),
            },
        )
        return apply(traj)

    def run(self, jobs: Sequence[tuple[Task, int]]) -> list[Trajectory]:
        """Run the episodes of ``jobs`` ((task, sample index) pairs) in lock-step batches: one
        batched generation per turn for all live episodes. Returns trajectories in job order."""
        eps = [self._start(t, s, k) for k, (t, s) in enumerate(jobs)]
        live = list(range(len(eps)))
        while live:
            for i in list(live):
                why = self._budget_stop(eps[i])
                if why:
                    eps[i].stop = eps[i].stop or why
                    live.remove(i)
            if not live:
                break
            t0 = time.monotonic()
            if self.token_level:
                gens = self.policy.generate(
                    [eps[i].ids for i in live], self.cfg.max_new_tokens, keys=list(live)
                )
            else:
                with ThreadPoolExecutor(max_workers=min(len(live), 16)) as pool:
                    gens = list(pool.map(lambda i: self.policy.chat(eps[i].api_messages), live))
            dt = time.monotonic() - t0
            for i, g in zip(list(live), gens, strict=True):
                eps[i].timings["generate_s"] += dt / len(gens)
                try:
                    (self._act if self.token_level else self._act_text)(eps[i], g)
                except Exception as e:  # noqa: BLE001 - an episode error ends that episode only
                    eps[i].stop = "error"
                    eps[i].counters["errors"] += 1
                    eps[i].messages.append(
                        Message(role="user", content=f"[episode error] {type(e).__name__}: {e}")
                    )
                if eps[i].stop:
                    live.remove(i)
        return [self._finish(ep) for ep in eps]
