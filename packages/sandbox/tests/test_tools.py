"""The workspace tools an agent calls: utils/compile.py and utils/verify.py (cpu backend)."""

from __future__ import annotations

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
