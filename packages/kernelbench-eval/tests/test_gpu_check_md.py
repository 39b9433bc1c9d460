"""benchmarks/to_md.py renders the GPU check's summary (here: a cpu rehearsal's) and copies the
report into a docs folder."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
SCRIPT = HERE.parent / "benchmarks" / "to_md.py"
FIX = HERE / "fixtures" / "gpu_check_cpu"


def test_to_md_section_and_copy(tmp_path, md_row):
    dest = tmp_path / "docs" / "kernelbench-example"
    p = subprocess.run(
        [sys.executable, str(SCRIPT), str(FIX), "--copy-to", str(dest)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    md = p.stdout
    assert "## KernelBench fixture tree through the cpu path" in md
    assert md_row(md, "L1/2 Softmax", "incorrect (incorrect)") and "**unexpected**" not in md
    assert md_row(md, "overall", 6, "33.3%")
    assert "![speed-up per level](kernelbench-example/speedup.png)" in md
    assert {f.name for f in dest.iterdir()} == {"report.md", "speedup.png", "summary.json"}
