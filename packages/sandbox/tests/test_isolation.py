"""The confinement of one process: deadline, process tree, output cap, network, file system."""

import os
import socket
import sys
import time

from cuda_agent.sandbox.isolation import Limits, cap_text, caps, run_confined

PY = sys.executable


def _run(code: str, cwd, **kw):
    lim = Limits(**{"timeout_s": 20.0, **kw})
    return run_confined(
        [PY, "-c", code],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin"},
        limits=lim,
        writable=[cwd],
    )


def test_exit_code_and_output(confined_tmp):
    out = _run("import sys; print('hi'); sys.stderr.write('err'); sys.exit(3)", confined_tmp)
    assert out.returncode == 3 and out.stdout.strip() == "hi" and out.stderr == "err"


def test_deadline_kills_the_whole_tree(confined_tmp):
    # a duration of its own, so no other sleep on the host (another test run) can be taken for it
    secs = f"300.{os.getpid()}"
    code = (
        "import os, subprocess, time\n"
        f"p = subprocess.Popen(['sleep', '{secs}'], start_new_session=True)\n"
        "time.sleep(0.3)\n"
        f"open('{confined_tmp}/child', 'w').write(str(p.pid) if p.poll() is None else 'exited')\n"
        "time.sleep(300)\n"
    )
    t0 = time.monotonic()
    out = _run(code, confined_tmp, timeout_s=3.0)
    assert out.timed_out and out.killed_for == "timeout"
    assert time.monotonic() - t0 < 30
    assert (confined_tmp / "child").read_text() != "exited"  # the child was running when killed
    # the kernel tears a dead pid namespace down asynchronously: under a fully loaded 2-core CI
    # machine that took more than 15 s twice (the process was gone a minute later)
    deadline = time.monotonic() + 90
    while _alive_sleep(secs) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive_sleep(secs)


def _alive_sleep(secs: str) -> bool:
    # inside a pid namespace the child's pid is not a host pid: look for its command line instead
    import psutil

    return any(p.info["cmdline"] == ["sleep", secs] for p in psutil.process_iter(["cmdline"]))


def test_output_is_capped_head_and_tail(confined_tmp):
    out = _run("print('A' * 100000 + 'END')", confined_tmp, output_cap=1000)
    assert out.stdout.startswith("A") and out.stdout.rstrip().endswith("END")
    assert "bytes cut" in out.stdout and len(out.stdout) < 1200
    assert "cut" in cap_text("x" * 5000, 100)


def test_no_network_and_read_only_fs(confined_tmp):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    outside = confined_tmp.parent / f"outside-{port}"
    code = (
        "import socket\n"
        f"try:\n  socket.create_connection(('127.0.0.1', {port}), timeout=2); print('NET')\n"
        "except OSError as e: print('nonet')\n"
        f"try:\n  open('{outside}', 'w').write('x'); print('WROTE')\n"
        "except OSError: print('ro')\n"
        f"open('{confined_tmp}/inside', 'w').write('x'); print('inside')\n"
    )
    out = _run(code, confined_tmp)
    c = caps()
    if c.network_ns:
        assert "nonet" in out.stdout and "NET" not in out.stdout
        try:
            srv.accept()
            raise AssertionError("the confined process reached the test's server")
        except TimeoutError:
            pass
        assert out.isolation["network"].startswith("namespace")
        assert "ro" in out.stdout.split() and not outside.exists()
    else:
        assert "NOT isolated" in out.isolation["network"]
    assert "inside" in out.stdout and (confined_tmp / "inside").exists()


def test_process_limit(confined_tmp):
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "  for _ in range(200):\n"
        "    if os.fork() == 0:\n"
        "      time.sleep(30); os._exit(0)\n"
        "    n += 1\n"
        "except OSError: pass\n"
        "print(n)\n"
    )
    out = _run(code, confined_tmp, nproc=20)
    c = caps()
    if c.cgroup_base:  # the watchdog may stop it as soon as a fork is refused
        assert out.killed_for == "processes" or int(out.stdout.strip()) < 20, out
    elif c.drop_user:
        assert out.returncode == 0 and int(out.stdout.strip()) < 20, out


