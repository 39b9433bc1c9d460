"""Runner processes started ahead of need (warm.py, ``jail.py --warm``) or forked from a fork
server (forkserver.py, ``jail.py --zygote``): a job handed to a warm launcher runs confined
exactly as a cold one, under the job's environment and directory, not those the launcher started
with; a launcher that cannot take a job leaves the run cold."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from cuda_agent.sandbox.forkserver import start_server
from cuda_agent.sandbox.isolation import (
    RUN_MARK,
    Limits,
    caps,
    kill_marked,
    run_confined,
    start_warm,
)
from cuda_agent.sandbox.warm import WarmPool

PROBE = """
import json, os, sys, tempfile

IMPORTED_PID = os.getpid()


def _open(fd):  # not the listing's own descriptor, closed by now
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def main(argv):
    out = {
        "argv": argv,
        "sys_argv0": os.path.basename(sys.argv[0]),
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "tmp": tempfile.gettempdir(),
        "env_x": os.environ.get("PROBE_X"),
        "pid": os.getpid(),
        "imported_pid": IMPORTED_PID,
        "uid": os.getuid(),
        "fds": sorted(int(f) for f in os.listdir("/proc/self/fd") if _open(int(f))),
        "environ_mark": [
            e.decode() for e in open("/proc/self/environ", "rb").read().split(bytes(1))
            if e.startswith(b"CUDA_AGENT_RUN=")
        ],
    }
    if os.environ.get("PROBE_SIGNAL"):
        os.kill(os.getpid(), int(os.environ["PROBE_SIGNAL"]))
    try:
        open(os.path.join(os.path.dirname(__file__), "written"), "w").write("x")
        out["wrote_module_dir"] = True
    except OSError:
        out["wrote_module_dir"] = False
    print(json.dumps(out))
    return int(argv[0]) if argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def probe(confined_tmp):
    """A module ``warmprobe`` on a PYTHONPATH of its own, and an environment that finds it."""
    lib = confined_tmp / "lib"
    lib.mkdir()
    (lib / "warmprobe.py").write_text(PROBE)
    os.chmod(lib, 0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(lib), "TMPDIR": "/nonexistent-at-start"}
    return lib, env


def _job_dir(confined_tmp, name):
    d = confined_tmp / name
    d.mkdir()
    d.chmod(0o777)
    return d


def test_warm_job_runs_with_the_jobs_environment_and_confinement(confined_tmp, probe):
    lib, env = probe
    w = start_warm(["warmprobe"], env, "/")
    time.sleep(0.3)
    job = _job_dir(confined_tmp, "job")
    out = run_confined(
        [sys.executable, "-m", "warmprobe", "7"],
        cwd=job,
        env={**env, "PROBE_X": "from-the-job", "TMPDIR": str(job)},
        limits=Limits(timeout_s=30),
        writable=[job],
        warm=w,
    )
    assert out.warm, out.stderr
    assert out.returncode == 7, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["argv"] == ["7"] and got["sys_argv0"] == "warmprobe.py"
    assert got["cwd"] == str(job) and got["path0"] == str(job)
    assert got["env_x"] == "from-the-job" and got["tmp"] == str(job)
    # imported by the launcher before the job, run in a later child: never the same process
    assert got["pid"] != got["imported_pid"]
    if caps().network_ns:
        assert not got["wrote_module_dir"]  # read-only outside its own directories
        assert out.isolation.get("filesystem", "").startswith("read-only")
        assert "pid_namespace" in out.isolation
    if caps().drop_user:
        assert got["uid"] != 0


def test_a_cold_run_of_the_same_command_reports_the_same(confined_tmp, probe):
    lib, env = probe
    job = _job_dir(confined_tmp, "job")
    out = run_confined(
        [sys.executable, "-m", "warmprobe"],
        cwd=job,
        env={**env, "PROBE_X": "cold", "TMPDIR": str(job)},
        limits=Limits(timeout_s=30),
        writable=[job],
    )
    assert not out.warm and out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["env_x"] == "cold" and got["cwd"] == str(job) and got["tmp"] == str(job)


