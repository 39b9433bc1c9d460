"""Shared fixtures: the run's build cache (bindings compile once), small tasks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cuda_agent.records import Candidate, Solution, Task

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture
def confined_tmp(tmp_path, reach_for_other_users) -> Path:
    """``tmp_path`` that confined processes can reach and write, also as root (where they run as
    another uid)."""
    reach_for_other_users(tmp_path)
    tmp_path.chmod(0o777)
    return tmp_path


@pytest.fixture(scope="session")
def cache_dir(run_sandbox_cache, tmp_path_factory) -> Path:
    """The run's sandbox cache (root conftest: shared by the workers; objects are keyed by
    content, so tests that need a cold build use new source text); the profiler's baselines in
    a cache of this worker's own."""
    os.environ.setdefault("CUDA_AGENT_CACHE", str(tmp_path_factory.mktemp("profiler-cache")))
    return run_sandbox_cache


def fixture_files(name: str) -> dict[str, str]:
    root = FIX / name
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "model.py"
    }


@pytest.fixture(scope="session")
def scale_add_task() -> Task:
    return Task.make("scale_add", (FIX / "scale_add" / "model.py").read_text())


@pytest.fixture(scope="session")
def scale_add_files() -> dict[str, str]:
    return fixture_files("scale_add")


def workdir_candidate(task: Task, files: dict[str, str], **changes: str) -> Candidate:
    f = dict(files)
    f.update(changes)
    return Candidate(task=task, solution=Solution.make("workdir", f))


def kb_candidate(task: Task, model_new: str) -> Candidate:
    return Candidate(task=task, solution=Solution.make("kernelbench", {"model_new.py": model_new}))


@pytest.fixture(scope="session")
def warm_build(cache_dir, scale_add_task, scale_add_files):
    """Build the scale_add fixture once so later tests find its binding objects cached."""
    from cuda_agent.sandbox.build import ObjectCache, build_workdir
    from cuda_agent.sandbox.workspace import materialise

    c = workdir_candidate(scale_add_task, scale_add_files)
    # a tree per xdist worker (two workers materialising one directory raced); the object
    # cache they build into is shared, and safe for that
    work = cache_dir / f"warm-work-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    if not work.exists():
        materialise(c.task, c.solution, work, "cpu")
    res = build_workdir(
        work,
        work / "build",
        backend="cpu",
        cache=ObjectCache(cache_dir / "build"),
        timeout_s=900,
    )
    assert res.ok, res.log
    fresh = [u for u in res.units if u["file"] == "kernels/ops_binding.cpp" and not u["cached"]]
    # it includes <torch/extension.h>: compiled against the stand-in, not the umbrella header
    assert all(u.get("headers") == "stand-in" for u in fresh), res.units
    return res
