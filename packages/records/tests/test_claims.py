"""The claim queue through real processes: every record processed once across workers, a dead
worker's claim taken over, a done record never redone."""

import json
import subprocess
import sys
import textwrap

from cuda_agent.records import encode
from cuda_agent.records.claims import Claims
from cuda_agent.records.examples import task

WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from cuda_agent.records.cli_helpers import run_stream

    print("ready", flush=True)
    while not Path(sys.argv[3] + ".go").exists():  # all workers start together
        time.sleep(0.01)

    def process(rec):
        time.sleep(0.02 if sys.argv[4] == "fast" else 0.2)
        yield rec

    run_stream(process, input=Path(sys.argv[1]), output=Path(sys.argv[2]), claim=Path(sys.argv[3]),
               resume=True, quiet=True)
    """
)


def test_workers_share_one_input_and_a_slow_one_takes_less(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(encode(task(i)) for i in range(60)))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                str(src),
                str(tmp_path / f"out{i}.jsonl"),
                str(tmp_path / "claims"),
                speed,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, speed in enumerate(["fast", "fast", "slow"])
    ]
    assert all(p.stdout.readline().strip() == "ready" for p in procs)
    (tmp_path / "claims.go").touch()
    assert all(p.wait(timeout=120) == 0 for p in procs)
    outs = [
        [json.loads(x)["id"] for x in (tmp_path / f"out{i}.jsonl").read_text().splitlines()]
        for i in range(3)
    ]
    ids = [k for o in outs for k in o]
    assert len(ids) == 60 and len(set(ids)) == 60  # each record once, none lost
    assert len(outs[2]) < len(outs[0]) and len(outs[2]) < len(outs[1])  # the queue balances
    assert Claims(tmp_path / "claims").count_done() == 60
    # a second run over the same queue does nothing: every record is marked done
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            WORKER,
            str(src),
            str(tmp_path / "again.jsonl"),
            str(tmp_path / "claims"),
            "fast",
        ],
        timeout=120,
    )
    assert p.returncode == 0 and not (tmp_path / "again.jsonl").read_text()


def test_a_dead_holders_claim_is_taken_over_and_a_live_ones_is_not(tmp_path):
    d = tmp_path / "claims"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from cuda_agent.records.claims import Claims\n"
            f"c = Claims({str(d)!r}); assert c.take('k1'); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    mine = Claims(d)
    assert not mine.take("k1")  # a live process holds it
    holder.kill()
    holder.wait(timeout=30)
    assert mine.take("k1")  # its lock died with it and it was not marked done
    mine.done("k1")
    assert not Claims(d).take("k1")  # done: nobody takes it again
    assert mine.take("a/b c") and mine.take("a_b_c")  # keys that clean alike stay distinct
    mine.release("a/b c")
    assert Claims(d).take("a/b c")  # released undone: free again
