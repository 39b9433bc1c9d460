#!/usr/bin/env bash
# The next session's GPU calls, one per `run`, back to back on one warm machine. COMMIT=<sha> CALL=...
#   AG:  issue 29: a warm-up episode (the task's baselines, counted in neither rate), then 32
#        scripted agent episodes at once (32 tool threads, a pool of 16 device workers) vs 2
#        serial, both warm; carry .whl. Session 28 (no warm-up, 16 tool threads, 8 workers):
#        4.02x, the concurrent evaluations' median stages baseline 17 s, compile queue 14 s.
#   KT:  issue 28's 10x: the 20-candidate subset through ours (8 device workers, 200 s) and then
#        KernelBench's harness in its default flow (builds inside each evaluation) on the same
#        subset; carry .whl .gpu-data, .gpu-data/kbt from docs/lab/session27/baselines.tgz.
#        Session 28's 100 s window with the default 2 workers finished none of ours on the device.
#   SER: issue 28's serial-vs-concurrent verdicts: the batch one candidate at a time, compared
#        with session 28's concurrent run (docs/lab/session28/s/batch-results.jsonl); carry
#        .whl .gpu-data (baselines seeded as in KT; one candidate at a time on the device while
#        later ones compile: KBT_SERIAL_MODE=device, "" for strictly one at a time). Continue it in a later call with KBT_SERIAL_FROM=<its results.jsonl>.
#   R31: issue 31's H200 items, part 1: the positive corpus under the robust setting
#        (`positive_corpus.py run --robust`, kernelbench policy, paired eager, 8 workers;
#        resumable: ROBUST_FROM=<an earlier call's results-*.jsonl>), the fraction that kept
#        passing and why in robust/check.md; then the GPU tests of the stress trials and the
#        shape check; carry .whl
#   MA:  issue 31's H200 items, part 2: a real subset (PROBLEMS, default level 1 problems
#        1,12,95: a matmul, a diagonal matmul, a cross-entropy; small to medium inputs) run with
#        the compile baseline in default and in max-autotune mode, and one `kernelbench-eval
#        report` over both; carry .whl
#   ACC: issue 30's "fixture runs unchanged": the command of docs/performance.md's fused-task
#        batch row (2026-12-01, 51e9c42: 16 of 16, 8 pass / 4 incorrect / 4 compile errors,
#        298.6 per GPU-hour; the agent's tool iteration 1.28 / 15.56 / 30.10 s at c1f7f97) on
#        the refactored evaluator; carry .whl
set -u
T0=$(date +%s)
left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
case ${CALL:?CALL=AG, KT, SER, R31, MA or ACC} in
  AG)
    SECTIONS=concurrent CONCURRENT=${CONCURRENT:-32} SERIAL=${SERIAL:-2} WORKERS_PER_GPU=${WORKERS_PER_GPU:-16} \
      WARMUP=1 BUDGET_S=$(( $(left) - 10 )) bash bin/gpu-check-agent.sh ;;
  KT)
    KBT_PARTS="subset kb" KBT_BASELINES_FROM=.gpu-data/kbt KBT_KB_FLOWS=default \
      KBT_RUN_ARGS="--workers-per-gpu=8" KBT_SUBSET_S=${KBT_SUBSET_S:-200} \
      DEADLINE_S=$(( $(left) - 5 )) LANE0="kb-throughput" bash bin/gpu-check.sh ;;
  SER)
    KBT_CONCURRENT_FROM=${KBT_CONCURRENT_FROM:-docs/lab/session28/s/batch-results.jsonl} KBT_BASELINES_FROM=.gpu-data/kbt \
      KBT_SERIAL_MODE=${KBT_SERIAL_MODE:-device} \
      DEADLINE_S=$(( $(left) - 5 )) LANE0="kb-throughput-serial" bash bin/gpu-check.sh ;;
  R31)
    . bin/gpu-env.sh; B=packages/kernelbench-eval/benchmarks; R=${OUT:-gpu-out}/robust; mkdir -p "$R"
    [ -n "${ROBUST_FROM:-}" ] && cp "$ROBUST_FROM" "$R/results-kernelbench-paired-robust-1.jsonl"
    timeout -k 5 $(( $(left) - 200 )) python3 $B/positive_corpus.py run --policy kernelbench --runs 1 \
      --robust --paired-eager --workers-per-gpu 8 --out "$R" > "$R/check.md" 2> "$R/run.log"
    python3 $B/positive_corpus.py check "$R/results-kernelbench-paired-robust-1.jsonl" > "$R/check.md"
    tail -12 "$R/check.md"
    timeout -k 5 $(( $(left) - 10 )) python3 -m pytest -o addopts=--import-mode=importlib -v \
      packages/sandbox/tests/test_gpu_stress_trials.py packages/sandbox/tests/test_gpu_shape_check.py \
      2>&1 | tee "$R/tests.txt" | tail -15 ;;
  MA)
    . bin/gpu-env.sh; B=packages/kernelbench-eval/benchmarks; M=${OUT:-gpu-out}/autotune; mkdir -p "$M"
    for mode in default max-autotune; do
      timeout -k 5 $(( $(left) / 2 - 20 )) python3 $B/positive_corpus.py run --policy kernelbench --runs 1 \
        --levels 1 --problems "${PROBLEMS:-1,12,95}" --compile-baseline --baseline-compile-mode $mode \
        --paired-eager --out "$M" > "$M/check-$mode.md" 2> "$M/run-$mode.log"
    done
    cat "$M"/results-*.jsonl | python3 -m cuda_agent.kernelbench_eval.cli report --tasks "$M/tasks.jsonl" \
      --out-dir "$M/report" > "$M/report.json"; cat "$M/report/report.md" ;;
  ACC)
    TOOLS_ROUNDS=3 D_N=16 DEADLINE_S=$(( $(left) - 5 )) LANE0="agent-tools sandbox-d1" bash bin/gpu-check.sh ;;
  *) echo "CALL=$CALL: AG, KT, SER, R31, MA or ACC" >&2; exit 2 ;;
esac
