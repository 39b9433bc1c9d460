"""cuda_agent.sandbox: build, verify and time candidate kernels in isolated processes.

Library API (what ``agent``, ``opsynth`` and ``ppo`` call)::

    from cuda_agent.sandbox import SandboxConfig, SandboxPool, evaluate
    result = evaluate(candidate, SandboxConfig(backend="cuda"))     # -> EvalResult
    with SandboxPool(SandboxConfig(), gpus=["0", "1"]) as pool:
        results = list(pool.map(candidates))                         # input order

Workspaces for agents: :func:`create_workspace`, :func:`solution_from_workspace`.
Heavy modules (torch) are imported only when an evaluation runs.
"""

from .config import SandboxConfig, resolve_backend
from .evaluate import evaluate, prepare, run_on_device
from .execute import exec_command, exec_shell
from .isolation import Limits, Outcome, caps, run_confined
from .pool import SandboxPool
from .workspace import create_workspace, materialise, solution_from_workspace

__all__ = [
    "Limits",
    "Outcome",
    "SandboxConfig",
    "SandboxPool",
    "caps",
    "create_workspace",
    "evaluate",
    "exec_command",
    "exec_shell",
    "materialise",
    "prepare",
    "resolve_backend",
    "run_confined",
    "run_on_device",
    "solution_from_workspace",
]
