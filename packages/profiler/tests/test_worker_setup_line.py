"""The worker's optional ``setup`` line (``report_setup``): the reference's one forward, its bytes
and the compile's seconds, printed after the set-up; absent without the key (real processes)."""

from cuda_agent.profiler import quick_config
from cuda_agent.profiler.baseline import (
    BaselineCache,
    baseline_for_task,
    cached_baseline,
    run_worker,
)

CFG = quick_config(time_cap_s=0.2, warmup_ms=5.0)
NBYTES = 96 * 96 * 4  # tiny_src: one 96x96 fp32 input, a 96x96 fp32 output

RAISES = (
    "import torch\nimport torch.nn as nn\n"
    "class Model(nn.Module):\n    def forward(self, x):\n        raise ValueError('broken ref')\n"
    "def get_inputs():\n    return [torch.ones(4)]\n"
    "def get_init_inputs():\n    return []\n"
)


def _request(src: str, **kw):
    return {
        "op": "baseline",
        "ref_code": src,
        "device": "cpu",
        "compile_mode": None,
        "config": CFG.to_dict(),
        "seed": 0,
        **kw,
    }


def test_report_setup_prints_the_setup_line_before_the_timing(tiny_src):
    lines, err, tail = run_worker(_request(tiny_src, report_setup=True), timeout_s=120)
    assert err is None, tail
    stages = [d["stage"] for d in lines]
    assert stages == ["info", "setup", "eager"], lines
    setup = lines[1]
    assert setup["input_bytes"] == setup["output_bytes"] == NBYTES
    assert setup["ref_s"] > 0
    assert setup["peak_bytes"] is None  # cpu: no device memory statistics
    assert setup["compile_s"] is None  # no compile mode


def test_without_the_key_the_worker_prints_no_setup_line(tiny_src):
    lines, err, tail = run_worker(_request(tiny_src), timeout_s=120)
    assert err is None, tail
    assert [d["stage"] for d in lines] == ["info", "eager"], lines


def test_a_reference_raising_in_its_forward_prints_an_error_and_no_setup_line():
    lines, err, _ = run_worker(_request(RAISES, report_setup=True), timeout_s=120)
    assert err is not None  # the worker exits with 1
    stages = [d["stage"] for d in lines]
    assert "setup" not in stages and stages[0] == "info" and stages[-1] == "error"
    assert "broken ref" in lines[-1]["message"]


def test_baseline_for_task_hands_the_lines_over_and_caches_as_usual(tiny_src, tmp_path):
    cache = BaselineCache(tmp_path)
    seen = []
    b = baseline_for_task(
        tiny_src,
        device="cpu",
        compile_mode=None,
        timeout_s=120,
        config=CFG,
        cache=cache,
        report_setup=True,
        on_line=seen.append,
    )
    assert b.error is None, b.error
    assert [d["stage"] for d in seen] == ["info", "setup", "eager"]
    # the same entry (same key, same record) the sandbox's lookup finds
    assert cached_baseline(tiny_src, device="cpu", compile_mode=None, cache=cache) == b
    again = []
    assert (
        baseline_for_task(
            tiny_src, device="cpu", compile_mode=None, cache=cache, on_line=again.append
        )
        == b
    )
    assert again == []  # a cache hit: no worker ran, no lines
