"""Rejection sampling rules: which agent trajectories are good enough to imitate.

The paper keeps trajectories with reward > 0 and drops those with inefficient or invalid
behaviour. Each rule returns a stable reason code; :func:`drop_reason` applies them in order and
returns the first that fires (``None`` = keep).

Reason codes, in the order they are checked: ``no_tokens``, ``malformed``, ``no_reward``,
``low_reward``, ``episode_error``, ``truncated``, ``schema_violation``, ``repeated_write``,
``repeated_tool_call``.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field

import msgspec

from cuda_agent.records import Trajectory

# stop reasons that mean the episode was cut short by the context or token budget
TRUNCATION_STOP_REASONS = (
    "context_overflow",
    "policy_token_limit",
    "truncated",
    "length",
    "max_tokens",
)
# stop reasons of an episode that broke down
ERROR_STOP_REASONS = ("error",)
# counters the agent keeps for tool calls that broke the tool schema
SCHEMA_COUNTERS = (
    "schema_violations",
    "tool_schema_errors",
    "tool_parse_errors",
    "invalid_tool_calls",
    "unknown_tools",
)
# tools whose arguments carry whole file contents (``path`` + ``content``)
WRITE_TOOLS = ("Write",)


@dataclass(frozen=True)
class SelectConfig:
    """Thresholds of the selection rules (the defaults are the CLI's)."""

    min_reward: float = 0.0  # keep reward > min_reward
    max_same_call: int = 3  # an identical tool call (name + arguments) at most this many times
    max_same_write: int = 2  # identical content written to one path at most this many times
    max_schema_violations: int = 0  # summed over ``schema_counters``
    max_truncated_turns: int = 0  # turns cut by the per-turn token limit (counter)
    error_stop_reasons: tuple[str, ...] = ERROR_STOP_REASONS  # stop reasons that drop an episode
    truncation_stop_reasons: tuple[str, ...] = TRUNCATION_STOP_REASONS
    schema_counters: tuple[str, ...] = SCHEMA_COUNTERS  # counters of malformed tool calls
    write_tools: tuple[str, ...] = WRITE_TOOLS  # tools whose writes max_same_write counts


class Drop(msgspec.Struct, kw_only=True, tag_field="kind", tag="rft_drop"):
    """One dropped trajectory and why (the lines of ``rft select --dropped FILE``)."""

    id: str
    task_id: str
    reason: str
    detail: str = ""
    reward: float | None = None


@dataclass
class SelectStats:
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        total = self.kept + sum(self.dropped.values())
        parts = [f"kept {self.kept}/{total}"]
        parts += [f"{r} {n}" for r, n in sorted(self.dropped.items(), key=lambda x: -x[1])]
        return "rft select: " + ", ".join(parts)


def _call_key(name: str, arguments: dict) -> str:
    blob = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    return name + ":" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def drop_reason(t: Trajectory, cfg: SelectConfig = SelectConfig()) -> tuple[str, str] | None:
    """``(reason, detail)`` for the first rule ``t`` breaks, or ``None`` when it is kept.

    Guarantees: every dropped trajectory gets exactly one stable reason code; the rules never
    look at anything but the record itself (selection is a pure function of the line).
    """
    n = len(t.token_ids)
    if n == 0 or not any(t.loss_mask):
        return "no_tokens", f"{n} tokens, {sum(t.loss_mask)} policy tokens"
    if len(t.loss_mask) != n or (t.logprobs and len(t.logprobs) != n):
        return "malformed", (
            f"token_ids {n}, loss_mask {len(t.loss_mask)}, logprobs {len(t.logprobs)}"
        )
    if t.reward is None:
        return "no_reward", "reward is missing (run `reward score` first)"
    if not t.reward > cfg.min_reward:
        return "low_reward", f"reward {t.reward} <= {cfg.min_reward}"
    if t.stop_reason in cfg.error_stop_reasons:
        return "episode_error", f"stop_reason {t.stop_reason}"
    if t.stop_reason in cfg.truncation_stop_reasons:
        return "truncated", f"stop_reason {t.stop_reason}"
    cut = int(t.counters.get("truncated_turns", 0))
    if cut > cfg.max_truncated_turns:
        return "truncated", f"{cut} turns cut by the token limit > {cfg.max_truncated_turns}"
    violations = sum(int(t.counters.get(k, 0)) for k in cfg.schema_counters)
    if violations > cfg.max_schema_violations:
        found = {k: t.counters[k] for k in cfg.schema_counters if t.counters.get(k)}
        return "schema_violation", f"{violations} > {cfg.max_schema_violations}: {found}"
    writes: Counter = Counter()
    for c in t.tool_calls:
        if c.name in cfg.write_tools:
            path = str(c.arguments.get("path", c.arguments.get("file_path", "")))
            content = str(c.arguments.get("content", ""))
            writes[(path, hashlib.sha256(content.encode()).hexdigest())] += 1
    if writes:
        (path, _), times = writes.most_common(1)[0]
        if times > cfg.max_same_write:
            return "repeated_write", f"{path} same content x{times} > {cfg.max_same_write}"
    calls = Counter(_call_key(c.name, c.arguments) for c in t.tool_calls)
    if calls:
        key, times = calls.most_common(1)[0]
        if times > cfg.max_same_call:
            return "repeated_tool_call", f"{key.split(':')[0]} x{times} > {cfg.max_same_call}"
    return None
