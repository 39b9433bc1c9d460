"""The library API: evaluate() and SandboxPool on the cpu backend; guards wired in."""

import json
import subprocess
import sys

from cuda_agent.records import Status
from cuda_agent.sandbox import SandboxConfig, SandboxPool, evaluate

from .conftest import FIX, kb_candidate, workdir_candidate

WRONG = 'extern "C" int kernel_run(float* out, const float* x, const float* w, const float* b, long rows, long cols) {\n  for (long i = 0; i < rows * cols; ++i) out[i] = x[i] * w[i % cols];\n  return 0;\n}\n'


def test_incorrect_kernel_is_caught(warm_build, cache_dir, scale_add_task, scale_add_files):
    """Wrong outputs are incorrect; the timing process started early (while the outputs were
    compared) is cancelled and killed at once, not left waiting for its start bound."""
    import time

    cfg = SandboxConfig(
        backend="cpu", cache_dir=str(cache_dir), guard_policy="off", baselines=False
    )
    t0 = time.monotonic()
    r = evaluate(
        workdir_candidate(scale_add_task, scale_add_files, **{"kernels/ops.cpp": WRONG}), cfg
    )
    assert r.status == Status.INCORRECT, r.message
    assert "time" not in r.meta["stages_s"] and "time_started_early" not in r.meta
    assert r.meta.get("time_cancelled_early") is True
    assert time.monotonic() - t0 < 300  # its start bound: verify_timeout_s + 600 s
    assert r.correctness is not None and not r.correctness.passed
    assert len(r.correctness.trials) >= 5 and not r.correctness.trials[0].passed
    assert r.compile is not None and r.compile.ok
    assert r.meta["isolation"]["network"]
    # the build says what linked the module (cpu modules: gold/lld/mold where one works)
    from cuda_agent.sandbox.toolchain import flags_for

    assert r.meta["build"]["linker"] == flags_for("cpu").linker
    from cuda_agent.sandbox.isolation import caps

    want = "leased unprivileged uids" if caps().drop_user else "the evaluator's user"
    assert r.meta["build"]["compilers_as"] == want
    # read from the build that ran, not from the config: an unchanged solution compiles nothing
    again = evaluate(
        workdir_candidate(scale_add_task, scale_add_files, **{"kernels/ops.cpp": WRONG}),
        cfg.with_(timing=False),
    )
    assert again.compile is not None and again.compile.cached
    assert again.meta["build"]["compilers_as"] == "none ran (all cached)"


def test_pool_keeps_order_and_static_guard_rejects(cache_dir, scale_add_task):
    # a ModelNew that computes with torch operators: the strict static guard rejects it before
    # anything runs, so this stays fast
    torch_ops = (
        "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self, cols):\n        super().__init__()\n"
        "        self.w = nn.Parameter(torch.empty(cols))\n        self.b = nn.Parameter(torch.empty(cols))\n"
        "    def forward(self, x):\n        return torch.addcmul(self.b, x, self.w)\n"
    )
    cands = [kb_candidate(scale_add_task, torch_ops + f"\n# {i}\n") for i in range(3)]
    cfg = SandboxConfig(backend="cpu", cache_dir=str(cache_dir), guard_policy="strict")
    with SandboxPool(cfg, compile_workers=2) as pool:
        results = list(pool.map(cands))
    assert [r.solution_id for r in results] == [c.solution.id for c in cands]
    for r in results:
        assert r.status == Status.GUARD_VIOLATION, (r.status, r.message)
        assert any(g.severity == "reject" for g in r.guards)


PEEK = (
    "import os, glob\nimport torch\nimport torch.nn as nn\n\n"
    "class ModelNew(nn.Module):\n"
    "    def __init__(self, cols):\n        super().__init__()\n"
    "        self.w = nn.Parameter(torch.empty(cols))\n        self.b = nn.Parameter(torch.empty(cols))\n"
    "    def forward(self, x):\n"
    "        root = os.path.dirname(os.getcwd())\n"
    "        seen = glob.glob(os.path.join(root, '**', 'ref_*.pt'), recursive=True)\n"
    "        if seen:\n            raise RuntimeError('SAW REFERENCE OUTPUTS: ' + ' '.join(seen))\n"
    "        return x * self.w + self.b\n"
)


def test_candidate_cannot_see_reference_outputs(cache_dir, scale_add_task):
    cfg = SandboxConfig(backend="cpu", cache_dir=str(cache_dir), timing=False, guard_policy="off")
    r = evaluate(kb_candidate(scale_add_task, PEEK), cfg)
    assert r.status == Status.OK, r.message


HONEST = (
    "import torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
    "    def __init__(self, cols):\n        super().__init__()\n"
    "        self.w = nn.Parameter(torch.empty(cols))\n        self.b = nn.Parameter(torch.empty(cols))\n"
    "    def forward(self, x):\n        return x * self.w + self.b\n"
)
HONEST = "import torch\n" + HONEST

BROKEN_REF = (
    "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
    "    def forward(self, x):\n        raise RuntimeError('reference breaks')\n\n"
    "def get_inputs():\n    return [torch.randn(8, 8)]\n\ndef get_init_inputs():\n    return []\n"
)


