// binding.cpp -- infrastructure of the sandbox workspace. DO NOT EDIT.
// Builds the Python module `cuda_extension` from every REGISTER_BINDING in kernels/.
#include <pybind11/pybind11.h>

#include "binding_registry.h"

PYBIND11_MODULE(cuda_extension, m) {
  m.doc() = "kernels of this workspace (see kernels/*_binding.cpp)";
  sandbox_binding::apply_all(m);
}
