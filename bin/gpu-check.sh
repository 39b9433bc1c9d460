#!/usr/bin/env bash
# Every GPU acceptance run of the project, in sections, for one device call (docs/lab/history/benchmarks.md).
# Run from the repo root on the GPU machine; sections write under $WORK/<section>/ (default
# /tmp/gc), packed at the end into $OUT/results.tgz (the device tool returns at most 8 files).
#
#   LANE0="ppo-ds sandbox-ab profiler guards kbeval agent" bash bin/gpu-check.sh       # one GPU
#   LANE0="opsynth sandbox-d1" LANE1="train-all" bash bin/gpu-check.sh                # two GPUs
#   LANE0="sandbox-d2 ppo-multi" bash bin/gpu-check.sh                                 # two GPUs
#   LANE0="gen-probe sandbox-wpg" bash bin/gpu-check.sh                                # one GPU
#   D_N=18 LANE0="sandbox-warm" bash bin/gpu-check.sh          # throughput, warm runner processes vs cold
#   WARM_ORDER="cold fork" D_N=14 LANE0="sandbox-warm" bash bin/gpu-check.sh  # fork server vs cold
#   OPSYNTH_FROM=.gpu-data/opsynth-run RESUME=1 LANE0="opsynth" bash bin/gpu-check.sh  # continue a run
#   TESTS="packages/profiler/tests/test_gpu.py" LANE0="tests sandbox-ab" bash bin/gpu-check.sh  # pytest files, then A+B
#   TOOL_ROUNDS=6 LANE0="tool-compile" bash bin/gpu-check.sh   # agent compile tool (direct, via exec_shell) vs load()
#   TOOLS_ROUNDS=3 LANE0="agent-tools" bash bin/gpu-check.sh  # an agent's compile/verify/profile, s each
#   B_ONLY_INLINE=1 B_INLINE_ROUNDS=3 LANE0="sandbox-b" bash bin/gpu-check.sh          # cold load_inline pairs
#   LANE0="kb-throughput" bash bin/gpu-check.sh   # evaluator throughput on real KernelBench work vs KernelBench's harness
#   LANE0="kb-throughput-serial" KBT_CONCURRENT_FROM=.gpu-data/kbt/results.jsonl bash bin/gpu-check.sh  # serial comparison
#   KBT_PARTS="batch service" KBT_BATCH_S=150 KBT_DRAIN_S=60 LANE0="kb-throughput" bash bin/gpu-check.sh  # the batch through the service vs the local pool
#
# Lanes run in parallel, each pinned to one GPU (LANE0 on GPU 0, LANE1 on GPU 1) unless its
# sections need every GPU (sandbox-d2, ppo-multi); sections of a lane run in order, each under its
# own time limit, and the whole call under DEADLINE_S. device: run(command=..., carry=[".whl",
# ".gpu-data"]).
set -u
RESULTS=${OUT:-$PWD/gpu-out}
export OUT=${WORK:-/tmp/gc}
export COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
DEADLINE_S=${DEADLINE_S:-570}
T0=$(date +%s)
mkdir -p "$OUT"
. bin/gpu-env.sh
{
  date -u; echo "commit $COMMIT"
  nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers, sys; print('torch', torch.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])"
  python3 -c "import deepspeed; print('deepspeed', deepspeed.__version__)" 2>&1 | tail -1
  nproc
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
say() { echo "[gpu-check $(( $(date +%s) - T0 ))s] $*" >&2; }

