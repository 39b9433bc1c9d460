#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <c10/cuda/CUDAStream.h>

#include "../binding_registry.h"

extern "C" cudaError_t colsum_gemv_launch(const float* x, const float* W, float* wsum, float* out, long batch,
                                          long in, long hidden, float alpha, cudaStream_t stream);

static torch::Tensor colsum_gemv(torch::Tensor x, torch::Tensor w, double alpha) {
  TORCH_CHECK(x.is_cuda() && w.is_cuda(), "colsum_gemv: CUDA tensors expected");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && w.scalar_type() == torch::kFloat32, "float32 expected");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "colsum_gemv: shape mismatch");
  x = x.contiguous();
  w = w.contiguous();
  auto wsum = torch::zeros({w.size(1)}, w.options());
  auto out = torch::empty({x.size(0), 1}, x.options());
  auto err = colsum_gemv_launch(x.data_ptr<float>(), w.data_ptr<float>(), wsum.data_ptr<float>(),
                                out.data_ptr<float>(), x.size(0), x.size(1), w.size(0), (float)alpha,
                                c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "colsum_gemv: ", cudaGetErrorString(err));
  return out;
}

static void register_colsum_gemv(pybind11::module_& m) { m.def("colsum_gemv", &colsum_gemv); }

REGISTER_BINDING(colsum_gemv, register_colsum_gemv);
