#!/usr/bin/env bash
# Session 19, call 2 (on the machine warm from call 1): the positive corpus for issue 27. The
# `kernelbench`-policy run is call 1's throughput batch (its 50 positive-corpus results, same
# task and solution keys), continued here with --resume where the batch was cut off; the
# `strict` run is session 18's (.gpu-data/kb-run), its 6 sandbox failures evaluated again.
set -u
W=${WORK:-/tmp/gc-kb} B=/tmp/gc/kb-throughput
mkdir -p "$W/positive"
if [ -s "$B/batch/results.jsonl" ]; then
  python3 - "$B/batch.jsonl" "$B/batch/results.jsonl" "$W/positive/results-kernelbench-1.jsonl" <<'PY'
import json, sys
batch, res, out = sys.argv[1:]
keys = set()
for ln in open(batch):
    c = json.loads(ln)
    if c["meta"]["bench"]["source"] == "positive":
        keys.add(f"{c['task']['id']}:{c['solution']['id']}")
rows = [ln for ln in open(res) if ln.strip()
        and f"{json.loads(ln)['task_id']}:{json.loads(ln)['solution_id']}" in keys]
open(out, "w").writelines(rows)
print(f"call2: {len(rows)} of {len(keys)} positive-corpus results from the batch", file=sys.stderr)
PY
fi
FROM=.gpu-data/kb-run STAGES="positive" POSITIVE_REDO="runtime_error infra_error" \
  POSITIVE_POLICIES="strict kernelbench" POSITIVE_RUNS=1 DEADLINE_S=${DEADLINE_S:-570} \
  bash bin/gpu-check-kernelbench.sh