# ---------------------------------------------------------------- sections (arg: time limit s)
sec_tests() {  # TESTS="path ..." (default: the sandbox's root-only and GPU-facing files), one pytest
  python3 -m pytest -o addopts=--import-mode=importlib -q -p no:cacheprovider -rA \
    ${TESTS:-packages/sandbox/tests/test_uids.py packages/sandbox/tests/test_exec.py packages/sandbox/tests/test_kb_headers.py}
}
sec_timing-ab() {  # the timing protocol's refresh sync, ca-timing-2 vs ca-timing-1, same process
  python3 packages/profiler/benchmarks/refresh_sync_ab.py "$1/refresh_sync_ab.json" ${AB_ROUNDS:-4}
}
sec_ppo-ds() {  # PPO on DeepSpeed ZeRO-2 and ZeRO-3, one rank: steps, resume reproduces step 2
  python3 -m pytest -o addopts=--import-mode=importlib -q -p no:cacheprovider -rA packages/ppo/tests/test_deepspeed.py
}
sec_sandbox-ab() {  # one fused task, workdir + kernelbench candidates (strict guards); compile times
  # with the faster linker on cuda too: section A passing is what makes it the default there
  CUDA_AGENT_LINKER=${CUDA_AGENT_LINKER:-fast} SECTIONS=${AB_SECTIONS:-A,B} python3 packages/sandbox/benchmarks/gpu_check.py "$1" "$(( $2 - 10 ))"
}
sec_sandbox-b() {  # compile times only (section B), with the load_inline comparison
  SECTIONS=B python3 packages/sandbox/benchmarks/gpu_check.py "$1" "$(( $2 - 10 ))"
}
sec_sandbox-d1() {  # throughput batch on one GPU
  SECTIONS=D D_N=${D_N:-20} D_TAG=D1 D_GPUS=0 python3 packages/sandbox/benchmarks/gpu_check.py "$1" "$(( $2 - 10 ))"
}
sec_sandbox-d2() {  # the same batch on every GPU (one device worker per GPU)
  SECTIONS=D D_N=${D_N:-20} D_TAG=D2 D_GPUS=all python3 packages/sandbox/benchmarks/gpu_check.py "$1" "$(( $2 - 10 ))"
}
sec_sandbox-w1() {  # the throughput batch on one GPU with ONE device worker (vs sandbox-d1's two)
  SECTIONS=D D_N=${D_N:-20} D_TAG=W1 D_WPG=1 D_GPUS=0 python3 packages/sandbox/benchmarks/gpu_check.py "$1" "$(( $2 - 10 ))"
}
sec_sandbox-wpg() {  # the same batch with 1 and with 2 device workers on one GPU (throughput ratio)
  local half=$(( ($2 - 20) / 2 ))
  mkdir -p "$1/w1" "$1/w2"
  SECTIONS=D D_N=${D_N:-20} D_TAG=W1 D_WPG=1 python3 packages/sandbox/benchmarks/gpu_check.py "$1/w1" "$half"
  SECTIONS=D D_N=${D_N:-20} D_TAG=W2 D_WPG=2 python3 packages/sandbox/benchmarks/gpu_check.py "$1/w2" "$half"
}
sec_sandbox-warm() {  # the same batch with runner processes forked from a fork server (fork),
  # started ahead (warm: 3 spares) and cold, one GPU; each half with fresh caches of its own
  # (prelude, builds; the profiler's baselines), so none inherits another's; WARM_ORDER picks the
  # halves and their order (default "warm cold"; e.g. "cold fork")
  local order=${WARM_ORDER:-warm cold}
  local halves=$(wc -w <<< "$order")
  local half=$(( ($2 - 20) / halves ))
  local c=/tmp/warm-ab-cache-$$ h n f
  for h in $order; do
    case $h in warm) n=3 f=0 ;; cold) n=0 f=0 ;; fork) n=0 f=1 ;;
      *) say "sandbox-warm: WARM_ORDER names $h"; return 2 ;; esac
    mkdir -p "$1/$h"
    CUDA_AGENT_SANDBOX_CACHE=$c-$h CUDA_AGENT_CACHE=$c-$h-base SECTIONS=D D_N=${D_N:-20} D_TAG=${h^^} D_WARM=$n D_FORK=$f D_GPUS=0 \
      python3 packages/sandbox/benchmarks/gpu_check.py "$1/$h" "$half"
  done
}
sec_agent-tools() {  # an agent's iteration through exec_shell: compile, verify, profile (s each)
  ( cd packages/sandbox/benchmarks && CUDA_AGENT_SANDBOX_CACHE=/tmp/agent-tools-cache-$$ \
    python3 agent_tools_time.py ${TOOLS_ROUNDS:-3} cuda ) > "$1/agent_tools_time.json" 2> "$1/agent_tools_time.err"
  cat "$1/agent_tools_time.err" "$1/agent_tools_time.json"
}
sec_tool-compile() {  # the agent's compile tool vs load() as whole processes, kernel-body edits
  # (fresh tool cache: its first, untimed build makes the prelude)
  ( cd packages/sandbox/benchmarks && CUDA_AGENT_SANDBOX_CACHE=/tmp/tool-ab-cache-$$ \
    python3 tool_compile_ab.py ${TOOL_ROUNDS:-6} cuda ) > "$1/tool_compile_ab.json"
  cat "$1/tool_compile_ab.json"
}
sec_gen-probe() {  # why the first generate calls of a process are slow on the GPU (docs/lab/history/benchmarks-ppo.md)
  local v
  for v in "bf16 off" "bf16 on" "fp32 off"; do  # the fix, torch's default (cuDNN attention), fp32
    set -- "$1" $v
    python3 packages/agent/benchmarks/gen_probe.py "$1" --calls ${GEN_CALLS:-3} --new 256 --dtype "$2" \
      --cudnn-sdpa "$3" 2>&1 | grep -v "Loading\|Writing"
  done
}
sec_profiler() {  # ceilings (incl. read bandwidth) and the GPU tests (CUDA-graph replay)
  OUT=$1 STAGES=${PROFILER_STAGES:-"ceilings tests"} bash bin/gpu-check-profiler.sh
}
sec_guards() {
  OUT=$1 PYTEST_TIMEOUT=$(( $2 - 5 )) bash bin/gpu-check-guards.sh
}
sec_kbeval() { OUT=$(dirname "$1") BUDGET_S=$2 bash bin/gpu-check-kbeval.sh; }
sec_agent() { OUT=$(dirname "$1") BUDGET_S=$2 bash bin/gpu-check-agent.sh; }
sec_opsynth() {  # OPSYNTH_FROM=DIR (e.g. a carried .gpu-data/opsynth-run): continue that run
  if [ -n "${OPSYNTH_FROM:-}" ] && [ ! -e "$1/env.json" ]; then cp -r "$OPSYNTH_FROM"/. "$1"/; fi
  OUT=$(dirname "$1") BUDGET_S=$2 bash bin/gpu-check-opsynth.sh
}
sec_train-all() {  # the whole pipeline on configs/h200-smoke.toml, then PPO resume from step 4
  local run=/tmp/smoke
  # its own limit, inside the section's, so the logs below are copied even when it runs out
  timeout -k 5 $(( $2 - 60 )) bash bin/train_all.sh --config configs/h200-smoke.toml --run-dir "$run" 2>&1 | tee "$1/train_all.log"
  cp -r "$run/logs" "$1/stage-logs" 2>/dev/null
  cp "$run/ppo/metrics.jsonl" "$1/ppo-metrics.jsonl" 2>/dev/null
  cp "$run/warmup/metrics.jsonl" "$1/warmup-metrics.jsonl" 2>/dev/null
  [ -d "$run/eval" ] && cp "$run/eval/report.md" "$run/eval/report.json" "$1/" 2>/dev/null
  [ -f "$run/ppo/checkpoint-4/ppo_state.json" ] || { say "train-all: no checkpoint-4 to resume from"; return 1; }
  local re=/tmp/smoke-resume
  rm -rf "$re"; mkdir -p "$re"
  cp -r "$run/ppo/checkpoint-4" "$run/ppo/tiny-actor" "$re/" 2>/dev/null
  echo checkpoint-4 > "$re/latest"
  head -n 4 "$run/ppo/metrics.jsonl" > "$re/metrics.jsonl"
  ppo train --config configs/h200-smoke.toml --set "data.tasks=\"$run/data/tasks.jsonl\"" \
    --set "train.out=\"$re\"" --set model.tiny=false --set "model.actor=\"$run/rft/final\"" \
    --set "model.critic=\"$run/critic/final\"" --resume > "$1/resume.log" 2>&1
  python3 - "$run/ppo/metrics.jsonl" "$re/metrics.jsonl" > "$1/resume_compare.json" <<'EOF'
import json, sys
a = [json.loads(x) for x in open(sys.argv[1])][4]
b = [json.loads(x) for x in open(sys.argv[2])][4]
keys = ["reward_mean", "policy_loss", "value_loss", "entropy", "clipfrac", "approx_kl",
        "explained_variance", "actor_grad_norm", "critic_grad_norm"]
print(json.dumps({k: {"straight": a.get(k), "resumed": b.get(k)} for k in keys}, indent=1))
EOF
  cat "$1/resume_compare.json"
}
sec_ppo-multi() {  # ZeRO-3, 2 ranks (torchrun) vs 1 rank, same seed, multi-turn, 3 steps
  local tasks=/tmp/smoke/data/tasks.jsonl
  if [ ! -s "$tasks" ]; then
    tasks=/tmp/kb_tasks.jsonl
    kernelbench-eval tasks --root packages/kernelbench-eval/tests/fixtures --levels 1,2 > "$tasks"
  fi
  local n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  local common=(--config configs/h200-smoke.toml --set "data.tasks=\"$tasks\"" --set ppo.steps=3
    --set 'train.deepspeed="configs/ds_zero3.json"' --set data.tasks_per_step=4)
  timeout -k 5 $(( $2 * 6 / 10 )) python3 -m torch.distributed.run --standalone --nproc_per_node="$n" \
    -m cuda_agent.ppo.cli train "${common[@]}" --set 'train.out="/tmp/ppo-multi"' > "$1/multi.log" 2>&1
  say "ppo-multi: $n ranks rc=$?"
  cp /tmp/ppo-multi/metrics.jsonl "$1/metrics-${n}gpu.jsonl" 2>/dev/null
  CUDA_VISIBLE_DEVICES=0 timeout -k 5 $(( $2 * 3 / 10 )) ppo train "${common[@]}" \
    --set 'train.out="/tmp/ppo-single"' > "$1/single.log" 2>&1
  say "ppo-multi: 1 rank rc=$?"
  cp /tmp/ppo-single/metrics.jsonl "$1/metrics-1gpu.jsonl" 2>/dev/null
  nvidia-smi --query-gpu=index,memory.used --format=csv > "$1/nvidia-smi-after.txt" 2>&1
}

