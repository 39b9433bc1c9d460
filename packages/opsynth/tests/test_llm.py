"""compose --llm against a real local HTTP server speaking the OpenAI chat-completions format."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from cuda_agent.opsynth.compose import ComposeConfig, compose
from cuda_agent.opsynth.llm import LLMConfig, extract_code

GOOD = '''Here it is:
```python
import torch
import torch.nn as nn


class Model(nn.Module):
    """written by the model"""

    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.relu(self.linear(x))


batch_size = 4
features = 16


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
```'''
BAD = "```python\nclass Model:\n    pass\n```"


class _Handler(BaseHTTPRequestHandler):
    replies: list[str] = []
    prompts: list[str] = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.prompts.append(body["messages"][0]["content"])
        text = _Handler.replies.pop(0) if _Handler.replies else BAD
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data.encode())

    def log_message(self, *a):
        pass


@pytest.fixture()
def server():
    srv = HTTPServer(("127.0.0.1", 0), _Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_port}/v1"
    srv.shutdown()


def test_llm_composition_is_validated_and_falls_back(server):
    _Handler.replies = [GOOD, BAD, BAD, BAD]
    _Handler.prompts = []
    cfg = ComposeConfig(size="tiny", length_weights={2: 1.0}, llm=LLMConfig(url=server, retries=2))
    first, second = list(compose(2, seed=3, cfg=cfg))
    assert first.meta["composer"] == "llm" and "written by the model" in first.ref_code
    assert first.meta["output_shape"] == [4, 16] and first.meta["llm"]["attempts"] == 1
    # three invalid answers: the programmatic draft is kept, the error recorded
    assert second.meta["composer"] == "program" and second.meta["llm"]["attempts"] == 3
    assert "contract" in second.meta["llm"]["error"]
    assert "class Model(nn.Module)" in second.ref_code
    # the prompt names the operators and carries the shape-consistent draft
    assert (
        all(op in _Handler.prompts[0] for op in first.ops)
        and "def get_inputs" in _Handler.prompts[0]
    )


def test_extract_code_takes_the_fenced_block():
    assert extract_code("x\n```python\na = 1\n```\ny").strip() == "a = 1"
    assert extract_code("a = 2").strip() == "a = 2"
