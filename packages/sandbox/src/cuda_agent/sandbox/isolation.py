"""Run one untrusted command confined: own session, limits, no network, another uid, a deadline.

:func:`run_confined` is the only way the sandbox starts a process that runs candidate code (or
compiles it). Guarantees, where the OS allows (what was in force is returned in
``Outcome.isolation``):

- a new session and process group; on the deadline, and again after every exit, the whole group,
  the pids cgroup and (under its own uid) every process of the sandbox uid are SIGKILLed, so
  nothing the candidate started outlives its phase;
- process count (pids cgroup, else RLIMIT_NPROC under a dedicated uid), file size, open files,
  address space (``address_space_mb``, CPU work only) and a resident-memory watchdog;
- no network (a fresh network namespace: no interface is up);
- its own pid namespace (it cannot signal its parent's process group) and mount namespace with
  the file system read-only except the directories it is given;
- an unprivileged uid when started as root and the interpreter is reachable by it: per worker
  slot (:func:`slot_uid`), or leased host-wide for commands that run side by side outside the
  slots, compilers and agent tool commands (:func:`sandbox_uid`);
- stdout/stderr captured with a cap: the head and tail are kept and the cut is said.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import select
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JAIL = str(Path(__file__).with_name("jail.py"))
UID_BASE = 61000
# leased uids (:func:`leased_uid`) start above every slot uid
LEASED_UID_BASE = UID_BASE + 70_000
LEASED_UIDS = 4096


@dataclass
class Limits:
    """Limits of one confined process. ``None`` disables a limit."""

    timeout_s: float = 120.0
    nproc: int | None = 512
    fsize_mb: int | None = 4096
    nofile: int | None = 4096
    address_space_mb: int | None = None  # RLIMIT_AS: CPU-only work (CUDA reserves huge ranges)
    rss_mb: int | None = 32768  # watchdog on the resident memory of the whole process tree
    no_network: bool = True
    # cores the process (and all it starts) runs on, set before exec; None: the parent's
    cpus: tuple[int, ...] | None = None
    drop_user: bool = True
    output_cap: int = 64_000  # bytes of stdout and of stderr kept (half head, half tail)
    read_only_fs: bool = True  # everything but the ``writable`` directories (and /dev) read-only


@dataclass
class Outcome:
    """What happened to a confined process."""

    returncode: int | None
    timed_out: bool
    seconds: float
    stdout: str
    stderr: str
    killed_for: str = ""  # "timeout" | "memory" | "processes" | ""
    isolation: dict[str, str] = field(default_factory=dict)
    warm: bool = False  # ran in a launcher started ahead of need (see :class:`WarmProcess`)

    @property
    def signal(self) -> int | None:
        rc = self.returncode
        return -rc if rc is not None and rc < 0 else None

    def describe(self) -> str:
        """One line: exit code or signal, or why it was killed."""
        if self.killed_for == "timeout":
            return f"killed after the {self.seconds:.0f}s wall-clock limit"
        if self.killed_for == "memory":
            return "killed: resident memory over the limit"
        if self.killed_for == "processes":
            return "killed: process limit reached (fork bomb?)"
        if self.signal:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = str(self.signal)
            return f"died of signal {name}"
        return f"exit code {self.returncode}"


class _Capped:
    """Keeps the first and last ``cap/2`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int):
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_len = 0
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail.append(data)
            self.tail_len += len(data)
            while self.tail and self.tail_len - len(self.tail[0]) >= self.tail_cap:
                self.tail_len -= len(self.tail.popleft())

    def text(self) -> str:
        tail = b"".join(self.tail)
        if len(tail) > self.tail_cap:
            tail = tail[-self.tail_cap :]
        cut = self.total - len(self.head) - len(tail)
        head_s = self.head.decode(errors="replace")
        tail_s = tail.decode(errors="replace")
        if cut > 0:
            return f"{head_s}\n[... {cut} bytes cut ...]\n{tail_s}"
        return head_s + tail_s


def cap_text(text: str, cap: int) -> str:
    """``text`` cut to about ``cap`` bytes: head and tail kept, the cut said."""
    c = _Capped(cap)
    c.feed(text.encode(errors="replace"))
    return c.text()


def _reader(stream: Any, sink: _Capped) -> None:
    try:
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                break
            sink.feed(chunk)
    except (OSError, ValueError):
        pass


# ---------------------------------------------------------------- capabilities


def _cgroup_pids_root() -> Path | None:
    for root in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if (root / "cgroup.procs").exists() and (
            root.name == "pids" or "pids" in _read(root / "cgroup.subtree_control")
        ):
            base = root / "cuda_agent_sandbox"
            try:
                base.mkdir(exist_ok=True)
                probe = base / f"probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
                probe.mkdir()
                ok = (probe / "pids.max").exists()
                probe.rmdir()
                if ok:
                    return base
            except OSError:
                continue
    return None


def _read(p: Path) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""


@dataclass(frozen=True)
class Caps:
    """What confinement this machine allows (probed once per process)."""

    root: bool
    drop_user: bool
    drop_user_why: str
    network_ns: bool
    network_why: str
    cgroup_base: str | None


@functools.lru_cache(maxsize=1)
def caps() -> Caps:
    """Probe once: can we drop to another uid (and still run this Python), unshare the network,
    use a pids cgroup. Costs one interpreter start or two."""
    root = os.geteuid() == 0
    cg = _cgroup_pids_root()
    drop, drop_why = False, "not root"
    if root:
        probe_uid = UID_BASE + 999
        env = {
            k: os.environ[k] for k in ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH") if k in os.environ
        }
        passed = _drop_probe_record(env)
        if passed is not None and _read_own(passed) == b"ok":
            drop = True  # this probe passed before, on this boot, with these files
        else:
            code = "import torch, msgspec, cuda_agent.sandbox.runner, cuda_agent.profiler.program"
            rc, err = _probe(
                {"uid": probe_uid, "require": ["user"], "env": env, "cwd": "/"},
                [sys.executable, "-c", code],
            )
            drop = rc == 0
            if drop and passed is not None:
                _write_own(passed, b"ok")
        drop_why = (
            ""
            if drop
            else f"uid {probe_uid} cannot run {sys.executable} with torch: {err.strip()[-300:]}"
        )
    rc, err = _probe(
        {"no_network": True, "require": ["network"]}, [sys.executable, "-I", "-S", "-c", "pass"]
    )
    net = rc == 0
    return Caps(
        root=root,
        drop_user=drop,
        drop_user_why=drop_why,
        network_ns=net,
        network_why="" if net else f"no network namespace: {err.strip()[-300:]}",
        cgroup_base=str(cg) if cg else None,
    )


def _drop_probe_record(env: dict[str, str]) -> Path | None:
    """Where a passed uid-drop probe is recorded: a file keyed by this boot, the interpreter,
    the torch installation, the environment the probe ran with, and the owner and mode of
    every directory the unprivileged uid must traverse to import what the runner imports
    (a chmod, a reinstall or a reboot asks again). The probe imports torch as that uid (3-4 s),
    which every ``sandbox`` process started as root, e.g. each agent tool command, paid."""
    import hashlib

    from .toolchain import _boot_key, _torch_install_key, default_cache_dir

    boot, torch_key = _boot_key(), _torch_install_key()
    if boot is None or torch_key is None:
        return None
    import importlib.util

    h = hashlib.sha256(f"{boot}\0{torch_key}\0{os.path.realpath(sys.executable)}\0".encode())
    h.update(json.dumps(env, sort_keys=True).encode())
    dirs: set[Path] = set()
    for mod in ("torch", "msgspec", "cuda_agent.sandbox", "cuda_agent.profiler"):
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(mod)
            if spec is not None and spec.origin:
                d = Path(spec.origin).resolve().parent
                dirs.update([d, *d.parents])
    dirs.update([Path(os.path.realpath(sys.executable)), *Path(sys.executable).resolve().parents])
    for d in sorted(dirs):
        try:
            st = os.stat(d)
        except OSError:
            return None
        h.update(f"{d}:{st.st_uid}:{st.st_gid}:{st.st_mode}\0".encode())
    return default_cache_dir() / "toolchain" / f"drop-probe-{h.hexdigest()[:24]}"


def _read_own(path: Path) -> bytes | None:
    """The content of a file only this user can have written (owned by it, in a directory
    owned by it, neither writable by others), else None."""
    try:
        for p in (path.parent, path):
            st = os.lstat(p)
            if st.st_uid != os.geteuid() or st.st_mode & 0o022 or stat.S_ISLNK(st.st_mode):
                return None
        return path.read_bytes()
    except OSError:
        return None


def _write_own(path: Path, data: bytes) -> None:
    """Write a file :func:`_read_own` will trust (its directories not writable by others)."""
    from .toolchain import write_atomic

    write_atomic(path, data, dir_mode=0o755)


def _probe(cfg: dict[str, Any], cmd: list[str]) -> tuple[int, str]:
    try:
        p = subprocess.run(
            [sys.executable, "-I", "-S", JAIL, json.dumps(cfg), "--", *cmd],
            capture_output=True,
            timeout=120,
            start_new_session=True,
        )
        return p.returncode, p.stderr.decode(errors="replace")
    except (OSError, subprocess.TimeoutExpired) as e:
        return -1, str(e)


def slot_uid(slot: int) -> int:
    """The uid confined processes of worker ``slot`` run as (distinct per parent process)."""
    return UID_BASE + 1000 + (os.getpid() % 997) * 64 + (slot % 64)


@contextlib.contextmanager
def leased_uid() -> Iterator[int]:
    """An unprivileged uid that no other confined command on this host holds until the block
    ends (one lock file per uid in a root-only directory; a lock dies with its process). The
    sweep after every command SIGKILLs all processes of its uid, so commands that run side by
    side must not share one: compiler processes of one build, agent commands of many episodes.
    Raises RuntimeError when all :data:`LEASED_UIDS` are held."""
    d = Path(tempfile.gettempdir()) / f"cuda-agent-uid-leases-{os.geteuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        # someone else's directory (or a link) in a shared /tmp: its leases would not be ours
        raise RuntimeError(f"{d} is not a directory of this user's alone: remove it")
    start = int.from_bytes(os.urandom(2), "little")
    for i in range(LEASED_UIDS):
        uid = LEASED_UID_BASE + (start + i) % LEASED_UIDS
        fd = os.open(d / str(uid), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)
        return
    raise RuntimeError(f"all {LEASED_UIDS} sandbox uids are in use (see {d})")


@contextlib.contextmanager
def sandbox_uid(limits: Limits | None = None) -> Iterator[int | None]:
    """A leased uid (:func:`leased_uid`) when confined processes run as another user (started as
    root, ``limits.drop_user``, the probe passed), else None: pass it to :func:`run_confined`
    and :func:`prepare_writable` as ``uid``."""
    if (limits is not None and not limits.drop_user) or not caps().drop_user:
        yield None
        return
    with leased_uid() as uid:
        yield uid


def give_tree(path: str | os.PathLike[str], uid: int) -> None:
    """Make every file and directory under ``path`` (included) owned by ``uid``: what a
    confined command of that uid may change, e.g. an agent's workspace. Links are not
    followed."""
    root = Path(path)
    os.lchown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            with contextlib.suppress(FileNotFoundError):
                os.lchown(os.path.join(dirpath, name), uid, uid)


# ---------------------------------------------------------------- running


def _tree_rss_mb(pid: int) -> float:
    try:
        import psutil

        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
        total = 0
        for q in procs:
            with contextlib.suppress(psutil.Error):
                total += q.memory_info().rss
        return total / 2**20
    except Exception:  # noqa: BLE001 - process gone
        return 0.0


def _kill_cgroup(cg: Path) -> None:
    for _ in range(50):
        pids = [int(x) for x in _read(cg / "cgroup.procs").split() if x.strip()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    with contextlib.suppress(OSError):
        cg.rmdir()


def _pids_max_hits(cg: Path) -> int:
    """How often the cgroup refused a fork for its pids.max (``pids.events``: ``max N``)."""
    for line in _read(cg / "pids.events").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "max":
            try:
                return int(parts[1])
            except ValueError:
                return 0
    return 0


RUN_MARK = "CUDA_AGENT_RUN"


def kill_marked(mark: str) -> int:
    """SIGKILL every process whose environment holds ``mark`` (``NAME=value``); the count."""
    needle = mark.encode() + b"\0"
    killed = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in (d / "environ").read_bytes():
                os.kill(int(d.name), signal.SIGKILL)
                killed += 1
        except (OSError, ProcessLookupError):
            continue
    return killed


def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` (from a helper running as that uid)."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            [sys.executable, "-I", "-S", JAIL, "--killall", str(uid)],
            timeout=30,
            capture_output=True,
        )


