"""Which user confined commands run as: leased uids for commands that run side by side (compiler
processes, agent tool commands), and what running as one keeps a candidate or an agent from."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from cuda_agent.sandbox import isolation
from cuda_agent.sandbox.isolation import caps, leased_uid

needs_drop = pytest.mark.skipif(
    not caps().drop_user, reason="runs as root with a uid to drop to (e.g. the GPU host)"
)

HOLDER = textwrap.dedent(
    """
    import importlib.util, sys, time
    spec = importlib.util.spec_from_file_location("iso", sys.argv[1])
    iso = sys.modules["iso"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(iso)
    iso.LEASED_UIDS = 2
    with iso.leased_uid() as uid:
        print(uid, flush=True)
        sys.stdin.read()  # held until the test closes stdin
    """
)


def test_a_leased_uid_is_held_host_wide(monkeypatch):
    """Two commands never share a leased uid, across processes too: the sweep after a command
    kills every process of its uid, so a shared one would kill the other's command."""
    monkeypatch.setattr(isolation, "LEASED_UIDS", 2)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, isolation.__file__],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        held = int(holder.stdout.readline())
        with leased_uid() as mine:
            assert mine != held and {mine, held} == {
                isolation.LEASED_UID_BASE,
                isolation.LEASED_UID_BASE + 1,
            }
            with pytest.raises(RuntimeError, match="in use"), leased_uid():
                pass
        with leased_uid() as again:  # released at the block's end
            assert again == mine
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    with leased_uid() as a, leased_uid() as b:  # the holder's lock died with it
        assert {a, b} == {isolation.LEASED_UID_BASE, isolation.LEASED_UID_BASE + 1}
    assert min(isolation.LEASED_UID_BASE, isolation.LEASED_UID_BASE + 4096) > isolation.slot_uid(63)


@needs_drop
def test_compilers_cannot_read_what_their_uid_may_not(
    confined_tmp, scale_add_task, scale_add_files
):
    """A candidate's source may name any file (``#include "/abs/path"``) and the compiler's
    errors go back to the agent: compilers run as a leased unprivileged uid, so a root-only file
    stays unread; a clean build still works and leaves root-owned objects in the cache."""
    from cuda_agent.sandbox.build import ObjectCache, build_workdir
    from cuda_agent.sandbox.isolation import Limits
    from cuda_agent.sandbox.workspace import materialise

    from .conftest import workdir_candidate

    secret = confined_tmp / "secret.h"
    secret.write_text("#error TOP-SECRET-7f3a\n")
    secret.chmod(0o600)
    cache = ObjectCache(confined_tmp / "cache")

    def build(name: str, **changes: str):
        c = workdir_candidate(scale_add_task, scale_add_files, **changes)
        work = materialise(c.task, c.solution, confined_tmp / name, "cpu")
        os.chmod(work, 0o755)
        lim = Limits(timeout_s=600)
        return work, build_workdir(
            work, work / "build", backend="cpu", cache=cache, pch=False, limits=lim
        )

    ops = scale_add_files["kernels/ops.cpp"]
    _, res = build("bad", **{"kernels/ops.cpp": f'#include "{secret}"\n' + ops})
    assert not res.ok
    assert "TOP-SECRET" not in res.log and "Permission denied" in res.log, res.log[-2000:]
    work, res = build("good")
    assert res.ok, res.log[-2000:]
    cached = [p for p in (confined_tmp / "cache").rglob("*") if p.is_file()]
    assert cached and all(p.stat().st_uid == os.geteuid() for p in cached)
    assert not list((work / "build").glob(".scratch-*"))


@needs_drop
def test_agent_commands_run_as_an_unprivileged_uid(confined_tmp, monkeypatch):
    """Root inside a mount namespace can remount its read-only views writable: started as root,
    an agent's command runs as a leased uid, which cannot, and owns only its workspace."""
    from cuda_agent.sandbox import exec_shell

    monkeypatch.setenv("CUDA_AGENT_SANDBOX_CACHE", str(confined_tmp / "cache"))
    trusted = confined_tmp / "cache" / "build"
    trusted.mkdir(parents=True)
    ws = confined_tmp / "ws"
    ws.mkdir()
    (ws / "model_new.py").write_text("x = 1\n")
    out = exec_shell(
        ws,
        f"id -u; mount -o remount,rw,bind {trusted} {trusted}; touch {trusted}/x && echo WROTE;"
        " echo y >> model_new.py && echo EDITED",
    )
    uid = int(out.stdout.split()[0])
    assert uid != 0 and uid >= isolation.LEASED_UID_BASE, out
    assert "WROTE" not in out.stdout and not (trusted / "x").exists(), out
    assert "EDITED" in out.stdout and (ws / "model_new.py").read_text() == "x = 1\ny\n", out


@needs_drop
def test_an_unreachable_workspace_is_refused_with_the_blocking_directory(tmp_path):
    from cuda_agent.sandbox.execute import check_workspace_reachable

    tmp_path.parent.chmod(0o700)
    with pytest.raises(PermissionError, match=str(tmp_path.parent)):
        check_workspace_reachable(tmp_path / "ws")
