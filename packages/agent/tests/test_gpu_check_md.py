"""benchmarks/to_md.py renders the GPU check's JSON (here: a cpu rehearsal's) into a docs section."""

import importlib.util
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
SCRIPT = HERE.parent / "benchmarks" / "to_md.py"
FIX = HERE / "fixtures" / "gpu_check_cpu"


def test_to_md_renders_both_sections():
    spec = importlib.util.spec_from_file_location("agent_to_md", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    md = mod.render(FIX, "bash bin/gpu-check-agent.sh")
    assert "## Agent on the GPU" in md and "commit `128bcf597950`" in md
    assert "| submit | 6 | 9 (0) | ok | +2.0 | 2.93x | n/a |" in md
    assert "`python utils/verify.py` 8.9 s" in md
    assert "| 2 | 20.4 | 354 | 20.2 | 0.0 | 0.1 |" in md
    assert "{'guard_violation': 2}" in md


def test_to_md_cli_and_a_failed_section(tmp_path):
    import json

    rep = json.loads((FIX / "agent_gpu.json").read_text())
    rep["tiny"] = {"error": "OutOfMemoryError: boom"}
    del rep["scripted"]
    (tmp_path / "agent_gpu.json").write_text(json.dumps(rep))
    p = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert "(not run)" in p.stdout and "failed to run**: `OutOfMemoryError: boom`" in p.stdout