def stop_session(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``, the leader of a session of its own, and its process group; reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(Exception):
        proc.wait(timeout=5)


@dataclass
class WarmProcess:
    """A confinement launcher started ahead of need (``jail.py --warm``) that has imported, or is
    importing, the modules a job will run; :func:`run_confined` hands it one job. ``mark`` is
    the run mark in its environment from the start (``/proc/PID/environ`` shows the
    environment a process started with, which the last sweep reads)."""

    proc: subprocess.Popen
    mark: str

    def alive(self) -> bool:
        return self.proc.poll() is None

    def discard(self) -> None:
        """Stop it (unused, or refused by a job)."""
        stop_session(self.proc)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError, AttributeError):
                f.close()


def start_warm(
    modules: Sequence[str], env: dict[str, str], cwd: str | os.PathLike[str]
) -> WarmProcess:
    """Start a launcher that imports ``modules`` (the first is the one jobs run as ``python -m``)
    under ``env`` and waits for its job; see :class:`WarmProcess`."""
    mark = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, JAIL, "--warm", ",".join(modules)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=str(cwd),
        env={**env, RUN_MARK: mark},
        start_new_session=True,
        close_fds=True,
    )
    return WarmProcess(proc=proc, mark=mark)


def _hand_over(warm: WarmProcess, cfg: dict[str, Any], cmd: list[str]) -> bool:
    """Give ``warm`` its job; False (and it is stopped) when it cannot take it."""
    try:
        if warm.alive() and warm.proc.stdin is not None:
            warm.proc.stdin.write((json.dumps({"cfg": cfg, "cmd": cmd}) + "\n").encode())
            warm.proc.stdin.close()
            return True
    except OSError:
        pass
    warm.discard()
    return False


