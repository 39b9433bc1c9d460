"""CUDA path of the timing protocol (skipped without a GPU)."""

from pathlib import Path

import pytest

from cuda_agent.profiler import TimingConfig, l2_size_bytes, measure, paired
from cuda_agent.profiler.baseline import time_program

pytestmark = pytest.mark.gpu

CFG = TimingConfig(time_cap_s=0.5, warmup_ms=50.0, warmup_max_s=2.0, trace_check=True)
EXPL = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "KernelBench" / "exploits"


def _mm_sets(n=2048, k=2):
    import torch

    return [[torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")] for _ in range(k)]


def test_l2_size_is_reported():
    assert l2_size_bytes("cuda") >= 1 << 20


def test_measure_matmul_is_consistent():
    import torch

    s = measure(torch.matmul, _mm_sets(), device="cuda", config=CFG)
    assert s.n >= 10
    assert s.ci95_low_ms <= s.median_ms <= s.ci95_high_ms
    assert s.min_ms <= s.median_ms
    assert "async_work" not in s.flags and "stale_output" not in s.flags
    # 2 * 2048^3 flops cannot take less than 1 us on any GPU made so far
    assert 0.001 < s.median_ms < 50


def test_paired_identical_programs_speedup_near_one():
    import torch

    res = paired({"a": torch.matmul, "b": torch.matmul}, _mm_sets(), device="cuda", config=CFG)
    lo, hi = res.speedup_ci("a", "b")
    assert 0.9 < res.speedup("a", "b") < 1.1
    assert lo <= 1.02 and hi >= 0.98


def test_short_program_uses_cuda_graphs():
    import torch

    sets = [[torch.randn(1024, device="cuda")] for _ in range(2)]
    forced = paired(
        {"relu": torch.relu, "neg": torch.neg},
        sets,
        device="cuda",
        config=CFG.with_(cuda_graph="on"),
    )
    assert forced.cuda_graph and "cuda_graph" in forced.flags
    assert "cuda_graph_failed" not in forced.flags
    eager = paired({"relu": torch.relu}, sets, device="cuda", config=CFG.with_(cuda_graph="off"))
    assert not eager.cuda_graph
    # replaying a graph removes the Python launch path: never slower than eager by much
    assert forced.stats["relu"].median_ms < eager.stats["relu"].median_ms * 1.5


def _exploit(name: str):
    ref = (EXPL / "ref_matmul.py").read_text()
    return time_program(ref, device="cuda", new_source=(EXPL / name).read_text(), config=CFG)


def test_side_stream_is_timed_at_true_cost_and_flagged():
    res = _exploit("side_stream.py")
    assert "async_work" in res.stats["new"].flags
    assert res.speedup("eager", "new") < 1.3


def test_background_thread_is_timed_at_true_cost_and_flagged():
    res = _exploit("background_thread.py")
    assert "background_thread" in res.stats["new"].flags
    assert res.speedup("eager", "new") < 1.3


def test_pointer_cache_is_flagged():
    res = _exploit("ptr_cache.py")
    assert "stale_output" in res.stats["new"].flags


def test_long_lived_worker_thread_is_flagged():
    res = _exploit("pool_thread.py")
    assert {"deferred_work", "async_work"} & set(res.stats["new"].flags)


def test_stats_say_which_gpu_and_clocks():
    """Each side's stats carry the physical GPU and the median SM and memory clocks of its
    samples, so that two runs on two GPUs of one name can be told apart."""
    res = _exploit("honest.py")
    for st in res.stats.values():
        assert st.gpu_uuid and st.gpu_uuid.startswith("GPU-")
        assert st.sm_clock_mhz and st.sm_clock_mhz > 100
        assert st.mem_clock_mhz and st.mem_clock_mhz > 100


def test_honest_solution_is_not_flagged():
    res = _exploit("honest.py")
    bad = {"async_work", "background_thread", "stale_output", "trace_mismatch", "deferred_work"}
    assert not bad & set(res.stats["new"].flags)
    assert 0.9 < res.speedup("eager", "new") < 1.1


def test_ceilings_quick():
    from cuda_agent.profiler.sol import measure_ceilings

    c = measure_ceilings("cuda", quick=True)
    assert c.copy_gbps > 50 and c.write_gbps > 50 and c.l2_bytes == l2_size_bytes("cuda")
    assert c.matmul_tflops["bf16"] > c.matmul_tflops["fp32"] > 0.1


def test_the_output_floor_holds_for_real_writes():
    """The fastest correct producer of an output only writes it (a fill): timed under the
    protocol it must never be under the floor, at output sizes around the L2 size and far past
    it, nor must a row scaling (KernelBench L1/12) or a broadcast output."""
    import torch

    from cuda_agent.profiler.sol import Work, measure_ceilings, output_floor_ms, storage_bytes

    c = measure_ceilings("cuda", quick=True)
    cfg = TimingConfig(time_cap_s=0.5, warmup_ms=50.0, warmup_max_s=2.0, fresh_values=False)

    def floor(out_bytes: int, storage: int | None = None) -> float:
        w = Work(
            flops=0.0,
            bytes=out_bytes,
            input_bytes=0,
            param_bytes=0,
            output_bytes=out_bytes,
            dtype_class="fp32",
            counted_on="cuda",
        )
        return output_floor_ms(w, c, output_storage_bytes=storage)

    l2 = c.l2_bytes
    for nbytes in (l2 // 2, l2, l2 + (16 << 20), 2 * l2, 8 * l2, 1 << 30):
        out = torch.empty(nbytes // 4, device="cuda")
        st = measure(lambda o: o.fill_(1.0), [[out]], device="cuda", config=cfg)
        assert st.median_ms >= floor(nbytes), (nbytes, st.median_ms, floor(nbytes))
        del out
    a, b = torch.rand(4096, device="cuda"), torch.rand(4096, 4096, device="cuda")
    st = measure(lambda x, y: x.unsqueeze(1) * y, [[a, b]], device="cuda", config=cfg)
    assert st.median_ms >= floor(b.numel() * 4)
    # a broadcast output: its storage is what is written (the whole view once copied to the CPU)
    view = (a.unsqueeze(1) + 1).expand(-1, 1 << 16)
    assert storage_bytes(view) == 4096 * 4 and floor(view.numel() * 4, storage_bytes(view)) == 0
    assert storage_bytes(view.to("cpu")) == view.numel() * 4  # what a judge reading files sees


def test_a_call_times_the_same_whatever_its_place_in_the_round():
    """ca-timing-1 left the per-round input refresh queued on the device ahead of the round's
    first call only: a program with host-side work before its kernel (torch.compile's wrappers)
    timed fast when first and slow otherwise (the fused task's compile baseline: minimum 0.187 ms,
    median 0.24-0.37 ms, IQR up to 0.31 ms). Every call now starts from an idle device."""
    import time

    import torch

    # a 512 MB input: refreshing it (noise, scale, multiply: ~4 GB of traffic) takes > 1 ms,
    # longer than the host work below, which it hid when left queued ahead of the first call
    sets = [[torch.randn(128 << 20, device="cuda")] for _ in range(2)]

    def kernel(x):
        return x[:4096].sum()

    def host_then_kernel(x):
        t = time.perf_counter()
        while time.perf_counter() - t < 5e-4:  # 0.5 ms on the host before the launch
            pass
        return x[:4096].sum()

    res = paired(
        {"kernel": kernel, "host_then_kernel": host_then_kernel},
        sets,
        device="cuda",
        config=CFG.with_(cuda_graph="off", trace_check=False),
    )
    s = res.stats["host_then_kernel"]
    # its host time is inside every sample (less the flush's lead, tens of microseconds), and the
    # samples do not split by position: before the fix about half were near the kernel alone
    assert s.median_ms > 0.35, s
    assert s.iqr_ms < 0.1, s
    assert "refresh_unsynced" not in res.flags
    # ca-timing-1's rounds (kept for this A/B): the first call of a round has its host work
    # hidden behind the queued refresh, the second not: two modes, half a millisecond apart
    old = paired(
        {"kernel": kernel, "host_then_kernel": host_then_kernel},
        sets,
        device="cuda",
        config=CFG.with_(cuda_graph="off", trace_check=False, sync_after_refresh=False),
    )
    o = old.stats["host_then_kernel"]
    assert "refresh_unsynced" in old.flags
    assert o.iqr_ms > 0.2 and o.min_ms < 0.1, o


_STREAM_KERNELS = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void softsign_kernel(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] / (1.0f + fabsf(x[i]));
}

// as most model-written kernels launch: legacy default stream, no error check
torch::Tensor softsign_default_stream(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    softsign_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}

torch::Tensor softsign_current_stream(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    auto s = at::cuda::getCurrentCUDAStream();
    softsign_kernel<<<(n + 255) / 256, 256, 0, s>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""


@pytest.fixture(scope="module")
def softsign_ext():
    from torch.utils.cpp_extension import load_inline

    return load_inline(
        name="profiler_test_softsign_streams",
        cpp_sources="torch::Tensor softsign_default_stream(torch::Tensor x);\n"
        "torch::Tensor softsign_current_stream(torch::Tensor x);",
        cuda_sources=_STREAM_KERNELS,
        functions=["softsign_default_stream", "softsign_current_stream"],
    )


def test_a_default_stream_kernel_is_not_graph_timed_and_reads_its_true_time(softsign_ext):
    import torch

    sets = [[torch.randn(4096, device="cuda")] for _ in range(2)]
    cfg = CFG.with_(cuda_graph="on")
    dflt = measure(softsign_ext.softsign_default_stream, sets, device="cuda", config=cfg)
    # its launches run outside a capture: the replay would do nothing (and read ~1 us, with
    # an output that never changes: the cache hack's signature)
    assert "cuda_graph_inert" in dflt.flags and "cuda_graph" not in dflt.flags
    assert "stale_output" not in dflt.flags
    eager = measure(
        softsign_ext.softsign_default_stream,
        sets,
        device="cuda",
        config=CFG.with_(cuda_graph="off"),
    )
    assert 0.5 < dflt.median_ms / eager.median_ms < 2.0
    cur = measure(softsign_ext.softsign_current_stream, sets, device="cuda", config=cfg)
    assert "cuda_graph" in cur.flags and "cuda_graph_inert" not in cur.flags


def test_paired_falls_back_to_eager_for_every_side_when_one_graph_is_inert(softsign_ext):
    import torch

    sets = [[torch.randn(4096, device="cuda")] for _ in range(2)]
    res = paired(
        {"ref": torch.nn.functional.softsign, "cand": softsign_ext.softsign_default_stream},
        sets,
        device="cuda",
        config=CFG.with_(cuda_graph="on"),
    )
    assert not res.cuda_graph and "cuda_graph_inert" in res.flags
