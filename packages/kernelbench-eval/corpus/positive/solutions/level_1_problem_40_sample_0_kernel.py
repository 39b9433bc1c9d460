import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# LayerNorm over the last len(normalized_shape) dims. Rows are few and long here (16 rows of
# 4M elements), so a row is split across many blocks: kernel 1 writes per-chunk (sum, sum of
# squares); kernel 2 has every block combine its row's chunk partials (a few hundred floats)
# and normalise its chunk with the affine weight and bias.
layernorm_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

constexpr int THREADS = 256;
constexpr int CHUNK = 16384;  // elements of a row per block

__device__ __forceinline__ float2 warp_sum2(float2 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v.x += __shfl_xor_sync(0xffffffff, v.x, o);
        v.y += __shfl_xor_sync(0xffffffff, v.y, o);
    }
    return v;
}

__device__ float2 block_sum2(float2 v) {
    __shared__ float2 warp_part[THREADS / 32];
    __shared__ float2 total;
    v = warp_sum2(v);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float2 w = lane < THREADS / 32 ? warp_part[lane] : make_float2(0.f, 0.f);
        w = warp_sum2(w);
        if (lane == 0) total = w;
    }
    __syncthreads();
    return total;
}

__global__ void chunk_stats_kernel(const float* __restrict__ x, float2* __restrict__ stats,
                                   long cols, int chunks) {
    long row = blockIdx.y;
    long start = (long)blockIdx.x * CHUNK;
    long end = min(start + CHUNK, cols);
    const float* xr = x + row * cols;
    float2 acc = make_float2(0.f, 0.f);
    for (long c = start + threadIdx.x; c < end; c += THREADS) {
        float v = xr[c];
        acc.x += v;
        acc.y += v * v;
    }
    acc = block_sum2(acc);
    if (threadIdx.x == 0) stats[row * chunks + blockIdx.x] = acc;
}

__global__ void normalize_kernel(const float* __restrict__ x, const float2* __restrict__ stats,
                                 const float* __restrict__ weight, const float* __restrict__ bias,
                                 float* __restrict__ y, long cols, int chunks, float eps) {
    long row = blockIdx.y;
    float2 acc = make_float2(0.f, 0.f);
    for (int k = threadIdx.x; k < chunks; k += THREADS) {
        float2 s = stats[row * chunks + k];
        acc.x += s.x;
        acc.y += s.y;
    }
    acc = block_sum2(acc);
    float mean = acc.x / (float)cols;
    float var = fmaxf(acc.y / (float)cols - mean * mean, 0.f);
    float rstd = rsqrtf(var + eps);
    long start = (long)blockIdx.x * CHUNK;
    long end = min(start + CHUNK, cols);
    const float* xr = x + row * cols;
    float* yr = y + row * cols;
    for (long c = start + threadIdx.x; c < end; c += THREADS)
        yr[c] = (xr[c] - mean) * rstd * weight[c] + bias[c];
}

torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    auto xc = x.contiguous();
    auto w = weight.contiguous();
    auto b = bias.contiguous();
    long cols = w.numel();
    TORCH_CHECK(cols > 0 && xc.numel() % cols == 0, "normalized_shape does not match the input");
    long rows = xc.numel() / cols;
    auto y = torch::empty_like(xc);
    if (rows == 0) return y;
    int chunks = (int)((cols + CHUNK - 1) / CHUNK);
    auto stats = torch::empty({rows, chunks, 2}, xc.options());
    dim3 grid(chunks, rows);
    auto stream = at::cuda::getCurrentCUDAStream();
    chunk_stats_kernel<<<grid, THREADS, 0, stream>>>(
        xc.data_ptr<float>(), reinterpret_cast<float2*>(stats.data_ptr<float>()), cols, chunks);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    normalize_kernel<<<grid, THREADS, 0, stream>>>(
        xc.data_ptr<float>(), reinterpret_cast<const float2*>(stats.data_ptr<float>()),
        w.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), cols, chunks, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

layernorm_cpp = (
    "torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps);"
)

layernorm_ext = load_inline(
    name="kb_l1_40_layernorm_split_rows",
    cpp_sources=layernorm_cpp,
    cuda_sources=layernorm_source,
    functions=["layernorm_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super(ModelNew, self).__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layernorm_ext.layernorm_forward(x, self.ln.weight, self.ln.bias, self.ln.eps)
