#!/usr/bin/env bash
# Session 24's GPU calls and the next session's, one per `run`, back to back on one warm machine;
# carry .whl and .gpu-data (bin/prepare-gpu-data.sh, then mkdir -p .gpu-data/kb-run &&
# cp docs/lab/session24/references-281.jsonl .gpu-data/kb-run/references.jsonl &&
# tar xzf docs/lab/session24/baseline-cache.tgz -C .gpu-data/kb-run). COMMIT=<sha> CALL=...
#   R:  the nine train-mode references left (session 21's CALL=R: the refs stage resumed)  [done]
#   BP: issue 28's fixed batch, 8 device workers per GPU, the paired eager timer, seeded from
#       .gpu-data/kb-run/cache  [run in session 24: that cache held only 19 of the batch's 47
#       device tasks, so every run measured baselines in-run and stalled behind them]
#   BL: the next session's first call: the eager and torch.compile baselines of the batch's 47
#       device tasks (kb_references.py over throughput_batch.py --tasks-output), nothing else;
#       then here: tar xzf results.tgz -C /tmp/bl && mkdir -p .gpu-data/kbt &&
#       cp -r /tmp/bl/kb-throughput/baselines/cache .gpu-data/kbt/cache (and commit a tgz of it)
#   BLT: BL with KBT_BASELINES_S (e.g. 300), then T in the time left (one machine start fewer)
#   B:  the batch seeded from .gpu-data/kbt/cache (its run.json's baselines_cover must read 47
#       of 47), 8 device workers, paired eager (the cuda default now); run twice (two calls):
#       the rate, then `throughput.py compare` of the two runs' results (the 3% check)
#   T:  the GPU tests not yet run: the multi-GB ReLU, the paired eager's (session 23's CALL=T)
set -u
T0=$(date +%s)
left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
case ${CALL:?CALL=R, BP, BL, BLT, B or T} in
  R) CALL=R DEADLINE_S=$(( $(left) - 5 )) bash docs/lab/session21/next.sh ;;
  BP) CALL=BP DEADLINE_S=$(( $(left) - 5 )) bash docs/lab/session23/next.sh ;;
  BL|BLT)  # BLT: then the GPU tests (T) in the time left
    bs=${KBT_BASELINES_S:-$(( $(left) - 40 ))}
    KBT_PARTS="baselines" KBT_BASELINES_S=$bs DEADLINE_S=$(( bs + 30 < $(left) - 5 ? bs + 30 : $(left) - 5 )) \
      LANE0="kb-throughput" bash bin/gpu-check.sh
    [ "$CALL" = BLT ] && [ "$(left)" -gt 120 ] && CALL=T DEADLINE_S=$(( $(left) - 5 )) bash docs/lab/session23/next.sh ;;
  B)
    KBT_PARTS="batch" KBT_BASELINES_FROM=.gpu-data/kbt/cache KBT_RUN_ARGS="--workers-per-gpu=8" \
      KBT_BATCH_S=${KBT_BATCH_S:-400} KBT_DRAIN_S=${KBT_DRAIN_S:-140} DEADLINE_S=$(( $(left) - 5 )) \
      LANE0="kb-throughput" bash bin/gpu-check.sh ;;
  T) CALL=T DEADLINE_S=$(( $(left) - 5 )) bash docs/lab/session23/next.sh ;;
  *) echo "CALL=$CALL: R, BP, BL, B or T" >&2; exit 2 ;;
esac
