"""Speed-of-light counts on the fixtures, and ncu CSV summaries (real ncu output from an H200)."""

import re
from pathlib import Path

import msgspec
import pytest

from cuda_agent.profiler.ncu import parse_ncu_csv, summary_text
from cuda_agent.profiler.program import check_contract
from cuda_agent.profiler.sol import Ceilings, count_work, datasheet_for, estimate

DATA = Path(__file__).parent / "data"
CEIL = Ceilings(
    device="test",
    torch_version="",
    protocol_version="",
    copy_gbps=4000.0,
    matmul_tflops={"fp32": 50.0, "tf32": 400.0, "bf16": 750.0, "fp16": 750.0},
)


def test_fixtures_follow_the_kernelbench_contract(fixtures_dir):
    files = sorted(fixtures_dir.glob("level*/*.py"))
    assert len(files) >= 20
    for p in files:
        src = p.read_text()
        assert re.match(r"\d+_\w+\.py$", p.name)
        assert check_contract(src) == [], p
        assert re.search(r"(?m)^\w+ = \d+$", src), f"{p} has no module-level size constant"


def test_count_work_on_meta(fixtures_dir):
    mm = count_work((fixtures_dir / "level1/13_Square_matmul.py").read_text())
    assert mm.flops == 2 * 8192**3 and mm.counted_on == "meta"
    assert mm.bytes == 3 * 8192 * 8192 * 4 and mm.dtype_class == "fp32"
    relu = count_work((fixtures_dir / "level1/1_ReLU.py").read_text())
    assert relu.flops == 0 and relu.bytes == 2 * 16384 * 32768 * 4
    bf = count_work((fixtures_dir / "level1/17_Matmul_bf16.py").read_text())
    assert bf.dtype_class == "bf16"
    ln = count_work((fixtures_dir / "level1/10_LayerNorm.py").read_text())
    assert ln.param_bytes == 2 * 16384 * 4


def test_estimate_bounds_and_fraction(fixtures_dir):
    mm = estimate(count_work((fixtures_dir / "level1/13_Square_matmul.py").read_text()), CEIL)
    assert mm.bound_by == "compute" and mm.rate_tflops == 400.0  # fp32 programs may use tf32
    assert mm.bound_ms == pytest.approx(2 * 8192**3 / 400e12 * 1e3)
    relu = estimate(count_work((fixtures_dir / "level1/1_ReLU.py").read_text()), CEIL)
    assert relu.bound_by == "memory"
    assert relu.fraction(relu.bound_ms * 2) == pytest.approx(0.5)
    # impossible() is against the floor (the 2 GiB output written), not the roofline (which
    # also counts the input read): half the floor is impossible, just above it is not
    assert 0 < relu.floor_ms < relu.bound_ms
    assert relu.impossible(relu.floor_ms * 0.5) and not relu.impossible(relu.floor_ms * 1.01)
    assert not relu.impossible(relu.bound_ms * 0.5)  # 0.5x the roofline is above the floor
    assert datasheet_for("NVIDIA H200")["copy_gbps"] == 4800.0
    assert datasheet_for("Some GPU") is None


def test_check_time_flags_impossible(fixtures_dir):
    from cuda_agent.profiler.sol import check_time

    src = (fixtures_dir / "level1/1_ReLU.py").read_text()
    e, flags = check_time(src, 0.1, CEIL)  # 4.3 GB in 0.1 ms would be 43 TB/s
    assert flags == ["below_speed_of_light"]
    assert check_time(src, e.bound_ms * 1.2, CEIL)[1] == []


def test_parse_real_ncu_csv_gemm():
    rep = parse_ncu_csv((DATA / "ncu_gemm_raw.csv").read_text(), program="gemm")
    assert len(rep.kernels) == 1
    k = rep.kernels[0]
    assert "gemm" in k.name
    assert k.duration_us == pytest.approx(21435.04, rel=1e-3)
    assert k.registers == 254 and k.block_size == 256 and k.grid_size == 2048
    assert k.smem_per_block_bytes == 67584
    assert 0 < k.occupancy_pct <= 100 and 0 < k.sm_pct <= 100 and 0 <= k.dram_pct <= 100
    assert k.stalls and all(n not in ("selected", "not_selected") for n, _ in k.stalls)
    text = summary_text(rep)
    assert "regs 254" in text and "stalls" in text


