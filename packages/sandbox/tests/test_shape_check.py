"""Shape generalisation (``SandboxConfig.shape_check``): a correct candidate is verified again at
a resized instance of its task. Real sandbox, cpu backend, the scale_add fixture's binding (built
once by ``warm_build``) with kernels that read their sizes, or hard-code one."""

from __future__ import annotations

import pytest

from cuda_agent.records import Status, Task
from cuda_agent.sandbox import SandboxConfig, SandboxPool, evaluate

from .conftest import workdir_candidate

# scale_add with its sizes as module-level constants (what `guards resize-task` scales) and the
# per-column weights as inputs, so the column count is resizable too (64x256 -> 49x193)
TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """y = x * w + b, w and b per column (given as inputs)."""

    def forward(self, x, w, b):
        return x * w + b


rows = 64
cols = 256


def get_inputs():
    return [torch.randn(rows, cols), torch.randn(cols), torch.randn(cols)]


def get_init_inputs():
    return []
'''

MODEL_NEW = """import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, w, b):
        return cuda_extension.run(x, w, b)
"""

# right at 64x256, wrong (and memory-safe) at any other column count: the column of element k is
# taken from the published shape's 256
HARD_CODED = """extern "C" int kernel_run(float* out, const float* x, const float* w, const float* b, long rows, long cols) {
  const long C = 256;  // the published column count
  for (long k = 0; k < rows * cols; ++k) {
    long j = (k % C) % cols;
    out[k] = x[k] * w[j] + b[j];
  }
  return 0;
}
"""


def _cfg(cache_dir, **kw) -> SandboxConfig:
    return SandboxConfig(**{"backend": "cpu", "cache_dir": str(cache_dir), "timing": False, **kw})


def _cand(files: dict[str, str], kernel: str | None = None):
    changes = {"model_new.py": MODEL_NEW}
    if kernel is not None:
        changes["kernels/ops.cpp"] = kernel
    return workdir_candidate(Task.make("scale_add_sized", TASK), files, **changes)


def test_an_honest_kernel_passes_at_the_resized_shape(warm_build, cache_dir, scale_add_files):
    """The fixture's kernel takes rows and cols from the tensors; the second verification
    reuses the build (all objects cached)."""
    r = evaluate(_cand(scale_add_files), _cfg(cache_dir, shape_check=True))
    assert r.status is Status.OK, (r.message, r.meta.get("shape_check"))
    sc = r.meta["shape_check"]
    assert sc["passed"] is True and len(sc["instances"]) == 1
    inst = sc["instances"][0]
    assert inst["sizes"] == {"rows": [64, 49], "cols": [256, 193]}
    assert inst["status"] == "ok" and inst["factor"] == 0.75
    assert inst["build_cached"] is True
    assert "shape_check" in r.meta["stages_s"]
    assert not [g for g in r.guards if g.code == "G-SHAPE-GENERALISATION"]


def test_a_hard_coded_shape_fails_the_shape_check_and_passes_without_it(
    warm_build, cache_dir, scale_add_files
):
    c = _cand(scale_add_files, HARD_CODED)
    plain = evaluate(c, _cfg(cache_dir))  # off by default: right at the published shape
    assert plain.status is Status.OK, plain.message
    assert "shape_check" not in plain.meta
    with SandboxPool(_cfg(cache_dir, shape_check=True), compile_workers=1) as pool:
        r = pool.evaluate(c)  # the device worker runs the second prepare and verification
    assert r.status is Status.INCORRECT, r.message
    assert r.message.startswith(
        "shape check: incorrect at resized sizes (rows 64->49, cols 256->193)"
    )
    found = [g for g in r.guards if g.code == "G-SHAPE-GENERALISATION"]
    assert len(found) == 1 and found[0].severity == "flag"
    assert "rows 64->49, cols 256->193" in found[0].message
    assert r.correctness is not None and r.correctness.passed is False
    # the plain trials passed: what the report counts as correct at the task's shape
    assert all(t.passed for t in r.correctness.trials)
    sc = r.meta["shape_check"]
    assert sc["passed"] is False and sc["instances"][0]["status"] == "incorrect"


def test_a_task_without_resizable_sizes_is_skipped(
    warm_build, cache_dir, scale_add_task, scale_add_files
):
    """scale_add's sizes are literals inside get_inputs: nothing to resize, the verdict stands."""
    r = evaluate(
        workdir_candidate(scale_add_task, scale_add_files), _cfg(cache_dir, shape_check=True)
    )
    assert r.status is Status.OK, r.message
    assert "cannot be resized" in r.meta["shape_check"]["skipped"]
    assert r.meta["shape_check"]["instances"] == []


def test_the_settings_are_checked():
    assert SandboxConfig().shape_check is False
    d = SandboxConfig(shape_check=True, shape_factors=[0.5, 0.75]).to_dict()
    assert SandboxConfig.from_dict(d).shape_factors == (0.5, 0.75)
    for bad in ((), (1.0,), (0.95,), (0.0,), (-0.5,)):
        with pytest.raises(ValueError, match="shape_factors"):
            SandboxConfig(shape_factors=bad)
    with pytest.raises(ValueError, match="unknown SandboxConfig key"):
        SandboxConfig.from_dict({"shape_checks": True})


def test_both_clis_have_the_flag():
    from typer.testing import CliRunner

    from cuda_agent.kernelbench_eval.cli import app as kb_app
    from cuda_agent.sandbox.cli import app

    for a, args in ((app, ["eval", "--help"]), (kb_app, ["run", "--help"])):
        out = CliRunner().invoke(a, args, env={"COLUMNS": "200"})
        assert out.exit_code == 0 and "--shape-check" in out.output


def test_a_reference_that_fails_at_the_new_sizes_skips_the_check(
    warm_build, cache_dir, scale_add_files
):
    """A task that only holds at multiples of 8 rows (49 is not): nothing about the kernel."""
    task = Task.make(
        "scale_add_rows8",
        TASK.replace(
            "        return x * w + b",
            "        assert x.shape[0] % 8 == 0\n        return x * w + b",
        ),
    )
    c = workdir_candidate(task, scale_add_files, **{"model_new.py": MODEL_NEW})
    r = evaluate(c, _cfg(cache_dir, shape_check=True))
    assert r.status is Status.OK, r.message
    sc = r.meta["shape_check"]
    assert sc["skipped"].startswith("the reference fails at resized sizes (rows 64->49")
    assert sc["instances"][0]["status"] == "infra_error" and "passed" not in sc
