"""Commands for agent tools in a workspace (``sandbox exec`` and the agent's Bash tool)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .isolation import Limits, Outcome, run_confined

# the environment a tool command sees: enough to run python, nvcc and the workspace's utils
KEEP_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_VISIBLE_DEVICES",
    "VIRTUAL_ENV",
    "TERM",
    "CUDA_AGENT_SANDBOX_CACHE",
    "CUDA_AGENT_CACHE",
    # where caches live: the command must resolve the same build cache as this process
    "XDG_CACHE_HOME",
    "TORCH_EXTENSIONS_DIR",
)


def exec_tmp_dir() -> Path:
    """The scratch directory tool commands may write besides their workspace."""
    d = Path(tempfile.gettempdir()) / "sandbox-exec"
    d.mkdir(exist_ok=True)
    return d


def exec_command(
    workspace: str | os.PathLike[str],
    argv: list[str],
    *,
    timeout: float = 300.0,
    max_output: int = 30000,
    network: bool = False,
) -> Outcome:
    """Run ``argv`` in ``workspace``: its own session and process group (all killed at the
    limit), no network unless asked, limits on processes and file size, writes confined to the
    workspace and a scratch directory; stdout and stderr each capped (head and tail kept)."""
    from .config import SandboxConfig
    from .evaluate import cache_root

    ws = Path(workspace).resolve()
    tmp = exec_tmp_dir()
    # the workspace's utils/ evaluate through this package, which writes its build cache
    cache = cache_root(SandboxConfig())
    cache.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k in KEEP_ENV}
    env["TMPDIR"] = str(tmp)
    lim = Limits(
        timeout_s=timeout,
        output_cap=max_output,
        no_network=not network,
        drop_user=False,
        rss_mb=None,
    )
    return run_confined(argv, cwd=ws, env=env, limits=lim, writable=[ws, tmp, cache])


def exec_shell(workspace: str | os.PathLike[str], command: str, **kw) -> Outcome:
    """:func:`exec_command` of a shell command line (``bash -lc``-free: ``bash -c``)."""
    return exec_command(workspace, ["bash", "-c", command], **kw)
