#!/usr/bin/env bash
# Session 18, device call 1: machine facts for the output hand-over (where the sandbox's files
# live), the output-staging A/B on a 6.4 GB output, then the references table continued
# (FROM=.gpu-data/kb-run: session 17's rows and baseline cache).
#   device: run(command="bash docs/lab/session18/call1.sh", carry=[".whl", ".gpu-data"])
set -u
R=${OUT:-$PWD/gpu-out}; mkdir -p "$R"; T0=$(date +%s)
{ date -u; df -B1 /tmp /dev/shm /run 2>&1; mount | grep -E ' on (/|/tmp|/dev/shm|/run) '
  grep -H . /proc/sys/vm/dirty_ratio /proc/sys/vm/dirty_background_ratio /proc/sys/vm/dirty_bytes
  free -g; nproc; } > "$R/facts.txt" 2>&1
. bin/gpu-env.sh
timeout 170 python3 packages/sandbox/benchmarks/output_staging_ab.py 3 6.4 > "$R/staging_ab.json" 2> "$R/staging_ab.err"
echo "staging_ab rc=$? $(cat "$R/staging_ab.json")"
FROM=.gpu-data/kb-run STAGES="refs report" JOBS=${JOBS:-12} DEADLINE_S=$(( ${BUDGET_S:-565} - ($(date +%s) - T0) )) \
  bash bin/gpu-check-kernelbench.sh
