import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# cuBLAS SGEMM + a grid-stride epilogue computing mish(mish(v + bias)) in registers.
# softplus follows torch's threshold (x > 20 -> x).
cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>

__device__ __forceinline__ float mish(float x) {
    float sp = x > 20.f ? x : log1pf(expf(x));
    return x * tanhf(sp);
}

__global__ void bias_mish_mish(float* __restrict__ y, const float* __restrict__ bias, long total, int N) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += stride)
        y[i] = mish(mish(y[i] + bias[i % N]));
}

torch::Tensor linear_mish_mish(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    x = x.contiguous();
    w = w.contiguous();
    int M = x.size(0), K = x.size(1), N = w.size(0);
    auto y = torch::empty({M, N}, x.options());
    const float one = 1.f, zero = 0.f;
    cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
    cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w.data_ptr<float>(), K,
                x.data_ptr<float>(), K, &zero, y.data_ptr<float>(), N);
    long total = (long)M * N;
    int blocks = (int)((total + 255) / 256 < 4096 ? (total + 255) / 256 : 4096);
    if (total > 0)
        bias_mish_mish<<<blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>(y.data_ptr<float>(), b.data_ptr<float>(), total, N);
    return y;
}
"""

cpp_source = "torch::Tensor linear_mish_mish(torch::Tensor x, torch::Tensor w, torch::Tensor b);"

linear_mish_mish = load_inline(
    name="linear_mish_mish",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["linear_mish_mish"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return linear_mish_mish.linear_mish_mish(x, self.linear.weight, self.linear.bias)
