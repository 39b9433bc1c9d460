"""The records CLI and the shared stream conventions, through real subprocesses."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cuda_agent.records import encode, load_records
from cuda_agent.records.examples import result, task, trajectory

BAD = b'{"kind": "task", "name": 3}\n'


def run(args, stdin=b"", **kw):
    return subprocess.run(args, input=stdin, capture_output=True, timeout=120, **kw)


def records_cmd(*args):
    return [sys.executable, "-m", "cuda_agent.records.cli", *args]


def test_help_has_examples():
    p = run(records_cmd("--help"))
    assert p.returncode == 0 and b"records validate" in p.stdout


def test_validate_counts_and_kind():
    data = encode(task(0)) + encode(result(0)) + encode(trajectory(0))
    p = run(records_cmd("validate"), data)
    assert p.returncode == 0, p.stderr
    assert p.stdout == b""
    assert b"3 valid" in p.stderr and b"status ok: 1" in p.stderr
    p = run(records_cmd("validate", "--kind", "task"), data)
    assert p.returncode == 2 and b"line 2: expected kind task, got 'eval_result'" in p.stderr


@pytest.mark.parametrize("cmd", [["validate"], ["stats"], ["head"], ["sample"]])
def test_malformed_line_exit_2_names_line_and_no_partial_stdout(cmd):
    data = encode(task(0)) + BAD + encode(task(1))
    p = run(records_cmd(*cmd), data)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert b"line 2:" in p.stderr
    # stdout holds whole lines only
    assert p.stdout == b"" or p.stdout.endswith(b"\n")
    for line in p.stdout.splitlines():
        json.loads(line)


def test_head_and_sample():
    data = b"".join(encode(task(i)) for i in range(20))
    p = run(records_cmd("head", "-n", "3"), data)
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 3
    p1 = run(records_cmd("sample", "-n", "5", "--seed", "1"), data)
    p2 = run(records_cmd("sample", "-n", "5", "--seed", "1"), data)
    assert p1.stdout == p2.stdout and len(p1.stdout.splitlines()) == 5
    names = [json.loads(x)["name"] for x in p1.stdout.splitlines()]
    assert names == sorted(names, key=lambda s: int(s.split("_")[1]))  # input order kept


def test_stats_histograms():
    from cuda_agent.records import Status

    recs = [result(0), result(1, Status.INCORRECT), trajectory(2)]
    import msgspec

    recs[0] = msgspec.structs.replace(recs[0], reward=3.0)
    recs[2] = msgspec.structs.replace(recs[2], reward=-1.0)
    p = run(records_cmd("stats"), b"".join(encode(r) for r in recs))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["kinds"] == {"eval_result": 2, "trajectory": 1}
    assert out["status"] == {"incorrect": 1, "ok": 2}
    assert out["reward"] == {"-1": 1, "3": 1}


def test_on_error_modes_through_reward_cli():
    data = encode(result(0)) + BAD + encode(result(1))
    cmd = [sys.executable, "-m", "cuda_agent.reward.cli", "score"]
    p = run(cmd, data)
    assert p.returncode == 2 and b"line 2:" in p.stderr
    assert len(p.stdout.splitlines()) == 1  # the record before the bad line, whole
    p = run([*cmd, "--on-error", "skip"], data)
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 2
    assert b"malformed" in p.stderr
    p = run([*cmd, "--on-error", "emit"], data)
    assert p.returncode == 0
    kinds = [json.loads(x)["kind"] for x in p.stdout.splitlines()]
    assert kinds == ["eval_result", "error", "eval_result"]
    err = json.loads(p.stdout.splitlines()[1])
    assert err["line"] == 2 and "name" in err["raw"]


SLOW_STREAM = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from cuda_agent.records.cli_helpers import run_stream

    def slow(rec):
        time.sleep(0.02)
        yield rec

    run_stream(slow, input=Path(sys.argv[1]), output=Path(sys.argv[2]), resume=True)
    """
)


def test_resume_after_sigkill_loses_and_duplicates_nothing(tmp_path):
    n = 200
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(encode(result(i)) for i in range(n)))
    out = tmp_path / "out.jsonl"
    script = tmp_path / "slow.py"
    script.write_text(SLOW_STREAM)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(src), str(out)], stderr=subprocess.PIPE
    )
    deadline = time.time() + 60
    while time.time() < deadline:
        if out.exists() and out.stat().st_size > 0 and len(out.read_bytes().splitlines()) >= 20:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = len(out.read_bytes().splitlines())
    assert 0 < partial < n
    # a line cut by the kill would be dropped on resume; simulate the worst case as well
    with open(out, "ab") as fh:
        fh.write(encode(result(n - 1))[:40])
    p = run(
        [
            sys.executable,
            "-m",
            "cuda_agent.reward.cli",
            "score",
            str(src),
            "-o",
            str(out),
            "--resume",
        ]
    )
    assert p.returncode == 0, p.stderr
    assert b"already done" in p.stderr
    recs = load_records(out)
    keys = [r.key for r in recs]
    assert len(keys) == len(set(keys)) == n
    assert set(keys) == {result(i).key for i in range(n)}


def test_resume_needs_output():
    p = run([sys.executable, "-m", "cuda_agent.reward.cli", "score", "--resume"], b"")
    assert p.returncode == 2 and b"--resume needs -o" in p.stderr


def test_shard_partition():
    from cuda_agent.records import in_shard, parse_shard

    keys = [f"k{i}" for i in range(300)]
    parts = [[k for k in keys if in_shard(k, (i, 3))] for i in range(3)]
    assert sorted(sum(parts, [])) == sorted(keys)
    assert all(40 < len(p) < 160 for p in parts)
    assert parse_shard("1/4") == (1, 4)
    import typer

    with pytest.raises(typer.BadParameter):
        parse_shard("4/4")


BUNDLED = textwrap.dedent(
    """
    from __future__ import annotations

    import json
    from dataclasses import asdict, dataclass

    import typer

    from cuda_agent.records.cli_helpers import OutputOpt, ResumeOpt, bundle_options

    @dataclass
    class Flags:
        output: str | None = None
        resume: bool = False

    app = typer.Typer()

    @app.command()
    @bundle_options("flags", Flags)
    def cmd(
        name: str = typer.Option("x", help="Its own option."),
        output: OutputOpt = None,
        resume: ResumeOpt = False,
        *,
        flags: Flags,
    ) -> None:
        print(json.dumps({"name": name, "resume": resume, "flags": asdict(flags)}, default=str))

    app()
    """
)


def test_bundled_options_are_the_commands_own_and_come_whole():
    """``bundle_options``: the command's options stay as it declares them (the bundle is no
    option), and it gets them one by one and bundled."""
    p = run([sys.executable, "-c", BUNDLED, "--help"], env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 0, p.stderr
    helptext = p.stdout.decode()
    assert "--flags" not in helptext
    assert helptext.index("--name") < helptext.index("--output") < helptext.index("--resume")
    p = run([sys.executable, "-c", BUNDLED, "--name", "y", "-o", "f.jsonl", "--resume"])
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got == {"name": "y", "resume": True, "flags": {"output": "f.jsonl", "resume": True}}
