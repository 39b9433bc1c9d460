"""The cache must be reachable by the unprivileged user candidates run as; when our own code fails
in a candidate's process, the verdict is ``infra_error``, never a silent pass or the candidate's
fault (found on the H200: a private ``--cache-dir`` made every KernelBench build go unseen)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cuda_agent.records import Status
from cuda_agent.records.jsonl import encode
from cuda_agent.sandbox.config import SandboxConfig
from cuda_agent.sandbox.evaluate import prepare, unreachable_parent
from cuda_agent.sandbox.isolation import caps

from .conftest import kb_candidate

needs_drop_user = pytest.mark.skipif(
    not caps().drop_user, reason="needs root that can drop to an unprivileged uid"
)

# builds nothing: the compile process fails before (or would import plain torch code)
KB_WITH_LOAD_INLINE = (
    "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
    "class ModelNew(nn.Module):\n"
    "    def __init__(self, *args):\n        super().__init__()\n"
    "    def forward(self, x, y):\n        return x * 2.0 + y\n"
)


def _private(path):
    path.mkdir()
    path.chmod(0o700)
    return path


def test_unreachable_parent_names_the_directory_that_blocks_the_path(tmp_path):
    blocked = _private(tmp_path / "private")
    target = blocked / "cache"
    assert unreachable_parent(target) == blocked
    blocked.chmod(0o711)
    # no longer the blocker (pytest's own 0700 ancestors may still be)
    assert unreachable_parent(target) != blocked


@needs_drop_user
def test_eval_refuses_a_cache_dir_the_sandbox_user_cannot_reach(tmp_path, scale_add_task):
    blocked = _private(tmp_path / "private")
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(encode(kb_candidate(scale_add_task, KB_WITH_LOAD_INLINE)))
    out = subprocess.run(
        [sys.executable, "-m", "cuda_agent.sandbox.cli", "eval", str(inp), "--backend", "cpu",
         "--cache-dir", str(blocked / "cache")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert "not reachable" in out.stderr and str(blocked) in out.stderr
    assert out.stdout == ""


@needs_drop_user
def test_our_failure_in_the_compile_process_is_an_infra_error(tmp_path, scale_add_task):
    cache = tmp_path / "cache"
    cache.mkdir()
    for d in (tmp_path, *tmp_path.parents):  # the cache itself is reachable ...
        d.chmod(d.stat().st_mode | 0o111)
    hidden = _private(tmp_path / "hidden") / "kb_ext"
    hidden.mkdir()
    os.symlink(hidden, cache / "kb_ext")  # ... its KernelBench build cache is not
    cfg = SandboxConfig(backend="cpu", cache_dir=str(cache), guard_policy="off")
    p = prepare(kb_candidate(scale_add_task, KB_WITH_LOAD_INLINE), cfg, backend="cpu")
    assert p.result is not None, "compile stage passed although its process failed"
    assert p.result.status == Status.INFRA_ERROR
    assert "compile process" in p.result.message and "PermissionError" in p.result.message
    assert p.compile is not None and not p.compile.ok
