import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

hinge_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

#define THREADS 256
#define NUM_BLOCKS 2048

// mean(clamp(1 - predictions * targets, min=0)) where targets (D,) broadcasts over the last
// dimension of predictions (N, D): element (i, j) uses targets[j].
__global__ void hinge_partial_kernel(const float* pred, const float* targ, float* partial, long n, long d) {
    __shared__ float cache[THREADS];
    float sum = 0.0f;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)blockDim.x * gridDim.x) {
        float v = 1.0f - pred[i] * targ[i % d];
        sum += v > 0.0f ? v : 0.0f;
    }
    cache[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) cache[threadIdx.x] += cache[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = cache[0];
}

__global__ void hinge_final_kernel(const float* partial, float* out, int parts, long n) {
    __shared__ float cache[THREADS];
    float sum = 0.0f;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) sum += partial[i];
    cache[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) cache[threadIdx.x] += cache[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = cache[0] / (float)n;
}

torch::Tensor hinge_loss_cuda(torch::Tensor predictions, torch::Tensor targets) {
    auto pred = predictions.contiguous();
    auto targ = targets.contiguous();
    long n = pred.numel();
    long d = targ.numel();
    auto partial = torch::empty({NUM_BLOCKS}, pred.options());
    auto out = torch::empty({}, pred.options());
    hinge_partial_kernel<<<NUM_BLOCKS, THREADS>>>(pred.data_ptr<float>(), targ.data_ptr<float>(),
                                                  partial.data_ptr<float>(), n, d);
    hinge_final_kernel<<<1, THREADS>>>(partial.data_ptr<float>(), out.data_ptr<float>(), NUM_BLOCKS, n);
    return out;
}
"""

hinge_cpp_source = "torch::Tensor hinge_loss_cuda(torch::Tensor predictions, torch::Tensor targets);"

hinge = load_inline(
    name="kb_l1_100_hinge_loss",
    cpp_sources=hinge_cpp_source,
    cuda_sources=hinge_source,
    functions=["hinge_loss_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()
        self.hinge = hinge

    def forward(self, predictions, targets):
        return self.hinge.hinge_loss_cuda(predictions, targets)
