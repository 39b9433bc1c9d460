"""The OpenAI-compatible client against a real HTTP server on loopback that speaks the protocol."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cuda_agent.agent.episode import EpisodeConfig, EpisodeRunner
from cuda_agent.agent.openai_policy import OpenAIPolicy
from cuda_agent.records import Task


def _call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


REPLIES = [
    {"content": "reading", "tool_calls": [_call("c1", "Read", json.dumps({"path": "model.py"}))]},
    {"content": "", "tool_calls": [_call("c2", "Write", "{not json")]},
    {
        "content": "",
        "tool_calls": [
            _call(
                "c3",
                "Write",
                json.dumps({"path": "model_new.py", "content": "class ModelNew: pass\n"}),
            ),
            _call("c4", "Submit", "{}"),
        ],
    },
]


@pytest.fixture
def server():
    seen: list[dict] = []

    class H(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            if self.path != "/v1/chat/completions":
                self.send_response(404)
                self.end_headers()
                return
            reply = REPLIES[min(len(seen) - 1, len(REPLIES) - 1)]
            out = {
                "choices": [
                    {"message": {"role": "assistant", **reply}, "finish_reason": "tool_calls"}
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5},
            }
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", seen
    srv.shutdown()


def test_openai_episode_native_tool_calls(tmp_path, server, dir_env):
    url, seen = server
    policy = OpenAIPolicy.from_spec(f"{url}#test-model", retries=0)
    task = Task.make("Identity", "class Model: pass\n")
    (t,) = EpisodeRunner(policy, dir_env, EpisodeConfig(evaluate=False), tmp_path).run([(task, 0)])
    assert t.stop_reason == "submit"
    assert t.token_ids == [] and t.meta["token_exact"] is False
    assert t.counters["schema_violations"] == 1 and t.counters["api_prompt_tokens"] == 30
    assert t.solution.files == {"model_new.py": "class ModelNew: pass\n"}
    # the request carried the tools and, on turn 2, the tool result for call c1
    assert seen[0]["model"] == "test-model" and {
        x["function"]["name"] for x in seen[0]["tools"]
    } >= {"Bash", "Submit"}
    tool_msgs = [m for m in seen[1]["messages"] if m["role"] == "tool"]
    assert tool_msgs[0]["tool_call_id"] == "c1" and "class Model" in tool_msgs[0]["content"]
    assert any(
        "not a JSON object" in m.get("content", "")
        for m in seen[2]["messages"]
        if m["role"] == "tool"
    )


def test_http_error_is_clear(server):
    url, _ = server
    p = OpenAIPolicy(url.replace("/v1", "/nope"), "m", retries=0)
    with pytest.raises(RuntimeError, match="HTTP 404"):
        p.chat([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="URL#MODEL"):
        OpenAIPolicy.from_spec("http://x")
