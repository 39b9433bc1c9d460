"""Concurrent rollouts: tool calls of different episodes overlap, final evaluations go through one
pool, and one episode's failure (model endpoint, tool, evaluation) is recorded on its trajectory
while the others go on. Real components: a loopback HTTP server, the sandbox's cpu backend, the
CLI as a subprocess."""

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cuda_agent.agent.env import SandboxEnv
from cuda_agent.agent.episode import EpisodeConfig, EpisodeRunner, episode_error
from cuda_agent.agent.models import load_tokenizer
from cuda_agent.agent.openai_policy import OpenAIPolicy
from cuda_agent.agent.policy import ScriptedPolicy
from cuda_agent.agent.toolcalls import format_tool_call
from cuda_agent.agent.tools import DEFAULT_PROTECTED, BashOutput
from cuda_agent.records import Task, Trajectory, encode, read_records
from cuda_agent.sandbox import SandboxConfig, SandboxPool

REF = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
MODEL_NEW = "class ModelNew:\n    pass\n"


def _call(cid, name, args):
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


@pytest.fixture
def picky_server():
    """An OpenAI-compatible endpoint that answers HTTP 400 to any conversation mentioning
    ``Rejected`` and otherwise writes model_new.py and submits."""

    class H(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            text = " ".join(str(m.get("content", "")) for m in body["messages"])
            if "Rejected" in text:
                code, out = 400, {"error": {"message": "this prompt is rejected by the server"}}
            else:
                calls = [
                    _call("w", "Write", {"path": "model_new.py", "content": MODEL_NEW}),
                    _call("s", "Submit", {}),
                ]
                msg = {"role": "assistant", "content": "", "tool_calls": calls}
                code, out = 200, {"choices": [{"message": msg, "finish_reason": "tool_calls"}]}
            data = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_http_400_fails_only_its_episode(tmp_path, picky_server, dir_env):
    policy = OpenAIPolicy.from_spec(f"{picky_server}#m", retries=0)
    good, bad = Task.make("Accepted", REF), Task.make("Rejected", REF)
    runner = EpisodeRunner(policy, dir_env, EpisodeConfig(evaluate=False), tmp_path)
    t_good, t_bad = runner.run([(good, 0), (bad, 0)])
    assert episode_error(t_good) is None and t_good.stop_reason == "submit"
    assert t_good.solution is not None and t_good.solution.files == {"model_new.py": MODEL_NEW}
    err = episode_error(t_bad)
    assert err is not None and err["stage"] == "policy", t_bad.meta
    assert "HTTP 400" in err["message"] and "rejected by the server" in err["message"]
    assert t_bad.stop_reason == "error" and t_bad.counters["errors"] == 1
    assert t_bad.eval_result is None and "episode error (policy)" in t_bad.reward_reason
    # the failed episode keeps its prompt: it says which conversation was refused
    assert any("Rejected" in m.content for m in t_bad.messages)


def _free_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_endpoint_writes_every_trajectory_as_failed(tmp_path, reach_for_other_users):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(encode(Task.make(n, REF)) for n in ("A", "B")))
    ws = tmp_path / "ws"
    ws.mkdir()
    reach_for_other_users(ws)
    out = tmp_path / "traj.jsonl"
    argv = [sys.executable, "-m", "cuda_agent.agent.cli", "rollout"]
    argv += ["--policy", f"openai:http://127.0.0.1:{_free_port()}/v1#m", "--tasks", str(tasks)]
    argv += ["--backend", "cpu", "--no-eval", "--workdir", str(ws), "-o", str(out)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert p.returncode == 3, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert "2 trajectories written, 2 failed" in p.stderr, p.stderr
    trajs = [r for _, r in read_records(out, Trajectory)]
    assert sorted(t.task.name for t in trajs) == ["A", "B"]
    for t in trajs:
        err = episode_error(t)
        assert err is not None and err["stage"] == "policy", t.meta
        assert "no answer after 4 tries" in err["message"] and t.stop_reason == "error"
    # the failure shows when the episode is read back
    from cuda_agent.agent.cli import render

    assert "FAILED (policy)" in render(trajs[0])


@pytest.fixture
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture
def cpu_env():
    # no fork servers: nothing here evaluates on a device, so none is worth starting
    with SandboxEnv(SandboxConfig(backend="cpu", fork_server=False)) as env:
        yield env


def _stamp(name: str) -> str:
    return f"date +%s.%N > {name}"


TIMED = [
    # two calls in one turn: the second starts after the first has ended
    format_tool_call("Bash", {"command": f"{_stamp('a0')}; sleep 1; {_stamp('a1')}"})
    + format_tool_call("Bash", {"command": _stamp("b0")}),
    format_tool_call("Submit", {}),
]


def _spans(t: Trajectory) -> dict[str, float]:
    ws = Path(t.meta["workspace"])
    return {k: float((ws / k).read_text()) for k in ("a0", "a1", "b0")}


@pytest.mark.parametrize("workers", [3, 1])
def test_tools_of_different_episodes_overlap(
    tmp_path, tok, cpu_env, reach_for_other_users, workers
):
    reach_for_other_users(tmp_path)
    task = Task.make("Identity", REF)
    cfg = EpisodeConfig(evaluate=False, tool_workers=workers)
    runner = EpisodeRunner(ScriptedPolicy(tok, TIMED), cpu_env, cfg, tmp_path / "ws")
    trajs = runner.run([(task, s) for s in range(3)])
    for t in trajs:
        assert t.stop_reason == "submit" and episode_error(t) is None, t.meta
        assert all(c.ok for c in t.tool_calls), [c.result for c in t.tool_calls]
    spans = [_spans(t) for t in trajs]
    for s in spans:  # within one episode the calls ran in order
        assert s["a0"] < s["a1"] <= s["b0"]
    latest_start = max(s["a0"] for s in spans)
    earliest_end = min(s["a1"] for s in spans)
    if workers > 1:  # every episode's sleep was running at one moment
        assert latest_start < earliest_end, spans
    else:  # one at a time: no two sleeps overlap
        ordered = sorted(spans, key=lambda s: s["a0"])
        assert all(x["a1"] <= y["a0"] for x, y in itertools.pairwise(ordered)), spans


class _FlakyEnv:
    """Directory workspaces whose Bash runs a real shell, except in the workspace of a task named
    ``Broken``, where the runner itself raises (an infrastructure failure, not a failed command)."""

    backend = "cpu"
    protected = DEFAULT_PROTECTED

    def make_workspace(self, task, root):
        root.mkdir(parents=True)
        (root / "model.py").write_text(task.ref_code)
        if task.name == "Broken":
            (root / "BROKEN").touch()
        return root

    def bash(self, root, command, timeout):
        if (root / "BROKEN").exists():
            raise RuntimeError("the command runner is gone")
        p = subprocess.run(["bash", "-c", command], cwd=root, capture_output=True, text=True)
        return BashOutput(p.returncode, p.stdout + p.stderr)

    def evaluate(self, candidate):
        raise AssertionError("not used")


def test_a_raising_tool_fails_only_its_episode(tmp_path, tok):
    script = [
        format_tool_call("Bash", {"command": "echo hello > out.txt"}),
        format_tool_call("Submit", {}),
    ]
    tasks = [Task.make("Working", REF), Task.make("Broken", REF)]
    cfg = EpisodeConfig(evaluate=False)
    ok, broken = EpisodeRunner(ScriptedPolicy(tok, script), _FlakyEnv(), cfg, tmp_path).run(
        [(t, 0) for t in tasks]
    )
    assert ok.stop_reason == "submit" and episode_error(ok) is None
    assert (Path(ok.meta["workspace"]) / "out.txt").read_text() == "hello\n"
    err = episode_error(broken)
    assert err == {
        "stage": "tool",
        "type": "RuntimeError",
        "message": "the command runner is gone",
    }
    assert broken.stop_reason == "error" and broken.counters["turns"] == 1
    (call,) = broken.tool_calls  # the call that raised is on record
    assert call.name == "Bash" and not call.ok and call.error == "raised"


WRITE_AND_SUBMIT = [
    format_tool_call("Write", {"path": "model_new.py", "content": MODEL_NEW})
    + format_tool_call("Submit", {}),
]


def test_an_evaluation_that_raises_is_an_infra_error(tmp_path, tok, reach_for_other_users):
    reach_for_other_users(tmp_path)
    cfg = SandboxConfig(backend="cpu", fork_server=False)
    pool = SandboxPool(cfg)
    pool.close()  # every submit now raises
    env = SandboxEnv(cfg, pool=pool)
    task = Task.make("Identity", REF)
    runner = EpisodeRunner(ScriptedPolicy(tok, WRITE_AND_SUBMIT), env, EpisodeConfig(), tmp_path)
    trajs = runner.run([(task, 0), (task, 1)])
    for t in trajs:
        err = episode_error(t)
        assert err is not None and err["stage"] == "eval" and "pool is closed" in err["message"]
        assert t.stop_reason == "submit"  # the episode itself ended normally
        assert t.eval_result is not None and str(t.eval_result.status) == "infra_error"
        assert t.infra_failed and t.reward == -1.0
