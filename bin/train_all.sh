#!/usr/bin/env bash
# The CUDA Agent recipe end to end, as the packages' own CLIs joined by files and pipes:
#
#   data -> baselines -> warmup (single-turn PPO) -> collect (agent episodes) -> rft
#        -> critic (value pretraining) -> ppo (multi-turn) -> eval (KernelBench, when configured)
#
#   bin/train_all.sh --config configs/tiny-cpu.toml --run-dir runs/demo [--set section.key=value]...
#                    [--force STAGE]... [--only STAGE]
#
# Every stage writes into RUN_DIR/<stage>/, logs to RUN_DIR/logs/<stage>.log, and is skipped when
# RUN_DIR/<stage>/.done exists. --force STAGE deletes RUN_DIR/<stage>/ and runs the stage from
# scratch (--force all: every stage); the stages after it are not redone unless forced too. A
# failing stage stops the run with a message naming it and the end of its log. Rerunning the same
# command continues where it stopped (the long stages resume inside, too).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
CONFIG="" RUN="" ONLY="" FORCE=" "
SETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG=$2; shift 2 ;;
    --run-dir) RUN=$2; shift 2 ;;
    --force) FORCE="$FORCE$2 "; shift 2 ;;
    --set) SETS+=(--set "$2"); shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "train_all: unknown argument $1" >&2; usage 2 ;;
  esac
done
[ -n "$CONFIG" ] && [ -n "$RUN" ] || { echo "train_all: --config and --run-dir are required" >&2; usage 2; }
[ -f "$CONFIG" ] || { echo "train_all: no config file $CONFIG" >&2; exit 2; }
mkdir -p "$RUN/logs"
RUN=$(cd "$RUN" && pwd)
command -v ppo >/dev/null || { echo "train_all: the toolkit's commands are not on PATH; run it as: uv run bin/train_all.sh ..." >&2; exit 2; }
ENVS=$(ppo config-env --config "$CONFIG" "${SETS[@]}") || { echo "train_all: invalid config $CONFIG (see above)" >&2; exit 2; }
eval "$ENVS"   # CA_<SECTION>_<KEY> for every config key

say() { echo "[train_all $(date +%H:%M:%S)] $*" >&2; }
STAGES="data baselines warmup collect rft critic ppo eval"
run_stage() {  # run_stage NAME FUNCTION
  local name=$1 fn=$2 dir="$RUN/$1" logf="$RUN/logs/$1.log"
  if [ -n "$ONLY" ] && [ "$ONLY" != "$name" ]; then return 0; fi
  if [[ "$FORCE" == *" $name "* || "$FORCE" == *" all "* ]]; then
    say "$name: forced: deleting $dir to run it from scratch"; rm -rf "$dir"
  elif [ -f "$dir/.done" ]; then
    say "$name: done already (in $dir; --force $name to redo)"; return 0
  fi
  rm -f "$dir/.done"; mkdir -p "$dir"
  say "$name: running (log: $logf)"
  local t0=$SECONDS
  if ( set -euo pipefail; "$fn" "$dir" ) >>"$logf" 2>&1; then
    touch "$dir/.done"; say "$name: ok in $((SECONDS - t0))s"
  else
    say "stage '$name' FAILED after $((SECONDS - t0))s; the end of $logf:"
    tail -n 25 "$logf" >&2
    exit 1
  fi
}
PPO_ARGS=("${SETS[@]}")  # the overrides every PPO invocation shares

