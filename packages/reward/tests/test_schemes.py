import math

import msgspec
import pytest

from cuda_agent.records import GuardViolation, Status, TimingDetail
from cuda_agent.records.examples import result, trajectory
from cuda_agent.reward import RewardConfig, apply, beats, score


def res(eager=None, compile=None, status=Status.OK, ci_e=None, ci_c=None, guards=()):
    r = result(0, status)
    timing = TimingDetail(
        protocol_version="t", speedup_vs_eager_ci=ci_e, speedup_vs_compile_ci=ci_c
    )
    return msgspec.structs.replace(
        r, speedup_vs_eager=eager, speedup_vs_compile=compile, timing=timing, guards=list(guards)
    )


def times(t, t_eager, t_compile=None):
    """Speed-ups from times, as the sandbox computes them."""
    return t_eager / t, (None if t_compile is None else t_compile / t)


# (t, t_eager, t_compile, expected reward)
PAPER_TABLE = [
    (0.5, 1.0, 1.0, 3.0),  # 2x faster than both
    (0.5, 1.0, 0.4, 2.0),  # beats eager only
    (0.99, 1.0, 1.0, 1.0),  # 1% faster: not enough
    (1.5, 1.0, 1.0, 1.0),  # slower but correct
    (0.95, 1.0, 1.0, 1.0),  # exactly 5% faster: the boundary does not count
    (0.9499, 1.0, 1.0, 3.0),  # just past the boundary
    (0.95, 1.0, 0.5, 1.0),
    (0.4, 1.0, None, 2.0),  # missing compile baseline caps at 2
    (0.76, 0.8, 0.8, 1.0),  # 0.76 = exactly 5% below 0.8
    (3.8, 4.0, 4.0, 1.0),
]


@pytest.mark.parametrize("t,te,tc,expected", PAPER_TABLE)
def test_paper_schedule(t, te, tc, expected):
    se, sc = times(t, te, tc)
    r = score(res(se, sc), RewardConfig(use_ci=False))
    assert r.value == expected, r.reason


@pytest.mark.parametrize(
    "status",
    [s for s in Status if s is not Status.OK],
)
def test_every_failure_status_is_minus_one(status):
    r = score(res(10.0, 10.0, status=status))
    assert r.value == -1.0 and str(status) in r.reason


def test_guard_rejection_names_codes():
    g = [
        GuardViolation(code="G-STREAM", severity="reject", message="side stream"),
        GuardViolation(code="G-SHAPE", severity="flag", message="x"),
    ]
    r = score(res(10.0, 10.0, status=Status.GUARD_VIOLATION, guards=g))
    assert r.value == -1.0 and "G-STREAM" in r.reason and "G-SHAPE" not in r.reason


def test_no_eager_baseline_is_one():
    assert score(res(None, None)).value == 1.0
    assert "no eager baseline" in score(res(None, None)).reason


def test_ci_lower_bound_is_conservative():
    # median says 2x, CI low bound only 1.03x: not > 5% with confidence
    r = res(2.0, 2.0, ci_e=(1.03, 2.5), ci_c=(1.5, 2.5))
    assert score(r).value == 1.0
    assert score(r, RewardConfig(use_ci=False)).value == 3.0
    # CI never raises a reward above what the median gives
    r = res(1.01, 1.01, ci_e=(1.2, 1.3), ci_c=(1.2, 1.3))
    assert score(r).value == 1.0


def test_threshold_configurable():
    r = res(1.08, 1.08)
    assert score(r, RewardConfig(use_ci=False)).value == 3.0
    assert score(r, RewardConfig(use_ci=False, threshold=0.10)).value == 1.0


def test_beats_edge_values():
    assert not beats(None, 0.05)
    assert not beats(float("nan"), 0.05)
    assert not beats(0.0, 0.05)
    assert beats(float("inf"), 0.05) is False  # an infinite speed-up is a measurement bug
    assert beats(1.0 / 0.94, 0.05)
    assert not beats(1.0 / 0.95, 0.05)


def test_speedup_and_log_schemes():
    r = res(4.0, 2.0)
    assert score(r, RewardConfig(scheme="speedup", use_ci=False)).value == 2.0
    assert score(r, RewardConfig(scheme="speedup", use_ci=False, clip=1.5)).value == 1.5
    assert math.isclose(score(r, RewardConfig(scheme="log-speedup", use_ci=False)).value, 2.0)
    # falls back to eager when compile is missing
    assert score(res(4.0, None), RewardConfig(scheme="speedup", use_ci=False)).value == 4.0
    # a very slow correct kernel still beats a failure
    assert score(res(0.01, 0.01), RewardConfig(scheme="log-speedup")).value == 0.0
    assert score(res(1, 1, status=Status.INCORRECT), RewardConfig(scheme="speedup")).value == -1


def test_unknown_scheme():
    with pytest.raises(ValueError, match="unknown reward scheme"):
        score(res(1, 1), RewardConfig(scheme="nope"))


def test_apply_fills_result_and_trajectory():
    out = apply(res(2.0, 2.0), RewardConfig(use_ci=False))
    assert out.reward == 3.0 and out.reward_reason
    t = trajectory(0)
    t = msgspec.structs.replace(t, eval_result=res(2.0, 1.0))
    out = apply(t, RewardConfig(use_ci=False))
    assert out.reward == 2.0 and out.eval_result.reward == 2.0
    t = msgspec.structs.replace(t, eval_result=None)
    out = apply(t)
    assert out.reward == -1.0 and out.reward_reason == "no solution evaluated"


def test_an_infra_error_says_the_sandbox_failed():
    r = score(result(0, Status.INFRA_ERROR))
    assert r.value == -1.0 and r.reason.startswith("infra_error: the sandbox failed")
