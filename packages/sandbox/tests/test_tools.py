"""The workspace tools an agent calls: utils/compile.py and utils/verify.py (cpu backend)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from cuda_agent.sandbox.workspace import create_workspace


def _run(ws, env, *args: str) -> subprocess.CompletedProcess:
    """``python ARGS`` in the workspace, as an agent's tool command runs."""
    return subprocess.run(
        [sys.executable, *args], cwd=ws, env=env, capture_output=True, text=True, timeout=600
    )


def test_compile_and_verify_tools(warm_build, cache_dir, tmp_path, scale_add_task, scale_add_files):
    ws = create_workspace(scale_add_task, tmp_path / "ws", backend="cpu")
    shutil.rmtree(ws / "kernels")
    for name, text in scale_add_files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    env = dict(os.environ, CUDA_AGENT_SANDBOX_CACHE=str(cache_dir))
    p = _run(ws, env, "utils/compile.py")
    assert p.returncode == 0 and "BUILD OK" in p.stdout, p.stdout + p.stderr[-2000:]
    assert (ws / "build" / "cuda_extension.so").exists()
    # a later compile (a kernel edited) reads torch's facts from the cache: no import torch
    (ws / "kernels" / "ops.cpp").write_text(scale_add_files["kernels/ops.cpp"] + "\n// edited\n")
    p = _run(ws, env, "-X", "importtime", "utils/compile.py")
    assert p.returncode == 0 and "BUILD OK" in p.stdout, p.stdout + p.stderr[-2000:]
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in p.stderr.splitlines() if "|" in ln]
    assert "cuda_agent.sandbox.build" in imported and "torch" not in imported
    p = _run(ws, env, "utils/verify.py")
    assert p.returncode == 0 and p.stdout.strip().endswith("PASS"), p.stdout + p.stderr[-2000:]
    assert "trial 4" in p.stdout
    # a broken kernel: the compile tool shows the compiler's error and fails
    (ws / "kernels" / "ops.cpp").write_text("int broken( {")
    p = _run(ws, env, "utils/compile.py")
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
    # an agent tool's process: its own cache empty, the evaluation's readable (never written)
    env["CUDA_AGENT_SANDBOX_CACHE"] = str(tmp_path / "tools-cache")
    env["CUDA_AGENT_SANDBOX_READ_CACHE"] = str(tmp_path)
    tool, imported = facts()
    assert tool == first and not imported
    assert not (tmp_path / "tools-cache").exists()


def test_workspaces_find_torchs_facts_in_the_trusted_cache(tmp_path):
    """``prepare_trusted_cache`` (where workspaces are made) records torch's facts in the
    evaluation's cache, so even an agent's first tool command imports no torch for them."""
    from cuda_agent.sandbox.config import SandboxConfig
    from cuda_agent.sandbox.execute import prepare_trusted_cache, trusted_cache_root

    cfg = SandboxConfig(backend="cpu", cache_dir=str(tmp_path / "trusted"))
    prepare_trusted_cache("cpu", cfg)
    env = dict(
        os.environ,
        CUDA_AGENT_SANDBOX_CACHE=str(tmp_path / "tools-cache"),
        CUDA_AGENT_SANDBOX_READ_CACHE=str(trusted_cache_root(cfg)),
    )
    p = subprocess.run(
        [sys.executable, "-c", TORCH_INFO], env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-2000:]
    info, imported = json.loads(p.stdout.strip().splitlines()[-1])
    assert info["include"] and not imported


CAPABILITY = (
    "from cuda_agent.sandbox.toolchain import device_capability\nprint(device_capability())\n"
)


def test_the_gpus_capability_is_asked_once_per_boot(tmp_path):
    """nvidia-smi (slow where the driver is not kept loaded) answers once per boot and set of
    visible devices; later processes read the cache; a failed query is asked again. (nvidia-smi
    itself cannot run on a machine without a GPU: a script in its place counts the calls.)"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho x >> {calls}\ncat {tmp_path}/answer\n")
    smi.chmod(0o755)
    env = dict(os.environ, CUDA_AGENT_SANDBOX_CACHE=str(tmp_path / "cache"))
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env.pop("CUDA_AGENT_ARCH", None)

    def ask(**extra):
        p = subprocess.run(
            [sys.executable, "-c", CAPABILITY],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stderr[-2000:]
        n = len(calls.read_text().split()) if calls.exists() else 0
        return p.stdout.strip().splitlines()[-1], n

    (tmp_path / "answer").write_text("9.0\n")
    assert ask(CUDA_VISIBLE_DEVICES="0") == ("(9, 0)", 1)
    assert ask(CUDA_VISIBLE_DEVICES="0") == ("(9, 0)", 1)  # from the cache
    assert ask(CUDA_VISIBLE_DEVICES="1") == ("(9, 0)", 2)  # other devices: asked
    assert ask(CUDA_VISIBLE_DEVICES="0", CUDA_AGENT_ARCH="8.0") == ("(8, 0)", 2)
    (tmp_path / "answer").write_text("no devices were found\n")
    got, n = ask(CUDA_VISIBLE_DEVICES="7")  # nvidia-smi gives no capability: not kept
    assert ask(CUDA_VISIBLE_DEVICES="7")[1] == n + 1
