. bin/gpu-env.sh >/dev/null 2>&1
B=packages/kernelbench-eval/benchmarks; D=/tmp/kbt; mkdir -p $D; T0=$(date +%s)
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; nproc
python3 $B/throughput_batch.py build -o $D/batch.jsonl --subset-output $D/subset.jsonl --min 0 --positive packages/kernelbench-eval/corpus/positive 2>&1 | tail -2
python3 $B/throughput.py ours --batch $D/batch.jsonl --out $D/batch --gpus all --backend cuda --feed-s 230 --timeout-s 290 --run-arg=--compile-jobs=6 --run-arg=--no-compile-baseline > $D/batch.log 2>&1; tail -3 $D/batch.log
python3 $B/throughput.py summary $D/batch --md > $D/batch-summary.md 2>&1; echo "t=$(( $(date +%s)-T0 ))"
python3 $B/throughput.py ours --batch $D/subset.jsonl --out $D/subset-ours --gpus all --backend cuda --timeout-s 80 --run-arg=--compile-jobs=6 --run-arg=--no-compile-baseline > $D/subset.log 2>&1; echo "t=$(( $(date +%s)-T0 ))"
R=$(( 545 - ($(date +%s)-T0) )); python3 $B/throughput.py kb --subset $D/subset.jsonl --out $D/kb --src .gpu-data/kernelbench/src --budget-s $R --precompile-workers 16 > $D/kb.log 2>&1; echo "t=$(( $(date +%s)-T0 ))"
python3 $B/throughput.py ratio $D/subset-ours $D/kb --md > $D/ratio.md 2>&1
python3 $B/throughput.py ratio $D/subset-ours $D/kb > $D/ratio.json 2>&1
cd $D && tar czf $OUT/kbt.tgz --exclude='cache-*' batch.jsonl subset.jsonl *.log *.md *.json batch/results.jsonl batch/run.json subset-ours/results.jsonl subset-ours/run.json kb 2>/dev/null; cat $D/batch-summary.md | head -60; cat $D/ratio.md | head -40
