"""The header levels of KernelBench ``load_inline`` builds (kbcache): what the CUDA source and
main.cpp are compiled with, and how a failed unit steps down to the sources as given."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.sandbox import kbcache

SRC = """#include <torch/extension.h>
#include <cuda_runtime.h>
__global__ void k(float* o, const float* x, int n) { int i = threadIdx.x; if (i < n) o[i] = x[i]; }
torch::Tensor f(torch::Tensor x) {
  auto out = torch::empty_like(x);
  auto z = at::zeros({1}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "f", [&] {});
  k<<<1, 32>>>(out.data_ptr<float>(), x.data_ptr<float>(), (int)x.numel());
  return out;
}
"""


def test_cuda_sources_get_the_headers_of_what_they_call(tmp_path):
    ops = tmp_path / "ops"
    ops.mkdir()
    for name in ("empty_like", "zeros", "numel"):
        (ops / f"{name}.h").write_text("")
    h = kbcache.aten_ops_types_h([SRC], ops)
    assert h is not None and "#pragma once" in h and "torch/extension.h" not in h
    assert "#include <ATen/core/Tensor.h>" in h
    assert "#include <ATen/ops/empty_like.h>" in h and "#include <ATen/ops/zeros.h>" in h
    assert "ATen/ops/numel.h" not in h  # a method call, not torch::/at:: numel(...)
    assert "#include <ATen/Dispatch.h>" in h
    assert "namespace torch { using namespace at;" in h and "kFloat32 = at::kFloat;" in h
    assert "Dispatch" not in kbcache.aten_ops_types_h(["__global__ void k() {}"], ops)
    assert kbcache.aten_ops_types_h([SRC], None) is None


def test_real_aten_has_the_per_operator_headers():
    """The lightest level relies on torch's per-operator headers (ATen/ops/*.h)."""
    d = kbcache._aten_ops_dir()
    assert d is not None and (d / "empty_like.h").is_file() and (d / "zeros.h").is_file()


def test_levels_in_order(monkeypatch):
    params = {"name": "x", "cpp_sources": "", "cuda_sources": SRC}
    monkeypatch.setattr(kbcache, "LIGHT_HEADERS", 2)
    lab, p, types_h = kbcache._lighter_attempt("load_inline", params)
    assert lab == "aten_ops"  # one lighter try, then as given
    assert "ATen/ops/empty_like.h" in types_h
    assert "torch/extension.h" not in p["cuda_sources"]
    monkeypatch.setattr(kbcache, "LIGHT_HEADERS", 1)
    lab, p, types_h = kbcache._lighter_attempt("load_inline", params)
    assert lab == "torch_types" and "#include <torch/types.h>" in p["cuda_sources"]
    assert types_h is None
    monkeypatch.setattr(kbcache, "LIGHT_HEADERS", 0)
    assert kbcache._lighter_attempt("load_inline", params) is None
    monkeypatch.setattr(kbcache, "LIGHT_HEADERS", 2)
    plain = dict(params, cuda_sources="__global__ void k() {}")
    assert kbcache._lighter_attempt("load_inline", plain)[0] == "aten_ops"
    monkeypatch.setattr(kbcache, "_aten_ops_dir", lambda: None)  # no per-operator headers
    assert kbcache._lighter_attempt("load_inline", plain)[0] == "cuda_as_given"
    assert kbcache._lighter_attempt("load_inline", params)[0] == "torch_types"
    assert kbcache._lighter_attempt("load", params) is None


@pytest.mark.parametrize(
    ("message", "cu", "main"),
    [
        ("[1/3] nvcc ...\nFAILED: cuda.cuda.o \nerror: x", True, False),
        ("FAILED: main.o \nmain.cpp:3: error", False, True),
        ("FAILED: cuda.cuda.o\nFAILED: main.o", True, True),
        ("ImportError: undefined symbol", False, False),
    ],
)
def test_failed_unit_is_read_from_ninja(message, cu, main):
    assert kbcache._failed_targets(RuntimeError(message)) == (cu, main)


