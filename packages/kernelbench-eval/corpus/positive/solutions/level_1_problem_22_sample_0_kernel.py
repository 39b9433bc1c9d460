import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

tanh_kernel_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void tanh_kernel(const float* __restrict__ input, float* __restrict__ output, size_t n) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t stride = (size_t)blockDim.x * gridDim.x;
    for (size_t i = idx; i < n; i += stride) {
        output[i] = tanhf(input[i]);
    }
}

torch::Tensor tanh_cuda(torch::Tensor input) {
    auto output = torch::empty_like(input);
    size_t n = input.numel();
    int threads = 256;
    int blocks = 132 * 16;
    tanh_kernel<<<blocks, threads>>>(input.data_ptr<float>(), output.data_ptr<float>(), n);
    return output;
}
"""

tanh_cpp_source = "torch::Tensor tanh_cuda(torch::Tensor input);"

tanh_ext = load_inline(
    name="kb_l1_22_tanh_gridstride",
    cpp_sources=tanh_cpp_source,
    cuda_sources=tanh_kernel_source,
    functions=["tanh_cuda"],
    verbose=False,
    extra_cuda_cflags=["-O3", "--use_fast_math"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()
        self.tanh = tanh_ext

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tanh.tanh_cuda(x.contiguous())
