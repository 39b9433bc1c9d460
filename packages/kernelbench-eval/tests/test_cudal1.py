"""benchmarks/cudal1.py: corpus lines become candidates against their own references; the
verdict tables."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from cuda_agent.records import (
    CompileDetail,
    EvalResult,
    GuardViolation,
    Status,
    TimingDetail,
    TimingStats,
    content_id,
    load_records,
)

HERE = Path(__file__).parent
SCRIPT = HERE.parent / "benchmarks" / "cudal1.py"
CORPUS = HERE / "fixtures" / "cudal1" / "two_lines.jsonl"

spec = importlib.util.spec_from_file_location("cudal1", SCRIPT)
cudal1 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cudal1)


def test_candidates_cli(tmp_path):
    out, tasks = tmp_path / "cands.jsonl", tmp_path / "tasks.jsonl"
    p = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "candidates",
            str(CORPUS),
            "-o",
            str(out),
            "--tasks-out",
            str(tasks),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "2 candidates from 2 lines" in p.stderr
    lines = [json.loads(x) for x in CORPUS.read_text().splitlines()]
    cands = load_records(out)
    assert [c.task.name for c in cands] == ["cudal1_L1_2", "cudal1_L2_4"]
    for c, ln in zip(cands, lines, strict=True):
        assert c.task.ref_code == ln["ref_code"] and c.task.id == content_id(ln["ref_code"])
        assert (c.task.source, c.task.level, c.task.problem_id) == (
            "kernelbench",
            ln["level"],
            ln["problem_id"],
        )
        assert c.solution.format == "kernelbench"
        assert c.solution.files == {"model_new.py": ln["code"]}
        assert c.solution.origin == f"cuda-l1:L{ln['level']}/{ln['problem_id']}"
        assert c.meta["claimed_speedup_vs_eager_h100"] == ln["claimed_speedup_vs_eager_h100"]
        assert c.meta["level"] == ln["level"] and c.meta["name"] == c.task.name
    assert [t.id for t in load_records(tasks)] == [c.task.id for c in cands]


def _result(c, status, message, **kw):
    return EvalResult(
        task_id=c.task.id,
        solution_id=c.solution.id,
        backend="cuda",
        device="NVIDIA H200",
        status=status,
        message=message,
        **kw,
    )


def test_summary_tables(md_row):
    _, cands, issues = cudal1.to_candidates(CORPUS)
    assert issues == []
    a, b = cands
    gv = _result(
        a,
        Status.GUARD_VIOLATION,
        "G-NO-KERNEL: the solution has no C/C++/CUDA source and no Triton kernel",
        guards=[GuardViolation(code="G-NO-KERNEL", severity="reject", message="no kernel")],
    )
    ok = _result(
        b,
        Status.OK,
        "correct and timed",
        speedup_vs_eager=2.5,
        timing=TimingDetail(protocol_version="x", candidate=TimingStats(median_ms=0.4, n=10)),
    )
    md = cudal1.render(cands, [gv], {}, [], "")
    assert "1 of 2 lines have a verdict: **1 not yet**." in md
    assert md_row(md, "L2/4", "(no verdict)", "", "", "", "3.25")
    env = ["Tue Dec  1 14:00:00 UTC 2026", "commit 1234abc", "0, NVIDIA H200, 9.0"]
    md = cudal1.render(cands, [gv, ok], {}, env, "bash bin/gpu-check-kernelbench.sh")
    assert "2 of 2 lines have a verdict." in md and "commit `1234abc`" in md
    from cuda_agent.guards import CHECKS

    words = cudal1._words(CHECKS["G-NO-KERNEL"].description, 8)
    assert md_row(md, "guard_violation", "G-NO-KERNEL", words, 1, "L1/2")
    assert md_row(md, "ok", "-", "correct and timed", 1, "L2/4")
    assert md_row(md, "L2/4", "ok", "-", "correct and timed", "2.50", "3.25")
    assert md_row(md, "G-NO-KERNEL", 1)  # lines per guard code
    # two policies, two sections
    md = cudal1.render(cands, [("strict", [gv]), ("kernelbench", [ok])], {}, env, "")
    assert "## Guard policy `strict`" in md and "## Guard policy `kernelbench`" in md
    assert "### Every line (kernelbench)" in md
    # without the sandbox's baseline: the references run's eager median over the candidate's
    ok2 = _result(
        b,
        Status.OK,
        "correct and timed",
        timing=TimingDetail(protocol_version="x", candidate=TimingStats(median_ms=0.4, n=10)),
    )
    md = cudal1.render(cands, [gv, ok2], {b.task.id: {"eager_ms": 1.0}}, env, "")
    assert md_row(md, "L2/4", "ok", "-", "correct and timed", "~2.50", "3.25")


def test_reason_words_and_compile_detail():
    _, (a, _b), _ = cudal1.to_candidates(CORPUS)
    r = _result(
        a,
        Status.INCORRECT,
        "trial 0 (base): out: 32768 of 32768 elements outside "
        "atol=0.01 rtol=0.01 (max abs err 102)",
    )
    assert cudal1.reason(r) == ("incorrect", "-", "trial # (base): out: # of # elements")
    ce = _result(
        a,
        Status.COMPILE_ERROR,
        "compilation failed",
        compile=CompileDetail(ok=False, log_tail='x.cu(3): error: identifier "y" is undefined\n'),
    )
    assert cudal1.reason(ce) == ("compile_error", "-", "compilation failed")
    assert cudal1.detail(ce) == 'x.cu(3): error: identifier "y" is undefined'


def test_sandbox_gives_every_line_a_verdict(tmp_path, md_row):
    """candidates | sandbox eval (cpu backend, strict guards) | summary: a verdict per line."""
    cands, res = tmp_path / "c.jsonl", tmp_path / "r.jsonl"
    cudal1.candidates(CORPUS, cands, None)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "cuda_agent.sandbox.cli",
            "eval",
            str(cands),
            "--backend",
            "cpu",
            "-o",
            str(res),
            "--resume",
            "--guard-policy",
            "strict",
            "--no-baselines",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    results = load_records(res)
    assert len(results) == 2
    by_task = {r.task_id: r for r in results}
    a, _b = load_records(cands)
    # a PyTorch rewrite: rejected by the static guards before anything runs
    assert by_task[a.task.id].status == Status.GUARD_VIOLATION
    assert "G-NO-KERNEL" in {g.code for g in by_task[a.task.id].guards}
    md = cudal1.render(load_records(cands), results, {}, [], "")
    assert "2 of 2 lines have a verdict." in md and md_row(md, "L1/2", "guard_violation")
