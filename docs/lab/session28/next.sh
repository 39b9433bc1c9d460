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
#        .whl .gpu-data (baselines seeded as in KT). Continue it in a later call with KBT_SERIAL_FROM=<its results.jsonl>.
set -u
T0=$(date +%s)
left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
case ${CALL:?CALL=AG, KT or SER} in
  AG)
    SECTIONS=concurrent CONCURRENT=${CONCURRENT:-32} SERIAL=${SERIAL:-2} WORKERS_PER_GPU=${WORKERS_PER_GPU:-16} \
      WARMUP=1 BUDGET_S=$(( $(left) - 10 )) bash bin/gpu-check-agent.sh ;;
  KT)
    KBT_PARTS="subset kb" KBT_BASELINES_FROM=.gpu-data/kbt KBT_KB_FLOWS=default \
      KBT_RUN_ARGS="--workers-per-gpu=8" KBT_SUBSET_S=${KBT_SUBSET_S:-200} \
      DEADLINE_S=$(( $(left) - 5 )) LANE0="kb-throughput" bash bin/gpu-check.sh ;;
  SER)
    KBT_CONCURRENT_FROM=${KBT_CONCURRENT_FROM:-docs/lab/session28/s/batch-results.jsonl} KBT_BASELINES_FROM=.gpu-data/kbt \
      DEADLINE_S=$(( $(left) - 5 )) LANE0="kb-throughput-serial" bash bin/gpu-check.sh ;;
  *) echo "CALL=$CALL: AG, KT or SER" >&2; exit 2 ;;
esac
