import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    """log_softmax over the last dimension of a 2D input: one block per row (kernels/)."""

    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.log_softmax_forward(x, self.dim)
