import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Linear (cuBLAS SGEMM on torch's handle) followed by one fused epilogue kernel:
# y = leaky_relu((x @ W^T + b) * multiplier). The epilogue reads and writes the GEMM output
# in place with float4 accesses; launched on the default stream with no error check, the way
# most generated KernelBench solutions are written.
cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>

__global__ void bias_mul_leaky_vec4(float4* __restrict__ y, const float4* __restrict__ bias,
                                    long rows, long cols4, float mult, float slope) {
    long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
    long total = rows * cols4;
    if (idx >= total) return;
    float4 v = y[idx];
    float4 b = bias[idx % cols4];
    v.x = (v.x + b.x) * mult; v.y = (v.y + b.y) * mult;
    v.z = (v.z + b.z) * mult; v.w = (v.w + b.w) * mult;
    v.x = v.x > 0.f ? v.x : v.x * slope; v.y = v.y > 0.f ? v.y : v.y * slope;
    v.z = v.z > 0.f ? v.z : v.z * slope; v.w = v.w > 0.f ? v.w : v.w * slope;
    y[idx] = v;
}

__global__ void bias_mul_leaky_scalar(float* __restrict__ y, const float* __restrict__ bias,
                                      long rows, long cols, float mult, float slope) {
    long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (idx >= rows * cols) return;
    float v = (y[idx] + bias[idx % cols]) * mult;
    y[idx] = v > 0.f ? v : v * slope;
}

torch::Tensor gemm_mul_leaky(torch::Tensor x, torch::Tensor w, torch::Tensor b, double mult, double slope) {
    x = x.contiguous();
    w = w.contiguous();
    long M = x.size(0), K = x.size(1), N = w.size(0);
    auto y = torch::empty({M, N}, x.options());
    const float one = 1.f, zero = 0.f;
    cublasHandle_t h = at::cuda::getCurrentCUDABlasHandle();
    cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &one,
                w.data_ptr<float>(), (int)K, x.data_ptr<float>(), (int)K, &zero, y.data_ptr<float>(), (int)N);
    const int threads = 256;
    if (N % 4 == 0) {
        long total = M * (N / 4);
        bias_mul_leaky_vec4<<<(total + threads - 1) / threads, threads>>>(
            reinterpret_cast<float4*>(y.data_ptr<float>()), reinterpret_cast<const float4*>(b.data_ptr<float>()),
            M, N / 4, (float)mult, (float)slope);
    } else {
        long total = M * N;
        bias_mul_leaky_scalar<<<(total + threads - 1) / threads, threads>>>(
            y.data_ptr<float>(), b.data_ptr<float>(), M, N, (float)mult, (float)slope);
    }
    return y;
}
"""

cpp_source = "torch::Tensor gemm_mul_leaky(torch::Tensor x, torch::Tensor w, torch::Tensor b, double mult, double slope);"

gemm_mul_leaky = load_inline(
    name="gemm_mul_leaky",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gemm_mul_leaky"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.multiplier = multiplier
        self.negative_slope = negative_slope

    def forward(self, x):
        return gemm_mul_leaky.gemm_mul_leaky(
            x, self.gemm.weight, self.gemm.bias, self.multiplier, self.negative_slope
        )
