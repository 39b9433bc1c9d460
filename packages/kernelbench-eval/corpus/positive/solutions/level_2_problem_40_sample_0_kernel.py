import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# x * s + x == (1 + s) * (x W^T + b): the scaling and the residual add fold into the GEMM.
# A broadcast kernel writes (1 + s) * b into every output row, then cuBLAS accumulates onto it
# (alpha = 1 + s, beta = 1): the epilogue costs one write of the output instead of a read-modify-write.
cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>

__global__ void broadcast_scaled_bias(float* __restrict__ y, const float* __restrict__ b, long rows, int N, float a) {
    long total = rows * N;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x)
        y[i] = a * b[i % N];
}

torch::Tensor matmul_scale_residual(torch::Tensor x, torch::Tensor w, torch::Tensor b, double s) {
    x = x.contiguous();
    w = w.contiguous();
    int M = x.size(0), K = x.size(1), N = w.size(0);
    auto y = torch::empty({M, N}, x.options());
    if ((long)M * N == 0) return y;
    const float alpha = (float)(1.0 + s), beta = 1.f;
    broadcast_scaled_bias<<<2048, 256, 0, at::cuda::getCurrentCUDAStream()>>>(y.data_ptr<float>(), b.data_ptr<float>(), M, N, alpha);
    cublasSgemm(at::cuda::getCurrentCUDABlasHandle(), CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha,
                w.data_ptr<float>(), K, x.data_ptr<float>(), K, &beta, y.data_ptr<float>(), N);
    return y;
}
"""

cpp_source = "torch::Tensor matmul_scale_residual(torch::Tensor x, torch::Tensor w, torch::Tensor b, double s);"

matmul_scale_residual = load_inline(
    name="matmul_scale_residual",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["matmul_scale_residual"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor):
        super(ModelNew, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        return matmul_scale_residual.matmul_scale_residual(
            x, self.matmul.weight, self.matmul.bias, self.scaling_factor
        )