def test_parse_real_ncu_csv_elementwise():
    rep = parse_ncu_csv((DATA / "ncu_relu_raw.csv").read_text(), program="relu")
    k = rep.kernels[0]
    assert "elementwise" in k.name and k.dram_pct > 50  # memory bound
    assert k.stalls[0][0] == "long_scoreboard"


def test_parse_rejects_non_csv():
    with pytest.raises(ValueError):
        parse_ncu_csv("==ERROR== something went wrong\n")


def _kb_ref(forward: str, inputs: str, sizes: str) -> str:
    return f"""import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, A, B):
        return {forward}

{sizes}

def get_inputs():
    return {inputs}

def get_init_inputs():
    return []
"""


def test_the_output_floor_counts_only_the_output_written():
    from cuda_agent.profiler.sol import WRITE_ABSORB_BYTES, output_floor_ms

    # KernelBench v0's level 1 problem 12: diag(A) @ B, at a size whose output is past any L2
    src = _kb_ref("torch.diag(A) @ B", "[torch.rand(N), torch.rand(N, M)]", "N = 16384\nM = 16384")
    w = count_work(src)
    floor = output_floor_ms(w, CEIL)
    out = 16384 * 16384 * 4
    assert w.output_bytes == out
    assert floor == pytest.approx((out - WRITE_ABSORB_BYTES) / 4000e9 * 1e3)
    # the honest row scaling reads B once and writes the output: it must stay above the floor
    honest_ms = 2 * out / 4000e9 * 1e3
    assert floor < 0.8 * honest_ms
    # the roofline from the reference's matmul FLOPs is ~40x the honest time: never a floor
    assert estimate(w, CEIL).bound_ms > 20 * honest_ms


def test_a_matmul_floor_ignores_its_flops_and_its_inputs():
    from cuda_agent.profiler.sol import output_floor_ms

    src = _kb_ref(
        "torch.matmul(A, B)", "[torch.rand(M, K), torch.rand(K, N)]", "M = 256\nN = 256\nK = 131072"
    )
    w = count_work(src)
    assert w.flops > 1e10 and w.input_bytes > 200 << 20
    assert output_floor_ms(w, CEIL) == 0.0  # a 256 KB output: a cache absorbs it


def test_a_broadcast_output_lowers_the_floor():
    from cuda_agent.profiler.sol import output_floor_ms

    src = _kb_ref("A + B", "[torch.rand(N, M), torch.rand(N, M)]", "N = 16384\nM = 16384")
    w = count_work(src)
    dense = output_floor_ms(w, CEIL)
    assert dense > 0.1
    assert output_floor_ms(w, CEIL, output_storage_bytes=4 * 16384) == 0.0
    assert output_floor_ms(w, CEIL, output_storage_bytes=10 * w.output_bytes) == dense


# KernelBench (MIT, data/LICENSE-KernelBench): level 1 problem 12, verbatim
KB12 = (DATA / "kernelbench_level1_12_Matmul_with_diagonal_matrices_.py.txt").read_text()
# the same problem as KernelBench v0 states it, the form whose honest row scaling was rejected
KB12_V0 = KB12.replace("return A.unsqueeze(1) * B", "return torch.diag(A) @ B")
H200ISH = Ceilings(
    device="test",
    torch_version="",
    protocol_version="",
    copy_gbps=4000.0,
    read_gbps=4400.0,
    write_gbps=4200.0,
    l2_bytes=50 << 20,
    matmul_tflops={"fp32": 50.0, "tf32": 400.0, "bf16": 750.0, "fp16": 750.0},
)


