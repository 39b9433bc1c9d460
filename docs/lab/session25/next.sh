#!/usr/bin/env bash
# Session 25's GPU calls, one per `run`, back to back on one warm machine; carry .whl and
# .gpu-data (bin/prepare-gpu-data.sh). COMMIT=<sha> CALL=...
#   BF: issue 28's fixed batch, 8 device workers, paired eager (the cuda default), fresh caches
#       and no seeded baselines: every task's eager and torch.compile baselines measured in the
#       run, as a new user's first run does (the gate's lengthy shared hold for their set-up);
#       the run keeps them in kb-throughput/batch/baselines/; then here:
#       mkdir -p .gpu-data/kbt && tar xzf docs/lab/session25/baselines.tgz -C .gpu-data/kbt &&
#       cp <results>/kb-throughput/batch/baselines/*.json .gpu-data/kbt/baselines/
#       (a stalled run ends with its state report: run.json's state_at_kill, the summary's end)
#   B:  the same batch seeded from .gpu-data/kbt (a user's second run), for the rate with
#       baselines cached and `throughput.py compare` of BF's and B's results (the 3% check)
#   KT: the KernelBench-harness subset (ours seeded from .gpu-data/kbt, then KernelBench's
#       default flow: it builds inside each evaluation), then the GPU tests not yet run
set -u
T0=$(date +%s)
left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
case ${CALL:?CALL=BF, B or KT} in
  BF|B)
    seed=""; [ "$CALL" = B ] && seed=.gpu-data/kbt
    KBT_PARTS="batch" KBT_BASELINES_FROM=$seed KBT_RUN_ARGS="--workers-per-gpu=8" \
      KBT_BATCH_S=${KBT_BATCH_S:-400} KBT_DRAIN_S=${KBT_DRAIN_S:-140} DEADLINE_S=$(( $(left) - 5 )) \
      LANE0="kb-throughput" bash bin/gpu-check.sh ;;
  KT)
    KBT_PARTS="subset kb" KBT_BASELINES_FROM=.gpu-data/kbt KBT_KB_FLOWS=default \
      KBT_SUBSET_S=${KBT_SUBSET_S:-120} DEADLINE_S=$(( $(left) - ${T_S:-170} )) \
      LANE0="kb-throughput" bash bin/gpu-check.sh
    [ "$(left)" -gt 60 ] && CALL=T DEADLINE_S=$(( $(left) - 5 )) bash docs/lab/session23/next.sh ;;
  *) echo "CALL=$CALL: BF, B or KT" >&2; exit 2 ;;
esac
