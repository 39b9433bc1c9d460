// log_softmax along rows. Pass 1: each thread keeps a running max and sum of exp(x - max)
// (online), merged across the block with warp shuffles and shared memory. Pass 2 writes
// x - max - log(sum).
#include <cuda_runtime.h>
#include <math.h>

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

struct MaxSum {
  float m;
  float s;
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  if (b.m == -INFINITY) return a;
  if (a.m == -INFINITY) return b;
  float m = fmaxf(a.m, b.m);
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ MaxSum warp_combine(MaxSum v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    MaxSum o;
    o.m = __shfl_down_sync(0xffffffffu, v.m, off);
    o.s = __shfl_down_sync(0xffffffffu, v.s, off);
    v = combine(v, o);
  }
  return v;
}

__global__ void __launch_bounds__(kThreads)
    log_softmax_kernel(const float* __restrict__ x, float* __restrict__ y, long cols) {
  __shared__ MaxSum partial[kWarps];
  __shared__ float shift;
  const float* xr = x + (size_t)blockIdx.x * cols;
  float* yr = y + (size_t)blockIdx.x * cols;

  MaxSum acc = {-INFINITY, 0.f};
  for (long c = threadIdx.x; c < cols; c += kThreads) {
    float v = xr[c];
    if (v > acc.m) {
      acc.s = acc.s * expf(acc.m - v) + 1.f;
      acc.m = v;
    } else {
      acc.s += expf(v - acc.m);
    }
  }
  acc = warp_combine(acc);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    MaxSum v = lane < kWarps ? partial[lane] : MaxSum{-INFINITY, 0.f};
    v = warp_combine(v);
    if (lane == 0) shift = v.m + logf(v.s);
  }
  __syncthreads();
  float sh = shift;
  for (long c = threadIdx.x; c < cols; c += kThreads) yr[c] = xr[c] - sh;
}

extern "C" cudaError_t log_softmax_launch(const float* x, float* y, long rows, long cols,
                                          cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  log_softmax_kernel<<<(unsigned)rows, kThreads, 0, stream>>>(x, y, cols);
  return cudaGetLastError();
}