sec_kb-throughput() {  # issue 28: the fixed batch of real KernelBench work through `kernelbench-eval
  # run` (concurrent, fresh caches), then the KernelBench-harness subset: ours (fresh caches) and
  # KernelBench's own eval_kernel_against_ref (.gpu-data/kernelbench/src) one after another.
  # KBT_PARTS (default "batch subset kb") picks the parts; KBT_BATCH_S (feed budget, default 40%
  # of the limit) + KBT_DRAIN_S (15%), KBT_SUBSET_S (15%), the rest for KernelBench's harness;
  # KBT_KB_PRECOMPILE (default nproc) workers for its CPU pre-compile (0: none, its default flow);
  # KBT_KB_FLOWS ("precompile"; "default precompile": both flows of KernelBench's harness, each
  # with its own ratio);
  # KBT_TIMING: profiler timing settings (JSON) for our runs (default: the protocol's);
  # KBT_RUN_ARGS: more `kernelbench-eval run` flags (e.g. "--workers-per-gpu=4");
  # KBT_BASELINES_FROM: a profiler cache folder (kb_references.py's) whose baselines seed ours;
  # the part "baselines" (first in KBT_PARTS) makes one: kb_references.py over the batch's tasks
  # that can reach the device (eager and torch.compile, once per task, as a user runs it once per
  # GPU), into $d/baselines/cache, which seeds the parts after it when KBT_BASELINES_FROM is
  # unset; KBT_BASELINES_S (default 45% of the limit) bounds it, KBT_BASELINES_LIMIT: at most
  # that many tasks (a rehearsal);
  # the part "service" sends the batch through the kernel service (`python -m cuda_agent.service
  # serve` on every GPU, KBT_SERVICE_CLIENTS client threads, default 16) into $d/service with the
  # same fresh caches, seeding and budget (KBT_BATCH_S + KBT_DRAIN_S, its own: with "batch
  # service" both fit in the limit) as "batch", then compares its verdicts with $d/batch's and
  # summarises it (each request's overhead over the evaluation in $d/service/run.json);
  # KBT_SERVE_ARGS: more `service serve` flags (KBT_TIMING goes in as --sandbox-config);
  # KBT_BACKEND=cpu rehearses the plumbing on a machine without a GPU
  local d=$1 lim=$2 B=packages/kernelbench-eval/benchmarks t0=$(date +%s) p
  local feed=${KBT_BATCH_S:-$(( lim * 40 / 100 ))} drain=${KBT_DRAIN_S:-$(( lim * 15 / 100 ))}
  local sub=${KBT_SUBSET_S:-$(( lim * 15 / 100 ))} parts=${KBT_PARTS:-batch subset kb}
  # the batch run must end (and write run.json, drop its caches) before the lane's own limit
  [ $(( feed + drain )) -gt $(( lim - 30 )) ] && drain=$(( lim - 30 - feed > 30 ? lim - 30 - feed : 30 ))
  local targ=(); [ -n "${KBT_TIMING:-}" ] && targ=("--run-arg=--timing-config=$KBT_TIMING")
  for p in ${KBT_RUN_ARGS:-}; do targ+=("--run-arg=$p"); done
  local seed=${KBT_BASELINES_FROM:-}
  [[ -z "$seed" && " $parts " == *" baselines "* ]] && seed=$d/baselines/cache
  [ -n "$seed" ] && targ+=(--baselines-from "$seed")
  local sarg=(); [ -n "${KBT_TIMING:-}" ] && sarg=("--serve-arg=--sandbox-config={\"timing_config\": $KBT_TIMING}")
  for p in ${KBT_SERVE_ARGS:-}; do sarg+=("--serve-arg=$p"); done
  [ -n "$seed" ] && sarg+=(--baselines-from "$seed")
  python3 $B/throughput_batch.py build -o "$d/batch.jsonl" --subset-output "$d/subset.jsonl" --min 0 \
    --tasks-output "$d/tasks.jsonl" --positive "${KBT_POSITIVE:-packages/kernelbench-eval/corpus/positive}" || return 1
  for p in $parts; do
    case $p in
      baselines)
        local bs=${KBT_BASELINES_S:-$(( lim * 45 / 100 ))} dev=cuda
        [ "${KBT_BACKEND:-cuda}" = cpu ] && dev=cpu
        mkdir -p "$d/baselines/cache"
        # stop starting tasks 60 s before its bound; those running then may still finish
        CUDA_AGENT_CACHE=$d/baselines/cache timeout -k 10 "$bs" python3 $B/kb_references.py run \
          --tasks "$d/tasks.jsonl" -o "$d/baselines/references.jsonl" --resume --jobs "${KBT_BASELINES_JOBS:-10}" \
          --deadline-s $(( bs > 120 ? bs - 60 : bs / 2 )) --device "$dev" --no-trace-check \
          ${KBT_BASELINES_LIMIT:+--limit "$KBT_BASELINES_LIMIT"} 2> "$d/baselines/log.txt"
        say "kb-throughput: baselines rc=$? rows $(wc -l < "$d/baselines/references.jsonl" 2>/dev/null || echo 0) of $(wc -l < "$d/tasks.jsonl") tasks, $(ls "$d/baselines/cache/baselines" 2>/dev/null | wc -l) cached" ;;
      batch)
        python3 $B/throughput.py ours --batch "$d/batch.jsonl" --out "$d/batch" --gpus all --backend "${KBT_BACKEND:-cuda}" \
          --feed-s "$feed" --timeout-s $(( feed + drain )) "${targ[@]}"
        python3 $B/throughput.py summary "$d/batch" > "$d/batch/summary.json"
        python3 $B/throughput.py summary "$d/batch" --md | tee "$d/batch/summary.md" ;;
      service)
        python3 $B/throughput.py service --batch "$d/batch.jsonl" --out "$d/service" --gpus all --backend "${KBT_BACKEND:-cuda}" \
          --clients "${KBT_SERVICE_CLIENTS:-16}" --feed-s "$feed" --timeout-s $(( feed + drain )) "${sarg[@]}"
        say "kb-throughput: service rc=$?"
        if [ -s "$d/batch/results.jsonl" ]; then
          python3 $B/throughput.py compare "$d/batch" "$d/service" > "$d/service/compare.json"
          python3 $B/throughput.py compare "$d/batch" "$d/service" --md | tee "$d/service/compare.md"
        fi
        python3 $B/throughput.py summary "$d/service" > "$d/service/summary.json"
        python3 $B/throughput.py summary "$d/service" --md | tee "$d/service/summary.md" ;;
      subset)
        python3 $B/throughput.py ours --batch "$d/subset.jsonl" --out "$d/subset-ours" --gpus all --backend "${KBT_BACKEND:-cuda}" --timeout-s "$sub" "${targ[@]}"
        python3 $B/throughput.py summary "$d/subset-ours" --md | tee "$d/subset-ours/summary.md" ;;
      kb)  # KBT_KB_FLOWS: "precompile" (its build_cache option, nproc workers: kb/, ratio.md),
        # "default" (its default flow, builds inside each evaluation: kb-default/, ratio-default.md),
        # or both, in that order, the time left split between them
        local flows=${KBT_KB_FLOWS:-precompile} nf; nf=$(echo $flows | wc -w)
        for flow in $flows; do
          local rest=$(( (lim - ($(date +%s) - t0) - 15) / nf )); nf=$(( nf > 1 ? nf - 1 : 1 ))
          local kd=$d/kb sfx="" pre=${KBT_KB_PRECOMPILE:-$(nproc)}
          case $flow in
            precompile) ;;
            default) kd=$d/kb-default; sfx="-default"; pre=0 ;;
            *) say "kb-throughput: KBT_KB_FLOWS names $flow (default or precompile)"; return 2 ;;
          esac
          python3 $B/throughput.py kb --subset "$d/subset.jsonl" --out "$kd" --src .gpu-data/kernelbench/src \
            --budget-s "$rest" --precompile-workers "$pre"
          [ -d "$d/subset-ours" ] && python3 $B/throughput.py ratio "$d/subset-ours" "$kd" > "$d/ratio$sfx.json" && \
            python3 $B/throughput.py ratio "$d/subset-ours" "$kd" --md | tee "$d/ratio$sfx.md"
        done ;;
      *) say "kb-throughput: KBT_PARTS names $p"; return 2 ;;
    esac
  done
}
sec_kb-throughput-serial() {  # issue 28: the same batch one candidate at a time (one worker, window
  # 1), then verdicts and honest speed-ups against the concurrent run: $WORK/kb-throughput/batch
  # of this call, else KBT_CONCURRENT_FROM (a results.jsonl). KBT_SERIAL_FROM (a results.jsonl of
  # an earlier call) is continued (resume), so the serial batch can span calls; KBT_BASELINES_FROM
  # seeds its baselines as in kb-throughput; KBT_SERIAL_MODE=device: one candidate at a time on the
  # device while later ones compile (throughput.py --serial-device), else strictly one at a time
  local d=$1 lim=$2 B=packages/kernelbench-eval/benchmarks
  local targ=(); [ -n "${KBT_TIMING:-}" ] && targ=("--run-arg=--timing-config=$KBT_TIMING")
  [ -n "${KBT_BASELINES_FROM:-}" ] && targ+=(--baselines-from "$KBT_BASELINES_FROM")
  python3 $B/throughput_batch.py build -o "$d/batch.jsonl" --min 0 \
    --positive "${KBT_POSITIVE:-packages/kernelbench-eval/corpus/positive}" || return 1
  mkdir -p "$d/serial"
  [ -n "${KBT_SERIAL_FROM:-}" ] && [ ! -s "$d/serial/results.jsonl" ] && cp "$KBT_SERIAL_FROM" "$d/serial/results.jsonl"
  local mode=--serial; [ "${KBT_SERIAL_MODE:-}" = device ] && mode=--serial-device
  python3 $B/throughput.py ours --batch "$d/batch.jsonl" --out "$d/serial" $mode --backend "${KBT_BACKEND:-cuda}" \
    --feed-s $(( lim > 200 ? lim - 150 : lim / 4 )) --timeout-s $(( lim - 30 )) "${targ[@]}"
  python3 $B/throughput.py summary "$d/serial" --md | tee "$d/serial/summary.md"
  local conc=$(dirname "$d")/kb-throughput/batch/results.jsonl
  [ -s "$conc" ] || conc=${KBT_CONCURRENT_FROM:-}
  if [ -n "$conc" ] && [ -s "$conc" ]; then
    python3 $B/throughput.py compare "$conc" "$d/serial" > "$d/compare.json"
    python3 $B/throughput.py compare "$conc" "$d/serial" --md | tee "$d/compare.md"
  else say "kb-throughput-serial: no concurrent results to compare with"; fi
}

