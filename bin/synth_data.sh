#!/usr/bin/env bash
# Synthesise a training set: crawl | compose | filter | dedup | profiler baseline -> data/tasks.jsonl
#
#   bin/synth_data.sh [OUTDIR]            (default OUTDIR=data)
#
# Environment (defaults in brackets):
#   N [6000]        composed tasks before filtering     SEED [0]     compose seed
#   BACKEND [cuda if a GPU is visible, else cpu]        SIZE [gpu for cuda, cpu for cpu]
#   GPUS [all visible]  GPUs to use (filter workers and baseline shards; CUDA_VISIBLE_DEVICES=i)
#   WORKERS_PER_GPU [cuda: min(12, (cores - 2) / GPUS); cpu: 1]  filter processes per GPU, all
#                   taking tasks from one queue; eager timing is serialised per GPU by its gate
#   MEM_GB [cuda: 90% of a GPU's memory / WORKERS_PER_GPU; cpu: 16]  memory cap per task
#   KB []           KernelBench checkout to decontaminate against (level*/*.py)
#   COMPILE [1]     also check torch.compile in the filter (0: skip, much faster on a CPU)
#   BASELINE [1 on cuda]  fill Task.baseline with `profiler baseline`
# Every stage is resumable: rerun the same command after an interruption.
set -euo pipefail
OUT=${1:-data}
N=${N:-6000}
SEED=${SEED:-0}
if [ -z "${BACKEND:-}" ]; then
  if python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    BACKEND=cuda; else BACKEND=cpu; fi
fi
SIZE=${SIZE:-$([ "$BACKEND" = cuda ] && echo gpu || echo cpu)}
if [ "$BACKEND" = cuda ]; then
  GPUS=${GPUS:-$(python -c "import torch; print(torch.cuda.device_count())")}
else
  GPUS=${GPUS:-1}
fi
# shard i runs on the i-th device this script may see (a restricted CUDA_VISIBLE_DEVICES is kept)
IFS=, read -r -a VISIBLE <<< "${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((GPUS - 1)))}"
dev() { [ "$BACKEND" = cuda ] && echo "${VISIBLE[$1]:-$1}" || echo ""; }
COMPILE_FLAG=$([ "${COMPILE:-1}" = 1 ] && echo --compile || echo --no-compile)
BASELINE=${BASELINE:-$([ "$BACKEND" = cuda ] && echo 1 || echo 0)}
mkdir -p "$OUT"
log() { echo "[synth_data $(date +%H:%M:%S)] $*" >&2; }

log "crawl + compose: N=$N SEED=$SEED SIZE=$SIZE BACKEND=$BACKEND GPUS=$GPUS"
if [ ! -s "$OUT/seeds.jsonl" ]; then
  rm -f "$OUT/seeds.jsonl.tmp"
  opsynth crawl --size "$SIZE" -o "$OUT/seeds.jsonl.tmp" && mv "$OUT/seeds.jsonl.tmp" "$OUT/seeds.jsonl"
fi
opsynth compose --n "$N" --seed "$SEED" --size "$SIZE" -o "$OUT/composed.jsonl" --resume

if [ "$BACKEND" = cuda ]; then
  CORES=$(nproc)
  WPG=${WORKERS_PER_GPU:-$(( (CORES - 2) / GPUS < 1 ? 1 : ((CORES - 2) / GPUS > 12 ? 12 : (CORES - 2) / GPUS) ))}
  MEM_GB=${MEM_GB:-$(python -c "import torch; print(max(1, int(0.9 * torch.cuda.get_device_properties(0).total_memory / 2**30 / $WPG)))")}
else
  WPG=${WORKERS_PER_GPU:-1}
  MEM_GB=${MEM_GB:-16}
fi
# every worker reads the whole composed file and takes the next task nobody has claimed
# ($OUT/claims.filter); a rerun skips the claimed-and-done tasks and redoes the interrupted ones
log "filter: $GPUS GPU(s) x $WPG worker(s), $MEM_GB GB per task, one task queue"
OUT_ABS=$(cd "$OUT" && pwd)
pids=()
for i in $(seq 0 $((GPUS - 1))); do
  for j in $(seq 0 $((WPG - 1))); do
    CUDA_VISIBLE_DEVICES=$(dev "$i") \
      opsynth filter "$OUT/composed.jsonl" --backend "$BACKEND" $COMPILE_FLAG --claim "$OUT/claims.filter" \
        --mem-gb "$MEM_GB" -o "$OUT/filtered.$i.$j.jsonl" --rejected "$OUT/rejected.$i.$j.jsonl" --resume \
        2> "$OUT/filter.$i.$j.log" &
    pids+=($!)
  done
done
for p in "${pids[@]}"; do wait "$p"; done
cat "$OUT"/filtered.[0-9]*.jsonl > "$OUT/filtered.jsonl"
cat "$OUT"/rejected.[0-9]*.jsonl > "$OUT/rejected.jsonl"

log "dedup"
opsynth dedup "$OUT/filtered.jsonl" ${KB:+--kernelbench "$KB"} -o "$OUT/deduped.jsonl" \
  --rejected "$OUT/dedup_rejected.jsonl" --resume

if [ "$BASELINE" = 1 ]; then
  log "baselines: one process per GPU, one task queue"
  pids=()
  for i in $(seq 0 $((GPUS - 1))); do
    CUDA_VISIBLE_DEVICES=$(dev "$i") profiler baseline "$OUT/deduped.jsonl" --claim "$OUT/claims.baseline" \
      -o "$OUT/baselined.$i.jsonl" --resume 2> "$OUT/baseline.$i.log" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  cat "$OUT"/baselined.[0-9]*.jsonl > "$OUT/tasks.jsonl"
else
  cp "$OUT/deduped.jsonl" "$OUT/tasks.jsonl"
fi

log "stats -> $OUT/stats.md"
{
  echo "# Synthesised set ($(date -u +%F), backend $BACKEND, size $SIZE)"
  echo
  opsynth stats "$OUT/tasks.jsonl" "$OUT/composed.jsonl" \
    --rejected "$OUT/rejected.jsonl" --rejected "$OUT/dedup_rejected.jsonl"
} > "$OUT/stats.md"
log "done: $(wc -l < "$OUT/tasks.jsonl") tasks in $OUT/tasks.jsonl"
