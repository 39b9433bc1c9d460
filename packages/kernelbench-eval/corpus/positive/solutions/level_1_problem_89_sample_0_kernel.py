import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Inclusive prefix sum along `dim`. The input is viewed as (outer, L, inner); each warp scans one
# line of L values (stride `inner`) 32 at a time: a shuffle-based inclusive scan within the warp,
# plus the running carry of the previous chunks, broadcast from lane 31.
cumsum_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

constexpr int WARPS_PER_BLOCK = 8;

__global__ void warp_scan_kernel(const float* __restrict__ x, float* __restrict__ y,
                                 long lines, long L, long inner) {
    const int lane = threadIdx.x & 31;
    long warp_id = (long)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    long warps = (long)gridDim.x * WARPS_PER_BLOCK;
    for (long line = warp_id; line < lines; line += warps) {
        long o = line / inner, i = line % inner;
        const float* xl = x + o * L * inner + i;
        float* yl = y + o * L * inner + i;
        float carry = 0.0f;
        for (long base = 0; base < L; base += 32) {
            long k = base + lane;
            float v = k < L ? xl[k * inner] : 0.0f;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                float u = __shfl_up_sync(0xffffffff, v, off);
                if (lane >= off) v += u;
            }
            v += carry;
            if (k < L) yl[k * inner] = v;
            carry = __shfl_sync(0xffffffff, v, 31);
        }
    }
}

torch::Tensor cumsum_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    auto xc = x.contiguous();
    int64_t nd = xc.dim();
    if (dim < 0) dim += nd;
    TORCH_CHECK(dim >= 0 && dim < nd, "dim out of range");
    long outer = 1, inner = 1, L = xc.size(dim);
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < nd; ++d) inner *= xc.size(d);
    auto y = torch::empty_like(xc);
    long lines = outer * inner;
    if (lines == 0 || L == 0) return y;
    long blocks = (lines + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
    if (blocks > 132L * 64) blocks = 132L * 64;
    warp_scan_kernel<<<(unsigned)blocks, WARPS_PER_BLOCK * 32, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), lines, L, inner);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cumsum_cpp = "torch::Tensor cumsum_forward(torch::Tensor x, int64_t dim);"

cumsum_ext = load_inline(
    name="kb_l1_89_warp_scan",
    cpp_sources=cumsum_cpp,
    cuda_sources=cumsum_source,
    functions=["cumsum_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x):
        return cumsum_ext.cumsum_forward(x, self.dim)
