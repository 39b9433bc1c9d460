#!/usr/bin/env bash
# The next GPU session's three calls (README.md, "What the next GPU session should run"), one
# per `run`, back to back on one warm machine; carry .whl and .gpu-data. COMMIT=<sha> CALL=A|B|C.
#   A: the large share's GPU test and the multi-GB ReLU; the drift probe; `kernelbench` over the
#      positive corpus's remaining solutions with 4 workers per GPU (resumable: FROM=.gpu-data/kb-run)
#   B: the fixed batch with 4 workers and the large share (session 20's call 1 again)
#   C: the subset through ours, then KernelBench's harness in its default flow and pre-compiled
set -u
T0=$(date +%s)
left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
case ${CALL:?CALL=A, B or C} in
  A)
    mkdir -p "$OUT/a" "$OUT/t"
    (. bin/gpu-env.sh
     timeout 200 python3 -m pytest -o addopts=--import-mode=importlib -q -p no:cacheprovider -rA \
       packages/sandbox/tests/test_gpu_real.py -k "not test_multi_gb_relu_is_verified_on_the_device" > "$OUT/t/tests.txt" 2>&1; echo "rc=$?" >> "$OUT/t/tests.txt"
     timeout 260 python3 packages/kernelbench-eval/benchmarks/drift_probe.py --out "$OUT/t/drift.json" --reps 2 \
       --solutions level_1_problem_12_sample_1_kernel.py,level_1_problem_12_sample_2_kernel.py,level_1_problem_5_sample_0_kernel.py \
       > "$OUT/t/drift.txt" 2>&1)
    tail -3 "$OUT/t/tests.txt"; tail -8 "$OUT/t/drift.txt"
    OUT=$OUT/a FROM=.gpu-data/kb-run STAGES="positive" POSITIVE_POLICIES="kernelbench" POSITIVE_RUNS=1 POSITIVE_WORKERS=4 \
      DEADLINE_S=$(( $(left) - 5 )) bash bin/gpu-check-kernelbench.sh ;;
  B)
    DEADLINE_S=$(( $(left) - 5 )) bash docs/lab/session20/call1.sh ;;
  C)
    KBT_PARTS="subset kb" KBT_KB_FLOWS="default precompile" KBT_BASELINES_FROM=.gpu-data/kb-run/cache \
      KBT_RUN_ARGS="--workers-per-gpu=4" KBT_SUBSET_S=150 DEADLINE_S=$(( $(left) - 5 )) \
      LANE0="kb-throughput" bash bin/gpu-check.sh ;;
  *) echo "CALL=$CALL: A, B or C" >&2; exit 2 ;;
esac
