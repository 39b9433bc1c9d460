"""The paired A/B loop of this directory's ``*_ab.py`` scripts (imported from the script's own
directory, which Python puts on ``sys.path``)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable


def paired_medians(
    fns: dict[str, Callable[[], object]],
    rounds: int,
    digits: int = 3,
    after_each: Callable[[], object] | None = None,
) -> dict[str, float]:
    """Run every function of ``fns`` once per round, their order reversed every other round (so
    neither side always runs first), and return each one's median wall seconds. A function
    checks its own result (an ``assert``): a wrong answer stops the benchmark. What it returns is
    released, and ``after_each`` (clean-up) runs, after every call, outside the timing."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    items = list(fns.items())
    for i in range(rounds):
        for name, fn in items[:: 1 if i % 2 == 0 else -1]:
            t = time.perf_counter()
            kept = fn()  # what it returns is freed after the timing
            times[name].append(time.perf_counter() - t)
            del kept
            if after_each is not None:
                after_each()
    return {k: round(statistics.median(v), digits) for k, v in times.items()}


def print_ab(med: dict[str, float], **facts: object) -> None:
    """One JSON line: ``facts``, the medians (``median_s``) and the ``after/before`` ratio."""
    ratio = round(med["after"] / med["before"], 3)
    print(json.dumps({**facts, "median_s": med, "after/before": ratio}))
