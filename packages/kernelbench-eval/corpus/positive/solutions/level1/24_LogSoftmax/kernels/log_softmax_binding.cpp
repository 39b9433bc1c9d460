#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <c10/cuda/CUDAStream.h>

#include "../binding_registry.h"

extern "C" cudaError_t log_softmax_launch(const float* x, float* y, long rows, long cols,
                                          cudaStream_t stream);

static torch::Tensor log_softmax_forward(torch::Tensor x, int64_t dim) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
  TORCH_CHECK(x.dim() == 2 && (dim == 1 || dim == -1), "log_softmax_forward: rows of a 2D input");
  auto xc = x.contiguous();
  auto y = torch::empty_like(xc);
  cudaError_t err = log_softmax_launch(xc.data_ptr<float>(), y.data_ptr<float>(), xc.size(0),
                                       xc.size(1), c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "log_softmax_forward: ", cudaGetErrorString(err));
  return y;
}

static void register_log_softmax(pybind11::module_& m) {
  m.def("log_softmax_forward", &log_softmax_forward, "log_softmax over rows (float32, CUDA)",
        py::arg("x"), py::arg("dim") = 1);
}

REGISTER_BINDING(log_softmax, register_log_softmax);
