"""The verl adapter without verl (verl 0.9 cannot join this workspace's lock: it requires
transformers < 5.11): ``compute_score`` called as verl's reward managers call a custom reward
function, on the strict cpu pool, and the parquet dataset read back."""

from __future__ import annotations

import pytest

from cuda_agent.adapters import verl as kverl
from cuda_agent.adapters.common import register_evaluator
from cuda_agent.adapters.trl import task_from_column


def test_compute_score_on_a_local_pool(scale_add_task, answers, strict_pool):
    register_evaluator("verl-test", strict_pool)
    rows = kverl.verl_rows([scale_add_task], backend="cpu", include_skill=False)
    gt = rows[0]["reward_model"]["ground_truth"]
    got = {
        n: kverl.compute_score(
            kverl.DATA_SOURCE, answers[n], gt, rows[0]["extra_info"], evaluator="verl-test"
        )
        for n in ("correct", "wrong", "unparsable")
    }
    assert {n: r["score"] for n, r in got.items()} == {
        "correct": 1.0,
        "wrong": -1.0,
        "unparsable": -1.0,
    }
    assert got["correct"] == {"score": 1.0, "ok": 1.0, "evaluated": 1.0, "status": "ok"}
    assert got["unparsable"]["evaluated"] == 0.0
    assert all(set(r) == {"score", "ok", "evaluated", "status"} for r in got.values())


def test_parquet_rows(scale_add_task, relu_task, tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    path = kverl.write_parquet([scale_add_task, relu_task], tmp_path / "k.parquet", backend="cpu")
    df = pd.read_parquet(path)
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert list(df["data_source"]) == [kverl.DATA_SOURCE] * 2
    prompt = list(df["prompt"][1])
    assert [m["role"] for m in prompt] == ["system", "user"] and "relu" in prompt[1]["content"]
    assert task_from_column(df["reward_model"][1]["ground_truth"]) == relu_task
    assert df["extra_info"][0]["task_id"] == scale_add_task.id
