import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

sum_reduce_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

// The input is viewed as (outer, R, inner); one thread per output element (o, i) walks the R
// values x[o, :, i]. Neighbouring threads read neighbouring addresses, so loads coalesce.
__global__ void sum_reduce_kernel(const float* x, float* out, long outer, long R, long inner) {
    long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (idx >= outer * inner) return;
    long o = idx / inner;
    long i = idx % inner;
    const float* p = x + o * R * inner + i;
    float sum = 0.0f;
    for (long r = 0; r < R; r++) {
        sum += p[r * inner];
    }
    out[idx] = sum;
}

torch::Tensor sum_reduce_cuda(torch::Tensor x, int64_t dim) {
    x = x.contiguous();
    int64_t nd = x.dim();
    if (dim < 0) dim += nd;
    long outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; d++) outer *= x.size(d);
    for (int64_t d = dim + 1; d < nd; d++) inner *= x.size(d);
    long R = x.size(dim);
    auto sizes = x.sizes().vec();
    sizes[dim] = 1;
    auto out = torch::empty(sizes, x.options());
    long total = outer * inner;
    int threads = 256;
    long blocks = (total + threads - 1) / threads;
    if (blocks > 0)
        sum_reduce_kernel<<<blocks, threads>>>(x.data_ptr<float>(), out.data_ptr<float>(), outer, R, inner);
    return out;
}
"""

sum_reduce_cpp_source = "torch::Tensor sum_reduce_cuda(torch::Tensor x, int64_t dim);"

sum_reduce = load_inline(
    name="kb_l1_47_sum_reduce",
    cpp_sources=sum_reduce_cpp_source,
    cuda_sources=sum_reduce_source,
    functions=["sum_reduce_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim
        self.sum_reduce = sum_reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sum_reduce.sum_reduce_cuda(x, self.dim)
