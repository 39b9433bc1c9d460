"""A work queue over one input stream for several processes of one machine: each record goes to
the first process that claims it (``--claim DIR``), so fast and slow workers even out, unlike
``--shard i/n`` which fixes each worker's share in advance.

A claim is the file ``DIR/<key>``, held under an exclusive ``fcntl.flock`` while its record is
processed, and marked done (non-empty) once the results are written. The OS drops the lock of a
process that dies, so a claim left without the mark is taken over by the next process to meet it:
a run stopped at any point and started again redoes exactly its unfinished records. A fresh run
needs a fresh (or empty) DIR. Locks must work between the processes: one host, or a shared
filesystem with working ``flock``.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

_SAFE = re.compile(r"[^A-Za-z0-9_.:-]")


class Claims:
    """The claims of one process on the queue in ``directory`` (created if missing)."""

    def __init__(self, directory: str | os.PathLike[str]):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._held: dict[str, int] = {}

    def _path(self, key: str) -> Path:
        name = _SAFE.sub("_", key)[:80]
        if name != key:  # keep distinct keys distinct after cleaning
            name += "-" + hashlib.sha256(key.encode()).hexdigest()[:12]
        return self.dir / name

    def take(self, key: str) -> bool:
        """Claim ``key`` for this process: True if it is now ours (nobody holds it and it is not
        done); False if another live process holds it or it is done."""
        import fcntl

        if key in self._held:
            return True
        fd = os.open(self._path(key), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        if os.fstat(fd).st_size > 0:  # done by someone, earlier
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            return False
        self._held[key] = fd
        return True

    def done(self, key: str) -> None:
        """Mark a claimed ``key`` done (after its results are written) and release it."""
        import fcntl

        fd = self._held.pop(key)
        try:
            os.write(fd, b"done\n")
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def release(self, key: str) -> None:
        """Give a claimed ``key`` back undone (another process, or a later run, will take it)."""
        import fcntl

        fd = self._held.pop(key, None)
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def count_done(self) -> int:
        """How many keys in the directory are marked done (by any process)."""
        return sum(1 for p in self.dir.iterdir() if p.is_file() and p.stat().st_size > 0)