class _ExitWaiter:
    """Waits for ``proc`` to exit, woken by the exit itself through a pidfd where the kernel has
    them (``Popen.wait`` with a timeout polls with sleeps of up to 50 ms, a delay every confined
    process would add). ``poll``, not ``select``: a long-lived pool's descriptors pass 1024."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.poller = select.poll()
        self.fd: int | None = None
        if getattr(proc, "waits_on_pipe", False):  # a fork server's launcher (forkserver.py)
            return
        try:
            self.fd = os.pidfd_open(proc.pid)
            self.poller.register(self.fd, select.POLLIN)
        except (AttributeError, OSError):
            self.fd = None

    def __call__(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True once the process has exited."""
        if self.fd is not None:
            self.poller.poll(timeout * 1000)
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        return self.proc.poll() is not None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def run_confined(
    cmd: list[str],
    *,
    cwd: str | os.PathLike[str],
    env: dict[str, str],
    limits: Limits,
    slot: int = 0,
    stdin: bytes | None = None,
    pass_fds: tuple[int, ...] = (),
    writable: Sequence[str | os.PathLike[str]] = (),
    hidden: Sequence[str | os.PathLike[str]] = (),
    extend: Callable[[], float] | None = None,
    uid: int | None = None,
    warm: WarmProcess | None = None,
) -> Outcome:
    """Run ``cmd`` confined (see the module docstring); never raises for what the command does.

    ``writable``: the only directories it may write (with namespaces). ``hidden``: directories
    covered by an empty mount in its namespace (required: the launcher refuses to run otherwise).
    ``extend``: seconds added to the wall-clock limit, asked again on every check (time the
    command spends waiting for its parent, e.g. for a device gate, is not its own). ``uid``: run
    as this uid (from :func:`sandbox_uid`) instead of ``slot``'s, where a uid is dropped to.
    ``warm``: a launcher started ahead (:func:`start_warm`) to take this run, confined the same
    way; one that has died or cannot take it is stopped and the run starts cold.
    """
    c = caps()
    dropping = limits.drop_user and c.drop_user
    uid = (uid if uid is not None else slot_uid(slot)) if dropping else None
    if warm is not None and (stdin is not None or pass_fds):  # a job it cannot be handed
        warm.discard()
        warm = None
    # a mark every descendant inherits: the last sweep finds processes that left the process
    # group, and the cgroup where there is none (a candidate can clear it; the cgroup is the
    # primary net, this the fallback)
    run_mark = f"{RUN_MARK}={warm.mark if warm is not None else uuid.uuid4().hex}"
    cfg: dict[str, Any] = {
        "cwd": str(cwd),
        "env": {**env, RUN_MARK: run_mark.split("=", 1)[1]},
        "require": [],
        "writable": [str(Path(w).resolve()) for w in writable],
        "read_only_fs": limits.read_only_fs,
        "hidden": [str(Path(h).resolve()) for h in hidden],
    }
    if hidden:
        cfg["require"].append("hide")  # never run with the hidden files visible
    iso: dict[str, str] = {}
    cg = _confine(cfg, iso, limits, c, uid)
    with tempfile.NamedTemporaryFile(prefix="jail-", suffix=".json", delete=False) as rep:
        report_path = rep.name
    cfg["report"] = report_path
    out, err = _Capped(limits.output_cap), _Capped(limits.output_cap)
    t0 = time.monotonic()
    proc, warm, run_mark = _launch(cfg, cmd, warm, run_mark, stdin, pass_fds)
    readers = _start_io(proc, out, err, stdin)
    exited = _ExitWaiter(proc)
    killed_for = _watch(proc, exited, limits, t0, extend, cg)
    rc = _sweep(proc, exited, cg, uid, run_mark)
    for r in readers:
        r.join(timeout=5)
    seconds = time.monotonic() - t0
    _read_jail_report(Path(report_path), iso)
    return Outcome(
        returncode=None if killed_for else rc,
        timed_out=killed_for == "timeout",
        seconds=seconds,
        stdout=out.text(),
        stderr=err.text(),
        killed_for=killed_for,
        isolation=iso,
        warm=warm is not None,
    )


