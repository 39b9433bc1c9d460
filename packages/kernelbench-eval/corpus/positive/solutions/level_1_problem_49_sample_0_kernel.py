import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

max_reduce_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <cfloat>

__global__ void max_reduce_kernel(const float* __restrict__ input, float* __restrict__ output,
                                  int64_t outer, int64_t reduce, int64_t inner) {
    int64_t total = outer * inner;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)blockDim.x * gridDim.x) {
        int64_t o = idx / inner;
        int64_t i = idx - o * inner;
        const float* base = input + o * reduce * inner + i;
        float m = -FLT_MAX;
        for (int64_t r = 0; r < reduce; ++r) {
            float v = base[r * inner];
            m = v > m ? v : m;
        }
        output[idx] = m;
    }
}

torch::Tensor max_reduce_cuda(torch::Tensor input, int64_t dim) {
    auto x = input.contiguous();
    if (dim < 0) dim += x.dim();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    int64_t reduce = x.size(dim);
    std::vector<int64_t> out_shape;
    for (int64_t d = 0; d < x.dim(); ++d)
        if (d != dim) out_shape.push_back(x.size(d));
    auto output = torch::empty(out_shape, x.options());
    int threads = 256;
    int blocks = 132 * 8;
    max_reduce_kernel<<<blocks, threads>>>(x.data_ptr<float>(), output.data_ptr<float>(), outer, reduce, inner);
    return output;
}
"""

max_reduce_cpp_source = "torch::Tensor max_reduce_cuda(torch::Tensor input, int64_t dim);"

max_reduce = load_inline(
    name="kb_l1_49_max_reduce",
    cpp_sources=max_reduce_cpp_source,
    cuda_sources=max_reduce_source,
    functions=["max_reduce_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return max_reduce.max_reduce_cuda(x, self.dim)
