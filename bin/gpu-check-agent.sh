#!/usr/bin/env bash
# GPU acceptance run of the agent package (issue #8), one device call. Run from the repo root on
# the GPU machine; writes agent_gpu.json, trajectories and logs under $OUT/agent (default
# ./gpu-out/agent). BUDGET_S (default 200) bounds the whole run; partial JSON is kept.
#   device: run(command="bash bin/gpu-check-agent.sh", carry=[".whl"])
#   32 scripted episodes at once vs 4 one at a time (episodes per hour, ratio):
#     SECTIONS=concurrent CONCURRENT=32 SERIAL=4 bash bin/gpu-check-agent.sh
#   cpu rehearsal here: BACKEND=cpu EPISODES=2 MAX_TURNS=2 MAX_NEW_TOKENS=32 bash bin/gpu-check-agent.sh
set -u
OUT=${OUT:-$PWD/gpu-out}
BUDGET_S=${BUDGET_S:-200}
D="$OUT/agent"
mkdir -p "$D"
if ! python3 -c "import msgspec" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
P=$PWD/packages
export PYTHONPATH=/tmp/site:$P/records/src:$P/profiler/src:$P/guards/src:$P/sandbox/src:$P/reward/src:$P/agent/src${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{
  date -u; echo "${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>&1
  python3 -c "import torch, transformers, sys; print('torch', torch.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])"
  nvcc --version | tail -1; nproc
} > "$D/env.txt" 2>&1
cat "$D/env.txt"
# the python script keeps its own budget 15 s under the hard one, so it saves before the kill
timeout -k 5 "$BUDGET_S" python3 packages/agent/benchmarks/gpu_check.py "$D" $((BUDGET_S - 15)) 2>&1 | tee "$D/gpu_check.log"
echo "agent gpu check: rc=${PIPESTATUS[0]} -> $D/agent_gpu.json"