run_lane() {  # run_lane GPU SECTIONS...
  local gpu=$1; shift
  for s in "$@"; do
    local lim=$(left)
    case "$s" in
      ppo-ds) [ "$lim" -gt 200 ] && lim=200 ;;
      profiler|guards) [ "$lim" -gt 150 ] && lim=150 ;;
      sandbox-ab|sandbox-b) [ "$lim" -gt 280 ] && lim=280 ;;
      agent) [ "$lim" -gt 200 ] && lim=200 ;;
      tests) [ "$lim" -gt "${TESTS_CAP:-200}" ] && lim=${TESTS_CAP:-200} ;;
      timing-ab) [ "$lim" -gt 200 ] && lim=200 ;;
      kbeval) [ "$lim" -gt 450 ] && lim=450 ;;
      opsynth) [ "$lim" -gt "${OPSYNTH_CAP:-240}" ] && lim=${OPSYNTH_CAP:-240} ;;
      gen-probe) [ "$lim" -gt 300 ] && lim=300 ;;
      tool-compile) [ "$lim" -gt 240 ] && lim=240 ;;
      agent-tools) [ "$lim" -gt "${TOOLS_CAP:-300}" ] && lim=${TOOLS_CAP:-300} ;;
    esac
    if [ "$lim" -lt 30 ]; then say "$s: skipped ($(left)s left)"; echo "$s skipped" >> "$OUT/sections.txt"; continue; fi
    mkdir -p "$OUT/$s"
    say "$s: start (limit ${lim}s, GPU ${gpu:-all})"
    local t=$(date +%s)
    if [ -n "$gpu" ]; then
      ( export CUDA_VISIBLE_DEVICES=$gpu; timeout -k 5 "$lim" bash -c "$(declare -f "sec_$s" say left); sec_$s '$OUT/$s' $lim" ) > "$OUT/$s/section.log" 2>&1
    else
      timeout -k 5 "$lim" bash -c "$(declare -f "sec_$s" say left); sec_$s '$OUT/$s' $lim" > "$OUT/$s/section.log" 2>&1
    fi
    local rc=$?
    say "$s: rc=$rc in $(( $(date +%s) - t ))s"
    echo "$s rc=$rc seconds=$(( $(date +%s) - t ))" >> "$OUT/sections.txt"
    tail -n 5 "$OUT/$s/section.log" >&2
  done
}

pin0="" pin1=1
[ -n "${LANE1:-}" ] && pin0=0   # two lanes: one GPU each (a lane alone sees every GPU)
run_lane "$pin0" ${LANE0:-} &
p0=$!
if [ -n "${LANE1:-}" ]; then run_lane "$pin1" $LANE1 & p1=$!; wait $p1; fi
wait $p0
say "done in $(( $(date +%s) - T0 ))s"
cat "$OUT/sections.txt"
mkdir -p "$RESULTS"
# caches (sandbox, profiler, inductor, triton: hundreds of MB) never travel back
tar czf "$RESULTS/results.tgz" -C "$OUT" --exclude='*.pt' --exclude='*.safetensors' --exclude='cache-*' . 2>/dev/null
cp "$OUT/sections.txt" "$OUT/env.txt" "$RESULTS/" 2>/dev/null
ls -la "$RESULTS"