def test_kernelbench_diag_floor_counts_only_the_output_beyond_l2():
    from cuda_agent.profiler.sol import output_floor_ms

    assert KB12_V0 != KB12
    out = 4096 * 4096 * 4
    for src in (KB12, KB12_V0):
        w = count_work(src)
        assert w.output_bytes == out
        floor = output_floor_ms(w, H200ISH)
        # only the output bytes an L2 cannot hold, at the best bandwidth (the read ceiling here)
        assert floor == pytest.approx((out - (50 << 20)) / 4400e9 * 1e3)
        assert estimate(w, H200ISH).floor_ms == floor
        # an honest row scaling reads B and writes the output: at that speed it is not rejected
        honest_ms = 2 * out / 4400e9 * 1e3
        assert floor < 0.8 * honest_ms
    # the v0 roofline counts the matmul's FLOPs: an honest row scaling beats it by far
    assert estimate(count_work(KB12_V0), H200ISH).bound_ms > 10 * honest_ms


def test_the_floor_uses_the_measured_l2_and_the_best_bandwidth():
    from cuda_agent.profiler.sol import WRITE_ABSORB_BYTES, output_floor_ms

    w = count_work(KB12)
    assert H200ISH.absorb_bytes() == 50 << 20 and H200ISH.floor_gbps() == 4400.0
    unknown_l2 = msgspec.structs.replace(H200ISH, l2_bytes=0)
    assert unknown_l2.absorb_bytes() == WRITE_ABSORB_BYTES  # more than any L2: 64 MiB fits
    assert output_floor_ms(w, unknown_l2) == 0.0
    # a datasheet above the measured ceilings wins: the floor must hold at the best bandwidth
    named = msgspec.structs.replace(H200ISH, device="NVIDIA H200")
    assert named.floor_gbps() == 4800.0
    assert output_floor_ms(w, named) < output_floor_ms(w, H200ISH)


def test_a_matmul_floor_with_a_small_output_is_zero_whatever_its_flops(tiny_src):
    e = estimate(count_work(tiny_src), H200ISH)  # relu(x @ x.T) on 96 x 96: a 36 KB output
    assert e.work.flops > 0 and e.bound_ms > 0
    assert e.floor_ms == 0.0 and not e.impossible(1e-9)


def test_storage_bytes_of_real_outputs():
    import torch

    from cuda_agent.profiler.sol import storage_bytes

    x = torch.randn(64, 32)
    assert storage_bytes(x) == 64 * 32 * 4
    assert storage_bytes(x.t()) == 64 * 32 * 4  # a dense permutation
    assert storage_bytes(torch.randn(64, 1).expand(64, 32)) == 64 * 4  # broadcast: once
    assert storage_bytes((x, x, x.view(-1))) == 64 * 32 * 4  # shared memory counts once
    assert storage_bytes(list(x.chunk(4))) == 64 * 32 * 4  # pieces of one buffer: the buffer
    assert storage_bytes({"a": x, "b": torch.randn(8)}) == 64 * 32 * 4 + 8 * 4
    assert storage_bytes(x[:, ::2]) == 64 * 16 * 4  # a view with gaps: its own elements only
    assert storage_bytes(torch.randn(100, 16)[:10]) == 10 * 16 * 4  # not the whole storage
    over = torch.randn(100).as_strided((50, 50), (1, 1))  # overlapping windows: 99 elements
    assert 0 < storage_bytes(over) <= 99 * 4  # a lower bound of what it occupies
    assert storage_bytes(torch.empty(0, 5)) == 0 and storage_bytes(3.0) == 0


def test_a_broadcast_output_lowers_the_floor_to_its_storage():
    import torch

    from cuda_agent.profiler.sol import output_floor_ms, storage_bytes

    src = KB12.replace("return A.unsqueeze(1) * B", "return (A.unsqueeze(1) + 1).expand(-1, M)")
    w = count_work(src)
    assert w.output_bytes == 4096 * 4096 * 4 and output_floor_ms(w, H200ISH) > 0
    cand = (torch.rand(4096, 1) + 1).expand(-1, 4096)  # the candidate returns a view as well
    assert output_floor_ms(w, H200ISH, output_storage_bytes=storage_bytes(cand)) == 0.0
    dense = output_floor_ms(w, H200ISH)
    assert output_floor_ms(w, H200ISH, output_storage_bytes=2 * w.output_bytes) == dense
