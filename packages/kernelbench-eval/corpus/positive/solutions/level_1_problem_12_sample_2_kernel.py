import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

// One block per row: the diagonal entry is read once into a register and the row of B is
// scaled by it (diag(A) @ B without materialising diag(A)).
__global__ void scale_rows_kernel(const float* __restrict__ diag, const float* __restrict__ B,
                                  float* __restrict__ out, int rows, int cols) {
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        float d = diag[r];
        const float* b_row = B + (size_t)r * cols;
        float* o_row = out + (size_t)r * cols;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            o_row[c] = d * b_row[c];
        }
    }
}

torch::Tensor scale_rows(torch::Tensor diag, torch::Tensor B) {
    auto d = diag.contiguous();
    auto b = B.contiguous();
    int rows = b.size(0);
    int cols = b.size(1);
    auto out = torch::empty({rows, cols}, b.options());
    int blocks = rows < 65535 ? rows : 65535;
    if (blocks > 0) {
        scale_rows_kernel<<<blocks, 512>>>(d.data_ptr<float>(), b.data_ptr<float>(),
                                          out.data_ptr<float>(), rows, cols);
    }
    return out;
}
"""

cpp_source = "torch::Tensor scale_rows(torch::Tensor diag, torch::Tensor B);"

scale_rows = load_inline(
    name="kb_l1_12_scale_rows",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["scale_rows"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, A, B):
        return scale_rows.scale_rows(A, B)
