"""`sandbox exec` (an agent's Bash tool): confined commands may write their workspace, a scratch
directory and the tools' own cache, never the cache the trusted evaluation builds from."""

from __future__ import annotations

import pytest

from cuda_agent.sandbox import SandboxConfig, exec_shell
from cuda_agent.sandbox.evaluate import cache_root
from cuda_agent.sandbox.execute import tools_cache_dir
from cuda_agent.sandbox.isolation import caps


def test_agent_commands_cannot_plant_objects_in_the_evaluation_cache(confined_tmp, monkeypatch):
    """An agent that could write the evaluation's build cache could plant an object under the
    content key of its own source, and the reward's build would link that object instead of
    compiling the source the guards read."""
    if not caps().network_ns:  # the same probe: namespaces, hence read-only views
        pytest.skip("read-only file system views need a mount namespace")
    monkeypatch.setenv("CUDA_AGENT_SANDBOX_CACHE", str(confined_tmp / "cache"))
    trusted = cache_root(SandboxConfig())
    (trusted / "build" / "objects" / "ab").mkdir(parents=True)
    ws = confined_tmp / "ws"
    ws.mkdir()
    planted = trusted / "build" / "objects" / "ab" / "ab0123.o"
    out = exec_shell(ws, f"echo evil > {planted}; echo rc=$?; echo $CUDA_AGENT_SANDBOX_CACHE")
    assert not planted.exists(), out.stdout
    assert "rc=0" not in out.stdout, out.stdout
    # the tools' own cache (what utils/compile.py and utils/verify.py build into) is writable
    tools = out.stdout.strip().splitlines()[-1]
    assert tools == str(tools_cache_dir(ws)) and tools.startswith(str(trusted))
    out = exec_shell(ws, "mkdir -p $CUDA_AGENT_SANDBOX_CACHE/build && touch $_/x && echo made")
    assert "made" in out.stdout, out.stdout + out.stderr


def test_agent_tools_reuse_what_the_evaluation_built(
    warm_build, cache_dir, confined_tmp, monkeypatch, scale_add_task, scale_add_files
):
    """The tools' cache reads (never writes) the trusted one: a workspace whose files the
    evaluation already built compiles from it without running a compiler."""
    import shutil

    from cuda_agent.sandbox.build import ObjectCache
    from cuda_agent.sandbox.workspace import create_workspace

    if not caps().network_ns:
        pytest.skip("read-only file system views need a mount namespace")
    monkeypatch.setenv("CUDA_AGENT_SANDBOX_CACHE", str(cache_dir))
    tmp_path = confined_tmp
    ws = create_workspace(scale_add_task, tmp_path / "ws", backend="cpu")
    shutil.rmtree(ws / "kernels")
    for name, text in scale_add_files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    out = exec_shell(ws, "python utils/compile.py")
    assert "BUILD OK" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "binding.cpp (main, cached)" in out.stdout and "(kernel, cached)" in out.stdout
    assert (ws / "build" / "cuda_extension.so").exists()
    # the lookup order: its own entry, else the other store's, else its own path (to write)
    own, other = ObjectCache(tmp_path / "own", read_also=tmp_path / "other"), tmp_path / "other"
    p = own.obj_path("ab01")
    assert own.existing(p) == p
    (other / p.relative_to(own.root)).parent.mkdir(parents=True)
    (other / p.relative_to(own.root)).write_bytes(b"x")
    assert own.existing(p) == other / p.relative_to(own.root)
    p.parent.mkdir(parents=True)
    p.write_bytes(b"y")
    assert own.existing(p) == p


PLANTER = (
    "import os\nimport torch\nimport torch.nn as nn\n\n"
    "class ModelNew(nn.Module):\n"
    "    def __init__(self, cols):\n        super().__init__()\n"
    "        self.w = nn.Parameter(torch.empty(cols))\n        self.b = nn.Parameter(torch.empty(cols))\n"
    "    def forward(self, x):\n"
    "        triton = os.environ['TRITON_CACHE_DIR']\n"
    "        root = os.path.dirname(os.path.dirname(triton))\n"
    "        for d in ('kb_ext', 'triton'):\n"
    "            try:\n"
    "                open(os.path.join(root, d, 'planted-for-another-solution'), 'w').close()\n"
    "                raise RuntimeError('PLANTED in ' + d)\n"
    "            except OSError:\n"
    "                pass\n"
    "        open(os.path.join(triton, 'own-entry'), 'w').close()  # its own namespace: fine\n"
    "        return x * self.w + self.b\n"
)