def test_a_failed_unit_steps_down_alone(monkeypatch, tmp_path):
    """main.cpp failing with the stand-in keeps the CUDA source's lighter headers; the CUDA
    source failing steps down its level; the last try is the sources as given."""
    seen: list[tuple[bool, bool]] = []

    def fake_build(**p):
        standin = str(kbcache._KB_STANDIN) in (p.get("extra_include_paths") or [])
        ultra = any("aten_ops_standin" in f for f in p.get("extra_cuda_cflags") or [])
        seen.append((ultra, standin))
        if standin:
            raise RuntimeError("FAILED: main.o")
        if ultra:
            return "module"
        raise AssertionError("should not get here")

    monkeypatch.setattr(kbcache, "LIGHT_HEADERS", 2)
    monkeypatch.setitem(kbcache._ORIG, "load_inline", fake_build)
    params = {"name": "x", "cpp_sources": "", "cuda_sources": SRC}
    build = tmp_path / "b"
    build.mkdir()
    assert kbcache._build_lighter("load_inline", params, build) == ("module", "aten_ops")
    assert seen == [(True, True), (True, False)]

    seen.clear()

    def cu_fails(**p):
        ultra = any("aten_ops_standin" in f for f in p.get("extra_cuda_cflags") or [])
        seen.append((ultra, "torch/types.h" in p["cuda_sources"]))
        if "torch/extension.h" not in p["cuda_sources"]:
            raise RuntimeError("FAILED: cuda.cuda.o")
        return "as given"

    monkeypatch.setitem(kbcache._ORIG, "load_inline", cu_fails)
    assert kbcache._build_lighter("load_inline", params, build) == ("as given", "as_given")
    assert seen == [(True, True), (False, False)]  # a CUDA-source error: then as given
    assert Path(build).is_dir()

    # no torch/extension.h in the CUDA source (load_inline puts torch/types.h first anyway)
    seen.clear()
    plain = {"name": "x", "cpp_sources": "", "cuda_sources": "__global__ void k() {}"}
    monkeypatch.setitem(kbcache._ORIG, "load_inline", fake_build)
    # the stand-in torch/types.h applies to it too; with the stand-in main it fails at main.o
    assert kbcache._build_lighter("load_inline", plain, build) == ("module", "aten_ops")
    assert seen == [(True, True), (True, False)]


def test_main_failing_with_the_real_header_ends_at_the_sources_as_given(monkeypatch, tmp_path):
    """A real error in main.cpp (the candidate's cpp_sources) fails at every level: once it
    fails with the real header, the next try is the last, never the same one again."""
    calls: list[dict] = []

    def main_broken(**p):
        calls.append(p)
        raise RuntimeError("FAILED: main.o\nmain.cpp:2: error: x")

    monkeypatch.setitem(kbcache._ORIG, "load_inline", main_broken)
    params = {"name": "x", "cpp_sources": "oops", "cuda_sources": SRC}
    for level, tries in ((1, 2), (2, 3)):  # level 2: with the stand-in main, without, as given
        monkeypatch.setattr(kbcache, "LIGHT_HEADERS", level)
        calls.clear()
        steps: list = []
        with pytest.raises(RuntimeError, match="main.o"):
            kbcache._build_lighter("load_inline", params, tmp_path, steps)
        assert len(calls) == tries and calls[-1] == params, level
        assert steps and steps[0]["main_failed"] and "error: x" in steps[0]["error"]


def test_an_unknown_level_is_refused(monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_KB_LIGHT_HEADERS", "yes")
    with pytest.raises(ValueError, match="expected 0, 1 or 2"):
        kbcache._light_level()
    monkeypatch.setenv("CUDA_AGENT_KB_LIGHT_HEADERS", "1")
    assert kbcache._light_level() == 1
