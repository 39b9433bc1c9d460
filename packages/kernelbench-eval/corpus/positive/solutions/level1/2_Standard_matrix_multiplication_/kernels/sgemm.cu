// Row-major C[M,N] = A[M,K] B[K,N] with cuBLAS, which is column-major: C^T = B^T A^T, so the
// call passes B first and swaps M and N.
#include <cuda_runtime.h>
#include <cublas_v2.h>

extern "C" int sgemm_launch(cublasHandle_t handle, const float* a, const float* b, float* c,
                            int M, int N, int K, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t st = cublasSetStream(handle, stream);
  if (st != CUBLAS_STATUS_SUCCESS) return (int)st;
  st = cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);  // plain fp32 FMA, no TF32
  if (st != CUBLAS_STATUS_SUCCESS) return (int)st;
  st = cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &alpha, b, N, a, K, &beta, c, N);
  return (int)st;
}
