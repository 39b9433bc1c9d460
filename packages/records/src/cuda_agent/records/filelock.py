"""An exclusive advisory lock on a file, shared by processes of one machine (``fcntl.flock``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing, never truncated) for the block;
    another holder anywhere on the machine waits. Released when the block ends, and by the OS
    if the process dies."""
    import fcntl

    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
