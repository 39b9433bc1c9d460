"""Every metric against hand-computed numbers."""

import math

import pytest

from cuda_agent.kernelbench_eval.metrics import (
    ProblemOutcome,
    compute_metrics,
    level_metrics,
    outcomes,
)
from cuda_agent.records import EvalResult, Status, Task


def P(level, pid, status="ok", se=None, sc=None, reward=None):
    return ProblemOutcome(level, pid, f"p{pid}", status, se, sc, reward)


LEVEL1 = [
    P(1, 1, se=2.0, sc=1.5, reward=3),
    P(1, 2, se=1.02, sc=0.5, reward=1),  # faster than eager but not by 5%
    P(1, 3, status="incorrect", reward=-1),
    P(1, 4, status="missing"),  # no result at all: reward counts -1
]
LEVEL2 = [P(2, 1, se=4.0, sc=2.0, reward=3), P(2, 2, se=0.5, sc=0.25, reward=1)]


def test_level_metrics_by_hand():
    m = level_metrics("1", LEVEL1)
    assert m.problems == 4 and m.correct == 2
    assert m.pass_rate == 0.5
    assert m.faster_than_eager == 0.5  # 2.0 and 1.02
    assert m.faster_than_eager_5pct == 0.25  # only 2.0
    assert m.faster_than_compile == 0.25  # 1.5
    assert m.faster_than_compile_5pct == 0.25
    # failures count as 1.0x: (2.0 * 1.02 * 1 * 1) ** (1/4)
    assert math.isclose(m.geomean_speedup_vs_eager_all, (2.0 * 1.02) ** 0.25)
    assert math.isclose(m.geomean_speedup_vs_compile_all, (1.5 * 0.5) ** 0.25)
    # over correct problems only
    assert math.isclose(m.geomean_speedup_vs_eager_correct, math.sqrt(2.0 * 1.02))
    assert math.isclose(m.geomean_speedup_vs_compile_correct, math.sqrt(0.75))
    assert m.mean_reward == (3 + 1 - 1 - 1) / 4


def test_overall_weights_levels_by_problem_count():
    rows = compute_metrics(LEVEL1 + LEVEL2)
    assert [r.level for r in rows] == ["1", "2", "overall"]
    overall = rows[-1]
    assert overall.problems == 6
    # pooled: 4 correct of 6 (not the mean of 0.5 and 1.0)
    assert math.isclose(overall.pass_rate, 4 / 6)
    assert math.isclose(overall.faster_than_eager, 3 / 6)  # 2.0, 1.02, 4.0
    assert math.isclose(
        overall.geomean_speedup_vs_eager_all, (2.0 * 1.02 * 1 * 1 * 4.0 * 0.5) ** (1 / 6)
    )
    assert math.isclose(overall.mean_reward, (3 + 1 - 1 - 1 + 3 + 1) / 6)


def test_correct_without_baseline_counts_one_and_is_excluded_from_correct_geomean():
    m = level_metrics("1", [P(1, 1, se=None, sc=None, reward=1), P(1, 2, se=4.0, sc=4.0, reward=3)])
    assert math.isclose(m.geomean_speedup_vs_eager_all, 2.0)
    assert math.isclose(m.geomean_speedup_vs_eager_correct, 4.0)


def test_no_correct_problem():
    m = level_metrics("3", [P(3, 1, status="timeout", reward=-1)])
    assert m.pass_rate == 0 and m.geomean_speedup_vs_eager_all == 1.0
    assert m.geomean_speedup_vs_eager_correct is None


def test_empty_level_is_an_error():
    with pytest.raises(ValueError):
        level_metrics("1", [])


def _task(level, pid):
    return Task.make(
        f"p{pid}", f"# L{level} P{pid}\n", source="kernelbench", level=level, problem_id=pid
    )


def _res(t, sol, status=Status.OK, se=None, sc=None, reward=None):
    return EvalResult(
        task_id=t.id,
        solution_id=sol,
        backend="cpu",
        device="cpu",
        status=status,
        speedup_vs_eager=se,
        speedup_vs_compile=sc,
        reward=reward,
    )


def test_outcomes_best_sample_missing_and_scoring():
    a, b, c = _task(1, 1), _task(1, 2), _task(2, 1)
    results = [
        _res(a, "s0", Status.INCORRECT),
        _res(a, "s1", se=1.5, sc=1.2),  # unscored: scored with the paper scheme -> 3
        _res(a, "s2", se=1.2, sc=1.01),  # -> 2, worse than s1
        _res(b, "s0", Status.COMPILE_ERROR),
        _res(Task.make("x", "other"), "s0", se=9.0),  # not one of the tasks: ignored
    ]
    outs = outcomes([a, b, c], results)
    assert [(o.level, o.problem_id, o.status) for o in outs] == [
        (1, 1, "ok"),
        (1, 2, "compile_error"),
        (2, 1, "missing"),
    ]
    assert outs[0].speedup_vs_eager == 1.5 and outs[0].reward == 3.0
    assert outs[1].reward == -1.0 and outs[2].reward is None
