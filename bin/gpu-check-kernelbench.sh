#!/usr/bin/env bash
# Issue 27's GPU acceptance runs on the real KernelBench (docs/kernelbench-references.md,
# docs/kernelbench-cudal1.md), one device call at a time, resumable across calls. Here first:
# `bash bin/prepare-gpu-data.sh` (fills .gpu-data/ and the einops wheel in .whl/). Then:
#   device: run(command="bash bin/gpu-check-kernelbench.sh", carry=[".whl", ".gpu-data"])
#   STAGES="refs report" PROBLEMS=1-4 bash bin/gpu-check-kernelbench.sh    # smoke: 12 problems
#   STAGES="cudal1 report" bash bin/gpu-check-kernelbench.sh                # the CUDA-L1 verdicts
#   CUDAL1_POLICIES=off STAGES="cudal1 report" bash ...   # runtime verdicts (long: every line built, run)
#   (strict, kernelbench: every line is rejected by static guards, seconds, no GPU work; off: the
#   guards off, every line built, verified and timed: the device time is there)
#   FROM=.gpu-data/kb-run bash bin/gpu-check-kernelbench.sh   # on a fresh machine: continue from a
#       previous call's results (unpacked: mkdir -p .gpu-data/kb-run && tar xzf results.tgz -C .gpu-data/kb-run)
#   STAGES="positive" bash bin/gpu-check-kernelbench.sh    # the positive corpus, both policies, twice
# Stages, in this order (STAGES, default "refs cudal1 report"):
#   refs         benchmarks/kb_references.py: every problem of levels $LEVELS: reference run once,
#                eager and torch.compile baselines (profiler) -> references.jsonl
#   cudal1-refs  the same over the CUDA-L1 lines' own (v0) references -> cudal1_refs.jsonl; fills the
#                profiler's baseline cache, so that cudal1's sandbox eval finds its baselines there
#   cudal1       benchmarks/cudal1.py candidates, then per guard policy of $CUDAL1_POLICIES
#                (strict kernelbench; add off for the runtime verdicts) `sandbox eval --backend cuda --gpus all --resume` ->
#                cudal1_results_<policy>.jsonl (baselines on only when cudal1-refs has rows)
#   positive     (POSITIVE_REDO="runtime_error infra_error": drop rows of these statuses first, so that
#                --resume evaluates them again) the positive corpus (packages/kernelbench-eval/corpus/positive) under each policy of
#                $POSITIVE_POLICIES ("strict kernelbench"), $POSITIVE_RUNS (2) runs each (only $LEVELS and
#                $PROBLEMS, as the refs stage; POSITIVE_WORKERS: --workers-per-gpu; POSITIVE_ARGS: more
#                positive_corpus.py run flags, e.g. --paired-eager): expected
#                verdicts, false rejections, speed-ups within 3% between the runs
#                (benchmarks/positive_corpus.py; exit 1 on a false rejection) -> positive/; with
#                POSITIVE_RUNS=1 under both policies, the 3% check is between the strict and the
#                kernelbench run (positive_strict_kernelbench.md)
#   report       kernelbench-references.md and kernelbench-cudal1.md (the docs' files, header filled)
# Env: LEVELS (1,2,3) PROBLEMS LIMIT JOBS (10) REFS_ARGS (extra kb_references.py run flags; default
#   "--no-trace-check": the trace cross-check's one-time CUPTI set-up, ~4 s per worker process,
#   would sit inside the exclusive timed section) CUDAL1_POLICIES ("strict kernelbench") CUDAL1_TIMING (JSON,
#   '{"time_cap_s": 3.0, "warmup_max_s": 1.0}') CUDAL1_BASELINES (auto|0|1) CUDAL1_ARGS,
#   DEADLINE_S (570: the whole call), WORK (/tmp/gc-kb; kept between calls on a warm machine),
#   KB_ROOT (.gpu-data/kernelbench), DEVICE (cuda), CUDAL1_BACKEND (cuda). CPU rehearsal of the refs stage on the fixture
#   tree: SKIP_ENV=1 DEVICE=cpu KB_ROOT=packages/kernelbench-eval/tests/fixtures STAGES="refs report" \
#     REFS_ARGS="--compile-mode none --time-cap 0.2" uv run bash bin/gpu-check-kernelbench.sh
# Returns $OUT/results.tgz (the work folder: rows, results, logs, the baseline cache) and, beside
# it, env.txt log.txt kernelbench-references.md kernelbench-cudal1.md.
set -u
RESULTS=${OUT:-$PWD/gpu-out}
W=${WORK:-/tmp/gc-kb}
DEADLINE_S=${DEADLINE_S:-570}
STAGES=${STAGES:-"refs cudal1 report"}
LEVELS=${LEVELS:-1,2,3}
JOBS=${JOBS:-10}
REFS_ARGS=${REFS_ARGS:---no-trace-check}
CUDAL1_POLICIES=${CUDAL1_POLICIES:-strict kernelbench}
CUDAL1_TIMING=${CUDAL1_TIMING:-'{"time_cap_s": 3.0, "warmup_max_s": 1.0}'}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
T0=$(date +%s)
mkdir -p "$W" "$RESULTS"
LOG=$W/log.txt
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
say() { echo "[gpu-check-kernelbench $(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG" >&2; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
[ -n "${SKIP_ENV:-}" ] || . bin/gpu-env.sh  # SKIP_ENV=1: a rehearsal under `uv run` on a CPU host
python3 -c "import einops" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --target /tmp/site .whl/einops-*.whl >/dev/null 2>&1 || say "no einops (L3 48/49 need it)"
export CUDA_AGENT_CACHE=${CUDA_AGENT_CACHE:-$W/cache}
if [ -n "${FROM:-}" ] && [ -d "$FROM" ]; then  # a previous call's results: continue them
  for p in "$FROM"/references.jsonl "$FROM"/cudal1_refs.jsonl "$FROM"/cudal1_results_*.jsonl "$FROM"/calls.txt; do
    [ -f "$p" ] && [ ! -f "$W/$(basename "$p")" ] && cp "$p" "$W/"
  done
  [ -d "$FROM/cache" ] && mkdir -p "$CUDA_AGENT_CACHE" && cp -rn "$FROM/cache/." "$CUDA_AGENT_CACHE/"
  [ -d "$FROM/positive" ] && mkdir -p "$W/positive" && cp -rn "$FROM/positive/." "$W/positive/"
fi
{
  date -u; echo "commit $COMMIT"
  nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"
  echo "cores $(nproc)"
} > "$W/env.txt" 2>&1
cat "$W/env.txt" | tee -a "$LOG"
echo "$(date -u +%FT%TZ) commit $COMMIT STAGES=\"$STAGES\" LEVELS=$LEVELS JOBS=$JOBS REFS_ARGS=\"$REFS_ARGS\" start" >> "$W/calls.txt"
KBR="python3 packages/kernelbench-eval/benchmarks/kb_references.py"
C1="python3 packages/kernelbench-eval/benchmarks/cudal1.py"
sel=(--levels "$LEVELS")
[ -n "${PROBLEMS:-}" ] && sel+=(--problems "$PROBLEMS")
[ -n "${LIMIT:-}" ] && sel+=(--limit "$LIMIT")

refs_run() {  # refs_run OUT_JSONL SOURCE_ARGS...: kb_references.py under the call's deadline
  local out=$1; shift
  local lim=$(( $(left) - 40 ))
  if [ "$lim" -lt 60 ]; then say "$(basename "$out"): skipped ($(left)s left)"; return 0; fi
  say "$(basename "$out"): start (limit ${lim}s, $JOBS at once)"
  # stop starting problems 90 s before the limit; those running then may still finish
  timeout -k 10 "$lim" $KBR run "$@" -o "$out" --resume --jobs "$JOBS" \
    --deadline-s $(( lim - 90 > 30 ? lim - 90 : 30 )) --device "${DEVICE:-cuda}" $REFS_ARGS 2>> "$LOG"
  say "$(basename "$out"): rc=$? rows $(wc -l < "$out" 2>/dev/null || echo 0)"
}

if has refs; then
  refs_run "$W/references.jsonl" --root "${KB_ROOT:-.gpu-data/kernelbench}" "${sel[@]}"
fi

if has cudal1-refs || has cudal1; then
  $C1 candidates .gpu-data/cuda-l1/h100_even_tasks.jsonl -o "$W/cudal1_candidates.jsonl" \
    --tasks-out "$W/cudal1_tasks.jsonl" 2>> "$LOG"
fi
if has cudal1-refs; then
  refs_run "$W/cudal1_refs.jsonl" --tasks "$W/cudal1_tasks.jsonl" --levels 1,2,3
fi

if has cudal1; then
  b=${CUDAL1_BASELINES:-auto}
  if [ "$b" = auto ]; then b=0; [ -s "$W/cudal1_refs.jsonl" ] && b=1; fi
  bflag=--no-baselines; [ "$b" = 1 ] && bflag=--baselines
  be=${CUDAL1_BACKEND:-cuda}; gp=(); [ "$be" = cuda ] && gp=(--gpus all)
  for pol in $CUDAL1_POLICIES; do  # strict first: its static guards reject in seconds
    lim=$(( $(left) - 40 ))
    if [ "$lim" -lt 60 ]; then say "cudal1 $pol: skipped ($(left)s left)"; continue; fi
    say "cudal1 $pol: sandbox eval (limit ${lim}s, $bflag)"
    timeout -k 10 "$lim" sandbox eval "$W/cudal1_candidates.jsonl" --backend "$be" "${gp[@]}" \
      -o "$W/cudal1_results_$pol.jsonl" --resume --guard-policy "$pol" $bflag \
      --timing-config "$CUDAL1_TIMING" --compile-jobs ${COMPILE_JOBS:-6} ${CUDAL1_ARGS:-} \
      2>> "$W/cudal1_eval_$pol.log"
    say "cudal1 $pol: rc=$? results $(wc -l < "$W/cudal1_results_$pol.jsonl" 2>/dev/null || echo 0) of 112"
    tail -n 2 "$W/cudal1_eval_$pol.log" >&2
  done
fi

if has positive; then
  if [ -n "${POSITIVE_REDO:-}" ]; then  # evaluate these statuses again (e.g. after a sandbox fix)
    for f in "$W"/positive/results-*.jsonl; do
      [ -f "$f" ] || continue
      python3 - "$f" $POSITIVE_REDO <<'PY' 2>> "$LOG"
import json, sys
path, redo = sys.argv[1], set(sys.argv[2:])
lines = open(path).readlines()
keep = [ln for ln in lines if ln.strip() and json.loads(ln).get("status") not in redo]
open(path, "w").writelines(keep)
print(f"{path}: {len(lines) - len(keep)} rows of {sorted(redo)} dropped to run again", file=sys.stderr)
PY
    done
  fi
  for pol in ${POSITIVE_POLICIES:-strict kernelbench}; do
    lim=$(( $(left) - 40 ))
    if [ "$lim" -lt 60 ]; then say "positive $pol: skipped ($(left)s left)"; continue; fi
    say "positive $pol: start (limit ${lim}s; resumable)"
    timeout -k 10 "$lim" python3 packages/kernelbench-eval/benchmarks/positive_corpus.py run \
      --policy "$pol" --out "$W/positive" --runs "${POSITIVE_RUNS:-2}" "${sel[@]}" \
      ${POSITIVE_WORKERS:+--workers-per-gpu "$POSITIVE_WORKERS"} ${POSITIVE_ARGS:-} \
      --json "$W/positive/check-$pol.json" > "$W/positive_$pol.md" 2>> "$W/positive_$pol.log"
    say "positive $pol: rc=$? (1: a false rejection)"; tail -n 3 "$W/positive_$pol.md" >&2
  done
  # the 3% check across two separate runs under the two policies (each judged under its own)
  s1=$W/positive/results-strict-1.jsonl k1=$W/positive/results-kernelbench-1.jsonl
  if [ -s "$s1" ] && [ -s "$k1" ]; then
    python3 packages/kernelbench-eval/benchmarks/positive_corpus.py check "$s1" "$k1" \
      --json "$W/positive/check-strict-kernelbench.json" > "$W/positive_strict_kernelbench.md" 2>> "$LOG"
    say "positive strict vs kernelbench: rc=$?"; tail -n 1 "$W/positive_strict_kernelbench.md" >&2
  fi
fi

if has report; then
  cmd=${CMDLINE:-"STAGES=\"$STAGES\" LEVELS=$LEVELS ${PROBLEMS:+PROBLEMS=$PROBLEMS }${LIMIT:+LIMIT=$LIMIT }JOBS=$JOBS bash bin/gpu-check-kernelbench.sh"}
  [ -f "$W/references.jsonl" ] && $KBR table "$W/references.jsonl" --env "$W/env.txt" \
    --command "$cmd" > "$W/kernelbench-references.md" 2>> "$LOG"
  rs=(); for pol in $CUDAL1_POLICIES; do rs+=(--results "$pol=$W/cudal1_results_$pol.jsonl"); done
  [ -f "$W/cudal1_candidates.jsonl" ] && $C1 summary --candidates "$W/cudal1_candidates.jsonl" \
    "${rs[@]}" --refs "$W/cudal1_refs.jsonl" --env "$W/env.txt" \
    --command "$cmd" > "$W/kernelbench-cudal1.md" 2>> "$LOG"
  for f in kernelbench-references.md kernelbench-cudal1.md; do [ -f "$W/$f" ] && head -n 14 "$W/$f" >&2; done
fi

say "done in $(( $(date +%s) - T0 ))s"
echo "$(date -u +%FT%TZ) commit $COMMIT end after $(( $(date +%s) - T0 ))s" >> "$W/calls.txt"
tar czf "$RESULTS/results.tgz" -C "$W" --exclude='cache/baselines/*.tmp*' \
  $(cd "$W" && ls -d *.jsonl *.txt *.md *.log positive cache/baselines cache/ceilings 2>/dev/null)
for f in env.txt log.txt kernelbench-references.md kernelbench-cudal1.md; do
  [ -f "$W/$f" ] && cp "$W/$f" "$RESULTS/"
done
ls -la "$RESULTS"
