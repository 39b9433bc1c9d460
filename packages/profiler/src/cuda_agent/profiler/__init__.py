"""cuda_agent.profiler: GPU timing the reward can trust, baselines, speed-of-light, ncu summaries.

The in-process timing API (used by the sandbox inside a candidate's process)::

    from cuda_agent.profiler import TimingConfig, measure, paired, PROTOCOL_VERSION
    stats = measure(model, input_sets, device="cuda")            # TimingStats (ms)
    res = paired({"eager": ref, "cand": new}, input_sets, device="cuda")
    res.speedup("eager", "cand"), res.speedup_ci("eager", "cand"), res.flags

Heavy modules (torch) are imported inside the functions.
"""

from .config import PROTOCOL_VERSION, TimingConfig, quick_config
from .stats import bootstrap_ratio_ci, median_ci, rse_of_median, should_stop, summarize
from .timing import (
    PairedResult,
    l2_size_bytes,
    measure,
    output_fingerprint,
    paired,
    warm_kernel_trace,
)

__all__ = [
    "PROTOCOL_VERSION",
    "PairedResult",
    "TimingConfig",
    "bootstrap_ratio_ci",
    "l2_size_bytes",
    "measure",
    "median_ci",
    "output_fingerprint",
    "paired",
    "quick_config",
    "rse_of_median",
    "should_stop",
    "summarize",
    "warm_kernel_trace",
]


def __getattr__(name: str):
    # baseline helpers live in a module that imports subprocess machinery; load on demand
    if name in ("baseline_for_task", "BaselineCache", "time_program", "make_input_pool"):
        from . import baseline

        return getattr(baseline, name)
    raise AttributeError(name)
