"""Launcher that confines one process, then ``exec``s the real command (run as a script).

Usage: ``python -I -S jail.py CONFIG_JSON -- ARGV...``. Runs in a fresh, single-threaded
process (started with ``start_new_session``), so no Python thread of the parent can deadlock it.
Steps, each recorded in the report file the parent named (written before privileges drop, so
the confined program cannot forge it):

1. join a pids cgroup (``cgroup``: a directory whose ``cgroup.procs`` we may write);
2. new namespaces: mount and pid always tried (``namespaces``), network when ``no_network``
   (as non-root inside a new user namespace);
3. fork: the child is pid 1 of the new pid namespace, so it cannot see or signal any process
   outside it (its parent's process group included), and everything it starts dies with it;
   this launcher waits and passes on its exit status (a signal death is re-raised);
4. in the child: the file system read-only except the ``writable`` directories (and /dev/shm),
   a fresh /proc, resource limits (``rlimits``), an unprivileged uid/gid (``uid``) when root,
   ``chdir`` and ``execve``.

A step listed in ``require`` that fails ends the launcher with exit code 111.
``--killall UID`` instead kills every process of UID (used after a phase ends).
This file imports only the standard library.

Warm mode (``python jail.py --warm MODULE[,MODULE...]``, started ahead of need without ``-I
-S``): import the modules (e.g. the runner and torch: seconds per process), then read one job,
``{"cfg": ..., "cmd": [...]}``, as a JSON line on stdin and confine itself as above. Where the
command is ``[this interpreter, "-m", MODULE, ARGS...]`` with MODULE among those imported, the
last step does what ``exec`` would: the job's environment, working directory, ``sys.path[0]``
and ``sys.argv``, then ``MODULE.main(ARGS)`` in this process (after the same confinement, uid
drop included); any other command is ``exec``ed. So the import is paid before the job exists.

Fork-server mode (``python jail.py --zygote MODULE[,MODULE...] FD``): import the modules once,
then serve requests on the socket FD: each request carries a run mark and four descriptors (the
child's stdin, stdout, stderr, and a pipe for its exit status). The server forks a child that
takes those as its standard streams, starts a session of its own, closes every descriptor the
import did not open, and then does what a warm launcher does after its import (one job from
stdin). The run mark is written into the child's initial environment block before the fork
(``/proc/PID/environ``, which the last sweep reads, shows that block), so each child carries its
own; the server waits for its children and writes each one's wait status to its pipe. It ends
when the socket closes, and with its parent.
"""

import contextlib
import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
JAIL_FAILED = 111

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4


def _die_with_parent() -> None:
    """SIGKILL this process when its parent dies: a killed evaluator leaves no candidate
    running. The kernel clears the request on a uid change (set it again after dropping)."""
    ppid = os.getppid()
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if ppid > 1 and os.getppid() != ppid:  # the parent died before the request
        os._exit(JAIL_FAILED)


def _unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def _mount(src, target, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(
        _libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f"mount {target}",
    )


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _killall(uid: int) -> int:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    return 0


def _mount_points() -> list[str]:
    pts = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) > 4:
                pts.append(parts[4].replace("\\040", " "))
    return pts


def _hide(paths: list[str]) -> None:
    """An empty read-only tmpfs over each of ``paths``: their files are invisible, even to root."""
    for d in paths:
        _mount(
            "tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=000"
        )


def _read_only_fs(writable: list[str]) -> None:
    """Everything read-only but ``writable`` (bind-mounted onto themselves first) and /dev."""
    for d in writable:
        _mount(d, d, None, MS_BIND | MS_REC)
    keep = tuple(os.path.realpath(d) for d in writable)
    for mp in _mount_points():
        if mp.startswith(("/proc", "/sys", "/dev")) or os.path.realpath(mp).startswith(keep):
            continue
        try:
            st = os.statvfs(mp)
        except OSError:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for bit, ms in (
            (os.ST_NOSUID, MS_NOSUID),
            (os.ST_NODEV, MS_NODEV),
            (os.ST_NOEXEC, MS_NOEXEC),
        ):
            if st.f_flag & bit:
                flags |= ms
        with contextlib.suppress(OSError):
            _mount(None, mp, None, flags)
    # the root itself must have become read-only, or the step failed
    if not (os.statvfs("/").f_flag & os.ST_RDONLY):
        raise OSError("/ is still writable")


def _import(modules: list[str]) -> None:
    """Import ``modules`` as a launcher whose jobs run the first of them (``python -m``)."""
    import importlib
    import warnings

    # run as a script, sys.path[0] is this package's directory: `python -m` would have the
    # working directory there (set per job below), never the sandbox's own modules
    sys.path[0] = "/"
    # fork() in a process whose libraries started threads (OpenBLAS, OpenMP) is what every
    # fork-started torch DataLoader worker does; Python 3.12 warns on it
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork.*")
    # the first module is the one jobs run; the others only save their import later (a job
    # that needs one that failed here fails there, as it would have started cold)
    importlib.import_module(modules[0])
    for m in modules[1:]:
        with contextlib.suppress(Exception):
            importlib.import_module(m)


