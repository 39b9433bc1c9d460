#!/usr/bin/env bash
# Session 24's GPU calls, one per `run`, back to back on one warm machine; carry .whl and .gpu-data
# (bin/prepare-gpu-data.sh, then mkdir -p .gpu-data/kb-run &&
# cp docs/lab/session23/references-272.jsonl .gpu-data/kb-run/references.jsonl &&
# tar xzf docs/lab/session23/baseline-cache.tgz -C .gpu-data/kb-run). COMMIT=<sha> CALL=R|BP|T.
#   R:  the nine train-mode references left (session 21's CALL=R: the refs stage resumed)
#   BP: issue 28's fixed batch, 8 device workers per GPU, the paired eager timer; run twice (two
#       calls): each run's rate, and the honest candidates' speed-ups of the two runs (the 3% check)
#   T:  the GPU tests not yet run: the paired eager's, then the multi-GB ReLU
set -u
T0=$(date +%s)
left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
case ${CALL:?CALL=R, BP or T} in
  R) CALL=R DEADLINE_S=$(( $(left) - 5 )) bash docs/lab/session21/next.sh ;;
  BP) CALL=BP DEADLINE_S=$(( $(left) - 5 )) bash docs/lab/session23/next.sh ;;
  T)
    mkdir -p "$OUT/t"
    . bin/gpu-env.sh
    for t in "packages/sandbox/tests/test_paired_eager.py" \
             "packages/sandbox/tests/test_gpu_real.py -k test_multi_gb_relu_is_verified_on_the_device"; do
      [ "$(left)" -lt 30 ] && break
      # shellcheck disable=SC2086
      timeout $(( $(left) < 300 ? $(left) - 10 : 300 )) python3 -m pytest -o addopts=--import-mode=importlib -x -v \
        -p no:cacheprovider $t >> "$OUT/t/tests.txt" 2>&1; echo "[$t] rc=$?" >> "$OUT/t/tests.txt"
    done
    grep -E "PASSED|FAILED|ERROR|SKIPPED|rc=" "$OUT/t/tests.txt" | tail -40 ;;
  *) echo "CALL=$CALL: R, BP or T" >&2; exit 2 ;;
esac
