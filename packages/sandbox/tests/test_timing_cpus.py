"""Cores kept for timed sections (profiler.cpus): every process the sandbox starts runs on the
other cores, and the timing process moves onto the kept ones once it holds the exclusive
section. Found on the H200: a 67 us KernelBench program (L1/12) timed 7% apart in two runs while
8 compile workers shared every core with the timed launches."""

from __future__ import annotations

import os

import pytest

from cuda_agent.profiler import cpus
from cuda_agent.records import Status
from cuda_agent.sandbox.config import SandboxConfig
from cuda_agent.sandbox.evaluate import evaluate

from .conftest import kb_candidate
from .test_evaluate_api import HONEST


def test_resolve_keeps_cores_only_where_there_are_enough(monkeypatch):
    monkeypatch.setattr(cpus, "_allowed", lambda: list(range(16)))
    assert cpus.resolve("auto") == (14, 15)
    assert cpus.resolve("off") == cpus.resolve(0) == cpus.resolve(None) == ()
    assert cpus.resolve(3) == cpus.resolve("3") == (13, 14, 15)
    assert cpus.resolve("2,5") == (2, 5)
    for bad in ("16", "99", "0,99", "cores", "-1", ",".join(map(str, range(16)))):
        with pytest.raises(ValueError, match="timing_cpus"):
            cpus.resolve(bad)
    monkeypatch.setattr(cpus, "_allowed", lambda: [0, 1])
    assert cpus.resolve("auto") == ()  # a 2-core host keeps none
    assert cpus.resolve(1) == (1,)


def test_install_takes_a_parents_decision(monkeypatch, capsys):
    monkeypatch.setenv(cpus.ENV, "")
    assert cpus.install("auto") == () and cpus.other_cpus() is None
    monkeypatch.delenv(cpus.ENV)
    monkeypatch.setattr(cpus, "_allowed", lambda: list(range(16)))
    assert cpus.install("auto") == (14, 15) and os.environ[cpus.ENV] == "14,15"
    assert cpus.install("off") == (14, 15)  # already decided for this process tree
    assert "timing_cpus='off' not applied" in capsys.readouterr().err
    assert cpus.install("auto") == (14, 15) and capsys.readouterr().err == ""
    assert cpus.other_cpus() == tuple(range(14))


def _cfg(cache_dir, timing_cpus: str) -> SandboxConfig:
    return SandboxConfig(
        backend="cpu",
        cache_dir=str(cache_dir),
        guard_policy="off",
        baselines=False,
        timing_config={"time_cap_s": 0.5, "min_samples": 3},
        timing_cpus=timing_cpus,
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_the_timed_section_runs_on_the_kept_core_and_the_rest_elsewhere(
    cache_dir, scale_add_task, monkeypatch
):
    monkeypatch.delenv(cpus.ENV, raising=False)
    allowed = sorted(os.sched_getaffinity(0))
    r = evaluate(kb_candidate(scale_add_task, HONEST), _cfg(cache_dir, "1"))
    assert r.status == Status.OK, r.message
    got = r.meta["cpus"]
    assert got["kept"] == allowed[-1:]
    assert got["time_process"] == allowed[:-1]  # started by the sandbox: off the kept core
    assert got["timed"] == allowed[-1:]  # in the exclusive section: on it
    assert "cpus" in r.meta["isolation"]


def test_no_kept_cores_records_nothing(cache_dir, scale_add_task, monkeypatch):
    monkeypatch.delenv(cpus.ENV, raising=False)
    r = evaluate(kb_candidate(scale_add_task, HONEST), _cfg(cache_dir, "off"))
    assert r.status == Status.OK, r.message
    assert "cpus" not in r.meta and "cpus" not in r.meta["isolation"]
