#!/usr/bin/env bash
# A model or a folder of solutions against a KernelBench checkout: the paper's table.
#
#   uv run bin/eval_kernelbench.sh --kernelbench ~/KernelBench --solutions my_kernels/ [OPTIONS]
#   uv run bin/eval_kernelbench.sh --kernelbench ~/KernelBench --model hf:/models/my-actor [OPTIONS]
#   uv run bin/eval_kernelbench.sh --kernelbench ~/KernelBench --model 'openai:http://host:8000/v1#MODEL'
#
# Options: --out DIR (runs/kernelbench), --levels 1,2,3, --problems 1-20, --backend cuda|cpu|auto,
# --guard-policy strict|kernelbench (kernelbench), --gpus all, --max-turns N (200), --device cuda.
# Resumable: rerun the same command after an interruption. Writes DIR/report.md, report.json,
# speedup.png.
set -euo pipefail
KB="" SOL="" MODEL="" OUT=runs/kernelbench LEVELS=1,2,3 PROBLEMS="" BACKEND=auto POLICY=kernelbench
GPUS="" TURNS=200 DEVICE=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --kernelbench) KB=$2; shift 2 ;;
    --solutions) SOL=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --levels) LEVELS=$2; shift 2 ;;
    --problems) PROBLEMS=$2; shift 2 ;;
    --backend) BACKEND=$2; shift 2 ;;
    --guard-policy) POLICY=$2; shift 2 ;;
    --gpus) GPUS=$2; shift 2 ;;
    --max-turns) TURNS=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "eval_kernelbench: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$KB" ] || { echo "eval_kernelbench: --kernelbench PATH is required" >&2; exit 2; }
if [ -n "$SOL" ] && [ -n "$MODEL" ] || [ -z "$SOL" ] && [ -z "$MODEL" ]; then
  echo "eval_kernelbench: give exactly one of --solutions DIR or --model SPEC" >&2; exit 2
fi
if [ "$DEVICE" = auto ]; then
  DEVICE=$(python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
fi
mkdir -p "$OUT"
kernelbench-eval tasks --root "$KB" --levels "$LEVELS" ${PROBLEMS:+--problems "$PROBLEMS"} > "$OUT/tasks.jsonl"
if [ -n "$SOL" ]; then
  kernelbench-eval solutions --dir "$SOL" < "$OUT/tasks.jsonl" > "$OUT/candidates.jsonl"
  kernelbench-eval run --backend "$BACKEND" --guard-policy "$POLICY" ${GPUS:+--gpus "$GPUS"} \
    -o "$OUT/results.jsonl" --resume < "$OUT/candidates.jsonl"
  RESULTS="$OUT/results.jsonl"
else
  agent rollout --policy "$MODEL" --tasks "$OUT/tasks.jsonl" --samples 1 --temperature 0 \
    --max-turns "$TURNS" --backend "$BACKEND" --device "$DEVICE" --workdir "$OUT/workspaces" \
    -o "$OUT/trajectories.jsonl" --resume
  RESULTS="$OUT/trajectories.jsonl"
fi
kernelbench-eval report --tasks "$OUT/tasks.jsonl" --out-dir "$OUT" "$RESULTS" > /dev/null
cat "$OUT/report.md"
