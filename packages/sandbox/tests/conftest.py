"""Shared fixtures: one build cache per test session (bindings compile once), small tasks."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from cuda_agent.records import Candidate, Solution, Task

FIX = Path(__file__).parent / "fixtures"


def let_other_users_reach(d: Path) -> None:
    """pytest's temporary dirs are 0700: let the sandbox's unprivileged uids through to ``d``."""
    for parent in (d, *d.parents):
        if parent == Path(tempfile.gettempdir()):
            break
        parent.chmod(parent.stat().st_mode | 0o111)


@pytest.fixture
def confined_tmp(tmp_path) -> Path:
    """``tmp_path`` that confined processes can reach and write, also as root (where they run as
    another uid)."""
    let_other_users_reach(tmp_path)
    tmp_path.chmod(0o777)
    return tmp_path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """Session-wide caches (set CUDA_AGENT_SANDBOX_TEST_CACHE to reuse one across runs)."""
    env = os.environ.get("CUDA_AGENT_SANDBOX_TEST_CACHE")
    d = Path(env) if env else tmp_path_factory.mktemp("sandbox-cache")
    d.mkdir(parents=True, exist_ok=True)
    if not env:
        let_other_users_reach(d)
    os.environ.setdefault("CUDA_AGENT_CACHE", str(d / "profiler"))  # baselines of the profiler
    return d


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
    work = (
        materialise(c.task, c.solution, cache_dir / "warm-work", "cpu")
        if not (cache_dir / "warm-work").exists()
        else cache_dir / "warm-work"
    )
    res = build_workdir(
        work,
        work / "build",
        backend="cpu",
        cache=ObjectCache(cache_dir / "build"),
        pch=False,
        timeout_s=900,
    )
    assert res.ok, res.log
    fresh = [u for u in res.units if u["file"] == "kernels/ops_binding.cpp" and not u["cached"]]
    # it includes <torch/extension.h>: compiled against the stand-in, not the umbrella header
    assert all(u.get("headers") == "stand-in" for u in fresh), res.units
    return res
