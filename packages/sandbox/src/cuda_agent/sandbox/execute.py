"""Commands for agent tools in a workspace (``sandbox exec`` and the agent's Bash tool)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .gate import device_gate
from .isolation import Limits, Outcome, caps, give_tree, run_confined, sandbox_uid
from .toolchain import READ_ALSO_ENV

if TYPE_CHECKING:
    from .config import SandboxConfig

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
    # the evaluator's compiler: objects are shared only when the compiler (part of every cache
    # key) is the same, and a uid may resolve another g++ on PATH
    "CXX",
    "CC",
    "CUDA_AGENT_SANDBOX_CACHE",
    "CUDA_AGENT_CACHE",
    # where caches live: the command must resolve the same build cache as this process
    "XDG_CACHE_HOME",
    "TORCH_EXTENSIONS_DIR",
    # the evaluator's target architecture where it is set by hand (cross-compiling): the tools
    # must build for the same device, and share its objects
    "CUDA_AGENT_ARCH",
)


def exec_tmp_dir() -> Path:
    """The directory under which each workspace's commands get their scratch directory."""
    d = Path(tempfile.gettempdir()) / "sandbox-exec"
    d.mkdir(exist_ok=True)
    return d


TOOLS_CACHE = "tools"  # under the cache root: the only part of it agent commands may write


def _ws_key(ws: Path) -> str:
    return hashlib.sha256(str(ws).encode()).hexdigest()[:16]


def trusted_cache_root(config: SandboxConfig | None = None) -> Path:
    """The cache root the trusted evaluation of ``config`` (default: ``SandboxConfig()``, i.e.
    ``$CUDA_AGENT_SANDBOX_CACHE`` or the user's cache) builds into."""
    from .config import SandboxConfig
    from .evaluate import cache_root

    return cache_root(config or SandboxConfig())


def tools_cache_dir(
    workspace: str | os.PathLike[str] | None = None, config: SandboxConfig | None = None
) -> Path:
    """The cache the workspace tools build into when run by :func:`exec_command`: its own root
    (objects, modules, extensions) under the sandbox's cache, one per workspace, which the
    trusted evaluation never reads. The rest of the cache is read-only to agent commands: one
    that could write the evaluation's build cache could plant an object under the content key of
    its own source, and the reward's build would link that object instead of compiling what the
    guards read. (Without ``workspace``: the parent of every workspace's tools cache.)
    ``config``: the evaluation's :class:`SandboxConfig`, whose cache they live under."""
    base = trusted_cache_root(config) / TOOLS_CACHE
    return base / _ws_key(Path(workspace).resolve()) if workspace is not None else base


def prepare_trusted_cache(backend: str, config: SandboxConfig | None = None) -> str:
    """Build what agent tools read from the trusted cache but never build themselves: the
    precompiled prelude of the cuda backend (once per cache and toolchain; about 20 s and 0.5 GB)
    and the fat-binary wrapper of split ``.cu`` compiles (a few seconds, once).
    Called where workspaces are made (``SandboxEnv``, ``sandbox workspace``); returns a note.
    ``config``: the evaluation's :class:`SandboxConfig` (whose cache the tools read)."""
    from .toolchain import publish_facts

    publish_facts(trusted_cache_root(config), backend)
    if backend != "cuda":
        # built by the evaluations once they have compiled a few bindings (build.pch_after)
        return "pch: cpu backend, built by the evaluations when they have earned it"
    from .build import build_cache, ensure_pch, ensure_split_wrapper, split_enabled
    from .toolchain import flags_for

    flags = flags_for("cuda")
    if flags.nvcc is None:
        return "pch: no nvcc"
    cache = build_cache(trusted_cache_root(config))
    _, note = ensure_pch(cache, flags, Limits(timeout_s=600.0, drop_user=False))
    if split_enabled():
        wrapper, why = ensure_split_wrapper(cache, flags)
        note += "; nvcc split: " + ("ready" if wrapper else f"off ({why})")
    return note


