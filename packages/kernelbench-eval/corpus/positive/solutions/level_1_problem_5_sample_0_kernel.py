import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

// C = A * s: float4 grid-stride loop over the bulk, scalar loop over the last n % 4 elements.
__global__ void scale_kernel(const float* __restrict__ a, float* __restrict__ c, float s, long n) {
    long tid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    long stride = (long)gridDim.x * blockDim.x;
    long n4 = n >> 2;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    float4* c4 = reinterpret_cast<float4*>(c);
    for (long i = tid; i < n4; i += stride) {
        float4 v = a4[i];
        v.x *= s; v.y *= s; v.z *= s; v.w *= s;
        c4[i] = v;
    }
    for (long i = (n4 << 2) + tid; i < n; i += stride) c[i] = a[i] * s;
}

torch::Tensor matrix_scalar_mul(torch::Tensor A, double s) {
    TORCH_CHECK(A.is_cuda() && A.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    auto a = A.contiguous();
    auto c = torch::empty_like(a);
    long n = a.numel();
    if (n == 0) return c;
    int threads = 256;
    long blocks = ((n >> 2) + threads - 1) / threads;
    if (blocks > 132L * 32) blocks = 132L * 32;
    if (blocks < 1) blocks = 1;
    scale_kernel<<<(unsigned)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), c.data_ptr<float>(), (float)s, n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return c;
}
"""

cpp_src = "torch::Tensor matrix_scalar_mul(torch::Tensor A, double s);"

ext = load_inline(
    name="kb_l1_5_scalar_mul_vec4",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["matrix_scalar_mul"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, s: float) -> torch.Tensor:
        return ext.matrix_scalar_mul(A, s)
