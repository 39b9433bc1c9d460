# Source me on the GPU machine (no uv there): installs the carried wheels (.whl/, .whl/rft/) into
# /tmp/site, puts every package's src on PYTHONPATH and the packages' CLIs (as `python3 -m` shims)
# on PATH, so bin/train_all.sh and the package CLIs run as they do under `uv run`.
#   . bin/gpu-env.sh
if ! python3 -c "import msgspec, deepspeed" >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl .whl/rft/*.whl >/dev/null 2>&1 || echo "gpu-env: wheel install failed" >&2
fi
export PYTHONPATH=/tmp/site:$(ls -d "$PWD"/packages/*/src | tr '\n' ':')${PYTHONPATH:-}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# the device README: NVLink multicast off
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/shims
for spec in agent:agent critic:critic guards:guards kernelbench-eval:kernelbench_eval \
    opsynth:opsynth ppo:ppo profiler:profiler records:records reward:reward rft:rft sandbox:sandbox; do
  name=${spec%%:*} mod=${spec#*:}
  printf '#!/bin/sh\nexec python3 -m cuda_agent.%s.cli "$@"\n' "$mod" > "/tmp/shims/$name"
  chmod +x "/tmp/shims/$name"
done
command -v python >/dev/null || ln -sf "$(command -v python3)" /tmp/shims/python
export PATH=/tmp/shims:$PATH
