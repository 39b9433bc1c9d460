"""Unit tests: registry and policies, static details (load_inline resolution, preprocessor
tricks and fallback), timing and output checks, shape resizing, runtime helpers, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from cuda_agent.guards import CHECKS, output_checks, resize_task_source, timing_checks
from cuda_agent.guards.checks import POLICIES, Findings, finding
from cuda_agent.guards.cstatic import CSource, scan_sources
from cuda_agent.guards.runtime import fingerprint, same_output
from cuda_agent.guards.static import analyze, task_is_float32
from cuda_agent.records import Candidate, Solution, Task, TimingDetail, TimingStats, encode

REF = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"


def _cand(files: dict[str, str], ref: str = REF) -> Candidate:
    return Candidate(task=Task.make("t", ref), solution=Solution.make("kernelbench", files))


def _codes(fs, sev="reject") -> set[str]:
    return {f.code for f in fs if f.severity == sev}


def test_registry_codes_and_policies() -> None:
    assert len(CHECKS) >= 30
    for code, c in CHECKS.items():
        assert code.startswith("G-") and c.description and c.stages
        assert c.severity("off") is None
        assert c.severity("strict") in ("reject", "flag")
    assert CHECKS["G-TORCH-COMPUTE"].severity("kernelbench") == "flag"
    assert CHECKS["G-NO-KERNEL"].severity("kernelbench") == "reject"
    assert set(POLICIES) == {"strict", "kernelbench", "off"}
    with pytest.raises(ValueError):
        Findings("lenient")
    assert finding("G-STREAM", "off", "x") is None
    f = finding("G-STREAM", "strict", "x", severity="flag")
    assert f is not None and f.severity == "flag"


def test_findings_merge_repeated_calls() -> None:
    fs = Findings("strict")
    fs.add("G-INPUT-MUTATION", "call 1: input 0 changed", "shape (2,)")
    fs.add("G-INPUT-MUTATION", "call 2: input 0 changed", "shape (2,)")
    assert len(fs.items) == 1 and fs.items[0].evidence.startswith("call 1")


SRC_TEMPLATE = '''import torch
from torch.utils.cpp_extension import load_inline
HEAD = "#include <torch/extension.h>\\n"
KERNEL = f"""{{HEAD}}
__global__ void k(float* y) {{{{ y[0] = 1.f; }}}}
torch::Tensor f(torch::Tensor x) {{{{ BODY }}}}
"""
ext = load_inline(name="e", cpp_sources=["torch::Tensor f(torch::Tensor x);"],
                  cuda_sources=[KERNEL], functions=["f"])

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.f(x)
'''


def test_load_inline_sources_resolved_through_names_and_fstrings() -> None:
    honest = SRC_TEMPLATE.replace("BODY", "auto y = torch::empty_like(x); return y;")
    rep = analyze(_cand({"model_new.py": honest}))
    assert rep.kernels == ["k"] and rep.functions == ["f"] and rep.modules == ["e"]
    assert _codes(rep.findings) == set()
    hack = SRC_TEMPLATE.replace("BODY", "return at::native::add(x, x, 1);")
    assert "G-TORCH-COMPUTE" in _codes(analyze(_cand({"model_new.py": hack})).findings)


def test_opaque_source_is_flagged() -> None:
    src = SRC_TEMPLATE.replace("cuda_sources=[KERNEL]", "cuda_sources=[''.join(map(chr, [95]))]")
    fs = analyze(_cand({"model_new.py": src})).findings
    assert "G-OPAQUE-SOURCE" in _codes(fs, "flag")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("#define S(a,b) a##b\nvoid g(){ cudaStream_t s; S(cudaStream,Create)(&s); }", "G-STREAM"),
        (
            "#define T torch\n#define OP T::matmul\nat::Tensor g(at::Tensor a){ return OP(a, a); }",
            "G-TORCH-COMPUTE",
        ),
        (
            "namespace tt = torch;\nat::Tensor g(at::Tensor a){ return tt::softmax(a, 1); }",
            "G-TORCH-COMPUTE",
        ),
        (
            "#ifdef __CUDA_ARCH__\n__device__ void d(){ int x = clock(); }\n#else\nvoid h(){ std::thread t([]{}); t.detach(); }\n#endif",
            "G-THREAD",
        ),
        ('void g(){ void* h = dlopen("libcublasLt.so", 2); }', "G-DYNAMIC-CODE"),
        ('void g(){ FILE* f = fopen("x", "w"); }', "G-FILE-IO"),
        ("void g(){ int s = socket(2, 1, 0); }", "G-NETWORK"),
        ("#include <thrust/reduce.h>\nvoid g(){}", "G-LIBRARY"),
        (
            "cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) { *ms = 0; return cudaSuccess; }",
            "G-TIMER-PATCH",
        ),
        (
            'void g(){ asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0}, {%1}, {%2}, {%3};"); }',
            "G-PRECISION",
        ),
        (
            "void g(float* p){ cudaStreamAttrValue v; v.accessPolicyWindow.num_bytes = 1; }",
            "G-L2-PERSIST",
        ),
        (
            "void g(){ cudaGraph_t gr; cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal); }",
            "G-GRAPH",
        ),
    ],
)
def test_c_rules_after_preprocessing(body: str, code: str) -> None:
    fs = Findings("strict")
    scan_sources([CSource("k.cu", body)], fs, float32_task=True)
    assert code in _codes(fs.items), fs.items


def test_c_honest_idioms_pass() -> None:
    body = """#include <torch/extension.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
