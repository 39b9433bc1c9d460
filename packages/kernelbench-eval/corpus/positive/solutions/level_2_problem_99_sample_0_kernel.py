import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# cuBLAS SGEMM for the linear layer, then one kernel per row that fuses bias add, exact (erf)
# GELU and a numerically stable softmax over the row. Block-wide max and sum use warp shuffles
# plus one shared-memory slot per warp.
cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>
#include <cfloat>

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

template <bool IS_MAX>
__device__ float block_reduce(float v, float* shm) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    float r = lane < nw ? shm[lane] : (IS_MAX ? -FLT_MAX : 0.f);
    r = IS_MAX ? warp_max(r) : warp_sum(r);
    __syncthreads();
    return r;
}

__global__ void bias_gelu_softmax(float* __restrict__ y, const float* __restrict__ bias, int N) {
    __shared__ float shm[32];
    float* row = y + (long)blockIdx.x * N;
    float m = -FLT_MAX;
    for (int j = threadIdx.x; j < N; j += blockDim.x) {
        float v = row[j] + bias[j];
        v = 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
        row[j] = v;
        m = fmaxf(m, v);
    }
    m = block_reduce<true>(m, shm);
    float s = 0.f;
    for (int j = threadIdx.x; j < N; j += blockDim.x) s += expf(row[j] - m);
    s = block_reduce<false>(s, shm);
    float inv = 1.f / s;
    for (int j = threadIdx.x; j < N; j += blockDim.x) row[j] = expf(row[j] - m) * inv;
}

torch::Tensor linear_gelu_softmax(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    x = x.contiguous();
    w = w.contiguous();
    int M = x.size(0), K = x.size(1), N = w.size(0);
    auto y = torch::empty({M, N}, x.options());
    const float one = 1.f, zero = 0.f;
    cublasHandle_t h = at::cuda::getCurrentCUDABlasHandle();
    cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w.data_ptr<float>(), K,
                x.data_ptr<float>(), K, &zero, y.data_ptr<float>(), N);
    if (M > 0)
        bias_gelu_softmax<<<M, 1024, 0, at::cuda::getCurrentCUDAStream()>>>(y.data_ptr<float>(), b.data_ptr<float>(), N);
    return y;
}
"""

cpp_source = "torch::Tensor linear_gelu_softmax(torch::Tensor x, torch::Tensor w, torch::Tensor b);"

linear_gelu_softmax = load_inline(
    name="linear_gelu_softmax",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["linear_gelu_softmax"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return linear_gelu_softmax.linear_gelu_softmax(x, self.linear.weight, self.linear.bias)
