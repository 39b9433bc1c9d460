"""What an agent's compile step costs, as a whole process: the workspace tool
``python utils/compile.py`` against ``torch.utils.cpp_extension.load`` of the same sources in a
``python -c`` (the CUDA-Agent harness's compile), both after an edit of a kernel's body (the
common iteration; a new constant each time, so nothing is a cache hit), alternating.

Arms:
  tool         ``utils/compile.py``, torch's facts and the GPU's capability read from the
               toolchain cache (no ``import torch``, no nvidia-smi; the default since session 14)
  tool_import  the same with torch's entry removed first (the tool imports torch, as before
               session 14; the capability stays cached)
  tool_exec    the same command through ``sandbox.exec_shell`` in this process, as the agent's
               Bash tool runs it: confined, as a leased uid when started as root, into the
               workspace tools' own cache (what an agent waits for)
  load         ``load()`` with its build directory kept (ninja rebuilds the one ``.cu``); its
               process also prints the ``load()`` call alone (``load_call_s``, torch imported)

    python packages/sandbox/benchmarks/tool_compile_ab.py [ROUNDS] [BACKEND]

BACKEND ``cuda`` (default) needs nvcc, not a GPU (set ``CUDA_AGENT_ARCH=9.0`` without one); the
tool's object cache is the default one (``CUDA_AGENT_SANDBOX_CACHE``), so run it once before
measuring (the first build of the precompiled prelude is not what this measures). Prints one
JSON line."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cuda_agent.records import Task
from cuda_agent.sandbox.execute import exec_shell, prepare_trusted_cache
from cuda_agent.sandbox.toolchain import (
    _torch_install_key,
    cuda_home,
    default_cache_dir,
    device_capability,
    torch_arch_list,
)
from cuda_agent.sandbox.workspace import create_workspace

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "gpu_fused"
BODY = "fminf(fmaxf((a + b) * s, -3.0f), 3.0f)"
SALT = os.getpid() % 100000  # the tool's cache outlives a run: every run's constants are new


def edit(cu: Path, n: int) -> None:
    """A kernel-body edit that changes the device code (a new clamp bound), not the host code."""
    text = (FIX / "kernels" / "fused.cu").read_text()
    assert BODY in text
    cu.chmod(0o644)
    cu.write_text(text.replace(BODY, f"fminf(fmaxf((a + b) * s, -3.{SALT:05d}{n:03d}f), 3.0f)"))


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    s = time.perf_counter() - t
    assert p.returncode == 0, (cmd, p.stdout[-2000:], p.stderr[-2000:])
    return s, p.stdout + p.stderr


def fixture_workspace(prefix: str, backend: str) -> tuple[Path, Path]:
    """(root, workspace): a fresh agent workspace of the gpu_fused fixture whose kernels are the
    fixture's own (the worked example removed), under a root an unprivileged uid can reach."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)  # exec_shell's leased uid must reach the workspace
    task = Task.make("gpu_fused", (FIX / "model.py").read_text())
    ws = create_workspace(task, root / "ws", backend)
    for f in (ws / "kernels").iterdir():
        f.unlink()
    for f in ("kernels/fused.cu", "kernels/fused_binding.cpp", "model_new.py"):
        (ws / f).write_text((FIX / f).read_text())
    return root, ws


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    backend = sys.argv[2] if len(sys.argv) > 2 else "cuda"
    root, ws = fixture_workspace("tool-compile-ab-", backend)
    env = dict(os.environ)
    if backend == "cuda":
        env["TORCH_CUDA_ARCH_LIST"] = torch_arch_list(device_capability() or (9, 0))
        if cuda_home():
            env.setdefault("CUDA_HOME", str(cuda_home()))
    bdir = root / "load_build"
    bdir.mkdir()
    load_ws = root / "load_ws"  # load's own copy of the tree: its edits never touch the workspace
    shutil.copytree(ws, load_ws, ignore=shutil.ignore_patterns("build", ".sandbox", "utils"))
    rel = ["binding.cpp", "kernels/fused_binding.cpp", "kernels/fused.cu"]
    load_code = (
        "import time, torch, torch.utils.cpp_extension as ce\n"
        "t = time.monotonic()\n"
        f"ce.load(name='cuda_extension', sources={[str(load_ws / r) for r in rel]!r},"
        f" build_directory={str(bdir)!r}, extra_include_paths=[{str(load_ws)!r}], verbose=False)\n"
        "print(f'LOAD_CALL_S={time.monotonic() - t:.3f}')\n"
    )
    tool = [sys.executable, "utils/compile.py"]
    prepare_trusted_cache(backend)  # what an agent's environment does before its first command

    def exec_tool() -> tuple[float, str]:
        t = time.perf_counter()
        o = exec_shell(ws, f"{sys.executable} utils/compile.py", timeout=900)
        s = time.perf_counter() - t
        assert o.returncode == 0, (o.stdout[-2000:], o.stderr[-2000:])
        return s, o.stdout + o.stderr

    info = default_cache_dir() / "toolchain" / f"torch-{_torch_install_key()}.json"
    # warm-up, not timed: the prelude and bindings in the tool's cache, load's first build
    timed(tool, ws, env)
    exec_tool()  # the tools' own cache: its prelude and bindings
    timed([sys.executable, "-c", load_code], root, env)
    times: dict[str, list[float]] = {"tool": [], "tool_import": [], "tool_exec": [], "load": []}
    load_call: list[float] = []
    n = 0
    for r in range(rounds):
        arms = list(times)
        for arm in arms if r % 2 == 0 else arms[::-1]:
            n += 1
            if arm == "load":
                edit(load_ws / "kernels" / "fused.cu", n)
                s, out = timed([sys.executable, "-c", load_code], root, env)
                m = re.search(r"LOAD_CALL_S=([0-9.]+)", out)
                load_call.append(float(m.group(1)) if m else float("nan"))
            else:
                edit(ws / "kernels" / "fused.cu", n)
                if arm == "tool_import":
                    info.unlink(missing_ok=True)
                s, out = exec_tool() if arm == "tool_exec" else timed(tool, ws, env)
                assert "BUILD OK" in out and "fused.cu (cuda, cached)" not in out, out[-1500:]
            times[arm].append(s)
    # where one more tool run's time goes (cProfile of the tool process, top of the list)
    edit(ws / "kernels" / "fused.cu", n + 1)
    _, prof = timed([sys.executable, "-m", "cProfile", "-s", "cumulative", *tool[1:]], ws, env)
    lines = prof.splitlines()
    start = next((i for i, ln in enumerate(lines) if "ncalls" in ln), 0)
    profile = [ln.rstrip() for ln in lines[: start + 30] if ln.strip()]
    med = {k: round(statistics.median(v), 3) for k, v in times.items()}
    med["load_call"] = round(statistics.median(load_call), 3)
    print(
        json.dumps(
            {
                "rounds": rounds,
                "backend": backend,
                "cpus": os.cpu_count(),
                "median_s": med,
                "load/tool": round(med["load"] / med["tool"], 2),
                "load_call/tool": round(med["load_call"] / med["tool"], 2),
                "tool_import/tool": round(med["tool_import"] / med["tool"], 2),
                "load/tool_exec": round(med["load"] / med["tool_exec"], 2),
                "tool_exec/tool": round(med["tool_exec"] / med["tool"], 2),
                "all_s": times,
                "tool_profile": profile,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
