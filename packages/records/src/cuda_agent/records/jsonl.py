"""JSONL streaming: one record per line, read lazily, written with a flush per line."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from .types import AnyRecord, record_key

_encoder = msgspec.json.Encoder()


class DecodeError(ValueError):
    """A line that is not a valid record; ``str()`` reads ``line N: <what is wrong>``."""

    def __init__(self, line: int, message: str, raw: bytes = b""):
        self.line = line
        self.message = message
        self.raw = raw
        super().__init__(f"line {line}: {message}")


def encode(record: Any) -> bytes:
    """One record as a JSON line (with the trailing newline)."""
    return _encoder.encode(record) + b"\n"


def decode(data: bytes | str, type: Any = AnyRecord) -> Any:
    """Decode one JSON document into ``type`` (default: any record kind, chosen by ``kind``)."""
    return msgspec.json.decode(data, type=type)


def _open_binary(source: str | Path | BinaryIO | None) -> tuple[BinaryIO, bool]:
    if source is None or str(source) == "-":
        return sys.stdin.buffer, False
    if isinstance(source, str | Path):
        return open(source, "rb"), True
    return source, False


def iter_lines(source: str | Path | BinaryIO | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line_number, line)`` one at a time, 1-based, skipping blank lines."""
    fh, close = _open_binary(source)
    try:
        for n, line in enumerate(fh, start=1):
            line = line.strip()
            if line:
                yield n, line
    finally:
        if close:
            fh.close()


def read_records(
    source: str | Path | BinaryIO | None = None, type: Any = AnyRecord
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, record)``; raises :class:`DecodeError` naming the line on a bad one.

    The iterator stays usable after a ``DecodeError`` (callers that skip bad lines keep going).
    """
    for n, line in iter_lines(source):
        try:
            rec = msgspec.json.decode(line, type=type)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            yield n, DecodeError(n, str(e), line)
            continue
        yield n, rec


def load_records(path: str | Path, type: Any = AnyRecord) -> list[Any]:
    """All records of a small file; raises :class:`DecodeError` on the first bad line."""
    out = []
    for _, rec in read_records(path, type):
        if isinstance(rec, DecodeError):
            raise rec
        out.append(rec)
    return out


class RecordWriter:
    """Writes records as JSON lines, each with one ``write`` call followed by a flush.

    With ``path`` set the file is opened for append; a line cut short by a killed process is
    removed first (see :func:`repair_tail`), so the file only ever holds whole lines.
    """

    def __init__(self, path: str | Path | None = None, append: bool = True, fsync: bool = False):
        self.path = None if path is None or str(path) == "-" else Path(path)
        self.fsync = fsync
        self.count = 0
        if self.path is None:
            self._fd = sys.stdout.fileno()
            sys.stdout.flush()
            self._own = False
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if append and self.path.exists():
                repair_tail(self.path)
            flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
            self._fd = os.open(self.path, flags, 0o644)
            self._own = True

    def write(self, record: Any) -> None:
        data = encode(record)
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        if self.fsync and self._own:
            os.fsync(self._fd)
        self.count += 1

    def write_all(self, records: Iterable[Any]) -> int:
        for r in records:
            self.write(r)
        return self.count

    def close(self) -> None:
        if self._own:
            os.close(self._fd)
            self._own = False

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def repair_tail(path: str | Path) -> int:
    """Truncate a trailing partial line (no final newline) left by a killed writer.

    Returns the number of bytes removed.
    """
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "rb+") as fh:
        fh.seek(-1, io.SEEK_END)
        if fh.read(1) == b"\n":
            return 0
        # scan back for the last newline
        pos = size
        chunk = 65536
        while pos > 0:
            start = max(0, pos - chunk)
            fh.seek(start)
            buf = fh.read(pos - start)
            i = buf.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                fh.truncate(keep)
                return size - keep
            pos = start
        fh.truncate(0)
        return size


def done_keys(path: str | Path, type: Any = AnyRecord) -> set[str]:
    """Keys of the whole, valid records already in ``path`` (for ``--resume``)."""
    path = Path(path)
    keys: set[str] = set()
    if not path.exists():
        return keys
    repair_tail(path)
    for _, rec in read_records(path, type):
        if isinstance(rec, DecodeError):
            continue
        try:
            keys.add(record_key(rec))
        except TypeError:
            continue
    return keys