def _confine(
    cfg: dict[str, Any], iso: dict[str, str], limits: Limits, c: Caps, uid: int | None
) -> Path | None:
    """Add to the launcher's ``cfg`` the resource limits, pids cgroup, cores, uid and network
    isolation of ``limits`` (each the OS allows is ``require``d), saying in ``iso`` what is in
    force; returns the run's pids cgroup (None: none)."""
    rl: dict[str, int] = {"core": 0}
    if limits.fsize_mb:
        rl["fsize"] = limits.fsize_mb << 20
    if limits.nofile:
        rl["nofile"] = limits.nofile
    if limits.address_space_mb:
        rl["as"] = limits.address_space_mb << 20
    cg = _pids_cgroup(cfg, iso, limits, c)
    if limits.nproc and uid is not None:
        rl["nproc"] = limits.nproc
        iso.setdefault("pids", f"RLIMIT_NPROC={limits.nproc} (uid {uid})")
    elif limits.nproc and "pids" not in iso:
        iso["pids"] = "unlimited: no pids cgroup and no separate uid"
    cfg["rlimits"] = rl
    if limits.cpus:
        cfg["cpus"] = list(limits.cpus)
        iso["cpus"] = ",".join(map(str, limits.cpus))
    if uid is not None:
        cfg["uid"] = uid
        cfg["require"].append("user")
        iso["user"] = f"uid {uid}"
    else:
        iso["user"] = "same user" + (
            f" ({c.drop_user_why})" if limits.drop_user and c.drop_user_why else ""
        )
    if limits.no_network:
        if c.network_ns:
            cfg["no_network"] = True
            cfg["require"].append("network")
            iso["network"] = "namespace (no interfaces)"
        else:
            iso["network"] = "NOT isolated: " + c.network_why
    return cg


