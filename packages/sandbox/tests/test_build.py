"""Workdir builds: parallel units, object cache by content, compile errors with their log."""

import importlib.util
import subprocess
import uuid

import pytest

from cuda_agent.sandbox.build import ObjectCache, build_workdir, uses_cpp_frontend
from cuda_agent.sandbox.workspace import materialise

from .conftest import workdir_candidate


def _build(cache_dir, tmp_path, task, files, name, **kw):
    c = workdir_candidate(task, files, **kw)
    work = materialise(c.task, c.solution, tmp_path / name, "cpu")
    return build_workdir(
        work,
        work / "build",
        backend="cpu",
        cache=ObjectCache(cache_dir / "build"),
        timeout_s=900,
    )


def test_cache_rebuilds_only_changed_files(
    warm_build, cache_dir, tmp_path, scale_add_task, scale_add_files
):
    same = _build(cache_dir, tmp_path, scale_add_task, scale_add_files, "same")
    assert same.ok and same.cached and all(u["cached"] for u in same.units)
    ops = scale_add_files["kernels/ops.cpp"] + f"\n// changed {uuid.uuid4().hex}\n"
    changed = _build(
        cache_dir, tmp_path, scale_add_task, scale_add_files, "changed", **{"kernels/ops.cpp": ops}
    )
    assert changed.ok and not changed.cached
    by_file = {u["file"]: u for u in changed.units}
    assert not by_file["kernels/ops.cpp"]["cached"]
    assert by_file["kernels/ops_binding.cpp"]["cached"] and by_file["binding.cpp"]["cached"]
    # the module works: load it and call the kernel
    import torch

    spec = importlib.util.spec_from_file_location("cuda_extension", changed.so_path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x, w, b = torch.randn(3, 4), torch.randn(4), torch.randn(4)
    assert torch.allclose(mod.run(x, w, b), x * w + b)


def test_module_linked_against_stand_ins_binds_to_the_real_libraries(
    warm_build, cache_dir, tmp_path, scale_add_task, scale_add_files
):
    """Modules are linked against symbol-less stand-ins of torch's libraries (faster links); the
    module still names every real library and, loaded in a fresh process with every symbol
    bound at once (LD_BIND_NOW), computes the right values."""
    import os
    import subprocess
    import sys

    from cuda_agent.sandbox.build import ensure_link_stubs
    from cuda_agent.sandbox.toolchain import flags_for, torch_info

    flags = flags_for("cpu")
    assert flags.link_stubs == ("c10", "torch", "torch_cpu", "torch_python")
    ops = scale_add_files["kernels/ops.cpp"] + f"\n// relinked {uuid.uuid4().hex}\n"
    b = _build(
        cache_dir, tmp_path, scale_add_task, scale_add_files, "stubs", **{"kernels/ops.cpp": ops}
    )
    assert b.ok and b.link_seconds > 0, b.log
    stubs = ensure_link_stubs(ObjectCache(cache_dir / "build"), flags)
    assert stubs is not None
    real_dir = next(d for d in torch_info()["lib"] if os.path.exists(f"{d}/libc10.so"))

    def dynamic(path) -> str:
        return subprocess.run(["readelf", "-dW", str(path)], capture_output=True, text=True).stdout

    for name in flags.link_stubs:
        stub = stubs / f"lib{name}.so"
        soname = f"Library soname: [lib{name}.so]"
        assert soname in dynamic(stub) and soname in dynamic(f"{real_dir}/lib{name}.so")
        syms = subprocess.run(
            ["nm", "-D", "--defined-only", str(stub)], capture_output=True, text=True
        )
        assert "torch" not in syms.stdout and "c10" not in syms.stdout  # a stand-in, not a copy
    needed = dynamic(b.so_path)
    for name in flags.link_stubs:
        assert f"Shared library: [lib{name}.so]" in needed, needed
    assert f"[{real_dir}" in needed  # runpath/rpath to the real libraries
    probe = (
        "import importlib.util, sys, torch\n"
        "s = importlib.util.spec_from_file_location('cuda_extension', sys.argv[1])\n"
        "m = importlib.util.module_from_spec(s); s.loader.exec_module(m)\n"
        "x, w, c = torch.randn(3, 4), torch.randn(4), torch.randn(4)\n"
        "assert torch.allclose(m.run(x, w, c), x * w + c)\n"
        "print('bound')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe, str(b.so_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "LD_BIND_NOW": "1"},
        timeout=300,
    )
    assert r.returncode == 0 and "bound" in r.stdout, r.stderr[-3000:]


def test_compile_error_keeps_the_log(
    warm_build, cache_dir, tmp_path, scale_add_task, scale_add_files
):
    bad = _build(
        cache_dir,
        tmp_path,
        scale_add_task,
        scale_add_files,
        "bad",
        **{"kernels/ops.cpp": "int broken( {"},
    )
    assert not bad.ok and bad.so_path is None
    assert "ops.cpp" in bad.log and "error" in bad.log


def test_cu_file_on_cpu_backend_is_an_error(cache_dir, tmp_path, scale_add_task, scale_add_files):
    res = _build(
        cache_dir,
        tmp_path,
        scale_add_task,
        scale_add_files,
        "cu",
        **{"kernels/k.cu": "__global__ void k(){}"},
    )
    assert not res.ok and "cuda backend" in res.log


def test_pch_rejection_is_reported_from_real_compiler_output(tmp_path):
    """A PCH built with other flags than the unit's is dropped by GCC with only a warning: the
    build must notice (``pch_rejection``), and stay quiet when the PCH was used."""
    import shutil
    import subprocess

    from cuda_agent.sandbox.build import pch_rejection
    from cuda_agent.sandbox.toolchain import cxx

    if not shutil.which(cxx()):
        import pytest

        pytest.skip("no host compiler")
    (tmp_path / "pre.h").write_text("#include <vector>\ninline int pre_fn() { return 3; }\n")
    (tmp_path / "u.cpp").write_text("int use() { return pre_fn(); }\n")
    gch = [cxx(), "-O1", "-x", "c++-header", "pre.h", "-o", "pre.h.gch"]
    subprocess.run(gch, cwd=tmp_path, check=True)

    def unit(opt: str) -> str:
        cmd = [cxx(), opt, "-Winvalid-pch", "-include", "pre.h", "-H", "-c", "u.cpp", "-o", "u.o"]
        p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=True)
        return p.stderr

    used = unit("-O1")
    assert "! " in used and "pre.h.gch" in used  # -H marks a used PCH with '!'
    assert pch_rejection(used) is None
    rejected = unit("-O0")
    why = pch_rejection(rejected)
    assert why is not None and "__OPTIMIZE__" in why


