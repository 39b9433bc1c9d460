"""Shared pieces of the adapter tests: fixture tasks and answers that pass or fail on the cpu
backend, real sandbox pools, a real service on loopback, and a tiny model taught to answer."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuda_agent.records import Task
from cuda_agent.sandbox import SandboxConfig, SandboxPool

FIX = Path(__file__).parent / "fixtures"
TOKEN = "adapters-test-token-0123456789"
FAST = {"backend": "cpu", "timing": False, "baselines": False}


def fenced(files: dict[str, str], preface: str = "") -> str:
    """An answer in the single-turn format: each file in a fence naming it."""
    blocks = [
        f"```{'python' if p.endswith('.py') else 'cpp'} {p}\n{text}```" for p, text in files.items()
    ]
    return (preface + "\n" if preface else "") + "\n".join(blocks)


def fixture_files(name: str) -> dict[str, str]:
    d = FIX / name
    out = {"model_new.py": (d / "model_new.py").read_text()}
    for p in sorted((d / "kernels").iterdir()):
        out[f"kernels/{p.name}"] = p.read_text()
    return out


@pytest.fixture(scope="session")
def scale_add_task() -> Task:
    return Task.make("scale_add", (FIX / "scale_add" / "model.py").read_text())


@pytest.fixture(scope="session")
def relu_task() -> Task:
    return Task.make("relu", (FIX / "relu" / "model.py").read_text())


@pytest.fixture(scope="session")
def answers() -> dict[str, str]:
    """Completions for scale_add: ``correct`` (the sandbox fixture, kernels on the cpu backend),
    ``wrong`` (its kernel subtracts b), ``torch_only`` (PyTorch operators: rejected by the strict
    guards), ``unparsable`` (no file blocks)."""
    files = fixture_files("scale_add")
    wrong = dict(files)
    wrong["kernels/ops.cpp"] = files["kernels/ops.cpp"].replace("+ b[j]", "- b[j]")
    assert wrong != files
    torch_only = {
        "model_new.py": "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self, cols):\n        super().__init__()\n"
        "        self.w = nn.Parameter(torch.empty(cols))\n"
        "        self.b = nn.Parameter(torch.empty(cols))\n"
        "    def forward(self, x):\n        return x * self.w + self.b\n"
    }
    return {
        "correct": fenced(files, "Here is a kernel for y = x * w + b."),
        "wrong": fenced(wrong),
        "torch_only": fenced(torch_only),
        "unparsable": "I would write a kernel, but here is only prose and ```no named block```.",
    }


@pytest.fixture(scope="session")
def relu_answers() -> dict[str, str]:
    """``good`` (a relu kernel in its binding) and ``bad`` (the same copying its input)."""
    files = fixture_files("relu")
    bad = dict(files)
    src = files["kernels/relu_binding.cpp"]
    bad["kernels/relu_binding.cpp"] = src.replace("a[i] > 0.f ? a[i] : 0.f", "a[i]")
    assert bad != files
    return {"good": fenced(files), "bad": fenced(bad)}


@pytest.fixture(scope="module")
def strict_pool() -> Iterator[SandboxPool]:
    """A real cpu pool under the production guard policy (strict), no timing."""
    with SandboxPool(SandboxConfig(**FAST, guard_policy="strict")) as pool:
        yield pool


@pytest.fixture(scope="module")
def ws_root(tmp_path_factory, reach_for_other_users) -> Path:
    """A directory for workspaces that the sandbox's unprivileged uids can reach."""
    d = tmp_path_factory.mktemp("adapters-ws")
    reach_for_other_users(d)
    d.chmod(0o711)
    return d


@contextlib.contextmanager
def running_service(cfg: SandboxConfig, ws_dir: Path, **settings: object) -> Iterator[str]:
    """A real kernel service over a fresh cpu pool on 127.0.0.1 (a free port): its URL."""
    from cuda_agent.agent.env import SandboxEnv
    from cuda_agent.service import KernelService, ServiceHTTPServer, ServiceSettings

    pool = SandboxPool(cfg, compile_workers=1)
    env = SandboxEnv(cfg, pool=pool)
    svc = KernelService(pool, env, TOKEN, ws_dir, ServiceSettings(**settings))
    server = ServiceHTTPServer(svc, "127.0.0.1", 0).start()
    try:
        yield server.url
    finally:
        server.stop()
        svc.close()
        pool.close()


@pytest.fixture(scope="module")
def service_url(ws_root) -> Iterator[str]:
    """A service under the strict guards, at most 2 requests running (a third is ``busy``, and
    told to come back after 1 s)."""
    cfg = SandboxConfig(**FAST, guard_policy="strict")
    with running_service(cfg, ws_root / "svc", max_concurrent=2, retry_after_s=1) as url:
        yield url


def teach(model, tok, prompt: str, targets: list[str], steps: int, lr: float) -> float:
    """Fit ``model`` (a random-weight tiny model) to answer ``prompt`` with each of ``targets``
    (then its end-of-turn token) by plain next-token cross-entropy (Adam); the last loss."""
    import torch

    eot = tok.convert_tokens_to_ids("<|im_end|>")
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    seqs = [p + tok(t, add_special_tokens=False)["input_ids"] + [eot] for t in targets]
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in seqs])
    labels = ids.clone()
    labels[:, : len(p)] = -100
    for k, s in enumerate(seqs):
        labels[k, len(s) :] = -100
    attention = torch.ones_like(ids)
    for k, s in enumerate(seqs):
        attention[k, len(s) :] = 0
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        logits = model(ids, attention_mask=attention).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        loss.backward()
        opt.step()
        opt.zero_grad()
    return loss.item()


@pytest.fixture(scope="session")
def teach_model():
    """:func:`teach`, for test modules (conftest files are not importable)."""
    return teach
