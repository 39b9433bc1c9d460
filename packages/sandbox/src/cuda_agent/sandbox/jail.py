"""Launcher that confines one process, then ``exec``s the real command (run as a script).

Usage: ``python -I -S jail.py CONFIG_JSON -- ARGV...``. Runs in a fresh, single-threaded
process (started with ``start_new_session``), so no Python thread of the parent can deadlock it.
Steps, each recorded in the report file the parent named (written before privileges drop, so
the confined program cannot forge it):

1. join a pids cgroup (``cgroup``: a directory whose ``cgroup.procs`` we may write);
2. leave the network: a new network namespace (root) or user+network namespace (non-root);
3. resource limits (``rlimits``: name -> soft=hard value);
4. drop to an unprivileged uid/gid (``uid``) when started as root;
5. ``chdir`` and ``execve``.

A step marked required (``require``) that fails ends the launcher with exit code 111.
``--killall UID`` instead kills every process of UID (used after a phase ends).
This file imports only the standard library.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
JAIL_FAILED = 111


def _unshare(flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _killall(uid: int) -> int:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--killall":
        return _killall(int(argv[1]))
    cfg = json.loads(argv[0])
    cmd = argv[2:] if len(argv) > 1 and argv[1] == "--" else argv[1:]
    report: dict = {"pid": os.getpid()}
    require = set(cfg.get("require", []))
    failed: list[str] = []

    def step(name: str, fn) -> None:
        try:
            fn()
            report[name] = "ok"
        except Exception as e:  # noqa: BLE001 - recorded
            report[name] = f"failed: {e}"
            if name in require:
                failed.append(name)

    if cfg.get("cgroup"):
        step(
            "cgroup", lambda: _write(os.path.join(cfg["cgroup"], "cgroup.procs"), str(os.getpid()))
        )
    if cfg.get("no_network"):
        if os.geteuid() == 0:
            step("network", lambda: _unshare(CLONE_NEWNET))
        else:
            uid, gid = os.getuid(), os.getgid()

            def userns() -> None:
                _unshare(CLONE_NEWUSER | CLONE_NEWNET)
                _write("/proc/self/setgroups", "deny")
                _write("/proc/self/uid_map", f"{uid} {uid} 1")
                _write("/proc/self/gid_map", f"{gid} {gid} 1")

            step("network", userns)
    for name, value in (cfg.get("rlimits") or {}).items():
        res = getattr(resource, "RLIMIT_" + name.upper())
        step(f"rlimit_{name}", lambda res=res, value=value: resource.setrlimit(res, (value, value)))
    uid = cfg.get("uid")
    if uid is not None and os.geteuid() == 0:

        def drop() -> None:
            os.setgroups([])
            os.setgid(int(cfg.get("gid", uid)))
            os.setuid(int(uid))

        step("user", drop)
    if cfg.get("report"):
        try:
            _write(cfg["report"], json.dumps(report))
        except OSError:
            pass
    if failed:
        sys.stderr.write(f"jail: required step(s) failed: {', '.join(failed)}: {report}\n")
        return JAIL_FAILED
    if cfg.get("cwd"):
        os.chdir(cfg["cwd"])
    env = cfg.get("env")
    try:
        if env is None:
            os.execvp(cmd[0], cmd)
        else:
            os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        sys.stderr.write(f"jail: cannot execute {cmd[0]}: {e}\n")
        return 127
    return 0  # unreachable


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