def _collect_stale_tools_caches(base: Path) -> None:
    """Remove tools caches, and scratch directories, whose workspace is gone (each cache records
    its workspace's path next to it): one per episode would otherwise pile up."""
    import shutil

    for mark in base.glob("*.workspace"):
        try:
            gone = not Path(mark.read_text().strip()).exists()
        except OSError:
            continue
        if gone:
            shutil.rmtree(mark.with_suffix(""), ignore_errors=True)
            shutil.rmtree(exec_tmp_dir() / mark.stem, ignore_errors=True)
            mark.unlink(missing_ok=True)


def check_workspace_reachable(workspace: str | os.PathLike[str]) -> None:
    """Raise PermissionError, naming the directory that blocks it, when agent commands could
    not reach ``workspace``: started as root they run as an unprivileged uid, which needs o+x
    on every parent (pytest's and many home directories are 0700)."""
    from .evaluate import unreachable_parent

    if not caps().drop_user:
        return
    ws = Path(workspace).resolve()
    blocker = unreachable_parent(ws.parent)
    if blocker is not None:
        raise PermissionError(
            f"workspace {ws}: agent commands run as an unprivileged uid (this process is root)"
            f" and cannot reach it: {blocker} has mode {blocker.stat().st_mode & 0o777:o}"
            f" (needs o+x); put workspaces under a directory whose parents are all"
            f" world-executable (e.g. {tempfile.gettempdir()}), or chmod o+x {blocker}"
        )


def exec_command(
    workspace: str | os.PathLike[str],
    argv: list[str],
    *,
    timeout: float = 300.0,
    max_output: int = 30000,
    network: bool = False,
    config: SandboxConfig | None = None,
    hold_devices: Sequence[str] = (),
) -> Outcome:
    """Run ``argv`` in ``workspace``: its own session and process group (all killed at the
    limit), no network unless asked, limits on processes and file size, writes confined to the
    workspace, its scratch directory and its tools' own cache (:func:`tools_cache_dir`); stdout
    and stderr each capped (head and tail kept). Started as root, the command runs as a leased
    unprivileged uid that is given the workspace, its scratch directory and its tools' cache for
    the command's time: root inside a mount namespace could remount the read-only views
    writable. ``config``: the evaluation's :class:`SandboxConfig`, whose cache the tools read
    (default ``SandboxConfig()``). ``hold_devices``: timing domains (``gate.domain_of``) whose
    gates the command holds shared for its whole time (a lengthy hold, host-wide): a command line
    can run any program on them, so nothing timed there overlaps it (a timed section waits for
    the commands running; new ones wait behind a waiting one). Its own tools
    (``utils/profile.py``) lock in its scratch directory (``$TMPDIR``), not the evaluator's gate
    directory, so they never wait for the command they run in."""
    ws = Path(workspace).resolve()
    # the workspace's utils/ build and evaluate through this package, into a cache of their own
    # that also reads (never writes) the trusted one
    cache = tools_cache_dir(ws, config)
    tmp = exec_tmp_dir() / _ws_key(ws)
    if not cache.exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        _collect_stale_tools_caches(cache.parent)
        cache.with_suffix(".workspace").write_text(str(ws))
    for d in (cache, tmp):
        d.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k in KEEP_ENV}
    env["TMPDIR"] = str(tmp)
    env["CUDA_AGENT_SANDBOX_CACHE"] = str(cache)
    env[READ_ALSO_ENV] = str(trusted_cache_root(config))
    lim = Limits(timeout_s=timeout, output_cap=max_output, no_network=not network, rss_mb=None)
    with contextlib.ExitStack() as held:
        for domain in hold_devices:  # before the uid: a command waiting here leases none
            held.enter_context(device_gate(domain).shared(None, "workspace command", lengthy=True))
        with sandbox_uid(lim) as uid:
            if uid is not None:
                check_workspace_reachable(ws)
                for d in (ws, cache, tmp):
                    give_tree(d, uid)
                env["HOME"] = str(tmp)  # root's home is not the command's
            return run_confined(
                argv, cwd=ws, env=env, limits=lim, writable=[ws, tmp, cache], uid=uid
            )


def exec_shell(workspace: str | os.PathLike[str], command: str, **kw) -> Outcome:
    """:func:`exec_command` of a shell command line (``bash -lc``-free: ``bash -c``)."""
    return exec_command(workspace, ["bash", "-c", command], **kw)