def test_fast_linker_is_probed_and_used_for_modules(tmp_path):
    """A linker that cannot link is never chosen; a working faster one ends up in the flags."""
    import shutil

    from cuda_agent.sandbox.toolchain import cxx, fast_linker, flags_for

    assert fast_linker(cxx(), ("no-such-linker",)) is None
    found = fast_linker(cxx())
    if found is None:  # none installed, or none this compiler can drive (a wrapper's, say)
        for n in ("mold", "lld", "gold"):
            if shutil.which(f"ld.{n}"):
                r = subprocess.run(
                    [
                        cxx(),
                        f"-fuse-ld={n}",
                        "-shared",
                        "-x",
                        "c++",
                        "-",
                        "-o",
                        str(tmp_path / "p.so"),
                    ],
                    input="int f() { return 1; }\n",
                    capture_output=True,
                    text=True,
                )
                assert r.returncode != 0, f"{n} links here but was not chosen"
        assert not any(a.startswith("-fuse-ld=") for a in flags_for("cpu").ldflags)
    else:
        assert shutil.which(f"ld.{found}")
        assert f"-fuse-ld={found}" in flags_for("cpu").ldflags


def test_heavy_includes_are_named_for_the_note():
    """Bindings that include an umbrella header the prelude does not cover get a note."""
    from cuda_agent.sandbox.build import heavy_includes

    from .conftest import FIX

    src = (
        '#include <torch/extension.h>\n  #  include "torch/torch.h"\n#include <torch/extension.h>\n'
    )
    assert heavy_includes(src) == ["torch/extension.h", "torch/torch.h"]
    assert heavy_includes((FIX / "gpu_fused/kernels/fused_binding.cpp").read_text()) == []
    ops = (FIX / "scale_add/kernels/ops_binding.cpp").read_text()
    assert heavy_includes(ops) == ["torch/extension.h"]  # the stand-in's fixture
    assert heavy_includes("// #include <torch/extension.h> is slow\n") == []


def test_binding_cpp_is_linked_first_at_O1(tmp_path, scale_add_task, scale_add_files):
    """The shared pybind11 code the linker keeps comes from the first object: binding.cpp, built
    at -O1 (call overhead), while candidate bindings compile faster at -Og."""
    from cuda_agent.sandbox.build import collect_units
    from cuda_agent.sandbox.toolchain import flags_for

    c = workdir_candidate(scale_add_task, scale_add_files)
    work = materialise(c.task, c.solution, tmp_path / "order", "cpu")
    units, problems = collect_units(work, "cpu")
    assert not problems and units[0].kind == "main" and units[0].rel == "binding.cpp"
    f = flags_for("cpu")
    assert f.main_cflags[0] == "-O1" and f.binding_cflags[0] == "-Og"
    assert f.main_cflags[1:] == f.binding_cflags[1:]