def _pids_cgroup(cfg: dict[str, Any], iso: dict[str, str], limits: Limits, c: Caps) -> Path | None:
    """A fresh pids cgroup capped at ``limits.nproc`` for the run, ``require``d in ``cfg``;
    None (``iso`` says why) where there is none to be had."""
    if not (limits.nproc and c.cgroup_base):
        return None
    cg = Path(c.cgroup_base) / f"run-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    try:
        cg.mkdir()
        (cg / "pids.max").write_text(str(limits.nproc))
    except OSError as e:
        iso["pids"] = f"no cgroup ({e})"
        return None
    cfg["cgroup"] = str(cg)
    cfg["require"].append("cgroup")
    iso["pids"] = f"cgroup pids.max={limits.nproc}"
    return cg


def _launch(
    cfg: dict[str, Any],
    cmd: list[str],
    warm: WarmProcess | None,
    run_mark: str,
    stdin: bytes | None,
    pass_fds: tuple[int, ...],
) -> tuple[subprocess.Popen, WarmProcess | None, str]:
    """Start the confined process: ``warm`` handed the job, or a fresh launcher (``jail.py``)
    when there is none or it cannot take it (then with a fresh run mark). Returns the process,
    the warm launcher that took it (None: a cold start) and the run mark."""
    if warm is not None and _hand_over(warm, cfg, cmd):
        return warm.proc, warm, run_mark
    if warm is not None:  # it could not take the job: a fresh mark for the cold start
        warm = None
        run_mark = f"{RUN_MARK}={uuid.uuid4().hex}"
        cfg["env"] = {**cfg["env"], RUN_MARK: run_mark.split("=", 1)[1]}
    argv = [sys.executable, "-I", "-S", JAIL, json.dumps(cfg), "--", *cmd]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        pass_fds=pass_fds,
        close_fds=True,
    )
    return proc, warm, run_mark


