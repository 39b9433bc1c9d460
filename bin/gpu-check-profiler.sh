#!/usr/bin/env bash
# Acceptance measurements of cuda_agent.profiler on a GPU (see docs/lab/history/benchmarks-profiler.md).
#
# Run from the repository root on the GPU machine (python3 with torch; msgspec on PYTHONPATH):
#   OUT=/tmp/prof bash bin/gpu-check-profiler.sh            # everything
#   STAGES="spread report" bash bin/gpu-check-profiler.sh    # some stages
# Stages: ceilings spread exploits ncu baseline tests precompile compile report.
# Env: PROCS (5), SPREAD_CAP (s per problem, 0.5), ONLY (regex on level*/name), DEADLINE_S (520):
# the compile stage stops taking problems once DEADLINE_S seconds have passed since the start.
# Writes at most 8 files under $OUT: log.txt, ceilings.json, spread.jsonl, exploits.jsonl,
# ncu.txt, baseline.jsonl, compile.jsonl, report.md (+ report.json when room).
set -u
OUT=${OUT:-/tmp/profiler-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export CUDA_AGENT_CACHE=${CUDA_AGENT_CACHE:-/tmp/cuda-agent-cache}
PY=${PY:-python3}
FIX=tests/fixtures/KernelBench
PROCS=${PROCS:-5}
SPREAD_CAP=${SPREAD_CAP:-0.5}
ONLY=${ONLY:-.}
DEADLINE_S=${DEADLINE_S:-520}
STAGES=${STAGES:-"ceilings spread exploits ncu baseline tests precompile compile report"}
T0=$(date +%s)
LOG="$OUT/log.txt"
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG" >&2; }
has() { [[ " $STAGES " == *" $1 "* ]]; }

say "start $(date -u +%FT%TZ) commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee -a "$LOG"
$PY -c "import torch; print('torch', torch.__version__, torch.version.cuda)" 2>&1 | tee -a "$LOG"

if has ceilings; then
  say "ceilings"
  timeout 120 $PY -m cuda_agent.profiler.cli ceilings --recompute > "$OUT/ceilings.json" 2>> "$LOG"
fi

if has spread; then
  for i in $(seq 0 $((PROCS - 1))); do
    say "spread process $i"
    timeout 150 $PY -m cuda_agent.profiler.bench spread $FIX --proc "$i" --only "$ONLY" \
      --time-cap "$SPREAD_CAP" --out "$OUT/spread.jsonl" 2>> "$LOG"
  done
fi

if has exploits; then
  say "exploits"
  timeout 120 $PY -m cuda_agent.profiler.bench exploits $FIX/exploits --time-cap 1 --trace \
    --out "$OUT/exploits.jsonl" 2>> "$LOG"
fi

if has ncu; then
  for p in level1/13_Square_matmul level1/1_ReLU; do
    say "ncu $p"
    {
      echo "===== profiler ncu $FIX/$p.py"
      timeout 120 $PY -m cuda_agent.profiler.cli ncu "$FIX/$p.py" --raw-csv "/tmp/ncu_raw.csv"
      echo "===== JSON"
      $PY -m cuda_agent.profiler.cli ncu "$FIX/$p.py" --from-csv /tmp/ncu_raw.csv --json
      echo "===== raw CSV (first 40 lines)"
      head -n 40 /tmp/ncu_raw.csv
    } >> "$OUT/ncu.txt" 2>> "$LOG"
  done
  say "torch.profiler fallback (--no-ncu) on level1/1_ReLU"
  { echo "===== profiler ncu --no-ncu level1/1_ReLU";
    timeout 120 $PY -m cuda_agent.profiler.cli ncu "$FIX/level1/1_ReLU.py" --no-ncu; } \
    >> "$OUT/ncu.txt" 2>> "$LOG"
fi

if has baseline; then
  say "profiler baseline (CLI, fresh subprocess per task)"
  $PY -m cuda_agent.profiler.bench tasks $FIX --only 'level1/(1_ReLU|6_Softmax)[.]|level2/1_' \
    > /tmp/tasks.jsonl 2>> "$LOG"
  timeout 180 $PY -m cuda_agent.profiler.cli baseline /tmp/tasks.jsonl --timeout 120 \
    --time-cap 1 > "$OUT/baseline.jsonl" 2>> "$LOG"
  say "second pass (must hit the cache)"
  timeout 60 $PY -m cuda_agent.profiler.cli baseline /tmp/tasks.jsonl > /dev/null 2>> "$LOG"
fi

if has tests; then
  say "pytest -m gpu packages/profiler"
  timeout 150 $PY -m pytest -o addopts=--import-mode=importlib -q -m gpu packages/profiler -p no:cacheprovider 2>&1 | tail -n 30 >> "$LOG"
fi

if has precompile; then
  say "precompile (8 processes in parallel; fills inductor caches, no timing)"
  pids=()
  for i in 0 1 2 3 4 5 6 7; do
    timeout 150 $PY -m cuda_agent.profiler.bench precompile $FIX --only "$ONLY" --shard "$i/8" \
      2>> "$LOG" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
fi

if has compile; then
  say "compile baselines (eager vs torch.compile interleaved, one process)"
  left=$(( DEADLINE_S - ($(date +%s) - T0) ))
  if (( left > 20 )); then
    timeout "$left" $PY -m cuda_agent.profiler.bench compile $FIX --only "$ONLY" --time-cap 0.5 \
      --out "$OUT/compile.jsonl" 2>> "$LOG"
  else
    say "no time left for compile"
  fi
fi

if has report; then
  say "report"
  $PY -m cuda_agent.profiler.bench report --spread "$OUT/spread.jsonl" \
    --compile "$OUT/compile.jsonl" --exploits "$OUT/exploits.jsonl" \
    --ceilings "$OUT/ceilings.json" --json-out /tmp/report.json --md-out "$OUT/report.md" \
    2>> "$LOG"
fi
say "done"
