#!/usr/bin/env bash
# GPU acceptance run of the opsynth package (issue 7), one device call on one H200:
#   compose N [500] gpu-size tasks -> full filter (cuda, [1, 100] ms, torch.compile inductor) in
#   parallel workers -> our filter on the Ops-6K 300-row sample (.gpu-data/ops6k_300.jsonl, made
#   by packages/opsynth/benchmarks/export_ops6k_sample.sh; skipped with a message if absent).
# Results: $OUT/opsynth/{env,ours,ops6k}.json + task files + logs (default OUT=./gpu-out).
# Then, here: uv run python packages/opsynth/benchmarks/make_doc.py OUT/opsynth > docs/opsynth.md
#   device: run(command="bash bin/gpu-check-opsynth.sh", carry=[".whl", ".gpu-data"], timeout_s=300)
# Knobs (env): BUDGET_S [240] hard wall limit, N, WORKERS, OURS_SHARE, BACKEND [cuda] ... (see
# the header of packages/opsynth/benchmarks/gpu_run.py). CPU smoke test:
#   BACKEND=cpu N=4 WORKERS=2 BUDGET_S=200 COMPILE=0 bash bin/gpu-check-opsynth.sh
set -u
OUT=${OUT:-$PWD/gpu-out}
BUDGET_S=${BUDGET_S:-240}
mkdir -p "$OUT/opsynth"
T0=$(date +%s)
if ! python3 -c "import msgspec" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/packages/records/src:$PWD/packages/profiler/src:$PWD/packages/guards/src:$PWD/packages/sandbox/src:$PWD/packages/opsynth/src${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
{
  date -u; echo "${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>&1
  python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"; nproc
} > "$OUT/opsynth/env.txt" 2>&1
cat "$OUT/opsynth/env.txt"
# the driver keeps its own deadline (BUDGET_S minus start-up); `timeout` is the backstop
USED=$(( $(date +%s) - T0 ))
export BUDGET_S=$(( BUDGET_S - USED - 5 ))
timeout -k 5 $(( BUDGET_S + 3 )) python3 packages/opsynth/benchmarks/gpu_run.py "$OUT/opsynth" 2>&1 | tee "$OUT/opsynth/gpu_run.log"
ls -la "$OUT/opsynth" | head -5
