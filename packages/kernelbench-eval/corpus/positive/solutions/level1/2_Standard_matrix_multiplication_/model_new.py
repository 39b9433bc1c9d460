import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    """C = A @ B through cuBLAS SGEMM (full fp32, no TF32) on torch's handle and stream."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return cuda_extension.sgemm_forward(A, B)
