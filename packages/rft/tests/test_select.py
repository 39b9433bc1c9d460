"""Trajectory selection: every rule, its thresholds, and the CLI conventions."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest

from cuda_agent.records import Task, ToolCall, Trajectory
from cuda_agent.records.jsonl import encode
from cuda_agent.rft.select import SelectConfig, drop_reason

TASK = Task.make("relu", "import torch\nclass Model: ...\n")


def traj(id: str = "t", **kw) -> Trajectory:
    """A small multi-turn trajectory: prompt (mask 0), policy turn, tool output, policy turn."""
    ids = list(range(10, 40))
    mask = [0] * 8 + [1] * 6 + [0] * 10 + [1] * 6
    calls = [
        ToolCall(turn=1, name="Write", arguments={"path": "k.cu", "content": "v1"}, result="ok"),
        ToolCall(turn=2, name="Bash", arguments={"command": "make"}, result="built\n" * 5),
    ]
    base = dict(
        id=id,
        task=TASK,
        token_ids=ids,
        loss_mask=mask,
        logprobs=[-0.5 if m else 0.0 for m in mask],
        tool_calls=calls,
        reward=2.0,
        stop_reason="submit",
        counters={"turns": 2, "tool_calls": 2, "schema_violations": 0},
    )
    base.update(kw)
    return Trajectory(**base)


def test_good_trajectory_is_kept():
    assert drop_reason(traj()) is None


@pytest.mark.parametrize(
    "kw, reason",
    [
        (dict(reward=-1.0), "low_reward"),
        (dict(reward=0.0), "low_reward"),
        (dict(reward=None), "no_reward"),
        (dict(stop_reason="context_overflow"), "truncated"),
        (dict(stop_reason="policy_token_limit"), "truncated"),
        (dict(counters={"truncated_turns": 1}), "truncated"),
        (dict(stop_reason="error"), "episode_error"),
        (dict(counters={"schema_violations": 1}), "schema_violation"),
        (dict(loss_mask=[0] * 30), "no_tokens"),
        (dict(loss_mask=[1] * 29), "malformed"),
    ],
)
def test_each_rule_fires_with_its_reason(kw, reason):
    assert drop_reason(traj(**kw))[0] == reason


def test_repeated_tool_call_threshold():
    calls = [ToolCall(turn=i, name="Bash", arguments={"command": "ls"}) for i in range(4)]
    assert drop_reason(traj(tool_calls=calls[:3])) is None  # 3 <= default 3
    why = drop_reason(traj(tool_calls=calls))
    assert why[0] == "repeated_tool_call" and "Bash x4" in why[1]
    assert drop_reason(traj(tool_calls=calls), SelectConfig(max_same_call=4)) is None
    # different arguments are different calls
    varied = [ToolCall(turn=i, name="Bash", arguments={"command": f"ls {i}"}) for i in range(8)]
    assert drop_reason(traj(tool_calls=varied)) is None


def test_same_content_written_again_and_again():
    w = [
        ToolCall(turn=i, name="Write", arguments={"path": "k.cu", "content": "same"})
        for i in range(3)
    ]
    why = drop_reason(traj(tool_calls=w))
    assert why[0] == "repeated_write" and "k.cu" in why[1]
    assert drop_reason(traj(tool_calls=w[:2])) is None
    # rewriting a file with new content is progress, not a loop
    edits = [
        ToolCall(turn=i, name="Write", arguments={"path": "k.cu", "content": f"v{i}"})
        for i in range(6)
    ]
    assert drop_reason(traj(tool_calls=edits)) is None
    assert drop_reason(traj(tool_calls=w), SelectConfig(max_same_write=3)) is None


def test_reward_threshold_is_configurable():
    assert drop_reason(traj(reward=1.0), SelectConfig(min_reward=1.0))[0] == "low_reward"
    assert drop_reason(traj(reward=2.0), SelectConfig(min_reward=1.0)) is None


def _rft(*args, input: bytes):
    return subprocess.run(
        [sys.executable, "-m", "cuda_agent.rft.cli", *args],
        input=input,
        capture_output=True,
        timeout=120,
    )


def test_cli_select_counts_reasons_and_writes_dropped(tmp_path):
    recs = [
        traj("keep1"),
        traj("low", reward=-1.0),
        traj("cut", stop_reason="context_overflow"),
        traj("schema", counters={"schema_violations": 2}),
        traj("keep2", reward=3.0),
    ]
    dropped = tmp_path / "dropped.jsonl"
    r = _rft("select", "--dropped", str(dropped), input=b"".join(encode(t) for t in recs))
    assert r.returncode == 0, r.stderr.decode()
    kept = [msgspec.json.decode(line, type=Trajectory) for line in r.stdout.splitlines()]
    assert [t.id for t in kept] == ["keep1", "keep2"]
    err = r.stderr.decode()
    assert "kept 2/5" in err and "low_reward 1" in err and "truncated 1" in err
    drops = [json.loads(line) for line in dropped.read_text().splitlines()]
    assert {d["id"]: d["reason"] for d in drops} == {
        "low": "low_reward",
        "cut": "truncated",
        "schema": "schema_violation",
    }
    assert all(d["kind"] == "rft_drop" and d["task_id"] == TASK.id for d in drops)


def test_cli_select_malformed_line_stops_with_line_number():
    r = _rft("select", input=encode(traj("a")) + b"{not json\n")
    assert r.returncode == 2
    assert "line 2" in r.stderr.decode()
    r = _rft("select", "--on-error", "skip", input=encode(traj("a")) + b"{not json\n")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1


def test_cli_select_resume_skips_kept_and_dropped(tmp_path):
    recs = [traj("k1"), traj("d1", reward=-1.0), traj("k2"), traj("d2", reward=0.0)]
    out, dropped = tmp_path / "kept.jsonl", tmp_path / "dropped.jsonl"
    first = b"".join(encode(t) for t in recs[:2])
    r = _rft("select", "-o", str(out), "--dropped", str(dropped), "--resume", input=first)
    assert r.returncode == 0, r.stderr.decode()
    every = b"".join(encode(t) for t in recs)
    r = _rft("select", "-o", str(out), "--dropped", str(dropped), "--resume", input=every)
    assert r.returncode == 0, r.stderr.decode()
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["k1", "k2"]
    assert [json.loads(x)["id"] for x in dropped.read_text().splitlines()] == ["d1", "d2"]
