// out[i] = alpha * sum_k x[i, k] * wsum[k], wsum[k] = sum_j W[j, k].
#include <cuda_runtime.h>

#define TPB 256
#define ROWS_PER_BLOCK 128

// grid-stride over columns; each block handles ROWS_PER_BLOCK rows of W and adds its partial
// column sums into wsum (zeroed by the caller) with one atomicAdd per column
__global__ void colsum_atomic(const float* __restrict__ W, float* __restrict__ wsum, long rows, long cols) {
  long r0 = (long)blockIdx.y * ROWS_PER_BLOCK;
  long r1 = r0 + ROWS_PER_BLOCK < rows ? r0 + ROWS_PER_BLOCK : rows;
  for (long k = blockIdx.x * (long)blockDim.x + threadIdx.x; k < cols; k += (long)gridDim.x * blockDim.x) {
    float s = 0.f;
    for (long r = r0; r < r1; ++r) s += W[r * cols + k];
    atomicAdd(wsum + k, s);
  }
}

// one block per row of x; shared-memory tree reduction
__global__ void gemv_scaled(const float* __restrict__ x, const float* __restrict__ wsum, float* __restrict__ out,
                            long cols, float alpha) {
  __shared__ float red[TPB];
  const float* xr = x + (long)blockIdx.x * cols;
  float s = 0.f;
  for (long k = threadIdx.x; k < cols; k += TPB) s += xr[k] * wsum[k];
  red[threadIdx.x] = s;
  __syncthreads();
  for (int o = TPB / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = red[0] * alpha;
}

extern "C" cudaError_t colsum_gemv_launch(const float* x, const float* W, float* wsum, float* out, long batch,
                                          long in, long hidden, float alpha, cudaStream_t stream) {
  long col_blocks = (in + TPB - 1) / TPB;
  if (col_blocks > 1024) col_blocks = 1024;
  dim3 g1((unsigned)col_blocks, (unsigned)((hidden + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK));
  if (hidden > 0 && in > 0) colsum_atomic<<<g1, TPB, 0, stream>>>(W, wsum, hidden, in);
  if (batch > 0) gemv_scaled<<<(unsigned)batch, TPB, 0, stream>>>(x, wsum, out, in, alpha);
  return cudaGetLastError();
}
