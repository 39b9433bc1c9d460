#!/usr/bin/env bash
# The next GPU session's calls (README.md, "What the next GPU session should run"), one per `run`,
# back to back on one warm machine; carry .whl and .gpu-data. COMMIT=<sha> CALL=B8|T|C|A|R.
#   B8: the fixed batch with 8 device workers per GPU and the large share (the lever call B found)
#   T:  the sandbox GPU tests one at a time (-x -v, 150 s each), the large-share test first
#   C:  the subset through ours, then KernelBench's harness in its default flow and pre-compiled
#   A:  `kernelbench` over the positive corpus's remaining solutions (resumable from .gpu-data/kb-run)
#   R:  the references run again, resumed: only the 31 problems now in train mode have no row (their
#       task ids changed), so only they run (reference, eager and torch.compile baselines)
set -u
T0=$(date +%s)
left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
case ${CALL:?CALL=B8, T, C, A or R} in
  B8)
    WPG_ARGS=--workers-per-gpu=8 DEADLINE_S=$(( $(left) - 5 )) bash docs/lab/session20/call1.sh ;;
  T)
    mkdir -p "$OUT/t"
    . bin/gpu-env.sh
    T=packages/sandbox/tests/test_gpu_real.py
    for k in test_multi_gb_problems_share_the_gpu_with_small_ones_under_a_large_share "not large_share and not test_multi_gb_relu_is_verified_on_the_device"; do
      [ "$(left)" -lt 30 ] && break
      # 4 new tasks' compiles and eager + torch.compile baselines, a 6.4 GB verification: minutes
      timeout $(( $(left) < 300 ? $(left) - 10 : 300 )) python3 -m pytest -o addopts=--import-mode=importlib -x -v \
        -p no:cacheprovider "$T" -k "$k" >> "$OUT/t/tests.txt" 2>&1; echo "[$k] rc=$?" >> "$OUT/t/tests.txt"
    done
    grep -E "PASSED|FAILED|ERROR|rc=" "$OUT/t/tests.txt" | tail -40 ;;
  C)
    KBT_PARTS="subset kb" KBT_KB_FLOWS="default precompile" KBT_BASELINES_FROM=.gpu-data/kb-run/cache \
      KBT_RUN_ARGS="--workers-per-gpu=4" KBT_SUBSET_S=150 DEADLINE_S=$(( $(left) - 5 )) \
      LANE0="kb-throughput" bash bin/gpu-check.sh ;;
  A)
    OUT=$OUT/a FROM=.gpu-data/kb-run STAGES="positive" POSITIVE_POLICIES="kernelbench" POSITIVE_RUNS=1 POSITIVE_WORKERS=4 \
      DEADLINE_S=$(( $(left) - 5 )) bash bin/gpu-check-kernelbench.sh ;;
  R)
    OUT=$OUT/r FROM=.gpu-data/kb-run STAGES="refs report" DEADLINE_S=$(( $(left) - 5 )) bash bin/gpu-check-kernelbench.sh ;;
  *) echo "CALL=$CALL: B8, T, C, A or R" >&2; exit 2 ;;
esac