def test_a_dead_launcher_leaves_the_run_cold(confined_tmp, probe):
    lib, env = probe
    w = start_warm(["warmprobe"], env, "/")
    w.proc.kill()
    w.proc.wait()
    job = _job_dir(confined_tmp, "job")
    out = run_confined(
        [sys.executable, "-m", "warmprobe", "0"],
        cwd=job,
        env={**env, "PROBE_X": "fallback"},
        limits=Limits(timeout_s=30),
        writable=[job],
        warm=w,
    )
    assert not out.warm and out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["env_x"] == "fallback"


def test_a_launcher_whose_import_failed_leaves_the_run_cold(confined_tmp, probe):
    lib, env = probe
    w = start_warm(["no_such_module_here"], env, "/")
    w.proc.wait(timeout=30)
    job = _job_dir(confined_tmp, "job")
    out = run_confined(
        [sys.executable, "-m", "warmprobe"],
        cwd=job,
        env=env,
        limits=Limits(timeout_s=30),
        writable=[job],
        warm=w,
    )
    assert not out.warm and out.returncode == 0, out.stderr


def test_other_commands_are_execed_by_a_warm_launcher(confined_tmp, probe):
    lib, env = probe
    w = start_warm(["warmprobe"], env, "/")
    job = _job_dir(confined_tmp, "job")
    out = run_confined(
        [sys.executable, "-c", "import os; print(os.environ['PROBE_X'])"],
        cwd=job,
        env={**env, "PROBE_X": "exec"},
        limits=Limits(timeout_s=30),
        writable=[job],
        warm=w,
    )
    assert out.warm and out.returncode == 0 and out.stdout.strip() == "exec", out.stderr


def test_the_deadline_kills_a_warm_job(confined_tmp, probe):
    lib, env = probe
    (lib / "sleeper.py").write_text("import time\n\ndef main(argv):\n    time.sleep(60)\n")
    w = start_warm(["sleeper"], env, "/")
    job = _job_dir(confined_tmp, "job")
    t = time.monotonic()
    out = run_confined(
        [sys.executable, "-m", "sleeper"],
        cwd=job,
        env=env,
        limits=Limits(timeout_s=3),
        writable=[job],
        warm=w,
    )
    assert out.warm and out.timed_out and time.monotonic() - t < 20
    assert w.proc.poll() is not None


def test_pool_hands_out_spares_per_environment(confined_tmp, probe):
    lib, env = probe
    pool = WarmPool(modules=("warmprobe",), per_key=1)
    try:
        cmd = [sys.executable, "-m", "warmprobe"]
        assert pool.take(cmd, env) is None  # nothing yet: cold, and one spare ordered
        deadline = time.monotonic() + 30
        while pool.started < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        # a per-evaluation directory differs: the same spares
        w = pool.take(cmd, {**env, "TMPDIR": str(confined_tmp), "HOME": "/x"})
        assert w is not None and w.alive()
        w.discard()
        # any other key differs: spares of its own
        assert pool.take(cmd, {**env, "OMP_NUM_THREADS": "3"}) is None
        # not the pool's module: never a spare
        assert pool.take([sys.executable, "-m", "json.tool"], env) is None
        assert pool.take([sys.executable, "-c", "1"], env) is None
    finally:
        pool.close()
    assert all(not w.alive() for ws in pool._spares.values() for w in ws)


def _probe_run(confined_tmp, env, w, exe):
    job = _job_dir(confined_tmp, "job")
    out = run_confined(
        [exe, "-m", "warmprobe"],
        cwd=job,
        env=env,
        limits=Limits(timeout_s=30),
        writable=[job],
        warm=w,
    )
    assert out.warm and out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_interpreter_is_matched_however_its_path_is_spelled(confined_tmp, probe):
    """A parent started as `../bin/python` names its interpreter with the `..`; the launcher's
    own path is normalised: still the same interpreter, run in-process."""
    lib, env = probe
    w = start_warm(["warmprobe"], env, "/")
    d, name = os.path.split(sys.executable)
    spelled = os.path.join(d, "..", os.path.basename(d), name)
    got = _probe_run(confined_tmp, env, w, spelled)
    assert got["pid"] != got["imported_pid"]  # imported before the job: in-process