def test_verification_starts_while_the_reference_runs(cache_dir, scale_add_task):
    import pytest

    from cuda_agent.sandbox.isolation import caps

    if not caps().network_ns:
        pytest.skip("the early start needs a mount namespace to hide the reference's outputs")
    base = SandboxConfig(backend="cpu", cache_dir=str(cache_dir), timing=False, guard_policy="off")
    early = evaluate(kb_candidate(scale_add_task, HONEST), base)
    late = evaluate(kb_candidate(scale_add_task, HONEST), base.with_(early_verify=False))
    assert early.status == late.status == Status.OK, (early.message, late.message)
    assert early.meta.get("verify_started_early") is True
    assert "verify_started_early" not in late.meta
    assert "wait_reference" in early.meta["phases_s"]["verify"]
    assert "wait_reference" not in late.meta["phases_s"]["verify"]
    # the early process's life before the stage's clock (its start signal) is not in "other";
    # it is its start-up, import and wait when it waited (the wait ends up to a poll after the
    # signal), and a part of them when the signal came during its import
    ph = early.meta["phases_s"]["verify"]
    pre = ph["startup"] + ph["import_torch"] + ph["wait_reference"]
    assert ph["before_stage"] <= pre + 0.05, ph
    if ph["wait_reference"] > 0.01:
        assert ph["before_stage"] + 0.05 >= pre, ph
    assert ph["other"] > -0.05, ph
    assert "before_stage" not in late.meta["phases_s"]["verify"]
    assert late.meta["phases_s"]["verify"]["other"] > -0.05


def test_a_failing_reference_cancels_the_waiting_verification(cache_dir):
    import time

    from cuda_agent.records import Task

    task = Task.make("broken_reference", BROKEN_REF)
    cand = kb_candidate(task, HONEST.replace("x * self.w + self.b", "x"))
    cfg = SandboxConfig(backend="cpu", cache_dir=str(cache_dir), timing=False, guard_policy="off")
    t0 = time.monotonic()
    r = evaluate(cand, cfg)
    assert r.status == Status.INFRA_ERROR and "reference failed" in r.message, r.message
    # the verification process started early exits on the abort signal, not at its 10-minute bound
    assert time.monotonic() - t0 < 120


def test_timing_starts_while_the_outputs_are_compared(cache_dir, scale_add_task):
    """The timing process is started when the verification process has ended well and waits,
    after ``import torch``, for the comparison's verdict; same verdict as a late start."""
    base = SandboxConfig(
        backend="cpu",
        cache_dir=str(cache_dir),
        guard_policy="off",
        baselines=False,
        timing_config={"time_cap_s": 0.5, "min_samples": 3},
        warm_processes=0,  # the import is what the early start moves out of the stage
        fork_server=False,
    )
    early = evaluate(kb_candidate(scale_add_task, HONEST), base)
    late = evaluate(kb_candidate(scale_add_task, HONEST), base.with_(early_time=False))
    assert early.status == late.status == Status.OK, (early.message, late.message)
    assert early.timing is not None and early.timing.candidate.median_ms > 0
    assert "time_started_early" in early.meta and "time_started_early" not in late.meta
    assert "wait_compare" in early.meta["phases_s"]["time"]
    assert "wait_compare" not in late.meta["phases_s"]["time"]
    # its import happened before the start signal: not in the stage, unlike the late start
    assert early.meta["phases_s"]["time"]["import_torch"] > 0
    assert early.meta["phases_s"]["time"]["other"] > -0.05, early.meta["phases_s"]["time"]


LONE_EVALUATION = """
import json, sys, threading
from pathlib import Path
from cuda_agent.records import Candidate, Solution, Task
from cuda_agent.sandbox import SandboxConfig, evaluate
fix = Path(sys.argv[1])
task = Task.make("scale_add", (fix / "model.py").read_text())
files = {str(p.relative_to(fix)): p.read_text() for p in sorted(fix.rglob("*"))
         if p.is_file() and p.name != "model.py"}
assert "torch" not in sys.modules
r = evaluate(Candidate(task=task, solution=Solution.make("workdir", files)),
             SandboxConfig(backend="cpu", timing=False, cache_dir=sys.argv[2]))
print(json.dumps([r.status, [t.name for t in threading.enumerate()], "torch" in sys.modules]))
"""


def test_a_lone_cpu_evaluation_never_imports_torch_in_the_parent(cache_dir, warm_build):
    """The outputs are compared by the judge process, so ``evaluate`` on the cpu backend needs
    no torch in its own process (on cuda it imports it in a thread while the reference runs,
    for the speed-of-light floor): no import thread left, the verdict the same."""
    p = subprocess.run(
        [sys.executable, "-c", LONE_EVALUATION, str(FIX / "scale_add"), str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    status, threads, torch_imported = json.loads(p.stdout.strip().splitlines()[-1])
    assert status == "ok" and "import-torch" not in threads
    assert not torch_imported


def test_a_pool_starts_its_device_phases_fork_server_at_once():
    """The fork server of the device phases starts when the pool does (its import overlaps the
    first candidates' builds), keyed as the phases' own environment will be."""
    import tempfile
    from pathlib import Path

    from cuda_agent.sandbox.evaluate import _candidate_env
    from cuda_agent.sandbox.warm import WarmPool, shared_pool

    here = Path(tempfile.mkdtemp())
    key = WarmPool.key(_candidate_env(here / "tmp", None, "cpu", here / "triton"))
    pool = SandboxPool(SandboxConfig(backend="cpu"))
    try:
        assert key in shared_pool(0, fork=True)._servers
    finally:
        pool.close()
