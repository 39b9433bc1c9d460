#!/usr/bin/env bash
# Session 24, last call: the batch's first N candidates twice, each a separate fresh run
# (`throughput.py ours`: fresh caches, the session-23 eager baselines seeded), 8 device workers,
# the paired eager timer, no torch.compile baseline (the seeded cache has none; measuring them
# held every device worker behind three profiler workers: diag.sh's call), then their rates,
# verdicts and honest speed-ups compared (the 3% check). Carry .whl and .gpu-data.
set -u
N=${N:-70}; RUN_S=${RUN_S:-230}; B=packages/kernelbench-eval/benchmarks
. bin/gpu-env.sh
D=/tmp/twice; rm -rf $D; mkdir -p $D "$OUT/twice"
python3 $B/throughput_batch.py build -o $D/batch.jsonl --min 0 --positive packages/kernelbench-eval/corpus/positive > /dev/null
head -n "$N" $D/batch.jsonl > $D/first.jsonl
for i in 1 2; do
  python3 $B/throughput.py ours --batch $D/first.jsonl --out $D/r$i --gpus all --backend cuda \
    --feed-s $(( RUN_S - 60 )) --timeout-s "$RUN_S" --baselines-from .gpu-data/kb-run/cache \
    --run-arg=--workers-per-gpu=8 --run-arg=--paired-eager --run-arg=--no-compile-baseline > /dev/null 2> $D/r$i.log
  python3 $B/throughput.py summary $D/r$i --md > $D/r$i/summary.md
  mkdir -p "$OUT/twice/r$i"; cp $D/r$i/results.jsonl $D/r$i/run.json $D/r$i/summary.md "$OUT/twice/r$i/"
  head -3 $D/r$i/summary.md
done
python3 $B/throughput.py compare $D/r1/results.jsonl $D/r2/results.jsonl --md | tee "$OUT/twice/compare.md"
