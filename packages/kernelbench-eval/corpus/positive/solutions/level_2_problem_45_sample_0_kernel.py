import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Two cuBLAS SGEMMs. After the first, a float4 epilogue adds the bias and applies the sigmoid in
# place; after the second, one warp per row adds the bias and reduces logsumexp with shuffles
# (online max / rescaled sum, a single pass over the row).
cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>
#include <cfloat>

__global__ void bias_sigmoid_vec4(float4* __restrict__ h, const float4* __restrict__ bias, long total4, long n4) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= total4) return;
    float4 v = h[i], b = bias[i % n4];
    v.x = 1.f / (1.f + expf(-(v.x + b.x)));
    v.y = 1.f / (1.f + expf(-(v.y + b.y)));
    v.z = 1.f / (1.f + expf(-(v.z + b.z)));
    v.w = 1.f / (1.f + expf(-(v.w + b.w)));
    h[i] = v;
}

__global__ void bias_sigmoid(float* __restrict__ h, const float* __restrict__ bias, long total, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < total) h[i] = 1.f / (1.f + expf(-(h[i] + bias[i % n])));
}

__global__ void row_logsumexp(const float* __restrict__ z, const float* __restrict__ bias, float* __restrict__ out,
                              int rows, int N) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* r = z + (long)row * N;
    float m = -FLT_MAX, s = 0.f;
    for (int j = lane; j < N; j += 32) {
        float v = r[j] + bias[j];
        if (v > m) { s = s * expf(m - v) + 1.f; m = v; }
        else s += expf(v - m);
    }
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffff, m, o);
        float s2 = __shfl_xor_sync(0xffffffff, s, o);
        float mm = fmaxf(m, m2);
        s = s * expf(m - mm) + s2 * expf(m2 - mm);
        m = mm;
    }
    if (lane == 0) out[row] = m + logf(s);
}

static void linear_nobias(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& y) {
    int M = x.size(0), K = x.size(1), N = w.size(0);
    const float one = 1.f, zero = 0.f;
    cublasSgemm(at::cuda::getCurrentCUDABlasHandle(), CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one,
                w.data_ptr<float>(), K, x.data_ptr<float>(), K, &zero, y.data_ptr<float>(), N);
}

torch::Tensor gemm_sigmoid_gemm_lse(torch::Tensor x, torch::Tensor w1, torch::Tensor b1,
                                    torch::Tensor w2, torch::Tensor b2) {
    x = x.contiguous(); w1 = w1.contiguous(); w2 = w2.contiguous();
    long M = x.size(0), H = w1.size(0), O = w2.size(0);
    auto h = torch::empty({M, H}, x.options());
    auto z = torch::empty({M, O}, x.options());
    auto out = torch::empty({M}, x.options());
    auto stream = at::cuda::getCurrentCUDAStream();
    linear_nobias(x, w1, h);
    if (M * H > 0) {
        if (H % 4 == 0) {
            long t4 = M * H / 4;
            bias_sigmoid_vec4<<<(t4 + 255) / 256, 256, 0, stream>>>(
                reinterpret_cast<float4*>(h.data_ptr<float>()), reinterpret_cast<const float4*>(b1.data_ptr<float>()), t4, H / 4);
        } else {
            bias_sigmoid<<<(M * H + 255) / 256, 256, 0, stream>>>(h.data_ptr<float>(), b1.data_ptr<float>(), M * H, H);
        }
    }
    linear_nobias(h, w2, z);
    if (M > 0)
        row_logsumexp<<<(M + 7) / 8, 256, 0, stream>>>(z.data_ptr<float>(), b2.data_ptr<float>(), out.data_ptr<float>(), M, O);
    return out;
}
"""

cpp_source = """torch::Tensor gemm_sigmoid_gemm_lse(torch::Tensor x, torch::Tensor w1, torch::Tensor b1,
                                    torch::Tensor w2, torch::Tensor b2);"""

gemm_sigmoid_gemm_lse = load_inline(
    name="gemm_sigmoid_gemm_lse",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gemm_sigmoid_gemm_lse"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super(ModelNew, self).__init__()
        self.linear1 = nn.Linear(input_size, hidden_size)
        self.linear2 = nn.Linear(hidden_size, output_size)

    def forward(self, x):
        return gemm_sigmoid_gemm_lse.gemm_sigmoid_gemm_lse(
            x, self.linear1.weight, self.linear1.bias, self.linear2.weight, self.linear2.bias
        )
