"""tasks -> solutions -> run (cpu backend) -> report on the miniature tree, joined by real pipes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "fixtures"
CLI = [sys.executable, "-m", "cuda_agent.kernelbench_eval.cli"]


def sh(args, stdin=b""):
    p = subprocess.run([*CLI, *args], input=stdin, capture_output=True, timeout=1800)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    return p


@pytest.mark.slow
def test_cpu_end_to_end(tmp_path):
    tasks = sh(["tasks", "--root", str(HERE)]).stdout
    cands = sh(["solutions", "--dir", str(HERE / "solutions")], tasks)
    assert b"1 tasks have no solution" in cands.stderr  # Sum_reduction has none
    assert len(cands.stdout.splitlines()) == 5
    (tmp_path / "tasks.jsonl").write_bytes(tasks)
    out = tmp_path / "results.jsonl"
    sh(["run", "--backend", "cpu", "-o", str(out)], cands.stdout)
    res = [json.loads(x) for x in out.read_text().splitlines()]
    status = {(r["meta"]["level"], r["meta"]["problem_id"]): r["status"] for r in res}
    assert status == {
        (1, 1): "ok",
        (1, 2): "incorrect",
        (2, 1): "ok",
        (2, 2): "compile_error",
        (3, 1): "guard_violation",
    }, {k: (v, r["message"][:300]) for (k, v), r in zip(status.items(), res, strict=True)}
    # resume: nothing is evaluated twice
    again = sh(["run", "--backend", "cpu", "-o", str(out), "--resume"], cands.stdout)
    assert b"5 already done" in again.stderr and len(out.read_text().splitlines()) == 5
    rep = sh(
        ["report", "--tasks", str(tmp_path / "tasks.jsonl"), "--out-dir", str(tmp_path / "rep")],
        out.read_bytes(),
    )
    doc = json.loads(rep.stdout)
    levels = {row["level"]: row for row in doc["levels"]}
    assert (levels["1"]["problems"], levels["1"]["correct"]) == (3, 1)
    assert (levels["2"]["problems"], levels["2"]["correct"]) == (2, 1)
    assert (levels["3"]["problems"], levels["3"]["correct"]) == (1, 0)
    assert (levels["overall"]["problems"], levels["overall"]["correct"]) == (6, 2)
    assert levels["overall"]["mean_reward"] <= (1 * 2 * 3 - 4) / 6 + 1e-9  # 2 correct, 4 x -1
    assert (
        doc["settings"]["guard policy"] == "kernelbench"
        and doc["settings"]["atol/rtol"] == "0.01/0.01"
    )
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| level 1 | 3 | 33.3% |" in md and "98.8%" in md and "## Definitions" in md
    assert (tmp_path / "rep" / "speedup.png").stat().st_size > 1000
