#!/usr/bin/env bash
# The README's main-job command: `uv run bin/demo.sh` (no GPU and no downloads beyond `uv sync`).
#
# Runs the whole CUDA Agent chain in miniature with configs/tiny-cpu.toml: a few synthesised
# fused-operator tasks, SmolLM2-135M-Instruct as the policy, a single-turn PPO warm-up step,
# agent episodes in the sandbox, rejection fine-tuning, critic value pretraining, one multi-turn
# PPO step, and a KernelBench-style report on the miniature tree shipped with the tests.
# With a GPU (torch.cuda available and nvcc on PATH) the sandbox uses the CUDA backend.
#
#   uv run bin/demo.sh [RUN_DIR]        (default runs/demo; rerun to continue an interrupted demo)
#
# Expect garbage kernels from a 135M model: the plumbing, not the model, is what the demo shows.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/demo}
EXTRA=()
if python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && command -v nvcc >/dev/null; then
  EXTRA+=(--set 'sandbox.backend="cuda"' --set 'train.device="cuda"' --set 'pipeline.synth_size="gpu"')
  echo "demo: GPU found, using the cuda backend" >&2
fi
bash bin/train_all.sh --config configs/tiny-cpu.toml --run-dir "$RUN" "${EXTRA[@]}"
echo >&2
echo "demo finished. What to look at:" >&2
echo "  $RUN/data/tasks.jsonl               synthesised tasks     (records stats / records head)" >&2
echo "  $RUN/collect/trajectories.jsonl     agent episodes        (agent replay $RUN/collect/trajectories.jsonl)" >&2
echo "  $RUN/ppo/metrics.jsonl              PPO metrics" >&2
echo "  $RUN/eval/report.md                 KernelBench-style report (and speedup.png)" >&2
echo "  $RUN/logs/                          one log per stage" >&2
[ -f "$RUN/eval/report.md" ] && cat "$RUN/eval/report.md"
exit 0
