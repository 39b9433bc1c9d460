#!/usr/bin/env bash
# CPU study behind the README's comparison table: our composed set vs a sample of Ops-6K,
# through the same filter. Usage: scripts/cpu_study.sh OUTDIR [N] [OPS6K.parquet]
set -euo pipefail
OUT=${1:?usage: cpu_study.sh OUTDIR [N] [OPS6K]}
N=${2:-300}
OPS6K=${3:-/work/shared/data/cuda_agent_ops_6k.parquet}
KB=${KB:-tests/fixtures/KernelBench}
mkdir -p "$OUT"
run() { echo "+ $*" >&2; "$@"; }
T0=$(date +%s)
# ours: compose -> filter (CPU window, no compile) -> dedup against KernelBench(-layout) refs
run opsynth compose --n "$N" --seed 0 --size cpu -o "$OUT/ours_composed.jsonl" --resume
T1=$(date +%s)
run opsynth filter "$OUT/ours_composed.jsonl" --backend cpu --no-compile --timeout 60 --mem-gb 4 \
    -o "$OUT/ours_kept.jsonl" --rejected "$OUT/ours_rejected.jsonl" --resume 2> "$OUT/ours_filter.log"
T2=$(date +%s)
run opsynth dedup "$OUT/ours_kept.jsonl" --kernelbench "$KB" -o "$OUT/ours_final.jsonl" \
    --rejected "$OUT/ours_dedup_rejected.jsonl" 2> "$OUT/ours_dedup.log"
T3=$(date +%s)
# Ops-6K: a sample of N rows through the same filter (no window: GPU-sized rows on a CPU)
[ -s "$OUT/ops6k_sample.jsonl" ] || run opsynth import-ops6k "$OPS6K" --sample "$N" --seed 0 \
    --kernelbench "$KB" -o "$OUT/ops6k_sample.jsonl" --report "$OUT/ops6k_sample_report.json"
run opsynth filter "$OUT/ops6k_sample.jsonl" --backend cpu --no-compile --timeout 60 --mem-gb 4 \
    --min-ms 0 --max-ms 1e9 --no-rescale \
    -o "$OUT/ops6k_kept.jsonl" --rejected "$OUT/ops6k_rejected.jsonl" --resume 2> "$OUT/ops6k_filter.log"
T4=$(date +%s)
echo "compose_s=$((T1-T0)) filter_ours_s=$((T2-T1)) dedup_s=$((T3-T2)) ops6k_s=$((T4-T3))" | tee "$OUT/times.txt"
