// binding_registry.h -- infrastructure of the sandbox workspace. DO NOT EDIT (read-only; the
// evaluator always uses its own copy).
//
// Every kernels/*_binding.cpp registers the Python functions it defines here, with
//   REGISTER_BINDING(my_op, register_my_op);   // void register_my_op(pybind11::module_& m)
// and binding.cpp adds all of them to the extension module `cuda_extension`.
#pragma once

#include <pybind11/pybind11.h>

#include <utility>
#include <vector>

namespace sandbox_binding {

using BindFn = void (*)(pybind11::module_&);

inline std::vector<std::pair<const char*, BindFn>>& entries() {
  static std::vector<std::pair<const char*, BindFn>> all;
  return all;
}

inline bool add(const char* name, BindFn fn) {
  entries().emplace_back(name, fn);
  return true;
}

inline void apply_all(pybind11::module_& m) {
  for (auto& e : entries()) e.second(m);
}

}  // namespace sandbox_binding

#define REGISTER_BINDING(NAME, FN) \
  static const bool sandbox_binding_registered_##NAME = ::sandbox_binding::add(#NAME, FN)
