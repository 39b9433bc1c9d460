"""`kernelbench-eval run` through the shared sandbox pool (cpu backend, real processes): the
concurrent run's verdicts are the serial run's, in input order; a run killed mid-stream and
resumed has exactly one result per candidate."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "fixtures"
CLI = [sys.executable, "-m", "cuda_agent.kernelbench_eval.cli"]
SERIAL = ["--window", "1", "--compile-jobs", "1", "--cpu-workers", "1"]
CONCURRENT = ["--window", "4", "--compile-jobs", "2", "--cpu-workers", "2"]
EXPECTED = {
    (1, 1): "ok",
    (1, 2): "incorrect",
    (2, 1): "ok",
    (2, 2): "compile_error",
    (3, 1): "guard_violation",
}


def sh(args, stdin=b""):
    p = subprocess.run([*CLI, *args], input=stdin, capture_output=True, timeout=900)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    return p


@pytest.fixture(scope="module")
def candidates(tmp_path_factory) -> Path:
    """The fixture tree's 5 candidates, the statically rejected one first (its result line is
    written at once, while the others still compile or run)."""
    tasks = sh(["tasks", "--root", str(HERE)]).stdout
    lines = sh(["solutions", "--dir", str(HERE / "solutions")], tasks).stdout.splitlines()
    lines.sort(key=lambda ln: json.loads(ln)["task"]["level"] != 3)
    f = tmp_path_factory.mktemp("kbrun") / "candidates.jsonl"
    f.write_bytes(b"\n".join(lines) + b"\n")
    return f


def results(path: Path) -> list[dict]:
    """The whole lines of ``path`` (a killed writer may have left a part of one)."""
    return [json.loads(x) for x in path.read_bytes().split(b"\n")[:-1]]


def statuses(rows: list[dict]) -> dict:
    return {(r["meta"]["level"], r["meta"]["problem_id"]): r["status"] for r in rows}


def keys_in(path: Path) -> list[str]:
    return [f"{json.loads(x)['task']['id']}:{json.loads(x)['solution']['id']}" for x in
            path.read_text().splitlines()]  # fmt: skip


@pytest.mark.slow
def test_concurrent_run_gives_the_serial_verdicts_in_input_order(tmp_path, candidates):
    out = {}
    for name, flags in (("concurrent", CONCURRENT), ("serial", SERIAL)):
        out[name] = tmp_path / f"{name}.jsonl"
        p = sh(["run", str(candidates), "--backend", "cpu", "--no-timing", "-o", str(out[name]),
                *flags])  # fmt: skip
        assert b"5 written" in p.stderr, p.stderr.decode()[-2000:]
    conc, ser = results(out["concurrent"]), results(out["serial"])
    want = keys_in(candidates)
    assert [f"{r['task_id']}:{r['solution_id']}" for r in conc] == want  # input order
    assert [f"{r['task_id']}:{r['solution_id']}" for r in ser] == want
    assert statuses(conc) == statuses(ser) == EXPECTED, [(r["status"], r["message"]) for r in conc]
    on_device = [r for r in conc if "workers_on_device" in r["meta"]]
    assert on_device and all(r["meta"]["workers_on_device"] == 2 for r in on_device)
    # one at a time: nothing the serial run verified shared the host with another candidate
    assert not any(r["meta"].get("overlapped") for r in ser)


@pytest.mark.slow
def test_a_killed_run_resumed_has_each_result_once(tmp_path, candidates):
    out = tmp_path / "results.jsonl"
    cmd = [*CLI, "run", str(candidates), "--backend", "cpu", "--no-timing", "-o", str(out),
           *CONCURRENT]  # fmt: skip
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, start_new_session=True)
    t_end = time.monotonic() + 600
    while not (out.exists() and out.read_bytes().count(b"\n") >= 1):
        assert p.poll() is None, p.stderr.read().decode()[-3000:]
        assert time.monotonic() < t_end
        time.sleep(0.01)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=60)
    p.stderr.close()
    first = results(out)
    assert 1 <= len(first) < 5, "the run was not interrupted mid-stream"
    again = sh(["run", str(candidates), "--backend", "cpu", "--no-timing", "-o", str(out),
                "--resume", *CONCURRENT])  # fmt: skip
    assert f"{len(first)} already done".encode() in again.stderr, again.stderr.decode()[-2000:]
    rows = results(out)
    got = [f"{r['task_id']}:{r['solution_id']}" for r in rows]
    assert sorted(got) == sorted(keys_in(candidates)) and len(set(got)) == len(got) == 5
    assert rows[: len(first)] == first  # what was written before the kill stands
    assert statuses(rows) == EXPECTED
