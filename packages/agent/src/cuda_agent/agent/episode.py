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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from cuda_agent.records import (
    Candidate,
    EvalResult,
    Message,
    Solution,
    Task,
    ToolCall,
    Trajectory,
    content_id,
)

from .policy import Generation, TokenPolicy
from .prompts import single_turn_prompt, system_prompt, task_prompt, tool_response
from .solution_parse import ALLOWED, parse_files
from .toolcalls import ParsedCall, parse_tool_calls
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


def workspace_solution(root: Path, origin: str) -> Solution:
    """The solution files (model_new.py, kernels/*) of a workspace."""
    files = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and ALLOWED.match(rel):
            files[rel] = p.read_text(errors="replace")
    return Solution.make("workdir", files, origin)


class EpisodeRunner:
    """Runs batches of episodes of one policy in one environment."""

    def __init__(self, policy: TokenPolicy, env: Environment, cfg: EpisodeConfig, workdir: Path):
        self.policy = policy
        self.env = env
        self.cfg = cfg
        self.workdir = Path(workdir)
        self.tok = policy.tokenizer

    # ------------------------------------------------------------------ setup
    def _start(self, task: Task, sample: int) -> _Ep:
        root = self.workdir / f"{task.id}-{sample}"
        root = self.env.make_workspace(task, root)
        skill = (root / "SKILL.md").read_text() if (root / "SKILL.md").is_file() else ""
        if self.cfg.mode == "single-turn":
            chat = single_turn_prompt(task.name, task.ref_code, skill, self.env.backend)
        else:
            chat = [
                {"role": "system", "content": system_prompt(skill)},
                {"role": "user", "content": task_prompt(task.name, task.ref_code)},
            ]
        text = self.tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        ids = _encode(self.tok, text)
        tb = Toolbox(
            root,
            bash=self.env.bash,
            protected=self.env.protected,
            bash_timeout=self.cfg.bash_timeout,
        )
        ep = _Ep(
            task,
            sample,
            root,
            tb,
            [Message(role=m["role"], content=m["content"]) for m in chat],
            [],
            [],
            [],
        )
        ep.add(ids, policy=False)
        ep.counters["prompt_tokens"] = len(ids)
        return ep

    # ------------------------------------------------------------------ turns
    def _budget_stop(self, ep: _Ep) -> str | None:
        if ep.turn >= (1 if self.cfg.mode == "single-turn" else self.cfg.max_turns):
            return "max_turns"
        if len(ep.ids) + self.cfg.max_new_tokens > self.cfg.max_context_tokens:
            return "context_overflow"
        if self.cfg.max_policy_tokens is not None and sum(ep.mask) >= self.cfg.max_policy_tokens:
            return "policy_token_limit"
        return None

    def _act(self, ep: _Ep, gen: Generation) -> None:
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
            files, problems = parse_files(text)
            for f, body in files.items():
                p = ep.root / f
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(body)
            ep.counters["files_written"] += len(files)
            ep.counters["format_problems"] += len(problems)
            ep.stop = "single_turn"
            return
        parsed = parse_tool_calls(text)
        results: list[str] = []
        if not parsed.calls:
            ep.idle += 1
            ep.counters["turns_without_tool_call"] += 1
            if ep.idle >= self.cfg.max_idle_turns:
                ep.stop = "no_tool_call"
                return
            results.append("No tool call found. Call a tool (see the format above), or Submit.")
        else:
            ep.idle = 0
        for call in parsed.calls:
            t0 = time.monotonic()
            if not isinstance(call, ParsedCall):
                ep.counters["schema_violations"] += 1
                ep.calls.append(
                    ToolCall(turn=ep.turn, name="?", result=call.message, ok=False, error="parse")
                )
                results.append(f"Error: {call.message}")
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
            results.append(res.text if res.ok else f"Error: {res.text}")
            if res.submit:
                ep.stop = "submit"
                break
        if ep.stop:
            return
        obs = tool_response(results)
        ep.messages.append(Message(role="user", content=obs))
        obs_ids = _encode(self.tok, turn_boundary(self.tok, obs))
        ep.add(obs_ids, policy=False)
        ep.counters["observation_tokens"] += len(obs_ids)

    # ------------------------------------------------------------------ end
    def _finish(self, ep: _Ep) -> Trajectory:
        from cuda_agent.reward import apply

        sol = workspace_solution(ep.root, origin=f"agent:{self.policy.name}")
        result = None
        t0 = time.monotonic()
        if self.cfg.evaluate and "model_new.py" in sol.files:
            result = self.env.evaluate(Candidate(task=ep.task, solution=sol))
        ep.timings["eval_s"] += time.monotonic() - t0
        tid = content_id(ep.task.id, self.policy.name, str(ep.sample), self.cfg.mode)
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
        eps = [self._start(t, s) for t, s in jobs]
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
            gens = self.policy.generate(
                [eps[i].ids for i in live], self.cfg.max_new_tokens, keys=list(live)
            )
            dt = time.monotonic() - t0
            for i, g in zip(list(live), gens, strict=True):
                eps[i].timings["generate_s"] += dt / len(gens)
                self._act(eps[i], g)
                if eps[i].stop:
                    live.remove(i)
        return [self._finish(ep) for ep in eps]
