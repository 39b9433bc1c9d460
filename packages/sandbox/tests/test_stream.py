"""`eval_stream` (what `sandbox eval` and `kernelbench-eval run` share) and `SandboxPool.map`'s
window: input read only a window ahead; an evaluation that raises is emitted, or stops the
stream after what was in flight, never reordering or losing the other results; results written
as each is done, so that a slow candidate holds back no other (``in_order``: input order)."""

from __future__ import annotations

import json

import pytest
import typer

from cuda_agent.records.cli_helpers import OnError
from cuda_agent.records.jsonl import encode
from cuda_agent.sandbox import SandboxConfig, SandboxPool
from cuda_agent.sandbox.stream import eval_stream

from .conftest import kb_candidate, workdir_candidate

# PyTorch only: the strict guard policy rejects it before any process runs
TORCH_OPS = (
    "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
    "    def forward(self, x):\n        return torch.relu(x)\n"
)


@pytest.fixture
def pool(cache_dir):
    cfg = SandboxConfig(backend="cpu", cache_dir=str(cache_dir), guard_policy="strict")
    with SandboxPool(cfg, compile_workers=2, cpu_workers=2) as p:
        yield p


def _cands(task, n):
    return [kb_candidate(task, TORCH_OPS + f"\n# stream {i}\n") for i in range(n)]


@pytest.mark.parametrize("unordered", [False, True])
@pytest.mark.parametrize("window", [1, 3])
def test_map_reads_only_a_window_ahead_of_its_results(pool, scale_add_task, window, unordered):
    cands = _cands(scale_add_task, 8)
    pulled = []

    def items():
        for c in cands:
            pulled.append(c)
            yield c

    ahead = []
    out = []
    if unordered:
        results = (
            r for c, r in pool.map_unordered(items(), window) if c.solution.id == r.solution_id
        )
    else:
        results = pool.map(items(), window)
    for r in results:
        ahead.append(len(pulled) - len(out))  # candidates read but not yet yielded, this one too
        out.append(r)
    got = [r.solution_id for r in out]
    want = [c.solution.id for c in cands]
    assert (sorted(got) == sorted(want)) if unordered else (got == want)
    assert max(ahead) <= window, ahead
    assert all(r.status.value == "guard_violation" for r in out)


def test_a_raising_evaluation_is_emitted_or_stops_after_the_work_in_flight(
    pool, scale_add_task, tmp_path
):
    cands = _cands(scale_add_task, 8)
    inp = tmp_path / "c.jsonl"
    inp.write_bytes(b"".join(encode(c) for c in cands))
    bad = cands[2].solution.id

    def finish(c, r):
        if c.solution.id == bad:
            raise RuntimeError("finish failed")
        return r

    out = tmp_path / "emit.jsonl"
    st = eval_stream(
        pool, input=inp, output=out, on_error=OnError.emit, finish=finish, window=2, in_order=True
    )
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["eval_result"] * 2 + ["error"] + ["eval_result"] * 5
    assert rows[2]["line"] == 3 and "RuntimeError: finish failed" in rows[2]["message"]
    assert (st.written, st.failed, st.statuses) == (8, 1, {"guard_violation": 7})

    out = tmp_path / "stop.jsonl"
    with pytest.raises(typer.Exit) as e:
        eval_stream(
            pool,
            input=inp,
            output=out,
            on_error=OnError.stop,
            finish=finish,
            window=2,
            in_order=True,
        )
    assert e.value.exit_code == 1
    got = [json.loads(x)["solution_id"] for x in out.read_text().splitlines()]
    ids = [c.solution.id for c in cands]
    # the two before it, and at most the one read ahead with it; nothing read after the stop
    assert got in (ids[:2], ids[:2] + ids[3:4]), got
    # resumed (the failure fixed): only what is missing is evaluated, each once
    st = eval_stream(pool, input=inp, output=out, resume=True, window=2)
    got = [json.loads(x)["solution_id"] for x in out.read_text().splitlines()]
    assert sorted(got) == sorted(ids) and st.skipped_done == len(ids) - st.written


def test_results_are_written_as_done_unless_in_order(
    pool, scale_add_task, scale_add_files, warm_build, tmp_path
):
    """A candidate that is built, verified and run (seconds) first, then static rejects
    (milliseconds): as done, the rejects are written before it; in order, after it."""
    slow = workdir_candidate(scale_add_task, scale_add_files)
    fast = _cands(scale_add_task, 4)
    inp = tmp_path / "c.jsonl"
    inp.write_bytes(b"".join(encode(c) for c in [slow, *fast]))
    ids = [c.solution.id for c in [slow, *fast]]

    def order(out):
        return [json.loads(x)["solution_id"] for x in out.read_text().splitlines()]

    as_done = tmp_path / "as-done.jsonl"
    st = eval_stream(pool, input=inp, output=as_done, window=5)
    got = order(as_done)
    assert sorted(got) == sorted(ids) and st.written == 5
    assert got[-1] == slow.solution.id, got  # written last, though read first
    assert json.loads(as_done.read_text().splitlines()[-1])["status"] == "ok"
    in_order = tmp_path / "in-order.jsonl"
    eval_stream(pool, input=inp, output=in_order, window=5, in_order=True)
    assert order(in_order) == ids
