"""`sandbox exec` (an agent's Bash tool): confined commands may write their workspace, a scratch
directory and the tools' own cache, never the cache the trusted evaluation builds from."""

from __future__ import annotations

import pytest

from cuda_agent.sandbox import SandboxConfig, exec_shell
from cuda_agent.sandbox.evaluate import cache_root
from cuda_agent.sandbox.isolation import caps


def test_agent_commands_cannot_plant_objects_in_the_evaluation_cache(tmp_path, monkeypatch):
    """An agent that could write the evaluation's build cache could plant an object under the
    content key of its own source, and the reward's build would link that object instead of
    compiling the source the guards read."""
    if not caps().network_ns:  # the same probe: namespaces, hence read-only views
        pytest.skip("read-only file system views need a mount namespace")
    monkeypatch.setenv("CUDA_AGENT_SANDBOX_CACHE", str(tmp_path / "cache"))
    trusted = cache_root(SandboxConfig())
    (trusted / "build" / "objects" / "ab").mkdir(parents=True)
    ws = tmp_path / "ws"
    ws.mkdir()
    planted = trusted / "build" / "objects" / "ab" / "ab0123.o"
    out = exec_shell(ws, f"echo evil > {planted}; echo rc=$?; echo $CUDA_AGENT_SANDBOX_CACHE")
    assert not planted.exists(), out.stdout
    assert "rc=0" not in out.stdout, out.stdout
    # the tools' own cache (what utils/compile.py and utils/verify.py build into) is writable
    tools = out.stdout.strip().splitlines()[-1]
    assert tools != str(trusted) and tools.startswith(str(trusted))
    out = exec_shell(ws, "mkdir -p $CUDA_AGENT_SANDBOX_CACHE/build && touch $_/x && echo made")
    assert "made" in out.stdout, out.stdout + out.stderr
