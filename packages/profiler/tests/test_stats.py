"""Statistics of the timing protocol: CIs, RSE, the adaptive stop rule, paired bootstrap."""

import math

import numpy as np
import pytest

from cuda_agent.profiler.stats import (
    bootstrap_ratio_ci,
    median_ci,
    ratio_of_medians,
    rse_of_median,
    should_stop,
    spread,
    summarize,
)


def test_median_ci_covers_true_median_about_95_percent():
    rng = np.random.default_rng(1)
    true_median = math.log(2)  # of Exp(1): skewed like timings
    hits = 0
    reps = 600
    for _ in range(reps):
        lo, hi = median_ci(rng.exponential(size=40))
        hits += lo <= true_median <= hi
    assert 0.91 <= hits / reps <= 0.99


def test_median_ci_brackets_the_sample_median():
    x = [5.0, 1.0, 3.0, 2.0, 4.0, 9.0, 7.0, 6.0, 8.0, 10.0, 11.0]
    lo, hi = median_ci(x)
    assert lo <= float(np.median(x)) <= hi
    assert median_ci([3.0]) == (3.0, 3.0)
    with pytest.raises(ValueError):
        median_ci([])


def test_rse_shrinks_with_more_samples():
    rng = np.random.default_rng(2)
    small = rng.normal(1.0, 0.02, size=20)
    large = rng.normal(1.0, 0.02, size=2000)
    assert rse_of_median(large) < rse_of_median(small) / 5
    assert rse_of_median([1.0, 1.0]) == math.inf
    assert rse_of_median([1.0, 1.0, 1.0]) == 0.0


def _stop(x, elapsed=0.0, **kw):
    args = dict(min_samples=10, max_samples=100, target_rse=0.005, time_cap_s=1.0)
    args.update(kw)
    return should_stop(x, elapsed_s=elapsed, **args)


def test_stop_rule_converges_only_after_min_samples():
    quiet = [1.0 + 1e-5 * i for i in range(9)]
    assert _stop(quiet) is None  # 9 < min_samples, however quiet
    assert _stop(quiet + [1.0]) == "converged"


def test_stop_rule_keeps_sampling_noisy_programs():
    rng = np.random.default_rng(3)
    noisy = list(rng.normal(1.0, 0.2, size=50))
    assert rse_of_median(noisy) > 0.005
    assert _stop(noisy) is None
    assert _stop(noisy, elapsed=1.5) == "time_cap"
    assert _stop(noisy + [1.0] * 50) == "max_samples"


def test_stop_rule_time_cap_needs_samples_unless_far_over():
    few = [1.0, 2.0, 3.0, 4.0]
    assert _stop(few, elapsed=1.5) is None  # over the cap but under min_samples
    assert _stop(few, elapsed=2.5) == "time_cap"  # twice over with >= 3 samples
    assert _stop([1.0, 2.0], elapsed=5.0) is None


def test_summarize_matches_numpy():
    x = [3.0, 1.0, 2.0, 10.0, 4.0, 5.0]
    s = summarize(x, discarded=2, flags=["time_cap"])
    assert s.median_ms == pytest.approx(np.median(x))
    q1, q3 = np.percentile(x, [25, 75])
    assert s.iqr_ms == pytest.approx(q3 - q1)
    assert s.min_ms == 1.0 and s.n == 6 and s.discarded == 2 and s.flags == ["time_cap"]
    assert s.ci95_low_ms <= s.median_ms <= s.ci95_high_ms
    with pytest.raises(ValueError):
        summarize([])


def test_paired_bootstrap_ci_contains_true_ratio_and_beats_unpaired():
    rng = np.random.default_rng(4)
    drift = rng.normal(0.0, 0.2, size=200)  # shared round-to-round noise (clocks, neighbours)
    base = 2.0 * (1.0 + drift) + rng.normal(0, 0.01, 200)
    other = 1.0 * (1.0 + drift) + rng.normal(0, 0.005, 200)
    assert ratio_of_medians(base, other) == pytest.approx(2.0, rel=0.05)
    lo, hi = bootstrap_ratio_ci(base, other, n_boot=1000, seed=0)
    assert lo <= 2.0 <= hi
    ulo, uhi = bootstrap_ratio_ci(base, other, n_boot=1000, seed=0, paired=False)
    assert (hi - lo) < (uhi - ulo)
    with pytest.raises(ValueError):
        bootstrap_ratio_ci([1.0, 2.0], [1.0], paired=True)


def test_spread():
    assert spread([1.0, 1.01, 0.99]) == pytest.approx(0.02)
