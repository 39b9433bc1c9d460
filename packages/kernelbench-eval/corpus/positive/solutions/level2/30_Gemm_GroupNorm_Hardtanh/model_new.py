import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    """cuBLAS SGEMM, then one fused kernel: bias, GroupNorm (two-pass mean / variance per
    (row, group), warp-shuffle reductions) and Hardtanh. The layers are kept as parameter holders
    so the reference's state_dict loads under the same names."""

    def __init__(self, in_features, out_features, num_groups, hardtanh_min, hardtanh_max):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)
        self.hardtanh_min = hardtanh_min
        self.hardtanh_max = hardtanh_max

    def forward(self, x):
        gn = self.group_norm
        return cuda_extension.gemm_groupnorm_hardtanh(
            x, self.gemm.weight, self.gemm.bias, gn.weight, gn.bias, gn.num_groups, gn.eps,
            self.hardtanh_min, self.hardtanh_max,
        )
