#!/usr/bin/env bash
# The next session's GPU calls, one per `run`, back to back on one warm machine. COMMIT=<sha> CALL=...
#   AG: issue 29's 32 scripted agent episodes at once vs serial, the episodes' pool with 8 device
#       workers (session 27: 16 at once through the default 2 gave 3.59x; 32 did not finish in
#       400 s); carry .whl. The JSON's time_split_s says where the episodes' time went.
#   S:  issue 28/32: the fixed batch through `kernelbench-eval run` and then through the kernel
#       service (same fresh caches, seeding and budget each; 8 device workers, 32 requests at
#       once, the run's window), and the verdicts of both compared; carry .whl, .gpu-data, with
#         mkdir -p .gpu-data/kbt && tar xzf docs/lab/session27/baselines.tgz -C .gpu-data/kbt
#       (33 of the batch's 47 device tasks' baselines)
#   KT: docs/lab/session25/next.sh CALL=KT (the KernelBench-harness subset, its default flow,
#       then session 23's GPU tests), seeded from the same .gpu-data/kbt
set -u
T0=$(date +%s)
left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
case ${CALL:?CALL=AG, S or KT} in
  AG)
    SECTIONS=concurrent CONCURRENT=${CONCURRENT:-32} SERIAL=${SERIAL:-3} WORKERS_PER_GPU=${WORKERS_PER_GPU:-8} \
      BUDGET_S=$(( $(left) - 10 )) bash bin/gpu-check-agent.sh ;;
  S)
    KBT_PARTS="batch service" KBT_BASELINES_FROM=.gpu-data/kbt KBT_RUN_ARGS="--workers-per-gpu=8" \
      KBT_SERVE_ARGS="--workers-per-gpu=8 --max-concurrent=32" KBT_SERVICE_CLIENTS=32 \
      KBT_BATCH_S=${KBT_BATCH_S:-170} KBT_DRAIN_S=${KBT_DRAIN_S:-90} DEADLINE_S=$(( $(left) - 5 )) \
      LANE0="kb-throughput" bash bin/gpu-check.sh ;;
  KT)
    CALL=KT DEADLINE_S=$(left) bash docs/lab/session25/next.sh ;;
  *) echo "CALL=$CALL: AG, S or KT" >&2; exit 2 ;;
esac
