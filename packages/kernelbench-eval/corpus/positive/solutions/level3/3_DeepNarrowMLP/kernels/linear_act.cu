// y = act(x W^T + b), x [M, K], W [N, K] (both K-contiguous). 64x64 output tile per block,
// BK = 16 slices of both operands staged k-major in shared memory, 4x4 outputs per thread.
#include <cuda_runtime.h>

#define BM 64
#define BN 64
#define BK 16

template <bool RELU>
__global__ void __launch_bounds__(256) linear_act_kernel(const float* __restrict__ X, const float* __restrict__ Wt,
                                                         const float* __restrict__ bias, float* __restrict__ Y,
                                                         int M, int N, int K) {
  __shared__ float As[BK][BM + 4];
  __shared__ float Bs[BK][BN + 4];
  const int t = threadIdx.x, tx = t % 16, ty = t / 16;
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  const int lrow = t / 4, lk = (t % 4) * 4;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int k = k0 + lk + i;
      int r = row0 + lrow, c = col0 + lrow;
      As[lk + i][lrow] = (r < M && k < K) ? X[(long)r * K + k] : 0.f;
      Bs[lk + i][lrow] = (c < N && k < K) ? Wt[(long)c * K + k] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int r = row0 + ty + 16 * i;
    if (r >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int c = col0 + tx + 16 * j;
      if (c >= N) continue;
      float v = acc[i][j] + bias[c];
      Y[(long)r * N + c] = RELU ? fmaxf(v, 0.f) : v;
    }
  }
}

extern "C" cudaError_t linear_act_launch(const float* x, const float* w, const float* b, float* y, int M, int N,
                                         int K, int relu, cudaStream_t stream) {
  if (M == 0 || N == 0) return cudaSuccess;
  dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
  if (relu) linear_act_kernel<true><<<grid, 256, 0, stream>>>(x, w, b, y, M, N, K);
  else linear_act_kernel<false><<<grid, 256, 0, stream>>>(x, w, b, y, M, N, K);
  return cudaGetLastError();
}
