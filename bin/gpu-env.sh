# Source me on the GPU machine (no uv there): installs the carried wheels (.whl/, .whl/rft/) into
# /tmp/site, puts every package's src on PYTHONPATH and the packages' CLIs (as `python3 -m` shims)
# on PATH, so bin/train_all.sh and the package CLIs run as they do under `uv run`.
#   . bin/gpu-env.sh
if ! python3 -c "import msgspec, deepspeed" >/dev/null 2>&1; then
  # only the wheel folders that are there (a sandbox-only run carries msgspec alone)
  _wheels=$(ls .whl/*.whl .whl/rft/*.whl 2>/dev/null)
  [ -n "$_wheels" ] && { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site $_wheels >/dev/null 2>&1 || echo "gpu-env: wheel install failed" >&2; }
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
# bytecode for what every sandbox phase process imports: without .pyc (a PYTHONDONTWRITEBYTECODE
# image, or wheels installed with --no-compile) each fresh interpreter compiles torch's sources
# again (on a 2-core VM: import torch 7 s instead of 3 s). Records what it found.
python3 - <<'PY' >&2 2>/dev/null || true
import compileall, importlib.util, os, sys, time
for name in ("torch", "transformers", "numpy", "msgspec", "deepspeed"):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        continue
    d = list(spec.submodule_search_locations)[0]
    if os.path.isdir(os.path.join(d, "__pycache__")) and os.listdir(os.path.join(d, "__pycache__")):
        continue
    t = time.time()
    ok = compileall.compile_dir(d, quiet=2, workers=os.cpu_count() or 1)
    print(f"gpu-env: compiled {name} bytecode in {time.time() - t:.0f}s (ok={ok})")
PY
