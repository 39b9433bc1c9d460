import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Fully custom GEMM: out = relu(x @ W^T + bias). 128x128 block tiles, BK = 8 slices staged in
# shared memory (stored k-major so both operands are read conflict-free), 8x8 register
# micro-tile per thread with a strided row/column mapping (coalesced stores), bias + ReLU
# fused into the store. Bounds-checked on every edge, so any M, N, K works.
cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define BM 128
#define BN 128
#define BK 8
#define TM 8
#define TN 8

__global__ void __launch_bounds__(256)
gemm_bias_relu_kernel(const float* __restrict__ A, const float* __restrict__ B,
                      const float* __restrict__ bias, float* __restrict__ C,
                      int M, int N, int K) {
    __shared__ float As[BK][BM];
    __shared__ float Bs[BK][BN];
    const int t = threadIdx.x;
    const int tx = t % 16, ty = t / 16;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int lr = t / 2, lk = (t % 2) * 4;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int k = k0 + lk + i;
            int r = row0 + lr;
            int c = col0 + lr;
            As[lk + i][lr] = (r < M && k < K) ? A[(long)r * K + k] : 0.f;
            Bs[lk + i][lr] = (c < N && k < K) ? B[(long)c * K + k] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        int r = row0 + ty + 16 * i;
        if (r >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            int c = col0 + tx + 16 * j;
            if (c < N) C[(long)r * N + c] = fmaxf(acc[i][j] + bias[c], 0.f);
        }
    }
}

torch::Tensor gemm_add_relu(torch::Tensor x, torch::Tensor w, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && w.is_cuda() && bias.is_cuda(), "CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 expected");
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    auto bc = bias.contiguous();
    int M = xc.size(0), K = xc.size(1), N = wc.size(0);
    TORCH_CHECK(wc.size(1) == K && bc.numel() == N, "shape mismatch");
    auto out = torch::empty({M, N}, xc.options());
    dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    gemm_bias_relu_kernel<<<grid, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(), M, N, K);
    return out;
}
"""

cpp_source = "torch::Tensor gemm_add_relu(torch::Tensor x, torch::Tensor w, torch::Tensor bias);"

gemm_add_relu = load_inline(
    name="tiled_gemm_add_relu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gemm_add_relu"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return gemm_add_relu.gemm_add_relu(x, self.gemm.weight, self.bias)