stage_data() {
  local d=$1
  case "$CA_PIPELINE_DATA" in
    tasks) cp "$CA_PIPELINE_TASKS_FILE" "$d/all.jsonl" ;;
    ops6k) opsynth import-ops6k "$CA_PIPELINE_OPS6K" > "$d/all.jsonl" ;;
    synth)
      N=$CA_PIPELINE_SYNTH_N BACKEND=$([ "$CA_SANDBOX_BACKEND" = auto ] && echo "" || echo "$CA_SANDBOX_BACKEND") \
      SIZE=$([ "$CA_PIPELINE_SYNTH_SIZE" = auto ] && echo "" || echo "$CA_PIPELINE_SYNTH_SIZE") \
      COMPILE=$CA_PIPELINE_SYNTH_COMPILE_CHECK BASELINE=0 KB=$CA_PIPELINE_KERNELBENCH \
        bash bin/synth_data.sh "$d/synth"
      cp "$d/synth/tasks.jsonl" "$d/all.jsonl" ;;
  esac
  if [ "$CA_PIPELINE_LIMIT_TASKS" -gt 0 ]; then
    records head -n "$CA_PIPELINE_LIMIT_TASKS" "$d/all.jsonl" > "$d/tasks.jsonl"
  else
    cp "$d/all.jsonl" "$d/tasks.jsonl"
  fi
  records validate --kind task "$d/tasks.jsonl"
  [ -s "$d/tasks.jsonl" ] || { echo "no tasks survived the data stage"; return 1; }
}

stage_baselines() {
  local d=$1
  if [ "$CA_PIPELINE_BASELINES" = 1 ] && python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    profiler baseline "$RUN/data/tasks.jsonl" -o "$d/tasks.jsonl" --resume
    cp "$d/tasks.jsonl" "$RUN/data/tasks.jsonl"
  else
    echo "baselines: skipped (pipeline.baselines off or no GPU); the sandbox measures them per evaluation"
  fi
}

stage_warmup() {
  local d=$1
  if [ "$CA_PIPELINE_WARMUP_STEPS" -le 0 ]; then
    echo "warm-up: skipped (pipeline.warmup_steps = 0); the base actor goes on"
    ln -sfn "$(python -c 'import sys; from cuda_agent.agent.models import resolve_model; print(resolve_model(sys.argv[1]).resolve())' "$CA_MODEL_ACTOR")" "$d/final"
    return 0
  fi
  ppo train --config "$CONFIG" "${PPO_ARGS[@]}" --set "data.tasks=\"$RUN/data/tasks.jsonl\"" --set "train.out=\"$d\"" \
    --set 'rollout.mode="single-turn"' --set "ppo.steps=$CA_PIPELINE_WARMUP_STEPS" \
    --set "ppo.use_critic=false" --resume
  test -f "$d/final/config.json"
}

stage_collect() {
  local d=$1 tasks="$RUN/data/tasks.jsonl"
  if [ "$CA_PIPELINE_COLLECT_TASKS" -gt 0 ]; then
    records head -n "$CA_PIPELINE_COLLECT_TASKS" "$tasks" > "$d/tasks.jsonl"; tasks="$d/tasks.jsonl"
  fi
  agent rollout --policy "hf:$RUN/warmup/final" --tasks "$tasks" --samples "$CA_PIPELINE_COLLECT_SAMPLES" \
    --mode multi-turn --max-turns "$CA_ROLLOUT_MAX_TURNS" --max-new-tokens "$CA_ROLLOUT_MAX_NEW_TOKENS" \
    --max-context "$CA_ROLLOUT_MAX_CONTEXT" --temperature "$CA_ROLLOUT_TEMPERATURE" \
    --backend "$CA_SANDBOX_BACKEND" --device "$CA_TRAIN_DEVICE" --workdir "$d/workspaces" \
    $([ "$CA_ROLLOUT_INCLUDE_SKILL" = 1 ] || echo --no-skill) \
    -o "$d/trajectories.jsonl" --resume
  records stats "$d/trajectories.jsonl"
}

