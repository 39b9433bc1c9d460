// y = max(x, 0): float4 loads/stores over the bulk, a scalar loop for the tail, grid-stride.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void relu_vec4_kernel(const float4* __restrict__ x, float4* __restrict__ y, long n4) {
  long stride = (long)gridDim.x * blockDim.x;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 v = x[i];
    v.x = fmaxf(v.x, 0.f);
    v.y = fmaxf(v.y, 0.f);
    v.z = fmaxf(v.z, 0.f);
    v.w = fmaxf(v.w, 0.f);
    y[i] = v;
  }
}

__global__ void relu_tail_kernel(const float* __restrict__ x, float* __restrict__ y, long start,
                                 long n) {
  long i = start + blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaxf(x[i], 0.f);
}

extern "C" cudaError_t relu_launch(const float* x, float* y, long n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  bool aligned = (((uintptr_t)x | (uintptr_t)y) & 15) == 0;
  long n4 = aligned ? n / 4 : 0;
  if (n4 > 0) {
    long blocks = (n4 + threads - 1) / threads;
    if (blocks > 132 * 32) blocks = 132 * 32;
    relu_vec4_kernel<<<(unsigned)blocks, threads, 0, stream>>>(
        reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y), n4);
  }
  long done = n4 * 4;
  if (done < n) {
    long rest = n - done;
    relu_tail_kernel<<<(unsigned)((rest + threads - 1) / threads), threads, 0, stream>>>(x, y, done, n);
  }
  return cudaGetLastError();
}
