#!/usr/bin/env bash
# Session 25: why a re-run alone of L1/36 RMSNorm stalls the GPU. Eight candidates of the fixed
# batch (RMSNorm first), 8 device workers, fresh caches; every 10 s: results so far, torch
# extension lock files in the sandbox cache, the processes and what they wait in; at LIMIT_S the
# run's state report (SIGUSR1) and the end. device: run(command="LIMIT_S=100 bash
# docs/lab/session25/lockdiag.sh", carry=[".whl", ".gpu-data"])
set -u
. bin/gpu-env.sh >/dev/null 2>&1
D=$OUT/lockdiag; mkdir -p $D; C=/tmp/ld-cache; rm -rf $C
python3 packages/kernelbench-eval/benchmarks/throughput_batch.py build -o /tmp/ld-batch.jsonl --min 0 \
  --positive packages/kernelbench-eval/corpus/positive >/dev/null 2>&1
python3 - <<'P' > $D/feed.jsonl
import sys
L = open("/tmp/ld-batch.jsonl").readlines()
for i in (7, 1, 2, 3, 8, 10, 11, 6):
    sys.stdout.write(L[i])
P
CUDA_AGENT_CACHE=$C setsid python3 -m cuda_agent.kernelbench_eval.cli run --backend cuda --gpus all \
  --workers-per-gpu=8 -o $D/results.jsonl < $D/feed.jsonl 2> $D/run.err &
PID=$!
T0=$(date +%s)
while kill -0 $PID 2>/dev/null && [ $(( $(date +%s) - T0 )) -lt ${LIMIT_S:-100} ]; do
  sleep 10
  { echo "== $(( $(date +%s) - T0 ))s results $(wc -l < $D/results.jsonl 2>/dev/null)"
    find $C -name lock -printf '%TT %p\n' 2>/dev/null
    ps -eo pid,ppid,etimes,stat,wchan:22,args --sort=pid | grep -E "runner|profiler.worker|jail" | grep -v grep | cut -c1-200
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
  } >> $D/monitor.txt 2>&1
done
kill -USR1 $PID 2>/dev/null; sleep 3
for p in $(pgrep -f "cuda_agent.sandbox.runner"); do echo "== $p $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-200)"; cat /proc/$p/stack 2>/dev/null | head -5; ls -l /proc/$p/cwd 2>/dev/null; done >> $D/monitor.txt 2>&1
kill -TERM -- -$PID 2>/dev/null; sleep 2; kill -KILL -- -$PID 2>/dev/null
tail -40 $D/monitor.txt
