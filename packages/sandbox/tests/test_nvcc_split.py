"""A ``.cu`` compiled as nvcc's own steps in two chains (nvcc_split): the same fat binary as nvcc
whole, the host object reused across edits of device code, errors reported once, and nvcc whole
where the steps are not in the expected shape. Compile-only: they need nvcc, not a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cuda_agent.sandbox import nvcc_split
from cuda_agent.sandbox.build import (
    SPLIT_ENV,
    TEMPLATE,
    ObjectCache,
    build_workdir,
    ensure_split_wrapper,
)
from cuda_agent.sandbox.isolation import Limits, caps
from cuda_agent.sandbox.toolchain import flags_for

needs_nvcc = pytest.mark.skipif(
    shutil.which("objcopy") is None or flags_for("cuda").nvcc is None,
    reason="needs nvcc and binutils",
)

KERNEL = """#include <cuda_runtime.h>
namespace {
__global__ void scale(float* x, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * s + 1.0f;
}
}  // anonymous: its mangled name carries the module id on both sides
template <int N> __global__ void fill(float* x) { x[threadIdx.x] = (float)N; }

extern "C" cudaError_t scale_launch(float* x, float s, int n, cudaStream_t st) {
  scale<<<(n + 255) / 256, 256, 0, st>>>(x, s, n);
  fill<3><<<1, 32, 0, st>>>(x);
  return cudaGetLastError();
}
"""


def _workdir(root: Path, name: str, cu: str, **files: str) -> Path:
    d = root / name
    (d / "kernels").mkdir(parents=True)
    for f in ("binding.cpp", "binding_registry.h"):
        shutil.copy(TEMPLATE / f, d / f)
    (d / "kernels" / "k.cu").write_text(cu)
    for rel, text in files.items():
        (d / "kernels" / rel).write_text(text)
    return d


def _build(root: Path, cache: ObjectCache, name: str, cu: str, **files: str):
    d = _workdir(root, name, cu, **files)
    res = build_workdir(d, d / "build", backend="cuda", cache=cache, jobs=2, timeout_s=600)
    return res, {u["file"]: u for u in res.units}


def _section(obj: Path, tmp: Path, name: str = ".nv_fatbin") -> bytes:
    out = tmp / f"{obj.name}.section"
    subprocess.run(
        ["objcopy", "-O", "binary", f"--only-section={name}", str(obj), str(out)], check=True
    )
    return out.read_bytes()


def _strings(blob: bytes) -> set[str]:
    import re

    return {m.decode() for m in re.findall(rb"[\x20-\x7e]{6,}", blob)}


@pytest.fixture(scope="module")
def split_cache(tmp_path_factory) -> ObjectCache:
    return ObjectCache(tmp_path_factory.mktemp("split-cache"))


def test_host_key_ignores_line_markers_and_device_bodies(tmp_path):
    """Pure text: the key changes with host code, not with what cudafe++ keeps in ``#if 0``."""

    def key(cpp: str, stub: str = "static void reg() {}\n") -> str | None:
        (tmp_path / "x.cudafe1.cpp").write_text(cpp)
        (tmp_path / "x.stub.c").write_text(stub)
        p = nvcc_split.SplitPlan(
            [], [], [], {}, tmp_path / "m", "", tmp_path / "x.cudafe1.cpp",
            tmp_path / "x.stub.c", tmp_path / "f.c", "wrapper", tmp_path / "a.S", "",
            tmp_path / "h.o", tmp_path / "d.o",
        )  # fmt: skip
        return nvcc_split.host_key(p, "toolchain")

    base = '# 2 "k.cu"\nvoid k(float *x);\n#if 0\n# 2\n{ x[0] = 1.0F; }\n#endif\nint launch();\n'
    body = base.replace("x[0] = 1.0F;", "x[0] = 2.0F; x[1] = 3.0F;")
    moved = base.replace('# 2 "k.cu"', '# 9 "k.cu"').replace("# 2\n", "# 9\n")
    assert key(base) == key(body) == key(moved) is not None
    assert key(base) != key(base.replace("int launch();", "int launch(int);"))
    assert key(base) != key(base, stub="static void reg() { int a; }\n")
    (tmp_path / "real.cpp").write_text(base)
    (tmp_path / "x.cudafe1.cpp").unlink()
    (tmp_path / "x.cudafe1.cpp").symlink_to(tmp_path / "real.cpp")
    p = nvcc_split.SplitPlan(
        [], [], [], {}, tmp_path / "m", "", tmp_path / "x.cudafe1.cpp", tmp_path / "x.stub.c",
        tmp_path / "f.c", "w", tmp_path / "a.S", "", tmp_path / "h.o", tmp_path / "d.o",
    )  # fmt: skip
    assert nvcc_split.host_key(p, "toolchain") is None  # never read through a link


@needs_nvcc
def test_wrapper_is_derived_from_nvcc_and_checked(split_cache):
    w, why = ensure_split_wrapper(split_cache, flags_for("cuda"))
    assert w is not None, why
    assert nvcc_split.SYMBOL_SLOT in w.c_text and "asm(" not in w.c_text
    assert "fatbinData" not in w.c_text and w.section.startswith(".")
    again, _ = ensure_split_wrapper(split_cache, flags_for("cuda"))  # from the cache's record
    assert again == w


