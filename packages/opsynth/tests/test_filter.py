"""The execution filter on hand-written tasks: each bad kind is caught with its reason."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from subprocess import PIPE

import pytest

from cuda_agent.opsynth.filter import FilterConfig, TaskFilter, rescale_source
from cuda_agent.records.types import Task

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
TAIL = """
batch_size = 4
features = 64


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return []
"""


def task(forward: str, name: str, init: str = "pass", tail: str = TAIL) -> Task:
    src = (
        HEAD
        + "class Model(nn.Module):\n"
        + "    def __init__(self):\n        super().__init__()\n"
        + f"        {init}\n\n"
        + "    def forward(self, x):\n"
        + "".join(f"        {ln}\n" for ln in forward.strip().splitlines())
        + "\n"
        + tail
    )
    return Task.make(name, src, source="opsynth")


GOOD = task("x = torch.relu(x) * 2.0\nreturn torch.cumsum(x, dim=1)", "good")
BAD = {
    "rng_consumed": task("return F.dropout(x, p=0.5, training=True)", "dropout_train"),
    "rng_consumed ": task("return x + torch.randn_like(x)", "randn_like"),
    "constant_output": task("return torch.zeros_like(x) + 1.0", "constant"),
    "nonfinite": task("return torch.log(x)", "log_negative"),
    "saturated_output": task("return torch.sigmoid(x * 1e4)", "saturated"),
    "input_independent": task(
        "return self.w * 1.0", "ignores_input", "self.w = nn.Parameter(torch.randn(4, 64))"
    ),
    "input_independent ": task("return x.mean() * 1e-4 + 1.0", "nearly_constant"),
    "eager_error": task("return x @ torch.randn(3, 3)", "shape_error"),
    "nondeterministic": task(
        "return x + torch.tensor(float(__import__('time').perf_counter_ns() % 100003))",
        "clock_dependent",
    ),
    "empty_output": task("return x[:, :0]", "empty"),
    "timeout": task("while True:\n    pass", "hangs"),
    "crash": task("import os\nos.abort()", "aborts"),
    "load_error": Task.make("no_get_inputs", HEAD + "class Model(nn.Module):\n    pass\n"),
}


@pytest.fixture(scope="module")
def tf():
    f = TaskFilter(FilterConfig(backend="cpu", window_ms=(0.0, 1e9), compile=False, timeout_s=6))
    yield f
    f.close()


def test_good_task_passes_with_meta(tf):
    v = tf.check(GOOD)
    assert v.passed, v.detail
    info = v.task.meta["filter"]
    assert info["eager_ms"] > 0 and info["input_id"] == GOOD.id
    assert info["checks"][:6] == [
        "load",
        "rng",
        "eager",
        "output",
        "deterministic",
        "input_dependent",
    ]


@pytest.mark.parametrize("reason", sorted(BAD))
def test_bad_task_dropped_with_reason(tf, reason):
    v = tf.check(BAD[reason])
    assert not v.passed
    assert v.reason == reason.strip(), (v.reason, v.detail)
    assert v.task.meta["rejected"]["reason"] == reason.strip()
    assert v.task.id == BAD[reason].id


def test_window_and_rescale(tf):
    src = GOOD.ref_code
    new, old, n = rescale_source(src, 8.0)
    assert (old, n) == (4, 32) and "batch_size = 32" in new
    assert rescale_source(src.replace("batch_size = 4", "bs = 4"), 8.0) is None
    saved = tf.cfg
    try:
        tf.cfg = dataclasses.replace(saved, window_ms=(1e5, 1e6), rescale=False)
        v = tf.check(GOOD)
        assert v.reason == "too_fast" and "outside" in v.detail
        # a ~0.05 ms task; a window starting far above it forces rescaling (recorded in meta)
        tf.cfg = dataclasses.replace(saved, window_ms=(0.5, 1e9), rescale=True)
        v = tf.check(GOOD)
    finally:
        tf.cfg = saved
    resc = (v.task.meta.get("filter") or v.task.meta.get("rejected"))["rescaled"]
    assert resc[0]["batch_size"][0] == 4 and resc[0]["batch_size"][1] > 4
    if v.passed:
        assert v.task.id != GOOD.id and "batch_size = 4\n" not in v.task.ref_code


@pytest.mark.slow
def test_compile_check_runs_inductor():
    f = TaskFilter(FilterConfig(window_ms=(0.0, 1e9), compile=True, timeout_s=300))
    try:
        v = f.check(GOOD)
    finally:
        f.close()
    assert v.passed, v.detail
    assert "compile" in v.task.meta["filter"]["checks"]


def test_filter_cli_counts_reasons_and_writes_rejected(tmp_path):
    inp = tmp_path / "in.jsonl"
    rej = tmp_path / "rej.jsonl"
    out = tmp_path / "out.jsonl"
    tasks = [GOOD, BAD["constant_output"], BAD["rng_consumed"]]
    inp.write_text("".join(json.dumps(__import__("msgspec").to_builtins(t)) + "\n" for t in tasks))
    cmd = [
        sys.executable,
        "-m",
        "cuda_agent.opsynth.cli",
        "filter",
        str(inp),
        "--no-compile",
        "--min-ms",
        "0",
        "-o",
        str(out),
        "--rejected",
        str(rej),
        "--timeout",
        "30",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert (
        "1/3 passed" in p.stderr
        and "constant_output 1" in p.stderr
        and "rng_consumed 1" in p.stderr
    )
    kept = [json.loads(x) for x in out.read_text().splitlines()]
    dropped = [json.loads(x) for x in rej.read_text().splitlines()]
    assert [t["name"] for t in kept] == ["good"]
    assert sorted(t["meta"]["rejected"]["reason"] for t in dropped) == [
        "constant_output",
        "rng_consumed",
    ]
    # resume: nothing is re-run, nothing duplicated
    p = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "0/0 passed" in p.stderr
    assert len(out.read_text().splitlines()) == 1 and len(rej.read_text().splitlines()) == 2


def test_filter_workers_share_a_queue_merge_and_resume(tmp_path):
    """``--workers 2``: each task checked once, outputs merged into -o / --rejected, nothing
    left behind; a run stopped with a worker's part file half written resumes from it."""
    inp = tmp_path / "in.jsonl"
    rej = tmp_path / "rej.jsonl"
    out = tmp_path / "out.jsonl"
    tasks = [GOOD, BAD["constant_output"], BAD["rng_consumed"]]
    inp.write_text("".join(json.dumps(__import__("msgspec").to_builtins(t)) + "\n" for t in tasks))
    cmd = [sys.executable, "-m", "cuda_agent.opsynth.cli", "filter", str(inp), "--no-compile"]
    cmd += ["--min-ms", "0", "-o", str(out), "--rejected", str(rej), "--timeout", "30"]
    p = subprocess.run(cmd + ["--workers", "2"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "2 workers wrote 3 records" in p.stderr, p.stderr
    kept = [json.loads(x) for x in out.read_text().splitlines()]
    dropped = [json.loads(x) for x in rej.read_text().splitlines()]
    assert [t["name"] for t in kept] == ["good"] and len(dropped) == 2
    assert sorted(x.name for x in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl", "rej.jsonl"]
    # stopped: the kept record only in a worker's part file, followed by half a line
    good_line = out.read_text()
    out.write_text("")
    (tmp_path / "out.jsonl.part0").write_text(good_line + good_line[:30])
    p = subprocess.run(
        cmd + ["--workers", "2", "--resume"], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    assert "merged 1 records" in p.stderr and "resume: 3 tasks" in p.stderr, p.stderr
    assert out.read_text() == good_line and len(rej.read_text().splitlines()) == 2
    p = subprocess.run(  # stdin cannot be shared: refused
        [*cmd[:4], "--workers", "2", "-o", str(out)], input="", capture_output=True, text=True
    )
    assert p.returncode == 2 and "--workers needs an input file" in p.stderr
    p = subprocess.run(cmd + ["--workers", "0"], capture_output=True, text=True)
    assert p.returncode == 2 and "--workers" in p.stderr  # not silently one worker


def test_shrink_halves_size_constants_consistently():
    from cuda_agent.opsynth.shrink import input_numel, shrink_source

    src = GOOD.ref_code.replace(
        "batch_size = 4\nfeatures = 64", "batch_size = 512\nfeatures = 4096"
    )
    src = src.replace("torch.randn(batch_size, features)", "torch.randn(batch_size, features)")
    assert input_numel(src) == 512 * 4096
    small, changed = shrink_source(src, 1 << 14)
    assert input_numel(small) <= 1 << 14
    assert changed["batch_size"][0] == 512 and changed["features"][0] == 4096
    two = "import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n        return x\n\nheight, width = 512, 256\ndef get_inputs():\n    return [torch.randn(height, width)]\ndef get_init_inputs():\n    return []\n"
    small, changed = shrink_source(two, 4096)
    assert "height, width = 128, 32" in small or input_numel(small) <= 4096
    assert changed["height"][0] == 512 and changed["width"][0] == 256
    assert shrink_source(GOOD.ref_code, 1 << 20) == (GOOD.ref_code, {})


def test_compile_deferred_outside_window_and_probe_seconds_recorded():
    """A task outside the window is not compiled (the GPU run's biggest cost); inside, it is."""
    f = TaskFilter(
        FilterConfig(
            backend="cpu",
            window_ms=(1e5, 1e6),
            compile=True,
            compile_backend="aot_eager",
            rescale=False,
            timeout_s=120,
        )
    )
    try:
        v = f.check(GOOD)
        assert v.reason == "too_fast"
        assert "compile_deferred" in v.probe["checks"] and "compile" not in v.probe["checks"]
        assert v.task.meta["rejected"]["probe_s"] > 0
        assert "compile" not in v.task.meta["rejected"]["phases_s"]  # deferred: not run
        f.cfg = dataclasses.replace(f.cfg, window_ms=(0.0, 1e9))
        v = f.check(GOOD)
        assert v.passed, v.detail
        assert "compile" in v.task.meta["filter"]["checks"]
        assert v.task.meta["filter"]["probe_s"] > 0
        # where the time went: every check that ran, and the process around them, add up
        ph = v.task.meta["filter"]["phases_s"]
        assert {
            "load",
            "rng",
            "eager",
            "deterministic",
            "input_dependent",
            "time",
            "compile",
        } <= set(ph)
        assert ph["compile"] > 0 and "failed" not in ph
        assert abs(sum(ph.values()) - v.task.meta["filter"]["probe_s"]) < 0.02, ph
    finally:
        f.close()


# A sandbox timer in a process of its own: holds the device's gate exclusive, as the sandbox's
# timing does (``cuda_agent.sandbox.gate``), until its stdin is closed.
SANDBOX_TIMER = r"""
import sys
from pathlib import Path
from cuda_agent.sandbox.gate import device_gate

with device_gate(sys.argv[1]).exclusive():
    Path(sys.argv[2]).touch()
    sys.stdin.read()
"""


@contextlib.contextmanager
def sandbox_timing(domain: str, tmp_path: Path) -> Iterator[None]:
    """A sandbox timer of ``domain`` (another process, the test's environment) times for the
    block."""
    held = tmp_path / f"held-{domain.replace(':', '-')}"
    p = subprocess.Popen([sys.executable, "-c", SANDBOX_TIMER, domain, str(held)], stdin=PIPE)
    try:
        end = time.monotonic() + 60
        while not held.exists():
            assert p.poll() is None and time.monotonic() < end, "the sandbox timer never held"
            time.sleep(0.01)
        yield
    finally:
        assert p.stdin is not None
        p.stdin.close()
        assert p.wait(30) == 0


def test_timing_waits_for_a_sandbox_timer_on_the_device(
    tmp_path, monkeypatch, reach_for_other_users
):
    """While a sandbox timer holds the device's gate (another process), a task cannot time (and
    times out); once it is done, it can."""
    reach_for_other_users(tmp_path)  # the gate's files, for the uid the probe runs as
    monkeypatch.setenv("CUDA_AGENT_GATE_DIR", str(tmp_path / "gates"))
    f = TaskFilter(FilterConfig(backend="cpu", window_ms=(0.0, 1e9), compile=False, timeout_s=8))
    try:
        with sandbox_timing("host", tmp_path):
            v = f.check(GOOD)
            assert v.reason == "timeout", (v.reason, v.detail)
        v = f.check(GOOD)
        assert v.passed, v.detail
        assert v.task.meta["filter"]["phases_s"].get("time_wait", 0.0) < 1.0  # nobody else timed
    finally:
        f.close()


def test_timing_wait_is_its_own_phase(tmp_path, monkeypatch, reach_for_other_users):
    """Seconds spent waiting for another timer's hold of the device are reported as
    ``time_wait``, apart from the timing itself."""
    reach_for_other_users(tmp_path)  # the gate's files, for the uid the probe runs as
    monkeypatch.setenv("CUDA_AGENT_GATE_DIR", str(tmp_path / "gates"))
    f = TaskFilter(
        FilterConfig(
            backend="cpu", window_ms=(0.0, 1e9), compile=False, timeout_s=60, time_budget_s=0.2
        )
    )
    got = {}
    try:
        # the first check starts the zygote (import torch: many seconds on a loaded 2-core CI
        # machine, which once outlasted the hold below); the second forks from it at once
        assert f.check(GOOD).passed
        with sandbox_timing("host", tmp_path):  # "another timer" times for 6 s
            t = threading.Thread(target=lambda: got.setdefault("v", f.check(GOOD)))
            t.start()
            time.sleep(6)
        t.join(60)
        v = got["v"]
        assert v.passed, v.detail
        ph = v.task.meta["filter"]["phases_s"]
        assert ph["time_wait"] > 1.0 and ph["time"] < ph["time_wait"], ph  # not counted twice
    finally:
        f.close()


# opsynth's side: the timing hold of a probe on the given device, in a process of its own
PROBE_TIMER = r"""
import sys, time
from cuda_agent.opsynth.probe import timing_hold

print("ready", flush=True)
with timing_hold(sys.argv[1]):
    print(time.time(), flush=True)
"""


def test_cuda_timing_holds_the_gate_of_the_gpu_the_sandbox_times_on(tmp_path, monkeypatch):
    """A probe on ``cuda`` (the first GPU of $CUDA_VISIBLE_DEVICES) holds the gate a sandbox
    timer of that GPU holds: it waits while the sandbox times there (no GPU needed: the gate
    is a lock)."""
    from cuda_agent.opsynth.probe import timing_domain

    monkeypatch.setenv("CUDA_AGENT_GATE_DIR", str(tmp_path / "gates"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert (timing_domain("cuda"), timing_domain("cuda:1")) == ("cuda:3", "cuda:1")
    assert timing_domain("cpu") == "host"
    with sandbox_timing("cuda:3", tmp_path):
        probe = subprocess.Popen(
            [sys.executable, "-c", PROBE_TIMER, "cuda"], stdout=PIPE, text=True
        )
        assert probe.stdout is not None and probe.stdout.readline() == "ready\n"
        time.sleep(2)  # far longer than taking a free gate takes
        assert probe.poll() is None, "the probe timed while the sandbox held the GPU's gate"
        released = time.time()
    out, _ = probe.communicate(timeout=60)
    assert probe.returncode == 0 and float(out) >= released


def test_task_runs_confined_by_the_sandbox(tmp_path):
    """A task's program runs under the sandbox's confinement: it cannot write outside its
    worker's directory (a read-only file system, where the host allows one) nor reach the
    network (its own namespace, where the host allows one)."""
    outside = tmp_path / "escaped"
    writes = task(f"open({str(outside)!r}, 'w').write('x')\nreturn x * 2.0", "writes_outside")
    connects = task(
        "__import__('socket').create_connection(('127.0.0.1', 9), timeout=2)\nreturn x * 2.0",
        "connects",
    )
    f = TaskFilter(FilterConfig(backend="cpu", window_ms=(0.0, 1e9), compile=False, timeout_s=60))
    try:
        v_write, v_net = f.check(writes), f.check(connects)
        iso = f.iso.isolation
    finally:
        f.close()
    assert iso.get("filesystem") and iso.get("network", "").startswith("namespace"), iso
    assert v_write.reason == "eager_error" and "OSError" in v_write.detail, v_write.detail
    assert not outside.exists()
    assert v_net.reason == "eager_error" and "OSError" in v_net.detail, v_net.detail


def test_spawn_mode_deadline_starts_after_the_imports():
    """``--isolation spawn``: a new interpreter per task, confined the same way; its start-up
    (import torch: seconds) is not the task's time, so a task well inside its timeout passes and
    one that hangs still times out."""
    f = TaskFilter(
        FilterConfig(
            backend="cpu", window_ms=(0.0, 1e9), compile=False, timeout_s=3, isolation="spawn"
        )
    )
    try:
        ok, hangs = f.check(GOOD), f.check(BAD["timeout"])
    finally:
        f.close()
    assert ok.passed, ok.detail
    assert ok.task.meta["filter"]["phases_s"]["process"] > 0  # the start-up, outside the checks
    assert hangs.reason == "timeout", (hangs.reason, hangs.detail)
    assert f.iso.isolation.get("filesystem"), f.iso.isolation


def test_out_of_memory_retried_with_a_smaller_batch():
    """A task over the worker's memory cap is shrunk (8x per try) until it fits, and says so;
    with rescaling off it is dropped as out_of_memory."""
    big = task(
        "return torch.relu(x) * 2.0",
        "too_big",
        tail=TAIL.replace("batch_size = 4", "batch_size = 262144").replace(
            "features = 64", "features = 2048"
        ),
    )  # 2 GiB of fp32 input
    f = TaskFilter(
        FilterConfig(backend="cpu", window_ms=(0.0, 1e9), compile=False, timeout_s=60, mem_gb=0.75)
    )
    try:
        f.cfg = dataclasses.replace(f.cfg, rescale=False)
        v = f.check(big)
        assert v.reason == "out_of_memory", (v.reason, v.detail)
        f.cfg = dataclasses.replace(f.cfg, rescale=True)
        v = f.check(big)
    finally:
        f.close()
    assert v.passed, (v.reason, v.detail)
    steps = v.task.meta["filter"]["rescaled"]
    assert steps[0] == {"batch_size": [262144, 32768], "after": "out_of_memory"}
    assert "batch_size = 32768" in v.task.ref_code or "batch_size = 4096" in v.task.ref_code


def test_upscale_limited_by_measured_peak_memory():
    """An upscale is cut so the larger batch should use at most half the memory cap (the H200
    run lost two probes per task on 16x upscales that then ran out of memory)."""
    from cuda_agent.opsynth.filter import upscale_memory_cap

    assert upscale_memory_cap(16.0, 2.0, 8.0) == 2.0  # 2 GiB now, 8 GiB cap: at most 2x
    assert upscale_memory_cap(16.0, 0.1, 8.0) == 16.0  # fits easily: unchanged
    assert upscale_memory_cap(16.0, 6.0, 8.0) == 1.0  # already over half the cap: no upscale
    assert upscale_memory_cap(0.25, 6.0, 8.0) == 0.25  # shrinking is never limited
    assert upscale_memory_cap(16.0, None, 8.0) == 16.0  # no measurement (cpu backend)
