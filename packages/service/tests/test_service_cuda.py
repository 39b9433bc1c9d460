"""The service on the cuda backend (skipped without CUDA): a real server on loopback over a real
cuda pool evaluates an honest CUDA workdir candidate ``ok`` with timing, with the verdict that
``cuda_agent.sandbox.evaluate`` gives the same candidate in this process. The fixture's compile
is checked without a GPU (nvcc only)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cuda_agent.records import Candidate, EvalResult, Solution, Status, Task
from cuda_agent.sandbox import SandboxConfig, evaluate

from .conftest import FIX, Running, running_service

CUDA_FIX = FIX / "cuda_scale_add"


def _candidate(task: Task) -> Candidate:
    files = {
        str(p.relative_to(CUDA_FIX)): p.read_text()
        for p in sorted(CUDA_FIX.rglob("*"))
        if p.is_file() and p.suffix in (".py", ".cu", ".cpp")
    }
    return Candidate(task=task, solution=Solution.make("workdir", files))


def _nvcc() -> bool:
    from cuda_agent.sandbox.toolchain import flags_for

    return flags_for("cuda").nvcc is not None


@pytest.mark.skipif(not _nvcc(), reason="needs nvcc")
def test_the_cuda_fixture_compiles(task, run_sandbox_cache, tmp_path):
    """The sandbox's own cuda build of the fixture (compile-only: no GPU needed)."""
    from cuda_agent.sandbox.build import ObjectCache, build_workdir
    from cuda_agent.sandbox.workspace import materialise

    c = _candidate(task)
    work = materialise(c.task, c.solution, tmp_path / "work", "cuda")
    res = build_workdir(
        work,
        work / "build",
        backend="cuda",
        cache=ObjectCache(run_sandbox_cache / "build"),
        jobs=2,
        timeout_s=900,
    )
    assert res.ok, res.log[-4000:]
    assert res.so_path is not None and res.so_path.exists()
    files = {u["file"] for u in res.units}
    assert {"kernels/scale_add.cu", "kernels/scale_add_binding.cpp"} <= files, res.units


def _cfg() -> SandboxConfig:
    # the production guard policy; the eager baseline (speedup_vs_eager), not torch.compile's
    return SandboxConfig(
        backend="cuda",
        guard_policy="strict",
        compile_baseline=False,
        timing_config={"time_cap_s": 2},
    )


@pytest.fixture(scope="module")
def cuda_service(ws_root) -> Iterator[Running]:
    with running_service(_cfg(), ws_root / "cuda") as r:
        yield r


@pytest.mark.gpu
@pytest.mark.slow
def test_an_honest_cuda_candidate_over_http_matches_a_direct_evaluation(cuda_service, task):
    h = cuda_service.client.health()
    assert h.backend == "cuda" and h.devices, h
    cand = _candidate(task)
    via_http = cuda_service.client.evaluate(cand)
    assert isinstance(via_http, EvalResult)
    assert via_http.status == Status.OK, (via_http.status, via_http.message)
    assert (via_http.task_id, via_http.solution_id, via_http.backend) == (
        task.id,
        cand.solution.id,
        "cuda",
    )
    assert via_http.correctness is not None and via_http.correctness.passed
    assert via_http.timing is not None and via_http.timing.candidate is not None
    assert via_http.timing.candidate.median_ms > 0
    assert via_http.speedup_vs_eager is not None and via_http.speedup_vs_eager > 0
    assert not [g for g in via_http.guards if g.severity == "reject"], via_http.guards

    direct = evaluate(cand, _cfg())
    assert direct.status == via_http.status, (direct.status, direct.message)
    assert (direct.task_id, direct.solution_id, direct.backend) == (
        via_http.task_id,
        via_http.solution_id,
        via_http.backend,
    )
    assert direct.correctness is not None
    assert [t.passed for t in direct.correctness.trials] == [
        t.passed for t in via_http.correctness.trials
    ]
    assert not [g for g in direct.guards if g.severity == "reject"], direct.guards
