#!/usr/bin/env bash
# The README's main-job command: `uv run bin/demo.sh`.
#
# Today it runs the part of the pipeline that exists: example evaluation results -> reward score
# -> records stats, written under runs/demo/. The full miniature training chain (synthesised tasks
# on the cpu backend, SmolLM2-135M-Instruct as the policy, one PPO step, a report) replaces this
# once the agent and trainers exist (issue 11).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${DEMO_DIR:-runs/demo}
mkdir -p "$out"
python - > "$out/results.jsonl" <<'PY'
import sys
import msgspec
from cuda_agent.records import Status, encode
from cuda_agent.records.examples import result
rows = [(2.0, 1.8, Status.OK), (1.2, 0.9, Status.OK), (1.01, 0.8, Status.OK), (0.0, 0.0, Status.INCORRECT)]
for i, (se, sc, st) in enumerate(rows):
    r = msgspec.structs.replace(result(i, st), speedup_vs_eager=se or None, speedup_vs_compile=sc or None, timing=None)
    sys.stdout.buffer.write(encode(r))
PY
reward score < "$out/results.jsonl" > "$out/rewarded.jsonl"
records stats "$out/rewarded.jsonl" | tee "$out/stats.json"
echo "demo outputs in $out/ (results.jsonl, rewarded.jsonl, stats.json)" >&2
