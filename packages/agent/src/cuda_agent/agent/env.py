"""The episode environment backed by the sandbox: workspaces, Bash, and the final evaluation."""

from __future__ import annotations

from pathlib import Path

from cuda_agent.records import Candidate, EvalResult, Task

from .tools import BashOutput


class SandboxEnv:
    """Workspaces from ``sandbox`` templates; final solutions evaluated by a fresh
    ``sandbox.evaluate`` (never by the workspace's own scripts)."""

    def __init__(self, config=None):
        from cuda_agent.sandbox.config import SandboxConfig, resolve_backend
        from cuda_agent.sandbox.workspace import INFRA_FILES

        self.config = config or SandboxConfig()
        self.backend = resolve_backend(self.config.backend)
        self.config = self.config.with_(backend=self.backend)
        self.protected = (*INFRA_FILES, "model.py", "SKILL.md", "utils/", ".sandbox/")
        self._prepared = ""

    def make_workspace(self, task: Task, root: Path) -> Path:
        from cuda_agent.sandbox.execute import check_workspace_reachable, prepare_trusted_cache
        from cuda_agent.sandbox.workspace import create_workspace

        check_workspace_reachable(root)  # fail before the episode, not at its first command
        if not self._prepared:  # what the workspace's tools read but never build
            self._prepared = prepare_trusted_cache(self.backend, self.config)
        return create_workspace(task, root, backend=self.backend)

    def bash(self, root: Path, command: str, timeout: float) -> BashOutput:
        from cuda_agent.sandbox.execute import exec_shell

        out = exec_shell(root, command, timeout=timeout, config=self.config)
        text = out.stdout + (("\n" + out.stderr) if out.stderr else "")
        if out.killed_for or out.signal:
            text += f"\n[{out.describe()}]"
        return BashOutput(exit_code=out.returncode, output=text, timed_out=out.timed_out)

    def evaluate(self, candidate: Candidate) -> EvalResult:
        from cuda_agent.sandbox.evaluate import evaluate

        return evaluate(candidate, self.config)
