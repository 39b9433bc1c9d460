import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

# The convolution stays in PyTorch (cuDNN); ReLU and HardSwish are fused into one float4
# elementwise kernel over the convolution's output, written to a fresh tensor.
cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__device__ __forceinline__ float relu_hardswish(float v) {
    v = fmaxf(v, 0.f);
    return v * fminf(fmaxf((v + 3.f) / 6.f, 0.f), 1.f);
}

__global__ void relu_hardswish_vec4(const float4* __restrict__ x, float4* __restrict__ y, long n4) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = x[i];
        v.x = relu_hardswish(v.x); v.y = relu_hardswish(v.y);
        v.z = relu_hardswish(v.z); v.w = relu_hardswish(v.w);
        y[i] = v;
    }
}

__global__ void relu_hardswish_tail(const float* __restrict__ x, float* __restrict__ y, long start, long n) {
    long i = start + blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = relu_hardswish(x[i]);
}

torch::Tensor relu_hardswish(torch::Tensor x) {
    x = x.contiguous();
    auto y = torch::empty_like(x);
    long n = x.numel(), n4 = n / 4;
    if (n4 > 0)
        relu_hardswish_vec4<<<(n4 + 255) / 256, 256>>>(
            reinterpret_cast<const float4*>(x.data_ptr<float>()), reinterpret_cast<float4*>(y.data_ptr<float>()), n4);
    if (n - n4 * 4 > 0)
        relu_hardswish_tail<<<1, 32>>>(x.data_ptr<float>(), y.data_ptr<float>(), n4 * 4, n);
    return y;
}
"""

cpp_source = "torch::Tensor relu_hardswish(torch::Tensor x);"

relu_hardswish = load_inline(
    name="conv_relu_hardswish_epilogue",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["relu_hardswish"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super(ModelNew, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        x = F.conv2d(x, self.conv.weight, self.conv.bias)
        return relu_hardswish.relu_hardswish(x)