stage_rft() {
  local d=$1
  # --resume: a rerun of an unfinished stage appends only what an interrupted select had not
  # written, so kept.jsonl stays the data `rft train --resume` started on
  rft select "$RUN/collect/trajectories.jsonl" --min-reward "$CA_PIPELINE_RFT_MIN_REWARD" \
    --dropped "$d/dropped.jsonl" -o "$d/kept.jsonl" --resume
  if [ ! -s "$d/kept.jsonl" ]; then
    echo "rft: no trajectory passed selection (expected for a tiny or untrained model);"
    echo "rft: the actor passes through unchanged"
    rm -rf "$d/final"; cp -r "$RUN/warmup/final/." "$d/final"
    return 0
  fi
  rft train --model "$RUN/warmup/final" --data "$d/kept.jsonl" --out "$d" --lr "$CA_PIPELINE_RFT_LR" \
    --epochs "$CA_PIPELINE_RFT_EPOCHS" --device "$CA_TRAIN_DEVICE" --max-len "$CA_ROLLOUT_MAX_CONTEXT" \
    $([ "$CA_TRAIN_GRAD_CKPT" = 1 ] && echo --grad-ckpt) \
    ${CA_PIPELINE_DEEPSPEED:+--deepspeed "$CA_PIPELINE_DEEPSPEED"} --resume
}

stage_critic() {
  local d=$1
  critic pretrain --model "$RUN/rft/final" --data "$RUN/collect/trajectories.jsonl" --out "$d" \
    --lr "$CA_PIPELINE_CRITIC_LR" --epochs "$CA_PIPELINE_CRITIC_EPOCHS" --device "$CA_TRAIN_DEVICE" \
    --gamma "$CA_PPO_GAMMA" --lambda "$CA_PPO_LAM" --max-len "$CA_ROLLOUT_MAX_CONTEXT" \
    $([ "$CA_TRAIN_GRAD_CKPT" = 1 ] && echo --grad-ckpt) \
    ${CA_PIPELINE_DEEPSPEED:+--deepspeed "$CA_PIPELINE_DEEPSPEED"} --resume
}

stage_ppo() {
  local d=$1
  ppo train --config "$CONFIG" "${PPO_ARGS[@]}" --set "data.tasks=\"$RUN/data/tasks.jsonl\"" --set "train.out=\"$d\"" --set "model.tiny=false" \
    --set "model.actor=\"$RUN/rft/final\"" --set "model.critic=\"$RUN/critic/final\"" --resume
  test -f "$d/final/config.json"
}

stage_eval() {
  local d=$1
  if [ -z "$CA_PIPELINE_KERNELBENCH" ]; then echo "eval: no pipeline.kernelbench configured; skipped"; return 0; fi
  kernelbench-eval tasks --root "$CA_PIPELINE_KERNELBENCH" --levels "$CA_PIPELINE_KB_LEVELS" \
    ${CA_PIPELINE_KB_PROBLEMS:+--problems "$CA_PIPELINE_KB_PROBLEMS"} > "$d/tasks.jsonl"
  agent rollout --policy "hf:$RUN/ppo/final" --tasks "$d/tasks.jsonl" --samples 1 --mode multi-turn \
    --max-turns "$CA_ROLLOUT_MAX_TURNS" --max-new-tokens "$CA_ROLLOUT_MAX_NEW_TOKENS" \
    --max-context "$CA_ROLLOUT_MAX_CONTEXT" --temperature 0 --backend "$CA_SANDBOX_BACKEND" \
    --device "$CA_TRAIN_DEVICE" --workdir "$d/workspaces" \
    $([ "$CA_ROLLOUT_INCLUDE_SKILL" = 1 ] || echo --no-skill) -o "$d/trajectories.jsonl" --resume
  kernelbench-eval report --tasks "$d/tasks.jsonl" --out-dir "$d" "$d/trajectories.jsonl" > "$d/report.json"
}

for s in $STAGES; do run_stage "$s" "stage_$s"; done
if [ -n "$ONLY" ]; then say "stage $ONLY done (in $RUN/$ONLY)"; exit 0; fi
say "all stages done. outputs in $RUN/: data/tasks.jsonl, collect/trajectories.jsonl, rft/final, critic/final, ppo/final, ppo/metrics.jsonl$([ -n "$CA_PIPELINE_KERNELBENCH" ] && echo ", eval/report.md")"
