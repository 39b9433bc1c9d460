"""Commands for agent tools in a workspace (``sandbox exec`` and the agent's Bash tool)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .build import READ_ALSO_ENV
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


TOOLS_CACHE = "tools"  # under the cache root: the only part of it agent commands may write


def tools_cache_dir() -> Path:
    """The cache the workspace tools build into when run by :func:`exec_command`: its own root
    (objects, modules, extensions) under the sandbox's cache, which the trusted evaluation never
    reads. The rest of the cache is read-only to agent commands: one that could write the
    evaluation's build cache could plant an object under the content key of its own source, and
    the reward's build would link that object instead of compiling what the guards read."""
    from .config import SandboxConfig
    from .evaluate import cache_root

    return cache_root(SandboxConfig()) / TOOLS_CACHE


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
    workspace, a scratch directory and the tools' own cache (:func:`tools_cache_dir`); stdout
    and stderr each capped (head and tail kept)."""
    ws = Path(workspace).resolve()
    tmp = exec_tmp_dir()
    # the workspace's utils/ build and evaluate through this package, into a cache of their own
    # that also reads (never writes) the trusted one
    cache = tools_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k in KEEP_ENV}
    env["TMPDIR"] = str(tmp)
    env["CUDA_AGENT_SANDBOX_CACHE"] = str(cache)
    env[READ_ALSO_ENV] = str(cache.parent)
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