def test_another_path_to_the_same_binary_is_execed(confined_tmp, probe):
    """A symlink elsewhere may be another virtual environment over the same binary: its
    modules are not the launcher's, so the command is started as given."""
    lib, env = probe
    link = confined_tmp / "bin" / "python"
    link.parent.mkdir()
    link.symlink_to(os.path.realpath(sys.executable))
    w = start_warm(["warmprobe"], env, "/")
    got = _probe_run(confined_tmp, env, w, str(link))
    assert got["pid"] == got["imported_pid"]  # imported by the command itself: execed


@pytest.mark.parametrize("fork", [True, False], ids=["fork-server", "spares"])
def test_evaluations_through_warm_runners_keep_their_verdicts(cache_dir, scale_add_task, fork):
    """Every phase of an evaluation from a warm launcher (forked from the fork server, or a
    spare): the same verdicts as cold, a candidate that kills its parent's process group harms
    only its own phase, and the launchers left serve the next candidate."""
    from cuda_agent.records import Status
    from cuda_agent.sandbox import SandboxConfig, evaluate

    from .conftest import kb_candidate
    from .test_evaluate_api import HONEST
    from .test_fault_suite import _kb

    cfg = SandboxConfig(
        backend="cpu",
        cache_dir=str(cache_dir),
        guard_policy="off",
        baselines=False,
        timing_config={"time_cap_s": 0.3, "min_samples": 3},
        warm_processes=3,
        fork_server=fork,
    )
    first = evaluate(kb_candidate(scale_add_task, HONEST), cfg)
    assert first.status == Status.OK, first.message
    killer = _kb("os.killpg(os.getpgid(os.getppid()), 9)\nos.kill(os.getppid(), 9)\nos.kill(-1, 9)")
    bad = evaluate(kb_candidate(scale_add_task, killer), cfg)
    assert bad.status == Status.RUNTIME_ERROR, bad.message
    assert "verify" in (bad.meta.get("warm_phases") or []), bad.meta
    again = evaluate(kb_candidate(scale_add_task, HONEST + "\n# again\n"), cfg)
    assert again.status == Status.OK, again.message
    assert {"reference", "verify", "time"} <= set(again.meta.get("warm_phases") or []), again.meta
    assert again.meta["phases_s"]["reference"]["import_torch"] < 0.5  # imported ahead


def test_a_launcher_retired_unused_exits_at_once(probe):
    lib, env = probe
    w = start_warm(["warmprobe"], env, "/")
    w.proc.stdin.close()  # no job: end of input
    assert w.proc.wait(timeout=30) == 0
    w.discard()


def test_warm_processes_setting_is_checked():
    """A negative count is refused where it is set (it used to be taken silently as 0); None
    resolves by the host's cores."""
    from cuda_agent.sandbox import SandboxConfig

    assert SandboxConfig(warm_processes=2).warm_spares() == 2
    assert SandboxConfig(warm_processes=0).warm_spares() == 0
    assert SandboxConfig().warm_spares() == (3 if (os.cpu_count() or 1) >= 8 else 0)
    with pytest.raises(ValueError, match="warm_processes=-1"):
        SandboxConfig(warm_processes=-1)
    with pytest.raises(ValueError, match="warm_processes"):
        SandboxConfig.from_dict({"warm_processes": -3})


def _job(confined_tmp, env, w, argv=(), timeout_s=30.0, module="warmprobe", slot=0, **extra):
    job = confined_tmp / f"job-{time.monotonic_ns()}"
    job.mkdir()
    job.chmod(0o777)
    return run_confined(
        [sys.executable, "-m", module, *argv],
        cwd=job,
        env={**env, "TMPDIR": str(job), **extra},
        limits=Limits(timeout_s=timeout_s),
        writable=[job],
        warm=w,
        slot=slot,  # where uids are dropped, the slot's uid: jobs side by side need their own
    )


