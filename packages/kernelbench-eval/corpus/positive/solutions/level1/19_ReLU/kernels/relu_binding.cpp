#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <c10/cuda/CUDAStream.h>

#include "../binding_registry.h"

extern "C" cudaError_t relu_launch(const float* x, float* y, long n, cudaStream_t stream);

static torch::Tensor relu_forward(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda(), "relu_forward: CUDA tensor expected");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "relu_forward: float32 expected");
  auto xc = x.contiguous();
  auto y = torch::empty_like(xc);
  cudaError_t err = relu_launch(xc.data_ptr<float>(), y.data_ptr<float>(), (long)xc.numel(),
                                c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "relu_forward: ", cudaGetErrorString(err));
  return y;
}

static void register_relu(pybind11::module_& m) {
  m.def("relu_forward", &relu_forward, "ReLU (float32, CUDA)");
}

REGISTER_BINDING(relu, register_relu);
