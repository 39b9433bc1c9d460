"""`kernelbench-eval run` through the shared sandbox pool (cpu backend, real processes): the
concurrent run's verdicts are the serial run's; a run killed mid-stream and
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
    (2, 2): "compile_error",
    (3, 1): "guard_violation",
}


def sh(args, stdin=b""):
    p = subprocess.run([*CLI, *args], input=stdin, capture_output=True, timeout=900)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    return p


@pytest.fixture(scope="module")
def candidates(tmp_path_factory) -> Path:
    """The fixture tree's candidates but Gemm+ReLU (one build fewer; its verdict, ok, is ReLU's),
    the statically rejected one first (its result line is written at once, while the others
    still compile or run)."""
    tasks = sh(["tasks", "--root", str(HERE)]).stdout
    lines = sh(["solutions", "--dir", str(HERE / "solutions")], tasks).stdout.splitlines()
    lines = [ln for ln in lines if json.loads(ln)["task"]["name"] != "Gemm_ReLU"]
    assert len(lines) == len(EXPECTED)
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


def run_to_file(candidates: Path, out: Path, *flags: str) -> bytes:
    p = sh(["run", str(candidates), "--backend", "cpu", "--no-timing", "-o", str(out), *flags])
    return p.stderr


@pytest.mark.slow
def test_concurrent_run_matches_the_serial_one_and_survives_a_kill(tmp_path, candidates):
    """One test, not two: the first run builds the fixtures (cold, concurrently); the serial
    run and the killed one then find them cached, so the kill lands while candidates are still
    in flight and the builds are not paid twice by parallel test workers."""
    want = keys_in(candidates)
    # (a) concurrent (written as each is done) and serial (one at a time: in input order; so is
    # --in-order): the same verdicts
    conc_f, ser_f = tmp_path / "concurrent.jsonl", tmp_path / "serial.jsonl"
    assert b"4 written" in run_to_file(candidates, conc_f, *CONCURRENT)
    assert b"4 written" in run_to_file(candidates, ser_f, *SERIAL, "--in-order")
    conc, ser = results(conc_f), results(ser_f)
    assert sorted(f"{r['task_id']}:{r['solution_id']}" for r in conc) == sorted(want)
    assert [f"{r['task_id']}:{r['solution_id']}" for r in ser] == want
    assert statuses(conc) == statuses(ser) == EXPECTED, [(r["status"], r["message"]) for r in conc]
    on_device = [r for r in conc if "workers_on_device" in r["meta"]]
    assert on_device and all(r["meta"]["workers_on_device"] == 2 for r in on_device)
    # one at a time: nothing the serial run verified shared the host with another candidate
    assert not any(r["meta"].get("overlapped") for r in ser)

    # (b) SIGKILL once the first result line is in the file, then --resume
    out = tmp_path / "results.jsonl"
    log = tmp_path / "killed.log"
    cmd = [*CLI, "run", str(candidates), "--backend", "cpu", "--no-timing", "-o", str(out),
           *CONCURRENT]  # fmt: skip
    with open(log, "wb") as err:
        p = subprocess.Popen(cmd, stderr=err, start_new_session=True)
    t_end = time.monotonic() + 600
    while not (out.exists() and out.read_bytes().count(b"\n") >= 1):
        assert p.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < t_end
        time.sleep(0.01)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=60)
    first = results(out)
    assert 1 <= len(first) < len(want), "the run was not interrupted mid-stream"
    again = run_to_file(candidates, out, "--resume", *CONCURRENT)
    assert f"{len(first)} already done".encode() in again, again.decode()[-2000:]
    rows = results(out)
    got = [f"{r['task_id']}:{r['solution_id']}" for r in rows]
    # none lost, none twice
    assert sorted(got) == sorted(want) and len(set(got)) == len(got) == len(want)
    assert rows[: len(first)] == first  # what was written before the kill stands
    assert statuses(rows) == EXPECTED