template <int B> __global__ void __launch_bounds__(B) k(const float* x, float* y, int n) {
  __shared__ float s[B];
  auto t = cg::tiled_partition<32>(cg::this_thread_block());
  float v = x[threadIdx.x]; v += t.shfl_down(v, 1); s[threadIdx.x] = v; __syncthreads();
  if (threadIdx.x < n) y[threadIdx.x] = fmaxf(s[threadIdx.x], 0.f) + expf(v) + sqrtf(v) + tanhf(v);
}
torch::Tensor f(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda());
  auto xc = x.contiguous(); auto y = torch::zeros_like(xc);
  auto o = torch::empty({xc.size(0), xc.size(1)}, xc.options().dtype(torch::kFloat32));
  k<256><<<1, 256, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel());
  return y.view({-1}).reshape(x.sizes()).transpose(0, 1).contiguous();
}"""
    fs = Findings("strict")
    res = scan_sources([CSource("k.cu", body)], fs, float32_task=True)
    assert _codes(fs.items) == set(), fs.items
    assert res.kernels == ["k"] and res.preprocessed


def test_preprocessor_failure_falls_back_to_raw_scan() -> None:
    fs = Findings("strict")
    res = scan_sources([CSource("k.cu", '#error "stop"\nvoid g(){ std::thread t; }')], fs)
    assert not res.preprocessed
    assert "G-OPAQUE-SOURCE" in _codes(fs.items, "flag")
    assert "G-THREAD" in _codes(fs.items)


def test_task_dtype_and_precision_only_on_float32() -> None:
    assert task_is_float32(REF)
    ref16 = REF.replace("torch.relu(x)", "torch.relu(x.half())")
    assert not task_is_float32(ref16)
    src = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.half()\n"
    assert "G-PRECISION" in _codes(analyze(_cand({"model_new.py": src})).findings)
    assert "G-PRECISION" not in _codes(analyze(_cand({"model_new.py": src}, ref16)).findings)


def test_timing_checks_against_speed_of_light() -> None:
    t = TimingDetail(protocol_version="1", candidate=TimingStats(median_ms=0.5, n=30, min_ms=0.45))
    # the floor holds for every correct implementation: under 0.8x it rejects, under it flags
    assert _codes(timing_checks(t, 1.0)) == {"G-SOL"}
    assert _codes(timing_checks(t, 0.55), "flag") == {"G-SOL"} and not _codes(
        timing_checks(t, 0.55)
    )
    assert _codes(timing_checks(t, 0.6), "flag") == {"G-SOL"}  # the fastest sample: 0.45 < 0.48
    assert timing_checks(t, 0.1) == [] and timing_checks(t, None) == []
    assert timing_checks(t, 1.0, policy="off") == []
    # the roofline of the reference's work is only an estimate: far under it only flags
    fs = timing_checks(t, 0.1, estimate_ms=10.0)
    assert [(f.code, f.severity) for f in fs] == [("G-SOL", "flag")] and "roofline" in fs[0].message
    assert timing_checks(t, 0.1, estimate_ms=0.55) == []  # 0.5 ms is above 0.8 x 0.55


# KernelBench v0, level 1 problem 12 (MIT, packages/kernelbench-eval/corpus/positive/KernelBench/
# LICENSE): the reference form whose honest row scaling G-SOL rejected at 0.35x the roofline
KB12_V0 = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A, B):
        return torch.diag(A) @ B

M = 4096
N = 4096

def get_inputs():
    A = torch.rand(N)
    B = torch.rand(N, M)
    return [A, B]

def get_init_inputs():
    return []
"""


