#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

#include "../binding_registry.h"

extern "C" int sgemm_launch(cublasHandle_t handle, const float* a, const float* b, float* c,
                            int M, int N, int K, cudaStream_t stream);

static torch::Tensor sgemm_forward(torch::Tensor a, torch::Tensor b) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda(), "sgemm_forward: CUDA tensors expected");
  TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32,
              "sgemm_forward: float32 expected");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0),
              "sgemm_forward: shapes do not chain");
  auto ac = a.contiguous();
  auto bc = b.contiguous();
  int M = (int)ac.size(0), K = (int)ac.size(1), N = (int)bc.size(1);
  auto c = torch::empty({M, N}, ac.options());
  if (M == 0 || N == 0) return c;
  int st = sgemm_launch(at::cuda::getCurrentCUDABlasHandle(), ac.data_ptr<float>(),
                        bc.data_ptr<float>(), c.data_ptr<float>(), M, N, K,
                        c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(st == 0, "sgemm_forward: cuBLAS status ", st);
  return c;
}

static void register_sgemm(pybind11::module_& m) {
  m.def("sgemm_forward", &sgemm_forward, "A @ B (float32, cuBLAS)");
}

REGISTER_BINDING(sgemm, register_sgemm);
