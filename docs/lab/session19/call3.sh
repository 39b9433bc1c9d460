#!/usr/bin/env bash
# Session 19, call 3 (fresh machine): issue 27's one false rejection under `strict` (L3/2, G-DEFERRED
# from host stalls; deferred_min_fraction since bd9f474) evaluated again, then issue 28's batch
# with the eager and torch.compile baselines of the references run (.gpu-data/kb-run/cache:
# 250 KernelBench problems, session 18) instead of timing each task's baselines in the run.
# .gpu-data/kb-run: call 2's work folder without L3/2's strict row.
set -u
T0=$(date +%s)
mkdir -p "$OUT/kb"
OUT=$OUT/kb FROM=.gpu-data/kb-run STAGES="positive" POSITIVE_POLICIES="strict" POSITIVE_RUNS=1 \
  DEADLINE_S=${KB_S:-230} bash bin/gpu-check-kernelbench.sh
left=$(( ${DEADLINE_S:-585} - ($(date +%s) - T0) ))
echo "call3: ${left}s left for the batch"
KBT_PARTS="batch" KBT_BASELINES_FROM=/tmp/gc-kb/cache KBT_BATCH_S=$(( left - 150 )) KBT_DRAIN_S=120 \
  DEADLINE_S=$(( left - 5 )) LANE0="kb-throughput" bash bin/gpu-check.sh
