"""KernelBench's own eval_kernel_against_ref on the positive corpus's batch-statistics
solutions (level 2 problem 33, level 3 problem 8) and on their earlier running-statistics forms
(git show 91bccbb:<path>): which form KernelBench's harness (train mode) accepts. Run on the GPU
machine from the repo root with .gpu-data carried: python3 docs/lab/session21/kb_harness_bn.py OUT_DIR"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, ".gpu-data/kernelbench/src")
sys.path.insert(0, "packages/kernelbench-eval/benchmarks")
from throughput import install_stubs  # noqa: E402  (dotenv, openai, litellm: absent there)

install_stubs()
from kernelbench.eval import eval_kernel_against_ref  # noqa: E402

CORPUS = Path("packages/kernelbench-eval/corpus/positive")
CASES = [
    (
        "KernelBench/level2/33_Gemm_Scale_BatchNorm.py",
        "solutions/level_2_problem_33_sample_0_kernel.py",
    ),
    ("KernelBench/level3/8_ResNetBasicBlock.py", "solutions/level_3_problem_8_sample_0_kernel.py"),
]
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rows = []
for ref, sol in CASES:
    ref_src = (CORPUS / ref).read_text()
    old = subprocess.run(
        ["git", "show", f"91bccbb:{CORPUS / sol}"], capture_output=True, text=True
    ).stdout
    for form, src in (
        ("batch-statistics", (CORPUS / sol).read_text()),
        ("running-statistics", old),
    ):
        if not src:
            continue
        with tempfile.TemporaryDirectory() as bd:
            r = eval_kernel_against_ref(
                ref_src,
                src,
                num_correct_trials=5,
                num_perf_trials=10,
                measure_performance=False,
                build_dir=bd,
            )
        row = {
            "problem": ref,
            "form": form,
            "compiled": getattr(r, "compiled", None),
            "correctness": getattr(r, "correctness", None),
            "metadata": {k: str(v)[:300] for k, v in (getattr(r, "metadata", {}) or {}).items()},
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
(out / "kb_harness_bn.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