def test_forked_launchers_run_jobs_confined_each_with_its_own_mark(confined_tmp, probe):
    lib, env = probe
    srv = start_server(["warmprobe"], env, confined_tmp)
    try:
        assert srv.ready, srv.error
        runs = []
        for code in (0, 5):
            w = srv.spawn()
            assert w is not None, srv.error
            out = _job(confined_tmp, env, w, [str(code)], PROBE_X=f"job{code}")
            assert out.warm and out.returncode == code, out.stderr
            got = json.loads(out.stdout.strip().splitlines()[-1])
            runs.append((w, got))
            assert got["env_x"] == f"job{code}" and got["tmp"].startswith(str(confined_tmp))
            assert got["imported_pid"] == srv.proc.pid  # imported once, by the server
            # its own run mark in the block the last sweep reads, not the server's
            assert got["environ_mark"] == [f"{RUN_MARK}={w.mark}"]
            # nothing of the server's (its socket, other launchers' status pipes) is open
            assert got["fds"] == [0, 1, 2], got["fds"]
            if caps().network_ns:
                assert out.isolation.get("filesystem", "").startswith("read-only")
            if caps().drop_user:
                assert got["uid"] != 0
        assert runs[0][0].mark != runs[1][0].mark
        # a sweep for a finished run's mark leaves the server serving
        assert kill_marked(f"{RUN_MARK}={runs[0][0].mark}") == 0
        assert srv.alive()
    finally:
        srv.close()
    assert srv.proc.poll() is not None


def test_a_forked_launchers_signal_death_and_deadline_are_reported(confined_tmp, probe):
    lib, env = probe
    (lib / "sleeper.py").write_text(
        "import time\n\ndef main(argv):\n    time.sleep(60)\n\n"
        "if __name__ == '__main__':\n    main([])\n"
    )
    srv = start_server(["warmprobe", "sleeper"], env, confined_tmp)
    try:
        assert srv.ready, srv.error
        out = _job(confined_tmp, env, srv.spawn(), PROBE_SIGNAL="11")
        cold = _job(confined_tmp, env, None, PROBE_SIGNAL="11")
        assert out.warm and out.returncode == cold.returncode == -11, (out, cold)
        w = srv.spawn()
        t = time.monotonic()
        out = _job(confined_tmp, env, w, timeout_s=2, module="sleeper")
        assert out.warm and out.timed_out and time.monotonic() - t < 15
        assert w.proc.poll() is not None
        # the server serves the next job
        assert _job(confined_tmp, env, srv.spawn()).returncode == 0
    finally:
        srv.close()


def test_a_launcher_whose_server_died_ends_and_the_pool_starts_another(confined_tmp, probe):
    lib, env = probe
    pool = WarmPool(modules=("warmprobe",), fork=True)
    try:
        cmd = [sys.executable, "-m", "warmprobe"]
        w = pool.take(cmd, env)  # waits for the server's import: no cold start beside it
        assert w is not None, pool.server_errors
        first = next(iter(pool._servers.values())).server
        # a per-evaluation directory differs: the same server
        w2 = pool.take(cmd, {**env, "TMPDIR": str(confined_tmp), "HOME": "/x"})
        assert w2 is not None and next(iter(pool._servers.values())).server is first
        w2.discard()
        first.close()  # its launchers die with it
        assert w.proc.wait(timeout=10) == -9
        w.discard()
        again = pool.take(cmd, env)
        assert again is not None and next(iter(pool._servers.values())).server is not first
        assert _job(confined_tmp, env, again).returncode == 0
        # any other key: a server of its own; not the pool's module: never a launcher
        assert pool.take(cmd, {**env, "OMP_NUM_THREADS": "3"}) is not None
        assert len(pool._servers) == 2
        assert pool.take([sys.executable, "-c", "1"], env) is None
    finally:
        pool.close()


