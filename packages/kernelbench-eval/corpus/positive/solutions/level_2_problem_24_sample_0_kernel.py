import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Fully custom: direct 3D convolution (stride 1, no padding, as nn.Conv3d(in, out, k) builds it)
# fused with the min over depth and the softmax over channels. One thread per (batch, h, w)
# output position walks the depth, keeps all output channels' accumulators and running minima in
# registers, and reads the weights as float4 broadcasts from shared memory (transposed so the
# channels are contiguous). The 5-D convolution output is never written to memory.
cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define MAX_OC 32

__global__ void __launch_bounds__(128)
conv3d_min_softmax_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                          float* __restrict__ out, int B, int C, int D, int H, int W, int OC, int KS) {
    extern __shared__ float4 ws4[];
    float* ws = reinterpret_cast<float*>(ws4);
    const int taps = C * KS * KS * KS;
    // ws[tap * MAX_OC + oc] = w[oc][tap], zero-padded to MAX_OC channels
    for (int i = threadIdx.x; i < taps * MAX_OC; i += blockDim.x) {
        int tap = i / MAX_OC, oc = i % MAX_OC;
        ws[i] = oc < OC ? w[(long)oc * taps + tap] : 0.f;
    }
    __syncthreads();

    const int Do = D - KS + 1, Ho = H - KS + 1, Wo = W - KS + 1;
    long pos = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (pos >= (long)B * Ho * Wo) return;
    const int ow = pos % Wo;
    const int oh = (pos / Wo) % Ho;
    const int b = pos / ((long)Wo * Ho);
    const int oc4 = (OC + 3) / 4;

    float mn[MAX_OC];
#pragma unroll
    for (int o = 0; o < MAX_OC; ++o) mn[o] = 3.402823466e38f;

    for (int d = 0; d < Do; ++d) {
        float acc[MAX_OC];
#pragma unroll
        for (int o = 0; o < MAX_OC; ++o) acc[o] = 0.f;
        int tap = 0;
        for (int c = 0; c < C; ++c)
            for (int kd = 0; kd < KS; ++kd)
                for (int kh = 0; kh < KS; ++kh) {
                    const float* xr = x + ((((long)b * C + c) * D + d + kd) * H + oh + kh) * W + ow;
                    for (int kw = 0; kw < KS; ++kw, ++tap) {
                        float xv = __ldg(xr + kw);
                        const float4* wt = ws4 + tap * (MAX_OC / 4);
#pragma unroll
                        for (int q = 0; q < MAX_OC / 4; ++q) {
                            if (q < oc4) {
                                float4 wv = wt[q];
                                acc[4 * q + 0] = fmaf(wv.x, xv, acc[4 * q + 0]);
                                acc[4 * q + 1] = fmaf(wv.y, xv, acc[4 * q + 1]);
                                acc[4 * q + 2] = fmaf(wv.z, xv, acc[4 * q + 2]);
                                acc[4 * q + 3] = fmaf(wv.w, xv, acc[4 * q + 3]);
                            }
                        }
                    }
                }
#pragma unroll
        for (int o = 0; o < MAX_OC; ++o) mn[o] = fminf(mn[o], acc[o]);
    }
    // the bias is constant along depth, so it commutes with the min
    float m = -3.402823466e38f;
#pragma unroll
    for (int o = 0; o < MAX_OC; ++o)
        if (o < OC) { mn[o] += bias[o]; m = fmaxf(m, mn[o]); }
    float s = 0.f;
#pragma unroll
    for (int o = 0; o < MAX_OC; ++o)
        if (o < OC) { mn[o] = expf(mn[o] - m); s += mn[o]; }
    float inv = 1.f / s;
    const long plane = (long)Ho * Wo;
    float* op = out + (long)b * OC * plane + (long)oh * Wo + ow;
#pragma unroll
    for (int o = 0; o < MAX_OC; ++o)
        if (o < OC) op[o * plane] = mn[o] * inv;
}

torch::Tensor conv3d_min_softmax(torch::Tensor x, torch::Tensor w, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.dim() == 5, "float32 CUDA NCDHW input expected");
    x = x.contiguous();
    w = w.contiguous();
    int B = x.size(0), C = x.size(1), D = x.size(2), H = x.size(3), W = x.size(4);
    int OC = w.size(0), KS = w.size(2);
    TORCH_CHECK(w.size(1) == C && w.size(3) == KS && w.size(4) == KS, "cubic kernel expected");
    TORCH_CHECK(OC <= MAX_OC, "at most 32 output channels");
    size_t smem = (size_t)C * KS * KS * KS * MAX_OC * sizeof(float);
    TORCH_CHECK(smem <= 48 * 1024, "weights do not fit in shared memory");
    int Ho = H - KS + 1, Wo = W - KS + 1;
    auto out = torch::empty({B, OC, Ho, Wo}, x.options());
    long n = (long)B * Ho * Wo;
    if (n == 0) return out;
    conv3d_min_softmax_kernel<<<(n + 127) / 128, 128, smem, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(), B, C, D, H, W, OC, KS);
    return out;
}
"""

cpp_source = "torch::Tensor conv3d_min_softmax(torch::Tensor x, torch::Tensor w, torch::Tensor bias);"

conv3d_min_softmax = load_inline(
    name="conv3d_min_softmax",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["conv3d_min_softmax"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dim):
        super(ModelNew, self).__init__()
        if dim != 2:
            raise ValueError("this kernel fuses the min over the depth dimension (dim=2)")
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.dim = dim

    def forward(self, x):
        return conv3d_min_softmax.conv3d_min_softmax(x, self.conv.weight, self.conv.bias)
