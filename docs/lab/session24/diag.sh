#!/usr/bin/env bash
# Session 24: where BP's run stalled (call 2: 29 results in 140 s, then nothing for 380 s, the GPU
# idle with 4.5 GB held). The batch's first N candidates through the same command
# (`kernelbench-eval run --backend cuda --workers-per-gpu=8 --paired-eager`, fresh caches, the
# seeded baselines); once no result came for STALL_S, py-spy dumps every thread of the run and of
# its runner processes, with the process tree and the signal files, then the run is killed.
# Carry .whl (py-spy, msgspec, einops) and .gpu-data. DIAG_ARGS: the run's flags.
set -u
T0=$(date +%s); N=${N:-40}; STALL_S=${STALL_S:-45}; LIMIT_S=${LIMIT_S:-330}
. bin/gpu-env.sh
python3 -m pip install -q --no-index --no-deps --find-links .whl py-spy 2>&1 | tail -1
D=/tmp/diag; rm -rf $D; mkdir -p $D/cache-profiler/baselines "$OUT/diag"
cp .gpu-data/kb-run/cache/baselines/*.json $D/cache-profiler/baselines/
python3 packages/kernelbench-eval/benchmarks/throughput_batch.py build -o $D/batch.jsonl --min 0 \
  --positive packages/kernelbench-eval/corpus/positive > /dev/null
head -n "$N" $D/batch.jsonl > $D/first.jsonl
export CUDA_AGENT_SANDBOX_CACHE=$D/cache-sandbox CUDA_AGENT_CACHE=$D/cache-profiler
# shellcheck disable=SC2086
python3 -m cuda_agent.kernelbench_eval.cli run --backend cuda --gpus all -o $D/results.jsonl \
  ${DIAG_ARGS:---workers-per-gpu=8 --paired-eager} < $D/first.jsonl > $D/run.out 2> $D/run.err &
RUN=$!
last=0; since=$(date +%s); dumps=0
while kill -0 $RUN 2>/dev/null; do
  sleep 5
  n=$(wc -l < $D/results.jsonl 2>/dev/null || echo 0)
  [ "$n" != "$last" ] && { last=$n; since=$(date +%s); }
  el=$(( $(date +%s) - T0 ))
  if [ $(( $(date +%s) - since )) -ge "$STALL_S" ] || [ "$el" -ge "$LIMIT_S" ]; then
    dumps=$((dumps + 1)); f="$OUT/diag/dump-$dumps.txt"
    { echo "== $(date) elapsed ${el}s results $n"; ps -eo pid,ppid,stat,etimes,rss,wchan:24,args --forest | grep -v " ps -eo" | cut -c1-300
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv
      echo "== signal files"; find $D/cache-sandbox -path '*signal*' -o -name '*ready*' 2>/dev/null | head -80
      echo "== py-spy of the run"; py-spy dump --pid $RUN 2>&1
      for c in $(pgrep -f "cuda_agent.sandbox.runner"); do echo "== py-spy $c: $(tr '\0' ' ' < /proc/$c/cmdline | cut -c1-200)"; py-spy dump --pid "$c" 2>&1 | head -60; done
    } > "$f" 2>&1
    since=$(date +%s)
    if [ $dumps -ge 2 ] || [ "$el" -ge "$LIMIT_S" ]; then kill -- $RUN; sleep 3; pkill -f cuda_agent.sandbox.runner; break; fi
  fi
done
wait $RUN 2>/dev/null
cp $D/results.jsonl $D/run.err "$OUT/diag/" 2>/dev/null
echo "results $(wc -l < $D/results.jsonl) in $(( $(date +%s) - T0 ))s, dumps $dumps"
tail -5 $D/run.err
