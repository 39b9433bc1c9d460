#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <c10/cuda/CUDAStream.h>

#include "../binding_registry.h"

extern "C" cudaError_t linear_act_launch(const float* x, const float* w, const float* b, float* y, int M, int N,
                                         int K, int relu, cudaStream_t stream);

static torch::Tensor linear_act(torch::Tensor x, torch::Tensor w, torch::Tensor b, bool relu) {
  TORCH_CHECK(x.is_cuda() && w.is_cuda() && b.is_cuda(), "linear_act: CUDA tensors expected");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "linear_act: float32 expected");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) && b.numel() == w.size(0),
              "linear_act: shape mismatch");
  x = x.contiguous();
  w = w.contiguous();
  b = b.contiguous();
  auto y = torch::empty({x.size(0), w.size(0)}, x.options());
  auto err = linear_act_launch(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(),
                               x.size(0), w.size(0), x.size(1), relu ? 1 : 0,
                               c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "linear_act: ", cudaGetErrorString(err));
  return y;
}

static void register_linear_act(pybind11::module_& m) { m.def("linear_act", &linear_act); }

REGISTER_BINDING(linear_act, register_linear_act);
