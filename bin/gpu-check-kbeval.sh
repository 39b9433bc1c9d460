#!/usr/bin/env bash
# GPU acceptance run of kernelbench-eval (issue #6), one device call: the miniature KernelBench
# tree in packages/kernelbench-eval/tests/fixtures through tasks | solutions | run (cuda) | report.
# Run from the repo root on the GPU machine; writes under $OUT/kbeval (default ./gpu-out/kbeval):
#   tasks.jsonl candidates.jsonl results.jsonl report/{report.json,report.md,speedup.png}
#   summary.json (statuses, stage times, wall times), *.stderr.txt, env.txt
# BUDGET_S (default 200) bounds the whole run; `run` is resumable and what it finished is reported.
#   device: run(command="bash bin/gpu-check-kbeval.sh", carry=[".whl"])
#   cpu rehearsal here: BACKEND=cpu bash bin/gpu-check-kbeval.sh   (the C++ fixture solutions)
set -u
OUT=${OUT:-$PWD/gpu-out}
BUDGET_S=${BUDGET_S:-200}
BACKEND=${BACKEND:-cuda}
D="$OUT/kbeval"
mkdir -p "$D"
T0=$(date +%s)
if ! python3 -c "import msgspec" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
P=$PWD/packages
export PYTHONPATH=/tmp/site:$P/records/src:$P/profiler/src:$P/guards/src:$P/sandbox/src:$P/reward/src:$P/kernelbench-eval/src${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
FIX=$P/kernelbench-eval/tests/fixtures
if [ "$BACKEND" = cuda ]; then SOL=$FIX/solutions_cuda; else SOL=$FIX/solutions; fi
KB="python3 -m cuda_agent.kernelbench_eval.cli"
TCFG=${TIMING_CONFIG:-'{"time_cap_s": 3.0, "warmup_max_s": 1.0}'}
{
  date -u; echo "${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>&1
  python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"
  nvcc --version | tail -1; nproc; echo "backend=$BACKEND solutions=${SOL#$PWD/}"
} > "$D/env.txt" 2>&1
cat "$D/env.txt"
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
stamp() { date +%s.%N; }

s0=$(stamp)
timeout 60 $KB tasks --root "$FIX" > "$D/tasks.jsonl" 2> "$D/tasks.stderr.txt"; rc_tasks=$?
s1=$(stamp)
timeout 60 $KB solutions --dir "$SOL" < "$D/tasks.jsonl" > "$D/candidates.jsonl" 2> "$D/solutions.stderr.txt"; rc_sol=$?
s2=$(stamp)
cat "$D/tasks.stderr.txt" "$D/solutions.stderr.txt"
# leave ~25 s for the report; the run is resumable, a rerun continues where it stopped
RUN_S=$(( $(left) - 25 )); [ "$RUN_S" -lt 20 ] && RUN_S=20
echo "run: ${RUN_S}s budget"
timeout -k 5 "$RUN_S" $KB run --backend "$BACKEND" --gpus "${GPUS:-all}" -o "$D/results.jsonl" --resume \
  --timing-config "$TCFG" \
  < "$D/candidates.jsonl" 2>&1 | tee "$D/run.stderr.txt"; rc_run=${PIPESTATUS[0]}
s3=$(stamp)
timeout 60 $KB report --tasks "$D/tasks.jsonl" --out-dir "$D/report" < "$D/results.jsonl" \
  > "$D/report.stdout.json" 2> "$D/report.stderr.txt"; rc_rep=$?
s4=$(stamp)
cat "$D/report.stderr.txt"
[ -f "$D/report/report.md" ] && cat "$D/report/report.md"
python3 - "$D" "$BACKEND" "$rc_tasks" "$rc_sol" "$rc_run" "$rc_rep" "$s0" "$s1" "$s2" "$s3" "$s4" <<'PY'
import json, sys
from pathlib import Path
d, backend = Path(sys.argv[1]), sys.argv[2]
rc = dict(zip(["tasks", "solutions", "run", "report"], map(int, sys.argv[3:7])))
s = list(map(float, sys.argv[7:12]))
rows = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines()] if (d / "results.jsonl").exists() else []
def n(p):
    return len((d / p).read_text().splitlines()) if (d / p).exists() else 0
summary = {
    "backend": backend,
    "exit_codes": rc,
    "wall_s": {"tasks": round(s[1] - s[0], 1), "solutions": round(s[2] - s[1], 1),
               "run": round(s[3] - s[2], 1), "report": round(s[4] - s[3], 1)},
    "tasks": n("tasks.jsonl"), "candidates": n("candidates.jsonl"), "results": len(rows),
    "problems": [
        {"level": r["meta"].get("level"), "problem_id": r["meta"].get("problem_id"),
         "name": r["meta"].get("name"), "status": r["status"], "message": r["message"][:300],
         "speedup_vs_eager": r.get("speedup_vs_eager"), "speedup_vs_compile": r.get("speedup_vs_compile"),
         "candidate_ms": ((r.get("timing") or {}).get("candidate") or {}).get("median_ms"),
         "eager_ms": ((r.get("timing") or {}).get("eager") or {}).get("median_ms"),
         "compile_ms": ((r.get("timing") or {}).get("compile") or {}).get("median_ms"),
         "reward": r.get("reward"), "device": r.get("device"),
         "stages_s": (r.get("meta") or {}).get("stages_s"), "seconds": r.get("seconds")}
        for r in rows
    ],
    "expected_status": {"1/1": "ok", "1/2": "incorrect", "2/1": "ok", "2/2": "compile_error", "3/1": "guard_violation"},
}
rep = d / "report" / "report.json"
if rep.exists():
    summary["report"] = json.loads(rep.read_text())["levels"]
(d / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps({k: summary[k] for k in ("exit_codes", "wall_s", "tasks", "candidates", "results")}))
for p in summary["problems"]:
    print(f"  L{p['level']}/{p['problem_id']} {p['name']}: {p['status']} x_eager={p['speedup_vs_eager']} x_compile={p['speedup_vs_compile']}")
PY
echo "kbeval gpu check done in $(( $(date +%s) - T0 ))s -> $D"