def test_a_candidate_cannot_leave_extensions_for_other_solutions(cache_dir, scale_add_task):
    """KernelBench extension and Triton builds run inside the candidate's process, so each
    solution writes only its own namespace of those caches."""
    from cuda_agent.records import Status
    from cuda_agent.sandbox import evaluate

    from .conftest import kb_candidate

    if not caps().network_ns:
        pytest.skip("read-only file system views need a mount namespace")
    cfg = SandboxConfig(backend="cpu", cache_dir=str(cache_dir), timing=False, guard_policy="off")
    cand = kb_candidate(scale_add_task, PLANTER)
    r = evaluate(cand, cfg)
    assert r.status == Status.OK, r.message
    assert (cache_dir / "triton" / cand.solution.id / "own-entry").exists()
    assert not list(cache_dir.glob("*/planted-for-another-solution"))


def test_tools_caches_of_removed_workspaces_are_collected(confined_tmp, monkeypatch):
    """One tools cache per workspace: those whose workspace is gone are removed when the next
    workspace's first command runs, so an RL run's episodes do not pile them up."""
    import shutil

    monkeypatch.setenv("CUDA_AGENT_SANDBOX_CACHE", str(confined_tmp / "cache"))
    old, new = confined_tmp / "ws-old", confined_tmp / "ws-new"
    old.mkdir()
    new.mkdir()
    out = exec_shell(old, "touch $CUDA_AGENT_SANDBOX_CACHE/left-over && echo ok")
    assert "ok" in out.stdout, out.stdout + out.stderr
    old_cache = tools_cache_dir(old)
    assert (old_cache / "left-over").exists()
    exec_shell(new, "true")
    assert old_cache.exists()  # its workspace is still there
    shutil.rmtree(old)
    exec_shell(new, "true")  # not a first command: nothing collected
    assert old_cache.exists()
    newer = confined_tmp / "ws-newer"
    newer.mkdir()
    exec_shell(newer, "true")
    assert not old_cache.exists() and tools_cache_dir(new).exists()
    from cuda_agent.sandbox.execute import exec_tmp_dir

    assert not (exec_tmp_dir() / old_cache.name).exists()  # its scratch directory too
    assert (exec_tmp_dir() / tools_cache_dir(new).name).exists()


def test_tools_never_build_the_prelude_they_can_read(tmp_path):
    """The precompiled prelude is about 0.5 GB: a tools cache (one per workspace) reads the
    trusted one and never builds its own."""
    from cuda_agent.sandbox.build import ObjectCache, ensure_pch
    from cuda_agent.sandbox.isolation import Limits
    from cuda_agent.sandbox.toolchain import flags_for

    flags = flags_for("cpu")
    tools = ObjectCache(tmp_path / "tools", read_also=tmp_path / "trusted" / "build")
    d, note = ensure_pch(tools, flags, Limits(timeout_s=60))
    assert d is None and "not built" in note and not list((tmp_path / "tools").rglob("*.gch"))
    gch = tmp_path / "trusted" / "build" / "pch" / flags.key / "sandbox_prelude.h.gch"
    gch.parent.mkdir(parents=True)
    gch.write_bytes(b"x")
    assert ensure_pch(tools, flags, Limits(timeout_s=60)) == (gch.parent, "pch: cached")


def test_agent_commands_read_the_cache_of_their_evaluations_config(confined_tmp):
    """A ``SandboxEnv`` whose config names a cache: its agents' tools read that cache (what its
    evaluations built), not the default one."""
    cfg = SandboxConfig(backend="cpu", cache_dir=str(confined_tmp / "run-cache"))
    ws = confined_tmp / "ws"
    ws.mkdir()
    out = exec_shell(
        ws, "echo $CUDA_AGENT_SANDBOX_CACHE; echo $CUDA_AGENT_SANDBOX_READ_CACHE", config=cfg
    )
    own, trusted = out.stdout.split()
    assert trusted == str(confined_tmp / "run-cache") and own == str(tools_cache_dir(ws, cfg))
    assert own.startswith(trusted + "/tools/")