def test_private_dev_shm(confined_tmp):
    out = _run(
        "import os\nopen('/dev/shm/sbx-left-behind', 'w').write('x')\nprint(os.listdir('/dev/shm'))",
        confined_tmp,
    )
    assert out.returncode == 0, out
    if caps().network_ns:  # namespaces available: the file lived in a private tmpfs
        import os

        assert not os.path.exists("/dev/shm/sbx-left-behind")


def test_memory_watchdog(confined_tmp):
    code = "x = []\nwhile True:\n  x.append(bytearray(64 << 20))\n"
    out = _run(code, confined_tmp, rss_mb=300, address_space_mb=None)
    assert out.killed_for == "memory" or out.returncode != 0


def test_kill_marked_finds_detached_descendants():
    """The last sweep's fallback: a process that left the group (new session) still carries the
    run's environment mark and is killed by it; an unmarked one is left alone."""
    import os
    import subprocess
    import uuid

    from cuda_agent.sandbox.isolation import RUN_MARK, kill_marked

    mark = uuid.uuid4().hex
    env = {**os.environ, RUN_MARK: mark}
    marked = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        time.sleep(0.2)
        assert kill_marked(f"{RUN_MARK}={mark}") == 1
        assert marked.wait(timeout=5) == -9
        assert other.poll() is None
    finally:
        other.kill()
        marked.kill()


def test_confined_processes_die_with_their_evaluator(confined_tmp):
    """A killed evaluator (SIGKILL: no clean-up runs) leaves no confined process behind."""
    import subprocess

    secs = f"300.{os.getpid()}1"
    code = (
        "from cuda_agent.sandbox.isolation import Limits, run_confined\n"
        f"run_confined(['sleep', '{secs}'], cwd={str(confined_tmp)!r}, env={{'PATH': '/usr/bin:/bin'}},"
        f" limits=Limits(timeout_s=300.0), writable=[{str(confined_tmp)!r}])\n"
    )
    ev = subprocess.Popen([PY, "-c", code])
    deadline = time.monotonic() + 60
    while not _alive_sleep(secs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive_sleep(secs), "the confined command never started"
    ev.kill()
    ev.wait()
    deadline = time.monotonic() + 30
    while _alive_sleep(secs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive_sleep(secs)


def test_a_passed_uid_drop_probe_is_recorded_per_boot_files_and_environment(tmp_path, monkeypatch):
    """``caps()`` as root imports torch as an unprivileged uid to see that it can (3-4 s per
    process); a pass is recorded under a key of the boot, the installation and the directories'
    owners and modes, and read back only from a file no one else can have written."""
    from cuda_agent.sandbox import isolation

    monkeypatch.setenv("CUDA_AGENT_SANDBOX_CACHE", str(tmp_path / "cache"))
    env = {"PATH": "/usr/bin:/bin"}
    rec = isolation._drop_probe_record(env)
    assert rec is not None and rec == isolation._drop_probe_record(dict(env))
    assert rec != isolation._drop_probe_record({**env, "PYTHONPATH": "/elsewhere"})
    assert isolation._read_own(rec) is None
    isolation._write_own(rec, b"ok")
    assert isolation._read_own(rec) == b"ok"
    rec.chmod(0o666)  # writable by others: not trusted
    assert isolation._read_own(rec) is None
    rec.chmod(0o644)
    rec.parent.chmod(0o777)
    assert isolation._read_own(rec) is None
    rec.parent.chmod(0o755)
    link = rec.with_name("link")
    link.symlink_to(rec)
    assert isolation._read_own(link) is None and isolation._read_own(rec) == b"ok"
