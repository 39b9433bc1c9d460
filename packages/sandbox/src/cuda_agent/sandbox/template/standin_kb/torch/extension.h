// sandbox stand-in for <torch/extension.h> in the main.cpp that load_inline generates
// (infrastructure, not the real header): the Tensor API, ATen operators and factories, pybind11
// with the Tensor casters, and torch::wrap_pybind_function. The real umbrella header adds the C++
// frontend (torch::nn, optim, data, ...), about half of main.cpp's compile time. If the build
// fails with this stand-in, the sandbox builds again with the real header.
#pragma once
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/Exceptions.h>