def test_servers_beyond_the_cap_stop_the_least_recently_used_idle_one(confined_tmp, probe):
    """Each server holds an imported interpreter: past ``max_servers`` a new environment stops
    the idle server used longest ago, never one whose launcher is still running a job."""
    lib, env = probe
    pool = WarmPool(modules=("warmprobe",), fork=True, max_servers=2)
    cmd = [sys.executable, "-m", "warmprobe"]
    envs = [{**env, "OMP_NUM_THREADS": str(i)} for i in range(4)]
    try:
        for e in envs[:2]:
            assert _job(confined_tmp, e, pool.take(cmd, e)).returncode == 0, pool.server_errors
        first, second = (s.server for s in pool._servers.values())
        held = pool.take(cmd, envs[1])  # a launcher of the second server, not yet ended
        assert held is not None
        assert _job(confined_tmp, envs[2], pool.take(cmd, envs[2])).returncode == 0
        assert len(pool._servers) == 2 and first.proc.wait(timeout=10) is not None
        assert second.alive()  # used less recently than the third, but busy: kept
        # every server busy: the pool goes over its cap rather than kill a job
        held3 = pool.take(cmd, envs[2])
        assert held3 is not None
        assert _job(confined_tmp, envs[3], pool.take(cmd, envs[3])).returncode == 0
        assert len(pool._servers) == 3 and second.alive()
        # the held launcher still runs its job, on the server that forked it
        assert _job(confined_tmp, envs[1], held).returncode == 0
        assert _job(confined_tmp, envs[2], held3).returncode == 0
    finally:
        pool.close()


def test_a_server_that_cannot_import_leaves_runs_cold(confined_tmp, probe):
    lib, env = probe
    pool = WarmPool(modules=("no_such_module_here",), fork=True)
    try:
        cmd = [sys.executable, "-m", "no_such_module_here"]
        assert pool.take(cmd, env) is None
        assert any("No module named" in e for e in pool.server_errors), pool.server_errors
        assert pool.take(cmd, env) is None  # not tried again for every run
        assert len(pool.server_errors) == 1
    finally:
        pool.close()


def test_a_server_whose_import_touched_cuda_refuses_to_serve(confined_tmp, probe):
    """A module that initialises CUDA at import would leave every forked launcher with a
    context that does not survive the fork: the server refuses, and runs start cold."""
    lib, env = probe
    (lib / "cudaprobe.py").write_text(
        "import torch\ntorch.cuda.is_initialized = lambda: True\n\ndef main(argv):\n    return 0\n"
    )
    srv = start_server(["cudaprobe"], env, confined_tmp)
    assert not srv.ready and "CUDA was initialised" in srv.error, srv.error
    assert srv.spawn() is None


def test_a_forked_evaluator_starts_pools_of_its_own():
    """A process forked after pools exist (``multiprocessing`` with fork) must not use them:
    their starter threads did not survive the fork, their servers answer the parent."""
    from cuda_agent.sandbox.warm import shared_pool

    pool = shared_pool(0, fork=True)
    assert shared_pool(0, fork=True) is pool
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        mine = shared_pool(0, fork=True)
        os.write(w, b"new" if mine is not None and mine is not pool else b"same")
        os._exit(0)
    os.close(w)
    got = os.read(r, 16)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"new"


def test_concurrent_jobs_from_one_server_get_their_own_output_and_status(confined_tmp, probe):
    """Many threads taking launchers from one server at once: each job's stdout and exit status
    reach its own caller (the server routes statuses by pid), and the evaluator keeps no
    descriptor per job."""
    from concurrent.futures import ThreadPoolExecutor

    lib, env = probe
    pool = WarmPool(modules=("warmprobe",), fork=True)
    try:
        cmd = [sys.executable, "-m", "warmprobe"]
        first = pool.take(cmd, env)  # the server is up before the count
        assert first is not None
        first.discard()
        fds = len(os.listdir("/proc/self/fd"))

        def one(i: int):
            # a slot each: the sweep after a job kills every process of its slot's uid
            out = _job(confined_tmp, env, pool.take(cmd, env), [str(i % 7)], slot=i, PROBE_X=str(i))
            return i, out

        with ThreadPoolExecutor(6) as ex:
            results = list(ex.map(one, range(36)))
        for i, out in results:
            assert out.warm and out.returncode == i % 7, (i, out)
            assert json.loads(out.stdout.strip().splitlines()[-1])["env_x"] == str(i)
        import gc

        gc.collect()
        assert len(os.listdir("/proc/self/fd")) <= fds + 1
    finally:
        pool.close()


