"""The workspace tools an agent calls: utils/compile.py and utils/verify.py (cpu backend)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from cuda_agent.sandbox.workspace import create_workspace


def test_compile_and_verify_tools(warm_build, cache_dir, tmp_path, scale_add_task, scale_add_files):
    ws = create_workspace(scale_add_task, tmp_path / "ws", backend="cpu")
    shutil.rmtree(ws / "kernels")
    for name, text in scale_add_files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    env = dict(os.environ, CUDA_AGENT_SANDBOX_CACHE=str(cache_dir))
    p = subprocess.run(
        [sys.executable, "utils/compile.py"],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0 and "BUILD OK" in p.stdout, p.stdout + p.stderr[-2000:]
    assert (ws / "build" / "cuda_extension.so").exists()
    # a later compile (a kernel edited) reads torch's facts from the cache: no import torch
    (ws / "kernels" / "ops.cpp").write_text(scale_add_files["kernels/ops.cpp"] + "\n// edited\n")
    p = subprocess.run(
        [sys.executable, "-X", "importtime", "utils/compile.py"],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0 and "BUILD OK" in p.stdout, p.stdout + p.stderr[-2000:]
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in p.stderr.splitlines() if "|" in ln]
    assert "cuda_agent.sandbox.build" in imported and "torch" not in imported
    p = subprocess.run(
        [sys.executable, "utils/verify.py"],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0 and p.stdout.strip().endswith("PASS"), p.stdout + p.stderr[-2000:]
    assert "trial 4" in p.stdout
    # a broken kernel: the compile tool shows the compiler's error and fails
    (ws / "kernels" / "ops.cpp").write_text("int broken( {")
    p = subprocess.run(
        [sys.executable, "utils/compile.py"],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 1 and "BUILD FAILED" in p.stdout and "ops.cpp" in p.stdout


TORCH_INFO = (
    "import json, sys\n"
    "from cuda_agent.sandbox.toolchain import torch_info\n"
    "print(json.dumps([torch_info(), 'torch' in sys.modules]))\n"
)


def test_torch_facts_are_imported_once_per_installation(tmp_path):
    """torch's include and library dirs, version and ABI come from one ``import torch`` per
    installation; later processes read them from the cache, and an entry naming a directory
    that is gone is computed again."""
    env = dict(os.environ, CUDA_AGENT_SANDBOX_CACHE=str(tmp_path))

    def facts():
        p = subprocess.run(
            [sys.executable, "-c", TORCH_INFO], env=env, capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    first, imported = facts()
    assert imported and first["include"] and first["lib"]
    (entry,) = (tmp_path / "toolchain").glob("torch-*.json")
    again, imported = facts()
    assert again == first and not imported
    entry.write_text(json.dumps({**first, "include": [str(tmp_path / "gone")]}))
    fixed, imported = facts()
    assert fixed == first and imported
    assert json.loads(entry.read_text()) == first
