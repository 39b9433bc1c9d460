import io

import msgspec
import pytest

from cuda_agent.records import (
    KINDS,
    DecodeError,
    ErrorRecord,
    EvalResult,
    RecordWriter,
    Status,
    Task,
    decode,
    done_keys,
    encode,
    load_records,
    read_records,
    record_key,
    repair_tail,
)
from cuda_agent.records.examples import candidate, result, task, trajectory

EXAMPLES = [
    task(),
    candidate(),
    result(),
    trajectory(),
    ErrorRecord(line=3, message="bad", raw="{"),
]


@pytest.mark.parametrize("rec", EXAMPLES, ids=lambda r: type(r).__name__)
def test_round_trip_every_kind(rec):
    line = encode(rec)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    back = decode(line)
    assert type(back) is type(rec)
    assert back == rec
    # typed decode to the concrete kind works too
    assert decode(line, type=type(rec)) == rec


def test_every_kind_is_tagged_and_versioned():
    for kind, cls in KINDS.items():
        assert cls.__struct_config__.tag == kind
        assert "schema" in cls.__struct_fields__
    raw = msgspec.json.decode(encode(task()))
    assert raw["kind"] == "task" and raw["schema"] == 1


def test_task_id_is_hash_of_source():
    a, b = task(1), task(1)
    assert a.id == b.id and a.id != task(2).id and len(a.id) == 16


def test_status_enum_values():
    assert {s.value for s in Status} == {
        "ok",
        "compile_error",
        "incorrect",
        "runtime_error",
        "timeout",
        "guard_violation",
        "infra_error",
    }


def test_keys():
    c, r = candidate(3), result(3)
    assert record_key(c) == record_key(r) == f"{c.task.id}:{c.solution.id}"
    assert record_key(task(3)) == task(3).id
    assert record_key(trajectory(3)) == "traj-3"


def test_decode_errors_name_the_line():
    data = encode(task(0)) + b"\n" + b'{"kind": "task", "id": 5}\n' + b"not json\n"
    out = list(read_records(io.BytesIO(data)))
    assert isinstance(out[0][1], Task)
    n, err = out[1]
    assert isinstance(err, DecodeError) and n == 3 and str(err).startswith("line 3: ")
    assert "id" in str(err) or "name" in str(err)
    n, err = out[2]
    assert n == 4 and str(err).startswith("line 4: ")


def test_unknown_kind_is_an_error():
    ((n, err),) = list(read_records(io.BytesIO(b'{"kind": "nope"}\n')))
    assert isinstance(err, DecodeError) and "nope" in err.message


def test_load_records_raises_on_bad_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(encode(task(0)) + b"{oops\n")
    with pytest.raises(DecodeError, match="line 2"):
        load_records(p)


def test_writer_appends_and_repairs_partial_tail(tmp_path):
    p = tmp_path / "out.jsonl"
    with RecordWriter(p) as w:
        w.write(result(0))
        w.write(result(1))
    # simulate a writer killed mid-line
    with open(p, "ab") as fh:
        fh.write(encode(result(2))[:37])
    assert repair_tail(p) == 37
    assert done_keys(p) == {result(0).key, result(1).key}
    with RecordWriter(p) as w:  # append after a cut line: the cut is removed first
        w.write(result(3))
    with open(p, "ab") as fh:
        fh.write(b'{"kind": "eval_re')
    with RecordWriter(p) as w:
        w.write(result(4))
    recs = load_records(p, EvalResult)
    assert [r.key for r in recs] == [result(i).key for i in (0, 1, 3, 4)]


def test_repair_tail_whole_file_partial(tmp_path):
    p = tmp_path / "o.jsonl"
    p.write_bytes(b'{"kind":')
    assert repair_tail(p) == 8 and p.read_bytes() == b""
