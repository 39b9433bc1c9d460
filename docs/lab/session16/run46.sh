# run 46 (session 16): the fixed throughput batch for ~3 minutes (the last device minutes)
. bin/gpu-env.sh >/dev/null 2>&1
B=packages/kernelbench-eval/benchmarks; D=/tmp/kbt; mkdir -p $D
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 $B/throughput_batch.py build -o $D/batch.jsonl --subset-output $D/subset.jsonl --min 0 --positive packages/kernelbench-eval/corpus/positive 2>&1 | tail -1
python3 $B/throughput.py ours --batch $D/batch.jsonl --out $D/batch --gpus all --backend cuda --feed-s 110 --timeout-s 165 --run-arg=--compile-jobs=8 --run-arg=--no-compile-baseline > $D/batch.log 2>&1; tail -2 $D/batch.log
python3 $B/throughput.py summary $D/batch --md > $D/batch-summary.md 2>&1
cp $D/batch/results.jsonl $OUT/run46-results.jsonl; cp $D/batch-summary.md $D/batch.log $OUT/; cat $D/batch-summary.md | head -70
