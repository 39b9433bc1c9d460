"""Compile the scale_add fixture's binding (it includes <torch/extension.h>) against the
sandbox's stand-in and against the real header, interleaved, cpu flags, no PCH; prints seconds.

    uv run python packages/sandbox/benchmarks/standin_ab.py [ROUNDS]
"""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cuda_agent.records import Solution, Task
from cuda_agent.sandbox.build import Unit, _unit_cmd
from cuda_agent.sandbox.toolchain import flags_for
from cuda_agent.sandbox.workspace import materialise

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "scale_add"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    files = {
        str(p.relative_to(FIX)): p.read_text()
        for p in FIX.rglob("*")
        if p.is_file() and p.name != "model.py"
    }
    task = Task.make("scale_add", (FIX / "model.py").read_text())
    d = Path(tempfile.mkdtemp())
    work = materialise(task, Solution.make("workdir", files), d / "w", "cpu")
    flags = flags_for("cpu")
    unit = Unit("binding", work / "kernels" / "ops_binding.cpp", "kernels/ops_binding.cpp")
    res: dict[str, list[float]] = {"stand-in": [], "real": []}
    for _ in range(rounds):
        for name, standin in (("stand-in", True), ("real", False)):
            cmd = _unit_cmd(unit, flags, d / "o.o", work, None, standin)
            t = time.monotonic()
            p = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
            res[name].append(round(time.monotonic() - t, 1))
            if p.returncode != 0:
                sys.exit(p.stderr[-2000:])
    print(res)


if __name__ == "__main__":
    main()
