"""Workdir builds: parallel units, object cache by content, compile errors with their log."""

import importlib.util
import uuid

from cuda_agent.sandbox.build import ObjectCache, build_workdir
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
        pch=False,
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