LINEAR_BINDING = """#include <torch/extension.h>
#include "../binding_registry.h"

static torch::Tensor lin(torch::Tensor x) {
  torch::nn::Linear layer(x.size(1), 2);  // the C++ frontend: only the real umbrella header has it
  return layer->forward(x);
}

static void register_extra(pybind11::module_& m) { m.def("lin", &lin); }

REGISTER_BINDING(extra, register_extra);
"""


def test_binding_needing_the_real_umbrella_header_is_compiled_again_with_it(
    cache_dir, tmp_path, scale_add_task, scale_add_files
):
    """A binding including <torch/extension.h> that needs more than the stand-in gives fails
    against it and is compiled again with the real header: it builds, and the build says so.
    (The stand-in's success: the scale_add fixture, checked in ``warm_build``.) The C++ frontend
    is named through a macro here, so the scan that sends such bindings straight to the real
    header does not see it and the fallback itself is what gets tested."""
    name = f"umbrella-{uuid.uuid4().hex[:8]}"  # new source: nothing from the object cache
    hidden = LINEAR_BINDING.replace("torch::nn::Linear", "FRONTEND(Linear)").replace(
        "#include <torch/extension.h>\n",
        "#include <torch/extension.h>\n#define FRONTEND(x) torch:: nn::x\n",
    )
    assert not uses_cpp_frontend(hidden) and uses_cpp_frontend(LINEAR_BINDING)
    r = _build(
        cache_dir,
        tmp_path,
        scale_add_task,
        scale_add_files,
        name,
        **{"kernels/extra_binding.cpp": hidden + f"// {name}\n"},
    )
    assert r.ok, r.log
    headers = {u["file"]: u.get("headers") for u in r.units}
    assert headers["kernels/extra_binding.cpp"] == "real (stand-in failed)", r.units
    assert "needs more than the precompiled prelude declares" in r.log


def test_cpp_frontend_scan():
    """Bindings naming the C++ frontend skip the stand-in attempt (it would fail); plain tensor
    code, and names that merely contain the words, do not."""
    assert uses_cpp_frontend("torch::nn::Linear l(3, 4);")
    assert uses_cpp_frontend("auto o = torch::optim::SGD(p, 0.1);")
    assert not uses_cpp_frontend("torch::Tensor f(torch::Tensor x) { return x.relu(); }")
    assert not uses_cpp_frontend("mytorch::nn::thing; // torch::nnx::")


def test_cpu_prelude_is_precompiled_once_a_cache_has_earned_it(tmp_path, monkeypatch):
    """The cpu backend builds the precompiled prelude only after a cache has compiled
    ``pch_after()`` bindings without it; one that exists (here or in the trusted cache a tools
    cache reads) is used at once; a tools cache never builds one; a failed build is not retried
    on every build. The cuda backend and an explicit choice are not counted against."""
    from dataclasses import replace

    from cuda_agent.sandbox.build import (
        PCH_AFTER_ENV,
        PRELUDE,
        _count_unprecompiled,
        pch_after,
        pch_wanted,
        unprecompiled_bindings,
    )
    from cuda_agent.sandbox.toolchain import flags_for

    flags = flags_for("cpu")
    cache = ObjectCache(tmp_path / "trusted")
    monkeypatch.setenv(PCH_AFTER_ENV, "2")
    assert pch_after() == 2
    assert pch_wanted(cache, flags, None) == (
        False,
        "off (cpu: built after 2 bindings in this cache, 0 so far)",
    )
    _count_unprecompiled(cache, flags, 1)
    assert unprecompiled_bindings(cache, flags) == 1 and not pch_wanted(cache, flags, None)[0]
    _count_unprecompiled(cache, flags, 1)
    assert pch_wanted(cache, flags, None) == (True, "on")
    assert pch_wanted(cache, flags, False) == (False, "off")  # asked: not overridden
    assert pch_wanted(cache, replace(flags, backend="cuda"), None) == (True, "on")

    tools = ObjectCache(tmp_path / "tools", read_also=tmp_path / "trusted")
    _count_unprecompiled(tools, flags, 5)  # not counted: it may not build the prelude
    assert unprecompiled_bindings(tools, flags) == 0 and not pch_wanted(tools, flags, None)[0]
    gch = tmp_path / "trusted" / "pch" / flags.key / (PRELUDE + ".gch")
    gch.parent.mkdir(parents=True)
    gch.write_bytes(b"")
    assert pch_wanted(tools, flags, None) == (True, "on")  # the trusted cache's is read

    fresh = ObjectCache(tmp_path / "fresh")
    _count_unprecompiled(fresh, flags, 2)
    (tmp_path / "fresh" / "pch" / f"{flags.key}.failed").write_text("g++: out of memory")
    on, why = pch_wanted(fresh, flags, None)
    assert not on and "failed" in why
    for bad in ("soon", "-1", "2.5"):
        monkeypatch.setenv(PCH_AFTER_ENV, bad)
        with pytest.raises(ValueError, match="whole number"):
            pch_after()
