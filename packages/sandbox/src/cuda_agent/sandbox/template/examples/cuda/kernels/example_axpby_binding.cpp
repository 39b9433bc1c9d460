// Binding of the worked example: checks arguments, allocates the output (allocation is the
// only torch call allowed here), launches on the current stream, registers the Python name.
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <c10/cuda/CUDAStream.h>

#include "../binding_registry.h"

extern "C" cudaError_t example_axpby_launch(float* out, const float* a, const float* b,
                                            float alpha, float beta, long n,
                                            cudaStream_t stream);

static torch::Tensor example_axpby(torch::Tensor a, torch::Tensor b, double alpha, double beta) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda(), "example_axpby: inputs must be CUDA tensors");
  TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32,
              "example_axpby: inputs must be float32");
  TORCH_CHECK(a.sizes() == b.sizes(), "example_axpby: shapes differ");
  a = a.contiguous();
  b = b.contiguous();
  auto out = torch::empty_like(a);
  auto stream = c10::cuda::getCurrentCUDAStream().stream();
  cudaError_t err = example_axpby_launch(out.data_ptr<float>(), a.data_ptr<float>(),
                                         b.data_ptr<float>(), (float)alpha, (float)beta,
                                         (long)a.numel(), stream);
  TORCH_CHECK(err == cudaSuccess, "example_axpby: launch failed: ", cudaGetErrorString(err));
  return out;
}

static void register_example_axpby(pybind11::module_& m) {
  m.def("example_axpby", &example_axpby, "alpha * a + beta * b", py::arg("a"), py::arg("b"),
        py::arg("alpha") = 1.0, py::arg("beta") = 1.0);
}

REGISTER_BINDING(example_axpby, register_example_axpby);