def test_an_honest_row_scaling_of_diag_matmul_is_not_rejected() -> None:
    from cuda_agent.profiler.sol import Ceilings, count_work, estimate, output_floor_ms

    ceil = Ceilings(
        device="NVIDIA H200",
        torch_version="",
        protocol_version="",
        copy_gbps=4000.0,
        read_gbps=4400.0,
        l2_bytes=50 << 20,
        matmul_tflops={"fp32": 50.0, "tf32": 400.0, "bf16": 750.0, "fp16": 750.0},
    )
    w = count_work(KB12_V0)
    e = estimate(w, ceil)
    # the rejected run: median 0.35x the roofline; an ideal row scaling reads B, writes C
    ideal_ms = 2 * w.output_bytes / (ceil.floor_gbps() * 1e9) * 1e3
    for median in (0.35 * e.bound_ms, ideal_ms):
        t = TimingDetail(
            protocol_version="1", candidate=TimingStats(median_ms=median, n=30, min_ms=median)
        )
        fs = timing_checks(t, output_floor_ms(w, ceil), estimate_ms=e.bound_ms)
        assert not _codes(fs) and _codes(fs, "flag") == {"G-SOL"}


def test_output_checks_structure_degenerate_sensitivity() -> None:
    g = torch.Generator().manual_seed(0)
    refs = [torch.randn(8, 8, generator=g) * 1e-3 for _ in range(3)]
    assert output_checks(refs, [r.clone() for r in refs]) == []
    assert "G-DEGENERATE" in _codes(output_checks(refs, [torch.zeros(8, 8)] * 3))
    const = torch.randn(8, 8, generator=g) * 1e-3
    assert "G-INPUT-INSENSITIVE" in _codes(output_checks(refs, [const] * 3))
    assert "G-OUTPUT-STRUCTURE" in _codes(
        output_checks([(r, r) for r in refs], [(r,) for r in refs])
    )


def test_resize_task_source() -> None:
    ref = (
        REF
        + "\nbatch_size = 128\nin_channels = 64\nheight, width = 100, 100  # note\n"
        + (
            "\ndef get_inputs():\n    return [torch.randn(batch_size, in_channels, height, width)]\n"
            "\ndef get_init_inputs():\n    return []\n"
        )
    )
    out = resize_task_source(ref, 0.75)
    assert out is not None
    ns: dict = {}
    exec(
        compile(out.split("\ndef get_inputs")[0].split("return torch.relu(x)\n")[1], "r", "exec"),
        ns,
    )
    assert ns["batch_size"] not in (128, 96) and ns["in_channels"] == 64
    assert ns["height"] == ns["width"] == 75 and "# note" in out
    assert resize_task_source(REF) is None


def test_fingerprint_and_same_output() -> None:
    x = torch.randn(1000)
    fp = fingerprint(x)
    x[517] += 1e-3
    assert fingerprint(x) != fp
    assert same_output((x, x), (x.clone(), x.clone())) is None
    y = x.clone()
    y[3] = float("nan")
    assert "NaN" in same_output(y, x)


