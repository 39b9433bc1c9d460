// CUDA kernels of the GPU adversarial tests: one honest elementwise kernel and the hacks that need
// a GPU (side stream, persisting L2, a kernel that writes nothing). Built by nvcc into a pybind11
// module without torch headers (fast); tensors are passed as raw pointers, streams as integers.
#include <pybind11/pybind11.h>
#include <cuda_runtime.h>
#include <cstdint>

using P = std::uintptr_t;

__global__ void guards_relu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

__global__ void guards_slow_relu_kernel(const float* __restrict__ x, float* __restrict__ y, long n, long long spin) {
    long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

__global__ void guards_touch_kernel(float* y, long n) { (void)y; (void)n; }

static int blocks(long n) { return (int)((n + 255) / 256); }

static void relu(P out, P in, long n, P stream) {
    guards_relu_kernel<<<blocks(n), 256, 0, (cudaStream_t)stream>>>((const float*)in, (float*)out, n);
}

static void relu_side(P out, P in, long n) {
    static cudaStream_t side = nullptr;
    if (side == nullptr) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    guards_slow_relu_kernel<<<blocks(n), 256, 0, side>>>((const float*)in, (float*)out, n, 20000000LL);
}

static void relu_l2(P out, P in, long n, P stream) {
    cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 16 << 20);
    cudaStreamAttrValue attr = {};
    attr.accessPolicyWindow.base_ptr = (void*)in;
    attr.accessPolicyWindow.num_bytes = n * sizeof(float);
    attr.accessPolicyWindow.hitRatio = 1.0f;
    attr.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    attr.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    cudaStreamSetAttribute((cudaStream_t)stream, cudaStreamAttributeAccessPolicyWindow, &attr);
    relu(out, in, n, stream);
}

static void reset_l2(P stream) {
    cudaStreamAttrValue attr = {};
    attr.accessPolicyWindow.num_bytes = 0;
    cudaStreamSetAttribute((cudaStream_t)stream, cudaStreamAttributeAccessPolicyWindow, &attr);
    cudaCtxResetPersistingL2Cache();
    cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0);
}

static void touch(P out, long n, P stream) {
    guards_touch_kernel<<<1, 32, 0, (cudaStream_t)stream>>>((float*)out, n);
}

PYBIND11_MODULE(guards_cuda_kernels, m) {
    m.def("relu", &relu);
    m.def("relu_side", &relu_side);
    m.def("relu_l2", &relu_l2);
    m.def("reset_l2", &reset_l2);
    m.def("touch", &touch);
}
