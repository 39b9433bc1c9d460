"""The CUDA candidates of the GPU tests of the robust settings (stress trials, shape check, the
host-wide gate): built from fixtures here, so that a compile-only test (nvcc, no GPU) builds
exactly what the GPU tests run.

- ``cuda_mul``: y = x * w (512 x 1024 fp32, 2 MB), sizes as module-level constants; its honest
  kernel (IEEE: subnormals, NaN and Inf as the reference's), and the variants of
  ``fixtures/cuda_variants``: ``mul_ftz.cu`` (the product as ``-ftz=true`` compiles it) and
  ``mul_hard_coded.cu`` (the published column count baked in);
- ``gpu_fused``: the fused add-scale-clamp-exp workdir solution of ``test_gpu.py``, as it is
  (``fminf``/``fmaxf`` return the other operand where one is NaN: its clamp turns a NaN into -3,
  where ``torch.clamp`` propagates it) and with a NaN-propagating clamp.
"""

from __future__ import annotations

from pathlib import Path

from cuda_agent.records import Candidate, Solution, Task

FIX = Path(__file__).parent / "fixtures"
MUL = FIX / "cuda_mul"
VARIANTS = FIX / "cuda_variants"
FUSED = FIX / "gpu_fused"

FUSED_CLAMP = "  float z = fminf(fmaxf((a + b) * s, -3.0f), 3.0f);\n"
FUSED_CLAMP_NAN = (
    "  float t = (a + b) * s;\n"
    "  float z = t != t ? t : fminf(fmaxf(t, -3.0f), 3.0f);  // NaN stays NaN, as torch.clamp\n"
)


def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "model.py" and p.suffix in (".py", ".cu", ".cpp", ".h")
    }


def mul_task() -> Task:
    return Task.make("cuda_mul_cols", (MUL / "model.py").read_text())


def mul_candidate(kernel: str | None = None) -> Candidate:
    """cuda_mul's solution; ``kernel``: a file of ``fixtures/cuda_variants`` as ``kernels/mul.cu``."""
    files = _files(MUL)
    if kernel is not None:
        files["kernels/mul.cu"] = (VARIANTS / kernel).read_text()
    return Candidate(task=mul_task(), solution=Solution.make("workdir", files))


def fused_task() -> Task:
    return Task.make("fused_add_scale_clamp_exp", (FUSED / "model.py").read_text())


def fused_candidate(nan_faithful: bool = False) -> Candidate:
    """test_gpu.py's workdir solution of the fused task; ``nan_faithful``: its clamp keeps NaN."""
    files = {
        "model_new.py": (FUSED / "model_new.py").read_text(),
        "kernels/fused.cu": (FUSED / "kernels" / "fused.cu").read_text(),
        "kernels/fused_binding.cpp": (FUSED / "kernels" / "fused_binding.cpp").read_text(),
    }
    if nan_faithful:
        cu = files["kernels/fused.cu"]
        assert cu.count(FUSED_CLAMP) == 1, "gpu_fused's clamp line changed"
        files["kernels/fused.cu"] = cu.replace(FUSED_CLAMP, FUSED_CLAMP_NAN)
    return Candidate(task=fused_task(), solution=Solution.make("workdir", files))


# every CUDA solution the GPU tests build (name -> candidate), for the compile-only test
CASES = {
    "cuda_mul": lambda: mul_candidate(),
    "cuda_mul+mul_ftz": lambda: mul_candidate("mul_ftz.cu"),
    "cuda_mul+mul_hard_coded": lambda: mul_candidate("mul_hard_coded.cu"),
    "gpu_fused": lambda: fused_candidate(),
    "gpu_fused+nan_faithful": lambda: fused_candidate(nan_faithful=True),
}