def _warm(modules: list[str]) -> int:
    """Import ``modules``, then take one job from stdin and run it (see the module docstring)."""
    _die_with_parent()
    _import(modules)
    return _one_job(modules)


def _one_job(modules: list[str]) -> int:
    """Read one job from stdin and run it, ``modules`` already imported (never returns)."""
    line = sys.stdin.buffer.readline()
    if not line.strip():
        os._exit(0)  # retired unused (no teardown of what it imported)
    job = json.loads(line)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    rc = main([json.dumps(job["cfg"]), "--", *job["cmd"]], warm={modules[0]})
    # the launcher's own end: no interpreter teardown of what it imported (seconds for torch)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(rc)


class _EnvironValue:
    """The bytes of ``NAME``'s value in this process's initial environment block (what
    ``/proc/self/environ`` shows, and what a child forked from here starts with), rewritable in
    place with a value of the same length."""

    def __init__(self, name: str) -> None:
        self.name = name
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end (fields 50, 51)
        block = ctypes.string_at(start, end - start)
        needle = b"\0" + name.encode() + b"="
        at = (b"\0" + block).find(needle)
        if at < 0:
            raise OSError(f"{name} is not in the initial environment")
        self.addr = start + at + len(needle) - 1
        self.size = block.index(b"\0", at + len(needle) - 1) - (at + len(needle) - 1)

    def set(self, value: str) -> None:
        data = value.encode()
        if len(data) != self.size:
            raise ValueError(f"a value of {self.size} bytes expected, got {len(data)}")
        ctypes.memmove(self.addr, data, self.size)

    def check(self, value: str) -> bool:
        """Whether ``/proc/self/environ`` now shows ``value``."""
        with open("/proc/self/environ", "rb") as f:
            return f"\0{self.name}={value}\0".encode() in b"\0" + f.read()


def _open_fds() -> set[int]:
    listed = [int(n) for n in os.listdir("/proc/self/fd")]
    open_now = set()
    for fd in listed:  # not the listing's own descriptor, closed by now
        with contextlib.suppress(OSError):
            os.fstat(fd)
            open_now.add(fd)
    return open_now


