"""The episode environment backed by the sandbox: workspaces, Bash, and the final evaluation."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cuda_agent.records import Candidate, EvalResult, Task

from .tools import BashOutput

if TYPE_CHECKING:
    from cuda_agent.sandbox import SandboxPool


class SandboxEnv:
    """Workspaces from ``sandbox`` templates; final solutions evaluated by the sandbox in fresh
    processes (never by the workspace's own scripts): ``evaluate`` one at a time, ``submit``
    through one ``SandboxPool`` shared by every episode of this environment.

    ``pool``: a pool to use (its owner closes it); otherwise one is made at the first ``submit``
    (on ``gpus``, default the first visible GPU) and closed by :meth:`close` (or when the
    environment is collected). Usable as a context manager."""

    def __init__(
        self,
        config: Any = None,
        *,
        pool: SandboxPool | None = None,
        gpus: Sequence[str] | None = None,
    ):
        from cuda_agent.sandbox.config import SandboxConfig, resolve_backend
        from cuda_agent.sandbox.workspace import INFRA_FILES

        self.config = config or SandboxConfig()
        self.backend = resolve_backend(self.config.backend)
        self.config = self.config.with_(backend=self.backend)
        self.protected = (*INFRA_FILES, "model.py", "SKILL.md", "utils/", ".sandbox/")
        self._prepared = ""
        self._pool = pool
        self._gpus = list(gpus) if gpus else None
        self._lock = threading.Lock()
        self._closer: weakref.finalize | None = None

    def make_workspace(self, task: Task, root: Path) -> Path:
        from cuda_agent.sandbox.execute import check_workspace_reachable, prepare_trusted_cache
        from cuda_agent.sandbox.workspace import create_workspace

        check_workspace_reachable(root)  # fail before the episode, not at its first command
        if not self._prepared:  # what the workspace's tools read but never build
            self._prepared = prepare_trusted_cache(self.backend, self.config)
        return create_workspace(
            task, root, backend=self.backend, guard_policy=self.config.guard_policy
        )

    def bash(self, root: Path, command: str, timeout: float) -> BashOutput:
        """Run ``command`` in the workspace ``root``, confined, holding this environment's
        devices' gates shared while it runs (``exec_command``'s ``hold_devices``): no timed
        evaluation on them overlaps a command."""
        from cuda_agent.sandbox.execute import exec_shell

        out = exec_shell(
            root,
            command,
            timeout=timeout,
            config=self.config,
            hold_devices=self._command_domains(),
        )
        text = out.stdout + (("\n" + out.stderr) if out.stderr else "")
        if out.killed_for or out.signal:
            text += f"\n[{out.describe()}]"
        return BashOutput(exit_code=out.returncode, output=text, timed_out=out.timed_out)

    def _command_domains(self) -> list[str]:
        """The timing domains a workspace command holds: the host on the cpu backend; on cuda
        the GPUs of this environment's pool (its ``gpus``, else the first visible GPU)."""
        from cuda_agent.sandbox.gate import domain_of
        from cuda_agent.sandbox.pool import pool_gpus

        if self.backend != "cuda":
            return [domain_of(self.backend, None)]
        given = getattr(self._pool, "devices", None) if self._gpus is None else self._gpus
        return [domain_of("cuda", d) for d in pool_gpus(given)]

    def evaluate(self, candidate: Candidate) -> EvalResult:
        from cuda_agent.sandbox.evaluate import evaluate

        return evaluate(candidate, self.config)

    @property
    def pool(self) -> SandboxPool:
        """The evaluation pool (made on first use unless one was given)."""
        with self._lock:
            if self._pool is None:
                from cuda_agent.sandbox import SandboxPool

                self._pool = SandboxPool(self.config, gpus=self._gpus)
                self._closer = weakref.finalize(self, self._pool.close)
                self._closer.atexit = False  # daemon workers: nothing to wait for at exit
            return self._pool

    def submit(self, candidate: Candidate) -> Future[EvalResult]:
        """Start evaluating ``candidate`` in the shared pool; the future's result is its
        ``EvalResult`` (an ``infra_error`` result for the sandbox's own failures)."""
        return self.pool.submit(candidate)

    def close(self) -> None:
        """Close the pool this environment made (a given pool is left to its owner)."""
        if self._closer is not None:
            self._closer()

    def __enter__(self) -> SandboxEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
