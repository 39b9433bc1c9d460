import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# C = diag(A) @ B computed as a row scaling C[i, :] = A[i] * B[i, :] (the diagonal matrix is
# never built). float4 loads and stores when a row is a whole number of float4s.
cuda_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>

__global__ void row_scale_vec4(const float* __restrict__ a, const float4* __restrict__ b,
                               float4* __restrict__ c, long rows, long vecs_per_row) {
    long total = rows * vecs_per_row;
    for (long v = blockIdx.x * (long)blockDim.x + threadIdx.x; v < total;
         v += (long)gridDim.x * blockDim.x) {
        float s = __ldg(a + v / vecs_per_row);
        float4 x = b[v];
        c[v] = make_float4(s * x.x, s * x.y, s * x.z, s * x.w);
    }
}

__global__ void row_scale_scalar(const float* __restrict__ a, const float* __restrict__ b,
                                 float* __restrict__ c, long rows, long cols) {
    long total = rows * cols;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        c[i] = __ldg(a + i / cols) * b[i];
    }
}

torch::Tensor diag_matmul(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "CUDA tensors expected");
    TORCH_CHECK(a.dim() == 1 && b.dim() == 2 && a.size(0) == b.size(0), "shape mismatch");
    auto ac = a.contiguous();
    auto bc = b.contiguous();
    auto c = torch::empty_like(bc);
    long rows = bc.size(0), cols = bc.size(1);
    if (rows * cols == 0) return c;
    auto stream = at::cuda::getCurrentCUDAStream();
    const int threads = 256;
    if (cols % 4 == 0) {
        long vecs = rows * (cols / 4);
        long blocks = std::min<long>((vecs + threads - 1) / threads, 132L * 16);
        row_scale_vec4<<<blocks, threads, 0, stream>>>(
            ac.data_ptr<float>(), reinterpret_cast<const float4*>(bc.data_ptr<float>()),
            reinterpret_cast<float4*>(c.data_ptr<float>()), rows, cols / 4);
    } else {
        long blocks = std::min<long>((rows * cols + threads - 1) / threads, 132L * 16);
        row_scale_scalar<<<blocks, threads, 0, stream>>>(
            ac.data_ptr<float>(), bc.data_ptr<float>(), c.data_ptr<float>(), rows, cols);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return c;
}
"""

cpp_src = "torch::Tensor diag_matmul(torch::Tensor a, torch::Tensor b);"

ext = load_inline(
    name="kb_l1_12_row_scale_vec4",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["diag_matmul"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    """diag(A) @ B as a row scaling of B."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return ext.diag_matmul(A, B)