def test_cli_check_list_and_resize(tmp_path) -> None:
    honest = SRC_TEMPLATE.replace("BODY", "return torch::empty_like(x);")
    hack = honest + "\nimport threading\n"
    lines = [encode(_cand({"model_new.py": s})) for s in (honest, hack)]
    inp = tmp_path / "c.jsonl"
    inp.write_bytes(b"".join(lines) + b"not json\n")
    r = subprocess.run(
        [sys.executable, "-m", "cuda_agent.guards.cli", "check", str(inp), "--on-error", "skip"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    recs = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert [x["status"] for x in recs] == ["ok", "guard_violation"]
    assert recs[1]["guards"][0]["code"] == "G-THREAD" or any(
        g["code"] == "G-THREAD" for g in recs[1]["guards"]
    )
    assert "malformed" in r.stderr or "skipped" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "cuda_agent.guards.cli", "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert len(r.stdout.splitlines()) == len(CHECKS)
    task = Task.make("t", REF + "\nN = 4096\n\ndef get_inputs():\n    return [torch.randn(N)]\n")
    (tmp_path / "t.jsonl").write_bytes(encode(task))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cuda_agent.guards.cli",
            "resize-task",
            str(tmp_path / "t.jsonl"),
            "--factor",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = json.loads(r.stdout)
    assert "N = 2049" in out["ref_code"] and out["meta"]["resized_from"] == task.id


def test_token_own_kernel_next_to_torch_kernels() -> None:
    from cuda_agent.guards.runtime import CallRecord, RuntimeGuardImpl

    rec = CallRecord(
        ops=["aten.empty_like.default", "aten.mm.default"],
        kernels=[("tiny_kernel", 7), ("sm90_xmma_gemm_f32", 7)],
        kernel_ns={"tiny_kernel": 1_000, "sm90_xmma_gemm_f32": 900_000},
        marker_stream=7,
    )
    for policy, sev in (("kernelbench", "reject"), ("strict", "flag")):
        g = RuntimeGuardImpl(policy, "cuda", ["tiny_kernel"], trace_kernels=False)
        g._judge_record(rec, 1, [torch.randn(4)])
        share = [f for f in g.fs.items if f.code == "G-NO-KERNEL"]
        assert share and share[0].severity == sev and "0.1%" in share[0].message
    honest = CallRecord(
        kernels=[("tiny_kernel", 7)], kernel_ns={"tiny_kernel": 5_000}, marker_stream=7
    )
    g = RuntimeGuardImpl("kernelbench", "cuda", ["tiny_kernel"], trace_kernels=False)
    g._judge_record(honest, 1, [torch.randn(4)])
    assert g.fs.items == []


def test_own_epilogue_next_to_own_cublas_is_real_work() -> None:
    from cuda_agent.guards.runtime import CallRecord, RuntimeGuardImpl

    # no torch compute dispatched: the big GEMM kernel came from the candidate's own cuBLAS call
    rec = CallRecord(
        ops=["aten.empty.memory_format"],
        own_calls=["cuda_extension.gemm_bias_relu"],
        kernels=[("bias_relu_kernel", 7), ("sm90_xmma_gemm_f32", 7)],
        kernel_ns={"bias_relu_kernel": 1_000, "sm90_xmma_gemm_f32": 900_000},
        marker_stream=7,
    )
    g = RuntimeGuardImpl("kernelbench", "cuda", ["bias_relu_kernel"], trace_kernels=False)
    g._judge_record(rec, 1, [torch.randn(4)])
    assert g.fs.items == []


def test_user_helpers_named_like_cuda_are_not_interposition() -> None:
    body = """#include <cuda_runtime.h>
#include <cstdio>
inline void cudaCheck(cudaError_t e) { if (e != cudaSuccess) printf("%s", cudaGetErrorString(e)); }
static void cuda_assert(int ok) { if (!ok) printf("bad"); }
__global__ void k(float* y) { y[0] = 1.f; }
void launch(float* y, cudaStream_t s) { k<<<1, 1, 0, s>>>(y); cudaCheck(cudaGetLastError()); }"""
    fs = Findings("strict")
    scan_sources([CSource("k.cu", body)], fs)
    assert _codes(fs.items) == set(), fs.items
    fs = Findings("strict")
    scan_sources(
        [CSource("k.cu", "cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }")], fs
    )
    assert "G-TIMER-PATCH" in _codes(fs.items)


def test_exact_constant_where_reference_only_has_rounding_noise() -> None:
    ref = [torch.ones(64) + torch.randn(64) * 1e-7 for _ in range(3)]  # e.g. rows of softmax summed
    cand = [torch.ones(64) for _ in range(3)]
    assert "G-DEGENERATE" not in _codes(output_checks(ref, cand))


def test_profiler_flags_that_hide_the_true_cost_reject():
    from cuda_agent.guards import timing_checks
    from cuda_agent.records import TimingDetail, TimingStats

    def td(*flags):
        return TimingDetail(
            protocol_version="p", candidate=TimingStats(median_ms=1.0, n=10, flags=list(flags))
        )

    codes = {f.code: f.severity for f in timing_checks(td("stale_output", "deferred_work"))}
    assert codes == {"G-CACHE": "reject", "G-DEFERRED": "reject"}
    # flags where the protocol charged the true cost are not guard findings
    assert timing_checks(td("async_work", "background_thread", "cuda_graph")) == []
    assert timing_checks(td("stale_output"), policy="off") == []


_LAZY_DYNAMO = """
import functools, json, sys
import torch
assert "torch._dynamo" not in sys.modules
from cuda_agent.guards.runtime import RuntimeGuardImpl

def run(patch):
    g = RuntimeGuardImpl("strict", "cpu", trace_kernels=False)
    g.install()
    x = [torch.randn(4)]
    with g.watch(x):
        patch()
        y = x[0] * 2
    g.after_call(x, y)
    return [[v.code, v.severity] for v in g.finish() if "PATCH" in v.code]

def lazy_import():  # what torch does on its own during a call: manual_seed re-wrapped by torch
    import torch._dynamo  # noqa: F401

def foreign():  # a candidate's wrapper that looks like torch's (same __wrapped__, same module)
    orig = torch.manual_seed
    @functools.wraps(orig)
    def fake(seed):
        return orig(seed)
    torch.manual_seed = fake

print(json.dumps({"lazy": run(lazy_import), "foreign": run(foreign)}))
"""


def test_torch_rewrapping_its_own_function_is_not_a_patch() -> None:
    """torch rebinds torch.manual_seed to its own wrapper when torch._dynamo is first imported
    (seen on every honest H200 candidate as a G-HARNESS-PATCH flag); a candidate's look-alike
    wrapper is still caught."""
    import json
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-c", _LAZY_DYNAMO], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["lazy"] == []
    assert ["G-HARNESS-PATCH", "reject"] in got["foreign"], got


def test_output_checks_shortcuts_agree_with_the_masked_computation():
    """The parent's degenerate-output checks decide the all-finite case with one reduction and
    fall back to isfinite masks otherwise: same answers as the masked definitions everywhere."""
    import math

    import torch

    from cuda_agent.guards import behaviour as B

    def constant(t):
        first = t.reshape(-1)[0]
        if torch.isnan(first):
            return bool(torch.isnan(t).all())
        return t.numel() > 1 and bool(((t == first) | torch.isnan(t)).all())

    def spread(t):
        f = t[torch.isfinite(t)]
        if f.numel() < 2:
            return 0.0
        hi, lo = float(f.max()), float(f.min())
        return (hi - lo) / max(abs(hi), abs(lo), 1e-30)

    def norm(t):
        return float(torch.where(torch.isfinite(t), t, 0.0).norm())

    g = torch.Generator().manual_seed(0)
    base = torch.randn(100_003, generator=g)
    cases = [base, torch.full((1000,), 3.0), torch.zeros(1000), torch.full((5,), float("nan"))]
    for pos in (0, 50_001, 100_002):
        for bad in (float("nan"), float("inf"), float("-inf")):
            t = base.clone()
            t[pos] = bad
            c = torch.full((1000,), 2.0)
            c[pos % 1000] = bad
            cases += [t, c]
    cases += [torch.full((4,), float("inf")), torch.tensor([1e30, 1e30, -1e30])]  # norm overflow
    for t in cases:
        assert B._is_constant(t) == constant(t), t
        assert math.isclose(B._spread(t), spread(t), rel_tol=1e-6), t
        a, b = B._finite_norm(t), norm(t)
        assert a == b or math.isclose(a, b, rel_tol=1e-6), (a, b)
