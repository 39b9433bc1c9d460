import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Algorithmic restructuring. sum_n (x W^T + b)[m, n] = x[m] . (sum_n W[n, :]) + sum_n b[n], and
# after that sum every later op (max, mean, logsumexp, logsumexp over a dim of size 1) is the
# identity. So the (M x N x K) GEMM becomes: column sums of W (read once), then one GEMV.
# Exact for any input and any weights (only the summation order differs from the reference).
# Deterministic two-pass column sum (no atomics); the GEMV reduces with warp shuffles.
cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define COLS_PER_BLOCK 256
#define ROW_CHUNKS 64

// partial[r][k] = sum of W[n][k] over the r-th chunk of rows
__global__ void colsum_partial(const float* __restrict__ W, float* __restrict__ partial, int N, int K) {
    int k = blockIdx.x * COLS_PER_BLOCK + threadIdx.x;
    int r = blockIdx.y;
    if (k >= K) return;
    int rows = (N + ROW_CHUNKS - 1) / ROW_CHUNKS;
    int n0 = r * rows, n1 = min(N, n0 + rows);
    float s = 0.f;
    for (int n = n0; n < n1; ++n) s += W[(long)n * K + k];
    partial[(long)r * K + k] = s;
}

// wsum[k] = sum_r partial[r][k]; the last block sums the bias into wsum[K]
__global__ void colsum_final(const float* __restrict__ partial, const float* __restrict__ bias,
                             float* __restrict__ wsum, int N, int K) {
    __shared__ float red[COLS_PER_BLOCK];
    if (blockIdx.x == gridDim.x - 1) {
        float s = 0.f;
        for (int n = threadIdx.x; n < N; n += blockDim.x) s += bias[n];
        red[threadIdx.x] = s;
        __syncthreads();
        for (int o = blockDim.x / 2; o > 0; o >>= 1) {
            if (threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
            __syncthreads();
        }
        if (threadIdx.x == 0) wsum[K] = red[0];
        return;
    }
    int k = blockIdx.x * COLS_PER_BLOCK + threadIdx.x;
    if (k >= K) return;
    float s = 0.f;
    for (int r = 0; r < ROW_CHUNKS; ++r) s += partial[(long)r * K + k];
    wsum[k] = s;
}

// out[m] = x[m] . wsum[0:K] + wsum[K]; one block per row
__global__ void row_dot(const float* __restrict__ x, const float* __restrict__ wsum,
                        float* __restrict__ out, int M, int K) {
    __shared__ float warp_part[32];
    int m = blockIdx.x;
    const float* xr = x + (long)m * K;
    float s = 0.f;
    for (int k = threadIdx.x; k < K; k += blockDim.x) s += xr[k] * wsum[k];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffff, s, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_part[warp] = s;
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        s = lane < nw ? warp_part[lane] : 0.f;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffff, s, o);
        if (lane == 0) out[m] = s + wsum[K];
    }
}

torch::Tensor linear_sum_chain(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    x = x.contiguous();
    w = w.contiguous();
    b = b.contiguous();
    int M = x.size(0), K = x.size(1), N = w.size(0);
    auto partial = torch::empty({ROW_CHUNKS, K}, x.options());
    auto wsum = torch::empty({K + 1}, x.options());
    auto out = torch::empty({M, 1}, x.options());
    auto stream = at::cuda::getCurrentCUDAStream();
    int col_blocks = (K + COLS_PER_BLOCK - 1) / COLS_PER_BLOCK;
    colsum_partial<<<dim3(col_blocks, ROW_CHUNKS), COLS_PER_BLOCK, 0, stream>>>(
        w.data_ptr<float>(), partial.data_ptr<float>(), N, K);
    colsum_final<<<col_blocks + 1, COLS_PER_BLOCK, 0, stream>>>(
        partial.data_ptr<float>(), b.data_ptr<float>(), wsum.data_ptr<float>(), N, K);
    if (M > 0)
        row_dot<<<M, 512, 0, stream>>>(x.data_ptr<float>(), wsum.data_ptr<float>(), out.data_ptr<float>(), M, K);
    return out;
}
"""

cpp_source = "torch::Tensor linear_sum_chain(torch::Tensor x, torch::Tensor w, torch::Tensor b);"

linear_sum_chain = load_inline(
    name="linear_sum_chain",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["linear_sum_chain"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return linear_sum_chain.linear_sum_chain(x, self.linear.weight, self.linear.bias)
