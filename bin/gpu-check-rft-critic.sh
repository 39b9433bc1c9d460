#!/usr/bin/env bash
# GPU acceptance run of `rft train` and `critic pretrain` (one device call; docs/lab/history/benchmarks-rft-critic.md).
# Run from the repo root on the GPU machine; writes logs, metrics and report.json under $OUT.
#   device: run(command="COMMIT=$(git rev-parse HEAD) bash bin/gpu-check-rft-critic.sh", carry=[".whl"])
# .whl/ holds msgspec (cp312) and .whl/rft/ the DeepSpeed wheel built here (uv build) and the
# dependencies the GPU image lacks (hjson, pydantic, pydantic-core, annotated-types, ...).
# Stages (STAGES): rft-ds2 critic-ds2 rft-ds3 rft-torch pytest-gpu (default), resume-ds2
set -u
OUT=${OUT:-$PWD/gpu-out}
W=${WORK:-/tmp/rftbench}
STEPS=${STEPS:-8}
STAGES=${STAGES:-"rft-ds2 critic-ds2 rft-ds3 rft-torch pytest-gpu"}
mkdir -p "$OUT" "$W"
[ -n "${SKIP_INSTALL:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl/rft/*.whl || exit 1
export PYTHONPATH=/tmp/site:${EXTRA_PYTHONPATH:-}$(ls -d "$PWD"/packages/*/src | tr '\n' ':')
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
{
  date -u; echo "commit ${COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers, deepspeed, sys; print('torch', torch.__version__, 'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__, 'python', sys.version.split()[0])" 2>&1 | grep -v WARNING
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
t0=$(date +%s)
python3 bin/gpu_bench_rft_critic.py setup "$W" ${SETUP_ARGS:---n 64 --turns 16 --lines 30} > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
cp "$W/setup.json" "$OUT/"
echo "setup $(( $(date +%s) - t0 ))s"

COMMON=(--model "$W/model" --data "$W/data.jsonl" --batch-tokens ${BATCH_TOKENS:-40000} --grad-accum 2
        --grad-ckpt --lr 1e-4 --warmup-steps 2 --no-tensorboard)
report() {
  local runs=()
  for d in rft-ds2 critic-ds2 rft-ds3 rft-torch resume; do [ -d "$W/$d" ] && runs+=("$W/$d"); done
  python3 bin/gpu_bench_rft_critic.py report "$OUT" "${runs[@]}" > /dev/null 2>&1
}
run() {  # name timeout_s module args...
  local name=$1 lim=$2; shift 2
  local s=$(date +%s)
  timeout "$lim" python3 -m "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - s ))s" | tee -a "$OUT/rc.txt"
  grep -E "^(train|step|rft|critic)" "$OUT/$name.log" | tail -4
  [ $rc -ne 0 ] && tail -25 "$OUT/$name.log"
  report  # after every stage: a run cut short by the time limit still leaves its numbers
  return 0
}
for st in $STAGES; do
  case $st in
    rft-ds2) run rft-ds2 120 cuda_agent.rft.cli train "${COMMON[@]}" --out "$W/rft-ds2" \
               --max-steps "$STEPS" --deepspeed configs/ds_zero2.json ;;
    critic-ds2) run critic-ds2 120 cuda_agent.critic.cli pretrain "${COMMON[@]}" --out "$W/critic-ds2" \
               --max-steps "$STEPS" --deepspeed configs/ds_zero2.json --lambda 0.95 ;;
    rft-torch) run rft-torch 90 cuda_agent.rft.cli train "${COMMON[@]}" --out "$W/rft-torch" \
               --max-steps "$STEPS" ;;
    rft-ds3) run rft-ds3 90 cuda_agent.rft.cli train "${COMMON[@]}" --out "$W/rft-ds3" \
               --max-steps 4 --deepspeed configs/ds_zero3.json ;;
    resume-ds2)
      run resume-a 90 cuda_agent.rft.cli train "${COMMON[@]}" --out "$W/resume" --max-steps 4 \
        --deepspeed configs/ds_zero2.json --stop-after 2
      run resume-b 90 cuda_agent.rft.cli train "${COMMON[@]}" --out "$W/resume" --max-steps 4 \
        --deepspeed configs/ds_zero2.json --resume ;;
    pytest-gpu) run pytest-gpu 60 pytest -o addopts=--import-mode=importlib -q -p no:cacheprovider packages/rft/tests/test_train.py \
        -k bf16 ;;
  esac
done
report
cat "$OUT/report.json"
ls "$W/rft-ds2/final" "$W/critic-ds2/final" > "$OUT/final-files.txt" 2>&1
echo "total $(( $(date +%s) - t0 ))s"
