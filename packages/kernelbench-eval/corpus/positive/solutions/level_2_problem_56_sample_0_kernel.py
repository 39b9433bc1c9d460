import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# 128 x 32768 x 32768 (a 4.3 GB weight): cuBLAS SGEMM, then one block per row adds the bias,
# applies the sigmoid and sums the row; warp-shuffle partial sums, one shared slot per warp.
cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>

__global__ void sigmoid_row_sum(const float* __restrict__ y, const float* __restrict__ bias, float* __restrict__ out, long N) {
    __shared__ float part[32];
    const float* row = y + blockIdx.x * N;
    float s = 0.f;
    for (long j = threadIdx.x; j < N; j += blockDim.x) s += 1.f / (1.f + expf(-(row[j] + bias[j])));
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffff, s, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.f;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffff, s, o);
        if (lane == 0) out[blockIdx.x] = s;
    }
}

torch::Tensor linear_sigmoid_sum(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    x = x.contiguous();
    w = w.contiguous();
    long M = x.size(0), K = x.size(1), N = w.size(0);
    auto y = torch::empty({M, N}, x.options());
    auto out = torch::empty({M, 1}, x.options());
    const float one = 1.f, zero = 0.f;
    cublasSgemm(at::cuda::getCurrentCUDABlasHandle(), CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &one,
                w.data_ptr<float>(), (int)K, x.data_ptr<float>(), (int)K, &zero, y.data_ptr<float>(), (int)N);
    if (M > 0)
        sigmoid_row_sum<<<M, 1024>>>(y.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), N);
    return out;
}
"""

cpp_source = "torch::Tensor linear_sigmoid_sum(torch::Tensor x, torch::Tensor w, torch::Tensor b);"

linear_sigmoid_sum = load_inline(
    name="linear_sigmoid_sum",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["linear_sigmoid_sum"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(input_size, hidden_size)

    def forward(self, x):
        return linear_sigmoid_sum.linear_sigmoid_sum(x, self.linear.weight, self.linear.bias)