@needs_nvcc
def test_split_build_gives_nvcc_whole_fat_binary_and_reuses_host_object(
    split_cache, tmp_path, monkeypatch
):
    """Same device code as nvcc whole (the kernel names the host registers are in the fat
    binary, the anonymous namespace's included); a kernel-body edit compiles the device side
    only; an edit of the launcher compiles the host side again."""
    res, units = _build(tmp_path, split_cache, "a", KERNEL)
    assert res.ok, res.log
    assert units["kernels/k.cu"]["nvcc"] == "split"
    body = KERNEL.replace("x[i] * s + 1.0f", "x[i] * s + 2.0f")
    res2, units2 = _build(tmp_path, split_cache, "b", body)
    assert res2.ok, res2.log
    assert units2["kernels/k.cu"]["nvcc"] == "split (host cached)"
    # a header of the solution's (which the host compile could pick up): never a shared object
    res4, units4 = _build(tmp_path, split_cache, "h", body, **{"fatbinary_section.h": "// x\n"})
    assert units4["kernels/k.cu"]["nvcc"] == "split", res4.log
    launcher = KERNEL.replace("fill<3><<<1, 32", "fill<4><<<1, 32")
    res3, units3 = _build(tmp_path, split_cache, "c", launcher)
    assert res3.ok and units3["kernels/k.cu"]["nvcc"] == "split"

    # the module's fat binary is byte for byte nvcc's own of the same source
    monkeypatch.setenv(SPLIT_ENV, "0")
    whole_cache = ObjectCache(tmp_path / "whole-cache")
    for f in ("objects", "pch"):  # binding.cpp's object: reuse it
        shutil.copytree(split_cache.root / f, whole_cache.root / f, dirs_exist_ok=True)
    resw, unitsw = _build(tmp_path, whole_cache, "w", body)
    assert resw.ok and unitsw["kernels/k.cu"]["nvcc"] == "whole"
    split_fat = _section(res2.so_path, tmp_path)
    whole_fat = _section(resw.so_path, tmp_path)
    assert len(split_fat) > 1000

    # the differences allowed: the module id in the anonymous namespace's names, the paths
    def names(blob: bytes) -> set[str]:
        return {s for s in _strings(blob) if "_GLOBAL__N_" not in s and str(tmp_path) not in s}

    assert names(split_fat) == names(whole_fat)
    # what the host side registers is what the fat binary defines
    rodata = _section(res2.so_path, tmp_path, ".rodata")
    registered = {s[s.index("_Z") :] for s in _strings(rodata) if "_Z" in s}
    assert any("_GLOBAL__N_" in s and "scale" in s for s in registered), registered
    assert registered <= _strings(split_fat)


@needs_nvcc
def test_split_compile_error_is_reported_once(split_cache, tmp_path):
    bad = KERNEL.replace("x[i] * s + 1.0f", "x[i] * undefined_name")
    res, units = _build(tmp_path, split_cache, "bad", bad)
    assert not res.ok and not units["kernels/k.cu"]["ok"]
    assert res.log.count('identifier "undefined_name" is undefined') == 1, res.log


@needs_nvcc
def test_two_architectures_are_compiled_whole(tmp_path, split_cache):
    flags = flags_for("cuda")
    w, why = ensure_split_wrapper(split_cache, flags)
    assert w is not None, why
    (tmp_path / "k.cu").write_text(KERNEL)
    env = dict(os.environ)
    two = [
        *(f for f in flags.cuda_cflags if not f.startswith("-gencode")),
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=sm_90",
    ]
    p, why = nvcc_split.plan(flags.nvcc, two, tmp_path / "k.cu", tmp_path, "k.cu", w, env)
    assert p is None and "architecture" in why
    p, why = nvcc_split.plan(flags.nvcc, ["-rdc=true", *flags.cuda_cflags], tmp_path / "k.cu",
                             tmp_path, "k.cu", w, env)  # fmt: skip
    assert p is None and why
    p, why = nvcc_split.plan(flags.nvcc, list(flags.cuda_cflags), tmp_path / 'a"b.cu', tmp_path,
                             "k.cu", w, env)  # fmt: skip
    assert p is None and "quote" in why


@needs_nvcc
@pytest.mark.skipif(
    not caps().drop_user, reason="runs as root with a uid to drop to (e.g. the GPU host)"
)
def test_split_build_as_an_unprivileged_uid(confined_tmp):
    """As the evaluation builds (root, compilers as a leased uid, whose every process a confined
    run's sweep kills): the two chains share one run, cold and after a kernel-body edit."""
    cache = ObjectCache(confined_tmp / "cache")
    for name, cu, want in (
        ("cold", KERNEL, "split"),
        ("edit", KERNEL.replace("x[i] * s + 1.0f", "x[i] * s - 1.0f"), "split (host cached)"),
    ):
        d = _workdir(confined_tmp, name, cu)
        for p in (d, *d.rglob("*")):
            p.chmod(0o755 if p.is_dir() else 0o644)
        res = build_workdir(
            d, d / "build", backend="cuda", cache=cache, jobs=2, limits=Limits(timeout_s=600)
        )
        units = {u["file"]: u for u in res.units}
        assert res.ok, res.log[-3000:]
        assert units["kernels/k.cu"]["nvcc"] == want
        assert "leased" in res.compilers_as
