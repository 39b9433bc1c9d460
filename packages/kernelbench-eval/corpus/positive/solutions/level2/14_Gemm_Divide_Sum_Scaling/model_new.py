import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """sum_j (x W^T / 2)[i, j] * s = (s / 2) * x[i] . colsum(W): column sums of W, then a GEMV.

    The GEMM is never formed; the result is exact for any x and W (only the summation order
    differs). The column sums are recomputed every call from the current weight.
    """

    def __init__(self, input_size, hidden_size, scaling_factor):
        super(ModelNew, self).__init__()
        self.weight = nn.Parameter(torch.randn(hidden_size, input_size))
        self.scaling_factor = scaling_factor

    def forward(self, x):
        return cuda_extension.colsum_gemv(x, self.weight, self.scaling_factor * 0.5)
