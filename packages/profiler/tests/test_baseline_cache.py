"""Baselines in a fresh subprocess with a timeout, and their cache (real worker processes)."""

import time

from cuda_agent.profiler import PROTOCOL_VERSION, quick_config
from cuda_agent.profiler.baseline import (
    BaselineCache,
    baseline_for_task,
    cache_root,
    cached_baseline,
    device_name,
    task_hash,
    torch_version,
)
from cuda_agent.records import Baseline, TimingStats

CFG = quick_config(time_cap_s=0.3, warmup_ms=5.0)


def test_cache_round_trip_and_key(tmp_path):
    c = BaselineCache(tmp_path)
    k = BaselineCache.key("t", "gpu", "2.11", "default", "cuda")
    assert c.get(k) is None
    b = Baseline(
        device="gpu",
        torch_version="2.11",
        protocol_version=PROTOCOL_VERSION,
        eager=TimingStats(median_ms=1.0, n=10),
    )
    c.put(k, b)
    assert c.get(k) == b
    others = [
        BaselineCache.key("t2", "gpu", "2.11", "default", "cuda"),
        BaselineCache.key("t", "gpu2", "2.11", "default", "cuda"),
        BaselineCache.key("t", "gpu", "2.12", "default", "cuda"),
        BaselineCache.key("t", "gpu", "2.11", "max-autotune", "cuda"),
        BaselineCache.key("t", "gpu", "2.11", "default", "cpu"),
        BaselineCache.key("t", "gpu", "2.11", "default", "cuda", protocol="ca-timing-0"),
    ]
    assert len({k, *others}) == 7
    c.path(k).write_text("{not json")
    assert c.get(k) is None  # a corrupt entry is a miss


def test_cache_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_AGENT_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    assert BaselineCache().dir == tmp_path / "baselines"


def test_baseline_subprocess_then_cache(tiny_src, tmp_path):
    cache = BaselineCache(tmp_path)
    b = baseline_for_task(
        tiny_src, device="cpu", compile_mode=None, timeout_s=120, config=CFG, cache=cache
    )
    assert b.error is None, b.error
    assert b.eager is not None and b.eager.median_ms > 0 and b.compile is None
    assert b.protocol_version == PROTOCOL_VERSION and b.backend == "cpu"
    key = BaselineCache.key(task_hash(tiny_src), device_name("cpu"), torch_version(), "none", "cpu")
    assert cache.get(key) == b
    # the read-only lookup the sandbox uses finds the same entry, and nothing else
    assert cached_baseline(tiny_src, device="cpu", compile_mode=None, cache=cache) == b
    assert cached_baseline(tiny_src, device="cpu", compile_mode="default", cache=cache) is None
    t0 = time.monotonic()
    again = baseline_for_task(tiny_src, device="cpu", compile_mode=None, config=CFG, cache=cache)
    assert again == b and time.monotonic() - t0 < 1.0  # served from the cache


def test_baseline_timeout_kills_worker_and_is_not_cached(tmp_path):
    src = (
        "import time, torch\nimport torch.nn as nn\n"
        "class Model(nn.Module):\n    def forward(self, x):\n        return x\n"
        "def get_inputs():\n    time.sleep(60)\n    return [torch.ones(1)]\n"
        "def get_init_inputs():\n    return []\n"
    )
    cache = BaselineCache(tmp_path)
    t0 = time.monotonic()
    b = baseline_for_task(
        src, device="cpu", compile_mode=None, timeout_s=4, config=CFG, cache=cache
    )
    assert time.monotonic() - t0 < 30
    assert b.error and b.error.startswith("timeout") and b.eager is None
    assert not list(tmp_path.glob("*.json"))


def test_baseline_crash_is_reported(tmp_path):
    src = (
        "import torch\nimport torch.nn as nn\n"
        "class Model(nn.Module):\n    def forward(self, x):\n        raise RuntimeError('boom')\n"
        "def get_inputs():\n    return [torch.ones(4)]\n"
        "def get_init_inputs():\n    return []\n"
    )
    b = baseline_for_task(
        src,
        device="cpu",
        compile_mode=None,
        timeout_s=120,
        config=CFG,
        cache=BaselineCache(tmp_path),
    )
    assert b.error and "boom" in b.error and b.eager is None
    assert not list(tmp_path.glob("*.json"))


class _Hold:
    """A context manager that records when it is entered and left (a stand-in for a gate)."""

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def __enter__(self):
        self.log.append((self.name, "enter", time.monotonic()))

    def __exit__(self, *exc):
        self.log.append((self.name, "exit", time.monotonic()))


def test_the_worker_sets_up_outside_the_hold_and_times_inside_it(tiny_src, tmp_path):
    slow_setup = tiny_src.replace("import torch", "import time, torch", 1).replace(
        "def get_inputs():", "def get_inputs():\n    time.sleep(0.5)", 1
    )
    assert slow_setup != tiny_src and "time.sleep" in slow_setup
    log: list = []
    b = baseline_for_task(
        slow_setup,
        device="cpu",
        compile_mode=None,
        config=CFG,
        cache=BaselineCache(tmp_path),
        setup=lambda: _Hold("setup", log),
        hold=lambda: _Hold("hold", log),
    )
    assert b.error is None and b.eager is not None and b.eager.n > 0
    assert [(n, e) for n, e, _ in log] == [
        ("setup", "enter"),
        ("setup", "exit"),
        ("hold", "enter"),
        ("hold", "exit"),
    ]
    # the inputs (3 sets, each sleeping 0.5 s) were drawn before the hold; the hold is the timing
    setup_s = log[1][2] - log[0][2]
    assert setup_s >= 1.4


def test_a_worker_failing_in_its_set_up_never_takes_the_hold(tmp_path):
    src = (
        "import torch\nimport torch.nn as nn\n"
        "class Model(nn.Module):\n    def forward(self, x):\n        return x\n"
        "def get_inputs():\n    raise RuntimeError('no inputs')\n"
        "def get_init_inputs():\n    return []\n"
    )
    log: list = []
    b = baseline_for_task(
        src,
        device="cpu",
        compile_mode=None,
        timeout_s=120,
        config=CFG,
        cache=BaselineCache(tmp_path),
        hold=lambda: _Hold("hold", log),
    )
    assert b.error and "no inputs" in b.error and b.eager is None
    assert log == []


def test_an_eager_only_lookup_is_served_by_a_full_entry(tiny_src, tmp_path):
    cache = BaselineCache(tmp_path)
    args = (task_hash(tiny_src), device_name("cpu"), torch_version())
    full = Baseline(
        device=args[1],
        torch_version=args[2],
        protocol_version=PROTOCOL_VERSION,
        eager=TimingStats(median_ms=2.0, n=10),
        compile=TimingStats(median_ms=1.0, n=10),
    )
    cache.put(BaselineCache.key(*args, "default", "cpu"), full)
    assert cached_baseline(tiny_src, device="cpu", compile_mode=None, cache=cache) == full
    t0 = time.monotonic()
    b = baseline_for_task(tiny_src, device="cpu", compile_mode=None, config=CFG, cache=cache)
    assert b == full and time.monotonic() - t0 < 1.0  # no worker ran
    # never the other way round, nor from an entry without eager figures
    assert cached_baseline(tiny_src, device="cpu", compile_mode="max-autotune", cache=cache) is None
    cache.put(
        BaselineCache.key(*args, "default", "cpu"),
        Baseline(
            device=args[1], torch_version=args[2], protocol_version=PROTOCOL_VERSION, error="x"
        ),
    )
    assert cached_baseline(tiny_src, device="cpu", compile_mode=None, cache=cache) is None
