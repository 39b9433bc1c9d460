"""Real services on loopback (port 0) over real sandbox pools on the cpu backend. The pool and
the environment are counted through thin wrappers (the real classes do the work) so that a test
can tell that a refused request ran nothing."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import pytest

from cuda_agent.agent.env import SandboxEnv
from cuda_agent.agent.tools import BashOutput
from cuda_agent.records import Candidate, EvalResult, Solution, Task
from cuda_agent.sandbox import SandboxConfig, SandboxPool
from cuda_agent.service import KernelService, ServiceClient, ServiceHTTPServer, ServiceSettings

FIX = Path(__file__).parent / "fixtures"
TOKEN = "test-token-0123456789abcdef"

# a ModelNew that computes what the reference does with torch operators: correct, and rejected
# by the strict guard policy before anything runs
HONEST = (
    "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
    "    def __init__(self, cols):\n        super().__init__()\n"
    "        self.w = nn.Parameter(torch.empty(cols))\n"
    "        self.b = nn.Parameter(torch.empty(cols))\n"
    "    def forward(self, x):\n        return x * self.w + self.b\n"
)


class CountingPool:
    """A real ``SandboxPool`` whose ``submit`` calls are counted."""

    def __init__(self, pool: SandboxPool):
        self.inner = pool
        self.devices = pool.devices
        self.submits = 0
        self._lock = threading.Lock()

    def submit(self, candidate: Candidate) -> Future[EvalResult]:
        with self._lock:
            self.submits += 1
        return self.inner.submit(candidate)

    def close(self) -> None:
        self.inner.close()


class CountingEnv(SandboxEnv):
    """The real agent environment, with its workspaces and commands counted."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.bash_calls = 0
        self.workspaces_made = 0
        self._n = threading.Lock()

    def bash(self, root: Path, command: str, timeout: float) -> BashOutput:
        with self._n:
            self.bash_calls += 1
        return super().bash(root, command, timeout)

    def make_workspace(self, task: Task, root: Path) -> Path:
        with self._n:
            self.workspaces_made += 1
        return super().make_workspace(task, root)


@dataclass
class Running:
    url: str
    client: ServiceClient
    pool: CountingPool
    env: CountingEnv
    service: KernelService
    server: ServiceHTTPServer

    def work_done(self) -> tuple[int, int, int]:
        """(submits, bash commands, workspaces made) so far."""
        return self.pool.submits, self.env.bash_calls, self.env.workspaces_made

    def wait_idle(self, timeout_s: float = 120.0) -> None:
        """Until no request holds a slot: an earlier test's evaluation keeps its slot to its end,
        even after its request was answered (a 504), and would make this test's requests 503s."""
        deadline = time.monotonic() + timeout_s
        while self.client.health().in_flight:
            assert time.monotonic() < deadline, "the service never became idle"
            time.sleep(0.05)


@contextlib.contextmanager
def running_service(cfg: SandboxConfig, ws_dir: Path, **settings: object) -> Iterator[Running]:
    """A service over a fresh cpu pool, serving on 127.0.0.1 (any free port) in a thread."""
    pool = CountingPool(SandboxPool(cfg, compile_workers=1))
    env = CountingEnv(cfg, pool=pool.inner)
    svc = KernelService(pool, env, TOKEN, ws_dir, ServiceSettings(**settings))
    server = ServiceHTTPServer(svc, "127.0.0.1", 0).start()
    try:
        yield Running(server.url, ServiceClient(server.url, TOKEN), pool, env, svc, server)
    finally:
        server.stop()
        svc.close()
        pool.close()


@pytest.fixture(scope="module")
def ws_root(tmp_path_factory, reach_for_other_users) -> Path:
    """A directory for workspaces that the sandbox's unprivileged uids can reach."""
    d = tmp_path_factory.mktemp("service-ws")
    reach_for_other_users(d)
    d.chmod(0o711)
    return d


@pytest.fixture(scope="session")
def task() -> Task:
    return Task.make("scale_add", (FIX / "scale_add" / "model.py").read_text())


def kb_candidate(task: Task, model_new: str) -> Candidate:
    return Candidate(task=task, solution=Solution.make("kernelbench", {"model_new.py": model_new}))


_FAST = {"backend": "cpu", "timing": False, "baselines": False}


@pytest.fixture(scope="module")
def strict(ws_root) -> Iterator[Running]:
    """The production guard policy (strict), small limits: 64 KiB bodies, 2 requests running,
    3 workspaces, 6 connections."""
    cfg = SandboxConfig(**_FAST, guard_policy="strict")
    with running_service(
        cfg,
        ws_root / "strict",
        max_body_bytes=64 * 1024,
        max_concurrent=2,
        max_workspaces=3,
        max_connections=6,
        max_bash_timeout_s=30.0,
        read_timeout_s=5.0,
    ) as r:
        yield r


@pytest.fixture(scope="module")
def unguarded(ws_root) -> Iterator[Running]:
    """Guards off: a ModelNew of torch operators is evaluated for correctness (no compiler)."""
    cfg = SandboxConfig(**_FAST, guard_policy="off")
    with running_service(cfg, ws_root / "unguarded") as r:
        yield r
