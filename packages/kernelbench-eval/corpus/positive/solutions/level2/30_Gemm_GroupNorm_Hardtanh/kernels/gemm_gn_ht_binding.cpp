#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

#include "../binding_registry.h"

extern "C" int gemm_gn_ht_launch(cublasHandle_t handle, const float* x, const float* w, const float* b,
                                 const float* gamma, const float* beta, float* y, int M, int N, int K,
                                 int groups, float eps, float lo, float hi, cudaStream_t stream);

static torch::Tensor gemm_groupnorm_hardtanh(torch::Tensor x, torch::Tensor w, torch::Tensor b,
                                             torch::Tensor gamma, torch::Tensor beta, int64_t groups,
                                             double eps, double lo, double hi) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA input expected");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "shape mismatch");
  TORCH_CHECK(w.size(0) % groups == 0, "features must divide into groups");
  x = x.contiguous();
  w = w.contiguous();
  auto y = torch::empty({x.size(0), w.size(0)}, x.options());
  int rc = gemm_gn_ht_launch(at::cuda::getCurrentCUDABlasHandle(), x.data_ptr<float>(), w.data_ptr<float>(),
                             b.contiguous().data_ptr<float>(), gamma.contiguous().data_ptr<float>(),
                             beta.contiguous().data_ptr<float>(), y.data_ptr<float>(), x.size(0), w.size(0),
                             x.size(1), groups, (float)eps, (float)lo, (float)hi,
                             c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(rc == 0, "gemm_groupnorm_hardtanh failed: ", rc);
  return y;
}

static void register_gemm_gn_ht(pybind11::module_& m) {
  m.def("gemm_groupnorm_hardtanh", &gemm_groupnorm_hardtanh);
}

REGISTER_BINDING(gemm_gn_ht, register_gemm_gn_ht);