def _start_io(
    proc: subprocess.Popen, out: _Capped, err: _Capped, stdin: bytes | None
) -> list[threading.Thread]:
    """Threads reading the process's stdout and stderr into ``out`` and ``err`` (returned, to
    be joined) and, with ``stdin``, one feeding it."""
    readers = [
        threading.Thread(target=_reader, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=_reader, args=(proc.stderr, err), daemon=True),
    ]
    for r in readers:
        r.start()
    if stdin is not None:

        def feed() -> None:
            with contextlib.suppress(OSError):
                proc.stdin.write(stdin)
                proc.stdin.close()

        threading.Thread(target=feed, daemon=True).start()
    return readers


def _watch(
    proc: subprocess.Popen,
    exited: _ExitWaiter,
    limits: Limits,
    t0: float,
    extend: Callable[[], float] | None,
    cg: Path | None,
) -> str:
    """Wait for the process to exit, or until it must be killed: why (``timeout``, ``memory``,
    ``processes``), or "" when it exited on its own."""
    deadline = t0 + limits.timeout_s
    next_mem = t0
    while True:
        if exited(0.1):
            return ""
        now = time.monotonic()
        if now >= deadline + (extend() if extend is not None else 0.0):
            return "timeout"
        if now >= next_mem:
            next_mem = now + 0.25
            if limits.rss_mb and _tree_rss_mb(proc.pid) > limits.rss_mb:
                return "memory"
            if cg is not None and _pids_max_hits(cg) > 0:
                return "processes"  # a fork bomb: stop it now, not at the deadline


def _sweep(
    proc: subprocess.Popen, exited: _ExitWaiter, cg: Path | None, uid: int | None, run_mark: str
) -> int:
    """Kill whatever is left of the run: its process group, its cgroup, its uid, the main
    process itself, then every process that carries its mark; the main process's exit code."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if cg is not None:
        _kill_cgroup(cg)
    if uid is not None:
        kill_uid(uid)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    rc = proc.wait()
    exited.close()
    kill_marked(run_mark)
    return rc


def _read_jail_report(path: Path, iso: dict[str, str]) -> None:
    """Add to ``iso`` what the launcher's report (removed) says: failed steps, a read-only file
    system, an own pid namespace."""
    rep_text = _read(path)
    with contextlib.suppress(OSError):
        os.unlink(path)
    if not rep_text:
        return
    with contextlib.suppress(json.JSONDecodeError):
        rep_d = json.loads(rep_text)
        for k, v in rep_d.items():
            if isinstance(v, str) and v.startswith("failed"):
                iso[f"{k}_step"] = v
        if rep_d.get("read_only_fs") == "ok":
            iso["filesystem"] = "read-only except its own directories"
        if rep_d.get("proc") == "ok":
            iso["pid_namespace"] = "own (cannot see or signal outside processes)"


def prepare_writable(
    path: str | os.PathLike[str],
    slot: int = 0,
    limits: Limits | None = None,
    uid: int | None = None,
) -> None:
    """Make ``path`` (a directory) writable by the confined processes of ``slot`` (or of
    ``uid``, a leased one)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    c = caps()
    if (limits is None or limits.drop_user) and c.drop_user:
        uid = uid if uid is not None else slot_uid(slot)
        os.chown(p, uid, uid)
        os.chmod(p, 0o700)
