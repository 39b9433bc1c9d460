"""Statistics of timing samples: robust summaries, the adaptive stop rule, paired bootstrap CIs.

Pure numpy; no torch. All times in milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cuda_agent.records import TimingStats

Z95 = 1.959963984540054


def median_ci(samples: Sequence[float], z: float = Z95) -> tuple[float, float]:
    """Distribution-free CI of the median from order statistics (binomial normal approximation).

    Ranks ``n/2 -+ z*sqrt(n)/2`` (clamped); exact enough for n >= 10 and needs no assumption on
    the shape of the distribution (timings are skewed).
    """
    x = np.sort(np.asarray(samples, dtype=float))
    n = len(x)
    if n == 0:
        raise ValueError("no samples")
    if n == 1:
        return float(x[0]), float(x[0])
    half = z * math.sqrt(n) / 2.0
    lo = max(0, int(math.floor(n / 2.0 - half)))
    hi = min(n - 1, int(math.ceil(n / 2.0 + half)) - 1)
    hi = max(hi, lo)
    return float(x[lo]), float(x[hi])


def rse_of_median(samples: Sequence[float]) -> float:
    """Relative standard error of the median: (CI95 width / (2*1.96)) / median; inf if n < 3."""
    n = len(samples)
    if n < 3:
        return math.inf
    med = float(np.median(samples))
    if med <= 0:
        return math.inf
    lo, hi = median_ci(samples)
    return (hi - lo) / (2.0 * Z95) / med


def should_stop(
    samples: Sequence[float],
    *,
    elapsed_s: float,
    min_samples: int,
    max_samples: int,
    target_rse: float,
    time_cap_s: float,
) -> str | None:
    """The adaptive stop rule: the reason to stop now, or ``None`` to take another sample.

    Reasons: ``"converged"`` (n >= min_samples and RSE of the median <= target), ``"max_samples"``,
    ``"time_cap"`` (only once n >= min_samples, or n >= 3 when the cap is exceeded twice over).
    """
    n = len(samples)
    if n >= max_samples:
        return "max_samples"
    if n >= min_samples and rse_of_median(samples) <= target_rse:
        return "converged"
    if elapsed_s >= time_cap_s and (n >= min_samples or (elapsed_s >= 2 * time_cap_s and n >= 3)):
        return "time_cap"
    return None


def summarize(
    samples: Sequence[float], discarded: int = 0, flags: Sequence[str] = ()
) -> TimingStats:
    """``TimingStats`` of the kept samples: median, IQR, min, mean, distribution-free CI95, n."""
    x = np.asarray(samples, dtype=float)
    if len(x) == 0:
        raise ValueError("no samples to summarize")
    q1, q3 = np.percentile(x, [25, 75])
    lo, hi = median_ci(x)
    return TimingStats(
        median_ms=float(np.median(x)),
        n=int(len(x)),
        iqr_ms=float(q3 - q1),
        min_ms=float(x.min()),
        mean_ms=float(x.mean()),
        ci95_low_ms=lo,
        ci95_high_ms=hi,
        discarded=int(discarded),
        flags=list(flags),
    )


def ratio_of_medians(base: Sequence[float], other: Sequence[float]) -> float:
    """median(base) / median(other): the speed-up of ``other`` over ``base``."""
    return float(np.median(base)) / float(np.median(other))


def bootstrap_ratio_ci(
    base: Sequence[float],
    other: Sequence[float],
    *,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    paired: bool = True,
) -> tuple[float, float]:
    """Percentile bootstrap CI of median(base)/median(other).

    ``paired=True`` resamples rounds (index i of both lists was measured in the same round, on
    the same inputs), keeping the pairing; otherwise each side is resampled independently.
    """
    b = np.asarray(base, dtype=float)
    o = np.asarray(other, dtype=float)
    if len(b) == 0 or len(o) == 0:
        raise ValueError("no samples")
    rng = np.random.default_rng(seed)
    if paired:
        if len(b) != len(o):
            raise ValueError(f"paired bootstrap needs equal lengths, got {len(b)} and {len(o)}")
        idx = rng.integers(0, len(b), size=(n_boot, len(b)))
        rb, ro = b[idx], o[idx]
    else:
        rb = b[rng.integers(0, len(b), size=(n_boot, len(b)))]
        ro = o[rng.integers(0, len(o), size=(n_boot, len(o)))]
    ratios = np.median(rb, axis=1) / np.median(ro, axis=1)
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(ratios, [a, 1.0 - a])
    return float(lo), float(hi)


def spread(values: Sequence[float]) -> float:
    """(max - min) / median of a few medians (e.g. the same program in 5 processes)."""
    v = np.asarray(values, dtype=float)
    return float((v.max() - v.min()) / np.median(v))