def _zygote(modules: list[str], fd: int, mark_name: str) -> int:
    """Serve forked launchers on the socket ``fd`` (see the module docstring)."""
    import select
    import socket

    _die_with_parent()
    sock = socket.socket(fileno=fd)
    try:
        _import(modules)
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            # a CUDA context does not survive fork: every launcher would fail in the driver
            raise RuntimeError("CUDA was initialised by an import; forked launchers cannot use it")
        env_mark = _EnvironValue(mark_name)
        own = os.environ[mark_name]
        probe = "f" * env_mark.size
        env_mark.set(probe)
        works = env_mark.check(probe)
        env_mark.set(own)
        if not (works and env_mark.check(own)):
            raise OSError("the environment block could not be rewritten")
    except BaseException as e:  # noqa: BLE001 - told to the parent, which starts cold instead
        with contextlib.suppress(OSError):
            sock.send(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
        return JAIL_FAILED
    keep = _open_fds() - {fd}  # what the import opened: the children keep those
    status: dict[int, int] = {}  # child pid -> the write end of its status pipe
    # A SIGCHLD the kernel delivers to another thread of this process (the imports start some)
    # neither wakes the main thread from its wait for the next request nor is held back by its
    # signal mask: the Python handler then runs late (a child's end unreported until the next
    # request, its parent waiting on it), or between a fork and the record of the child's pipe.
    # So the main thread also reaps every 0.2 s, and a status reaped before its pipe is known
    # is kept until it is.
    exited: dict[int, int] = {}

    def tell(w: int, st: int) -> None:
        with contextlib.suppress(OSError):
            os.write(w, f"{st}\n".encode())
        os.close(w)

    def reap(_sig=None, _frame=None) -> None:
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            w = status.pop(pid, None)
            if w is None:
                exited[pid] = st
            else:
                tell(w, st)

    def refuse(fds: list[int], why: str) -> None:
        for f in fds:
            os.close(f)
        sock.send(json.dumps({"error": why}).encode())

    signal.signal(signal.SIGCHLD, reap)
    sock.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        reap()
        try:
            if not select.select([sock], [], [], 0.2)[0]:
                continue
            msg, fds, _flags, _addr = socket.recv_fds(sock, 4096, 4)
        except OSError:
            break
        if not msg:
            break  # the parent closed the socket
        try:
            mark = json.loads(msg)["mark"]
            if len(fds) != 4:
                raise ValueError(f"4 descriptors expected, got {len(fds)}")
            env_mark.set(mark)
        except (ValueError, KeyError, TypeError) as e:
            refuse(fds, str(e))
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        # no reaping between the fork and the record of the child's status pipe
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            pid = os.fork()
        except OSError as e:  # e.g. out of processes: this request fails, the server serves on
            env_mark.set(own)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            refuse(fds, f"fork: {e}")
            continue
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            os.setsid()
            for i, f in enumerate(fds[:3]):
                os.dup2(f, i)
            for f in _open_fds() - keep - {0, 1, 2}:
                with contextlib.suppress(OSError):
                    os.close(f)  # the socket, its own fds, every other child's status pipe
            os._exit(_one_job(modules))
        env_mark.set(own)
        if pid in exited:  # it ended (and was reaped) before its pipe was recorded
            tell(fds[3], exited.pop(pid))
        else:
            status[pid] = fds[3]
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        for f in fds[:3]:
            os.close(f)
        sock.send(json.dumps({"pid": pid}).encode())
    return 0


def _run_in_process(cfg: dict, cmd: list[str], warm: set) -> bool:
    """``exec`` of ``python -m MODULE ARGS`` done in this process, MODULE already imported:
    False (nothing done) for any other command."""
    if len(cmd) < 3 or cmd[1] != "-m" or cmd[2] not in warm:
        return False
    # the same interpreter, however its path was spelled (a parent started as `../bin/python`
    # names it with the `..`), not merely the same binary behind a symlink: another venv
    same = os.path.normpath(os.path.abspath(cmd[0])) == os.path.normpath(sys.executable)
    if not same:
        return False
    mod = sys.modules.get(cmd[2])
    if mod is None or not callable(getattr(mod, "main", None)):
        return False
    import tempfile

    # a uid change leaves a process not dumpable (its /proc entries root's) until it execs a
    # program; exec is what a cold launch does next, so do what it would
    _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    env = cfg.get("env")
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    tempfile.tempdir = None  # gettempdir() caches; the job's TMPDIR decides
    cwd = cfg.get("cwd") or os.getcwd()
    os.chdir(cwd)
    sys.path[0] = cwd
    sys.argv = [getattr(mod, "__file__", None) or cmd[2], *cmd[3:]]
    warm_start = getattr(mod, "warm_start", None)
    if callable(warm_start):
        warm_start()
    code = 1
    try:
        rc = mod.main(cmd[3:])
        code = rc if isinstance(rc, int) else 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - as an uncaught exception would end `python -m`
        import traceback

        traceback.print_exc()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


class _Steps:
    """The launcher's report (``cfg["report"]``, opened now: written before privileges drop)
    and its steps: each runs once, its outcome recorded; a failed step that ``cfg`` requires is
    kept in :attr:`failed`."""

    def __init__(self, cfg: dict):
        self.report: dict = {"pid": os.getpid()}
        self.require = set(cfg.get("require", []))
        self.failed: list[str] = []
        self.fd = None
        if cfg.get("report"):
            with contextlib.suppress(OSError):
                self.fd = os.open(
                    cfg["report"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600
                )

    def step(self, name: str, fn) -> bool:
        """Run ``fn``; True when it did not raise."""
        try:
            fn()
            self.report[name] = "ok"
            return True
        except Exception as e:  # noqa: BLE001 - recorded
            self.report[name] = f"failed: {e}"
            if name in self.require:
                self.failed.append(name)
            return False

    def finish(self) -> None:
        """Write the report and close it."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.write(self.fd, json.dumps(self.report).encode())
                os.close(self.fd)

    def close(self) -> None:
        """Close the report unwritten (a process that leaves it to its child)."""
        if self.fd is not None:
            os.close(self.fd)

    def refuse(self) -> int:
        """Write the report, say which required steps failed; the launcher's exit code."""
        self.finish()
        sys.stderr.write(
            f"jail: required step(s) failed: {', '.join(self.failed)}: {self.report}\n"
        )
        return JAIL_FAILED


def main(argv: list[str], warm: set | None = None) -> int:
    if argv and argv[0] == "--killall":
        return _killall(int(argv[1]))
    if argv and argv[0] == "--warm":
        return _warm([m for m in argv[1].split(",") if m])
    if argv and argv[0] == "--zygote":
        return _zygote([m for m in argv[1].split(",") if m], int(argv[2]), argv[3])
    _die_with_parent()
    cfg = json.loads(argv[0])
    cmd = argv[2:] if len(argv) > 1 and argv[1] == "--" else argv[1:]
    s = _Steps(cfg)
    if cfg.get("cgroup"):
        s.step(
            "cgroup", lambda: _write(os.path.join(cfg["cgroup"], "cgroup.procs"), str(os.getpid()))
        )
    root = os.geteuid() == 0
    want_ns = cfg.get("namespaces", True)
    ns_ok = _namespaces(cfg, s, root, want_ns)
    if cfg.get("hidden") and not (ns_ok and want_ns):
        s.report["hide"] = "failed: no mount namespace"
        s.failed.append("hide")
    if s.failed:
        return s.refuse()
    if ns_ok and want_ns:  # a pid namespace
        rd, wr = os.pipe()
        init = os.fork()
        if init != 0:  # the launcher, outside: wait for the namespace's init, pass the status on
            os.close(wr)
            s.close()
            return _pass_on_status(init, rd)
        _namespace_init(cfg, s, rd, wr)
    _exec(cfg, cmd, s.report, s.step, s.failed, s.finish, root, warm)
    return 0


def _namespaces(cfg: dict, s: _Steps, root: bool, want_ns: bool) -> bool:
    """Step ``namespaces``: new mount and pid namespaces (``want_ns``) and, with
    ``no_network``, a network namespace (as non-root inside a new user namespace); True when
    they were made. ``network`` is reported (and required) as ``namespaces`` went."""
    flags = (CLONE_NEWNS | CLONE_NEWPID) if want_ns else 0
    if cfg.get("no_network"):
        flags |= CLONE_NEWNET
    if not flags:
        return False
    if root:
        ns_ok = s.step("namespaces", lambda: _unshare(flags))
    else:
        uid, gid = os.getuid(), os.getgid()

        def userns() -> None:
            _unshare(CLONE_NEWUSER | flags)
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")

        ns_ok = s.step("namespaces", userns)
    if cfg.get("no_network"):
        s.report["network"] = "ok" if ns_ok else s.report.get("namespaces", "failed")
        if not ns_ok and "network" in s.require:
            s.failed.append("network")
    return ns_ok


def _pass_on_status(init: int, rd: int) -> int:
    """The launcher outside the pid namespace: wait for its init (``init``; killed on a
    signal to the launcher) and end as the command did, its status read from ``rd`` (a signal
    death is re-raised)."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda sig, _f: os.kill(init, signal.SIGKILL))
    _, st = os.waitpid(init, 0)
    data = b""
    with contextlib.suppress(OSError):
        data = os.read(rd, 64)
    status = int(data) if data.strip() else st
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def _namespace_init(cfg: dict, s: _Steps, rd: int, wr: int) -> None:
    """Pid 1 of the namespace: set up the file system, start the command, reap, report the
    command's status on ``wr``. Returns only in the command's process (own session), which goes
    on to :func:`_exec`."""
    _die_with_parent()  # its death ends the namespace, and everything in it
    os.close(rd)
    writable = [d for d in cfg.get("writable", []) if os.path.isdir(d)]
    s.step("private_mounts", lambda: _mount(None, "/", None, MS_REC | MS_PRIVATE))
    hidden = [d for d in cfg.get("hidden", []) if os.path.isdir(d)]
    if hidden:
        s.step("hide", lambda: _hide(hidden))
    if cfg.get("read_only_fs", True):
        s.step("read_only_fs", lambda: _read_only_fs(writable))
    s.step("proc", lambda: _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC))
    if cfg.get("private_shm", True) and os.path.isdir("/dev/shm"):
        # a private /dev/shm: nothing left there outlives the namespace
        s.step(
            "shm",
            lambda: _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=4g"),
        )
    if s.failed:
        os._exit(s.refuse())
    cmd_pid = os.fork()
    if cmd_pid != 0:
        s.close()
        while True:
            try:
                pid, st = os.waitpid(-1, 0)
            except ChildProcessError:
                os._exit(1)
            if pid == cmd_pid:
                os.write(wr, str(st).encode())
                os._exit(0)  # the kernel kills everything left in the namespace
    os.close(wr)
    os.setsid()  # own process group: kill(0) reaches nothing outside


def _exec(cfg, cmd, report, step, failed, finish_report, root, warm=None) -> None:
    if cfg.get("cpus"):
        step("cpus", lambda: os.sched_setaffinity(0, cfg["cpus"]))
    for name, value in (cfg.get("rlimits") or {}).items():
        res = getattr(resource, "RLIMIT_" + name.upper())
        step(f"rlimit_{name}", lambda res=res, value=value: resource.setrlimit(res, (value, value)))
    uid = cfg.get("uid")
    if uid is not None and root:

        def drop() -> None:
            os.setgroups([])
            os.setgid(int(cfg.get("gid", uid)))
            os.setuid(int(uid))

        step("user", drop)
        _die_with_parent()
    finish_report()
    if failed:
        sys.stderr.write(f"jail: required step(s) failed: {', '.join(failed)}: {report}\n")
        os._exit(JAIL_FAILED)
    if warm and _run_in_process(cfg, cmd, warm):
        return  # not reached: it exits
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
    os._exit(127)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
