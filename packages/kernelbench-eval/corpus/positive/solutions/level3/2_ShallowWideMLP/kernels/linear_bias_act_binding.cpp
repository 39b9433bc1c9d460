#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

#include "../binding_registry.h"

extern "C" int linear_bias_act_launch(cublasHandle_t h, const float* x, const float* w, const float* b, float* y,
                                      int M, int N, int K, int relu, cudaStream_t stream);

static torch::Tensor linear_bias_act(torch::Tensor x, torch::Tensor w, torch::Tensor b, bool relu) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA input expected");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) && b.numel() == w.size(0), "shape mismatch");
  x = x.contiguous();
  w = w.contiguous();
  b = b.contiguous();
  auto y = torch::empty({x.size(0), w.size(0)}, x.options());
  int rc = linear_bias_act_launch(at::cuda::getCurrentCUDABlasHandle(), x.data_ptr<float>(), w.data_ptr<float>(),
                                  b.data_ptr<float>(), y.data_ptr<float>(), x.size(0), w.size(0), x.size(1),
                                  relu ? 1 : 0, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(rc == 0, "linear_bias_act failed: ", rc);
  return y;
}

static void register_linear_bias_act(pybind11::module_& m) { m.def("linear_bias_act", &linear_bias_act); }

REGISTER_BINDING(linear_bias_act, register_linear_bias_act);
