// sandbox_prelude.h -- infrastructure: force-included (and precompiled) before every binding.
// Gives torch::Tensor, pybind11 (alias `py`) and, on the cuda backend, the CUDA runtime and the
// current-stream helpers. Your bindings may include these headers again; it costs nothing.
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#ifdef SANDBOX_CUDA
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#endif
