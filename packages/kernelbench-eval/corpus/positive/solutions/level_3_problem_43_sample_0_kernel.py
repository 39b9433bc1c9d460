import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Causal self-attention with cuBLAS for the four matrix products (plain fp32, torch's handle) and
# custom kernels for everything between them:
#   split_heads   : QKV bias add + (B, T, 3C) -> three (B, nh, T, hs) tensors
#   (strided-batched SGEMM: S = Q K^T / sqrt(hs), the scale folded into alpha)
#   masked_softmax: one warp per row, the mask read from the model's own `bias` buffer, warp-shuffle
#                   max and sum, in place
#   (strided-batched SGEMM: Y = P V)
#   merge_heads   : (B, nh, T, hs) -> (B, T, C)
#   (SGEMM + bias_add for c_proj)
# Dropout probabilities are 0 in this task and the model runs in eval mode: identity.
cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>

__global__ void split_heads(const float* __restrict__ qkv, const float* __restrict__ bias, float* __restrict__ q,
                            float* __restrict__ k, float* __restrict__ v, int B, int T, int nh, int hs) {
    const int C = nh * hs;
    long total = (long)B * T * 3 * C;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        int col = i % (3 * C);
        long bt = i / (3 * C);
        int t = bt % T, b = bt / T;
        int which = col / C, c = col % C, h = c / hs, d = c % hs;
        float val = qkv[i] + bias[col];
        long dst = (((long)b * nh + h) * T + t) * hs + d;
        (which == 0 ? q : which == 1 ? k : v)[dst] = val;
    }
}

__global__ void masked_softmax(float* __restrict__ s, const float* __restrict__ mask, int mask_ld, long rows, int T) {
    long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    int i = row % T;
    float* r = s + row * T;
    const float* mr = mask + (long)i * mask_ld;
    float m = -INFINITY;
    for (int j = lane; j < T; j += 32) {
        float val = mr[j] == 0.f ? -INFINITY : r[j];
        r[j] = val;
        m = fmaxf(m, val);
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    float sum = 0.f;
    for (int j = lane; j < T; j += 32) {
        float e = expf(r[j] - m);
        r[j] = e;
        sum += e;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
    float inv = 1.f / sum;
    for (int j = lane; j < T; j += 32) r[j] *= inv;
}

__global__ void merge_heads(const float* __restrict__ y, float* __restrict__ out, int B, int T, int nh, int hs) {
    const int C = nh * hs;
    long total = (long)B * T * C;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        int c = i % C;
        long bt = i / C;
        int t = bt % T, b = bt / T, h = c / hs, d = c % hs;
        out[i] = y[(((long)b * nh + h) * T + t) * hs + d];
    }
}

__global__ void bias_add(float* __restrict__ y, const float* __restrict__ bias, long total, int N) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x)
        y[i] += bias[i % N];
}

torch::Tensor causal_attention(torch::Tensor x, torch::Tensor w_attn, torch::Tensor b_attn, torch::Tensor w_proj,
                               torch::Tensor b_proj, torch::Tensor mask, int64_t n_head) {
    x = x.contiguous(); w_attn = w_attn.contiguous(); w_proj = w_proj.contiguous();
    const int B = x.size(0), T = x.size(1), C = x.size(2), nh = (int)n_head, hs = C / nh;
    TORCH_CHECK(C % nh == 0 && w_attn.size(0) == 3 * C && w_attn.size(1) == C, "shape mismatch");
    TORCH_CHECK(mask.dim() == 4 && mask.size(2) >= T && mask.size(3) >= T, "mask smaller than the sequence");
    auto mc = mask.contiguous();
    const int mask_ld = mc.size(3);
    auto opts = x.options();
    const long rows = (long)B * T;
    auto out = torch::empty({B, T, C}, opts);
    if (rows == 0) return out;
    auto qkv = torch::empty({rows, 3 * C}, opts);
    auto q = torch::empty({B, nh, T, hs}, opts);
    auto k = torch::empty({B, nh, T, hs}, opts);
    auto v = torch::empty({B, nh, T, hs}, opts);
    auto att = torch::empty({B, nh, T, T}, opts);
    auto y = torch::empty({B, nh, T, hs}, opts);
    auto ym = torch::empty({B, T, C}, opts);
    auto stream = at::cuda::getCurrentCUDAStream();
    cublasHandle_t h = at::cuda::getCurrentCUDABlasHandle();
    const float one = 1.f, zero = 0.f, scale = 1.f / sqrtf((float)hs);
    cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 3 * C, (int)rows, C, &one, w_attn.data_ptr<float>(), C,
                x.data_ptr<float>(), C, &zero, qkv.data_ptr<float>(), 3 * C);
    split_heads<<<4096, 256, 0, stream>>>(qkv.data_ptr<float>(), b_attn.data_ptr<float>(), q.data_ptr<float>(),
                                          k.data_ptr<float>(), v.data_ptr<float>(), B, T, nh, hs);
    const long tt = (long)T * T, th = (long)T * hs;
    cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &scale, k.data_ptr<float>(), hs, th,
                              q.data_ptr<float>(), hs, th, &zero, att.data_ptr<float>(), T, tt, B * nh);
    long srows = (long)B * nh * T;
    masked_softmax<<<(srows * 32 + 255) / 256, 256, 0, stream>>>(att.data_ptr<float>(), mc.data_ptr<float>(), mask_ld, srows, T);
    cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &one, v.data_ptr<float>(), hs, th,
                              att.data_ptr<float>(), T, tt, &zero, y.data_ptr<float>(), hs, th, B * nh);
    merge_heads<<<4096, 256, 0, stream>>>(y.data_ptr<float>(), ym.data_ptr<float>(), B, T, nh, hs);
    cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, C, (int)rows, C, &one, w_proj.data_ptr<float>(), C,
                ym.data_ptr<float>(), C, &zero, out.data_ptr<float>(), C);
    bias_add<<<4096, 256, 0, stream>>>(out.data_ptr<float>(), b_proj.data_ptr<float>(), rows * C, C);
    return out;
}
"""

cpp_source = """torch::Tensor causal_attention(torch::Tensor x, torch::Tensor w_attn, torch::Tensor b_attn, torch::Tensor w_proj,
                               torch::Tensor b_proj, torch::Tensor mask, int64_t n_head);"""

attn_ext = load_inline(
    name="mingpt_causal_attention",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["causal_attention"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, n_embd, n_head, attn_pdrop, resid_pdrop, max_seqlen):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(attn_pdrop)
        self.resid_dropout = nn.Dropout(resid_pdrop)
        self.register_buffer(
            "bias", torch.tril(torch.ones(max_seqlen, max_seqlen)).view(1, 1, max_seqlen, max_seqlen)
        )
        self.n_head = n_head
        self.n_embd = n_embd
        self.scale = 1.0 / math.sqrt(n_embd // n_head)

    def forward(self, x):
        return attn_ext.causal_attention(
            x, self.c_attn.weight, self.c_attn.bias, self.c_proj.weight, self.c_proj.bias, self.bias, self.n_head
        )