def test_cpp_extension_is_imported_ahead_only_where_no_gpu_is_visible():
    """Importing ``torch.utils.cpp_extension`` initialises the CUDA driver (it asks
    ``torch.cuda.is_available()``), after which a forked process cannot use CUDA: only launchers
    whose environment hides every GPU (the kernelbench compile phase, the cpu backend) get it."""
    from cuda_agent.sandbox.warm import NO_GPU_MODULES, RUNNER_MODULES

    pool = WarmPool(fork=True)
    try:
        extra = set(NO_GPU_MODULES)
        assert extra <= set(pool.modules_for({"CUDA_VISIBLE_DEVICES": ""}))
        for env in ({"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "GPU-1,GPU-2"}, {}):
            assert not extra & set(pool.modules_for(env)), env
        assert pool.modules_for({"CUDA_VISIBLE_DEVICES": "0"}) == RUNNER_MODULES
        other = WarmPool(modules=("warmprobe",), fork=True)
        assert other.modules_for({"CUDA_VISIBLE_DEVICES": ""}) == ("warmprobe",)
        other.close()
    finally:
        pool.close()


def test_a_prewarmed_server_is_the_one_the_first_phase_forks_from(confined_tmp, probe):
    """``prewarm`` starts an environment's server without waiting for it; the first take then
    finds it (one import), and a pool without a fork server ignores it."""
    lib, env = probe
    pool = WarmPool(modules=("warmprobe",), fork=True)
    try:
        pool.prewarm(env)
        pool.prewarm({**env, "TMPDIR": "/elsewhere"})  # the same key: nothing more started
        (slot,) = pool._servers.values()
        assert slot.done.wait(60) and slot.server is not None and slot.server.alive()
        w = pool.take([sys.executable, "-m", "warmprobe"], env)
        assert w is not None and list(pool._servers.values()) == [slot]
        out = _job(confined_tmp, env, w)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert out.warm and got["imported_pid"] == slot.server.proc.pid
    finally:
        pool.close()
    spares = WarmPool(modules=("warmprobe",), per_key=0)
    try:
        spares.prewarm(env)
        assert not spares._servers
    finally:
        spares.close()


def test_a_launchers_end_is_reported_when_the_servers_sigchld_handler_never_runs(
    confined_tmp, probe
):
    # The kernel may deliver the server's SIGCHLD to a thread its imports started: the main
    # thread, asleep waiting for the next request, is not woken, and the child's end went
    # unreported (its parent waited on it until the job's time limit, a CI run for 600 s). Here
    # the handler is never installed at all (an imported module swallows it): the server's own
    # reaping must still report each launcher's end, within the job's time limit.
    lib, env = probe
    (lib / "nosigchld.py").write_text(
        "import signal\n_signal = signal.signal\n\n"
        "def _no_sigchld(sig, handler):\n"
        "    if sig == signal.SIGCHLD:\n"
        "        return signal.SIG_DFL\n"
        "    return _signal(sig, handler)\n\n"
        "signal.signal = _no_sigchld\n"
    )
    srv = start_server(["nosigchld", "warmprobe"], env, confined_tmp)
    try:
        assert srv.ready, srv.error
        for code in (0, 3):
            t = time.monotonic()
            out = _job(confined_tmp, env, srv.spawn(), [str(code)], timeout_s=20)
            assert out.warm and not out.timed_out, out.stderr
            assert out.returncode == code, out.stderr
            assert time.monotonic() - t < 15
    finally:
        srv.close()
