#!/usr/bin/env bash
# Export a seeded 300-row sample of the released Ops-6K parquet as Task JSONL into the
# git-ignored .gpu-data/ (carried to the GPU machine for bin/gpu-check-opsynth.sh).
#   packages/opsynth/benchmarks/export_ops6k_sample.sh [PARQUET] [N] [SEED]
set -euo pipefail
PARQUET=${1:-/work/shared/data/cuda_agent_ops_6k.parquet}
N=${2:-300}
SEED=${3:-0}
mkdir -p .gpu-data
rm -f .gpu-data/ops6k_$N.jsonl
uv run opsynth import-ops6k "$PARQUET" --sample "$N" --seed "$SEED" -o .gpu-data/ops6k_$N.jsonl
echo "wrote .gpu-data/ops6k_$N.jsonl ($(wc -l < .gpu-data/ops6k_$N.jsonl) tasks)" >&2
