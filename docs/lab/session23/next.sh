#!/usr/bin/env bash
# The next GPU session's calls (README.md, "Next GPU session"), one per `run`, back to back on one
# warm machine; carry .whl and .gpu-data (bin/prepare-gpu-data.sh, then
# mkdir -p .gpu-data/kb-run && cp docs/lab/session23/references-272.jsonl .gpu-data/kb-run/references.jsonl &&
# tar xzf docs/lab/session23/baseline-cache.tgz -C .gpu-data/kb-run: the H200 baselines of the positive
# corpus's 39 tasks and the GPU's ceilings, so they are not measured again). COMMIT=<sha> CALL=R|P|B8|BP|T.
#   R:  the nine train-mode references left (the refs stage resumed: only they have no row)
#   P:  the positive corpus under `kernelbench` twice with --paired-eager, then the two runs' 3% check
#       (resumable: a second call goes on where the first stopped)
#   B8: the fixed batch, 8 device workers per GPU (session 21's next.sh)
#   BP: the same batch with --paired-eager (its cost in candidates per GPU-hour)
#   T:  the GPU tests not run in session 23: the multi-GB ReLU, the paired eager's
set -u
T0=$(date +%s)
left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
case ${CALL:?CALL=R, P, B8, BP or T} in
  R|B8)
    DEADLINE_S=$(( $(left) - 5 )) bash docs/lab/session21/next.sh ;;
  P)
    OUT=$OUT/p FROM=.gpu-data/kb-run STAGES="positive" POSITIVE_POLICIES="kernelbench" POSITIVE_RUNS=2 \
      POSITIVE_WORKERS=4 POSITIVE_ARGS=--paired-eager DEADLINE_S=$(( $(left) - 5 )) bash bin/gpu-check-kernelbench.sh ;;
  BP)
    WPG_ARGS="--workers-per-gpu=8 --paired-eager" DEADLINE_S=$(( $(left) - 5 )) bash docs/lab/session20/call1.sh ;;
  T)
    mkdir -p "$OUT/t"
    . bin/gpu-env.sh
    for t in "packages/sandbox/tests/test_gpu_real.py -k test_multi_gb_relu_is_verified_on_the_device" \
             "packages/sandbox/tests/test_paired_eager.py"; do
      [ "$(left)" -lt 30 ] && break
      # shellcheck disable=SC2086
      timeout $(( $(left) < 300 ? $(left) - 10 : 300 )) python3 -m pytest -o addopts=--import-mode=importlib -x -v \
        -p no:cacheprovider $t >> "$OUT/t/tests.txt" 2>&1; echo "[$t] rc=$?" >> "$OUT/t/tests.txt"
    done
    grep -E "PASSED|FAILED|ERROR|SKIPPED|rc=" "$OUT/t/tests.txt" | tail -40 ;;
  *) echo "CALL=$CALL: R, P, B8, BP or T" >&2; exit 2 ;;
esac
