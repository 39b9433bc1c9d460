// y = act(x W^T + b): cuBLAS SGEMM (column-major trick: y^T = W x^T), then a float4 epilogue.
#include <cuda_runtime.h>
#include <cublas_v2.h>

template <bool RELU>
__global__ void bias_act4(float4* __restrict__ y, const float4* __restrict__ b, long n4_total, long n4_row) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4_total; i += (long)gridDim.x * blockDim.x) {
    float4 v = y[i], c = b[i % n4_row];
    v.x += c.x; v.y += c.y; v.z += c.z; v.w += c.w;
    if (RELU) { v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f); }
    y[i] = v;
  }
}

template <bool RELU>
__global__ void bias_act1(float* __restrict__ y, const float* __restrict__ b, long total, long n_row) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
    float v = y[i] + b[i % n_row];
    y[i] = RELU ? fmaxf(v, 0.f) : v;
  }
}

extern "C" int linear_bias_act_launch(cublasHandle_t h, const float* x, const float* w, const float* b, float* y,
                                      int M, int N, int K, int relu, cudaStream_t stream) {
  const float one = 1.f, zero = 0.f;
  cublasSetStream(h, stream);
  cublasStatus_t st = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w, K, x, K, &zero, y, N);
  if (st != CUBLAS_STATUS_SUCCESS) return 1000 + (int)st;
  long total = (long)M * N;
  if (total == 0) return 0;
  const int threads = 256, blocks = 132 * 16;
  if (N % 4 == 0) {
    auto y4 = reinterpret_cast<float4*>(y);
    auto b4 = reinterpret_cast<const float4*>(b);
    if (relu) bias_act4<true><<<blocks, threads, 0, stream>>>(y4, b4, total / 4, N / 4);
    else bias_act4<false><<<blocks, threads, 0, stream>>>(y4, b4, total / 4, N / 4);
  } else {
    if (relu) bias_act1<true><<<blocks, threads, 0, stream>>>(y, b, total, N);
    else bias_act1<false><<<blocks, threads, 0, stream>>>(y, b, total, N);
  }
  return (int)cudaGetLastError();
}
