#!/usr/bin/env bash
# Session 20, call 1 (fresh machine): issue 28's fixed batch with 4 device workers per GPU instead
# of 2 (session 19's stage split: the GPU's exclusive sections were about half of the wall clock;
# each worker spends most of a candidate in start-up, CUPTI set-up and waits), with the eager and
# torch.compile baselines of the 250-problem references run reused (.gpu-data/kb-run/cache).
# nvidia-smi samples the GPU's utilisation once a second beside it.
set -u
mkdir -p "$OUT/smi"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,clocks.sm,clocks.mem,power.draw \
  --format=csv -l 1 > "$OUT/smi/smi.csv" 2>&1 &
SMI=$!
KBT_PARTS="batch" KBT_BASELINES_FROM=.gpu-data/kb-run/cache KBT_RUN_ARGS="${WPG_ARGS:---workers-per-gpu=4}" \
  KBT_BATCH_S=${KBT_BATCH_S:-400} KBT_DRAIN_S=${KBT_DRAIN_S:-150} DEADLINE_S=${DEADLINE_S:-585} \
  LANE0="kb-throughput" bash bin/gpu-check.sh
kill $SMI 2>/dev/null
