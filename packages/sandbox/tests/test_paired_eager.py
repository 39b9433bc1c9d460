"""The paired eager timer (``SandboxConfig.paired_eager``): the reference's program timed again in
the candidate's own exclusive hold, by a trusted process, and the speed-up over eager taken from
it. Found on the H200 (docs/lab/session23): timed in one process, interleaved, a candidate and
its eager reference keep their ratio within 1.0-2.4% with nothing else running, beside other GPU
memory and with new input addresses, while their absolute times move up to 30%; dividing by an
eager time cached from another run moved honest speed-ups 4-25% between two runs of the positive
corpus."""

from __future__ import annotations

import pytest

from cuda_agent.records import Status
from cuda_agent.sandbox.config import SandboxConfig
from cuda_agent.sandbox.evaluate import evaluate

from .conftest import kb_candidate
from .test_evaluate_api import HONEST

# the same computation, 20 ms slower per call: a paired "eager" that timed the candidate (or
# shared its process) would read a speed-up near 1
SLOW = HONEST.replace(
    "    def forward(self, x):\n",
    "    def forward(self, x):\n        import time\n        time.sleep(0.02)\n",
)
# passes verification (a fresh process, a few calls), then fails inside its timing process
FAILS_WHEN_TIMED = HONEST.replace(
    "    def forward(self, x):\n",
    "    calls = 0\n\n    def forward(self, x):\n        ModelNew.calls += 1\n"
    "        if ModelNew.calls > 12:\n            raise RuntimeError('tired')\n",
)


def _cfg(cache_dir, **kw) -> SandboxConfig:
    return SandboxConfig(
        backend="cpu",
        cache_dir=str(cache_dir),
        guard_policy="off",
        timing_config={"time_cap_s": 0.5, "min_samples": 5},
        paired_eager=True,
        **kw,
    )


def test_speedup_over_eager_is_divided_by_the_paired_eager_time(cache_dir, scale_add_task):
    r = evaluate(kb_candidate(scale_add_task, HONEST), _cfg(cache_dir))
    assert r.status == Status.OK, r.message
    assert r.meta["eager_paired"] == "paired"
    t = r.timing
    assert t is not None and t.eager is not None
    assert r.speedup_vs_eager == pytest.approx(t.eager.median_ms / t.candidate.median_ms)
    assert r.meta["eager_cached_ms"] > 0  # the cached baseline's figure, kept beside it
    assert t.eager.median_ms != r.meta["eager_cached_ms"]  # a measurement of its own
    assert r.meta["stages_s"]["time_eager"] > 0


def test_the_paired_eager_times_the_reference_not_the_candidate(cache_dir, scale_add_task):
    r = evaluate(kb_candidate(scale_add_task, SLOW), _cfg(cache_dir))
    assert r.status == Status.OK, r.message
    assert r.meta["eager_paired"] == "paired"
    assert r.timing.candidate.median_ms > 15.0
    assert r.timing.eager.median_ms < 5.0
    assert r.speedup_vs_eager < 0.3


def test_a_candidate_that_fails_while_timed_ends_the_eager_timer_untimed(cache_dir, scale_add_task):
    r = evaluate(kb_candidate(scale_add_task, FAILS_WHEN_TIMED), _cfg(cache_dir))
    assert r.status == Status.RUNTIME_ERROR, r.message
    assert "candidate failed while timed" in r.message and "tired" in r.message
    assert "did not time" in r.meta["eager_paired"]


def test_off_by_default_on_the_cpu_backend_and_says_nothing(cache_dir, scale_add_task):
    assert SandboxConfig().paired_eager is None  # on for cuda, off for cpu
    for pe in (None, False):
        cfg = _cfg(cache_dir).with_(paired_eager=pe)
        r = evaluate(kb_candidate(scale_add_task, HONEST), cfg)
        assert r.status == Status.OK, r.message
        assert "eager_paired" not in r.meta and "time_eager" not in r.meta["stages_s"]


@pytest.mark.gpu
def test_on_the_gpu_the_paired_eager_is_taken_in_the_same_hold(cache_dir, scale_add_task):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cfg = _cfg(cache_dir).with_(backend="cuda", timing_config=None)
    r = evaluate(kb_candidate(scale_add_task, SLOW), cfg)
    assert r.status == Status.OK, r.message
    assert r.meta["eager_paired"] == "paired"
    assert r.timing.candidate.median_ms > 15.0 and r.speedup_vs_eager < 0.1
    # the exclusive hold of the timing phase covers both timed sections
    holds = [h for h in r.meta["device_phases"] if h["phase"] == "time"]
    assert len(holds) == 1 and holds[0]["mode"] == "exclusive"
