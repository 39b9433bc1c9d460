"""A running pool's state on demand: ``kill -USR1 <pid>`` of a stream command (``sandbox eval``,
``kernelbench-eval run``) writes to its stderr every device gate's holders and waiters, the memory
reservations and large shares in flight (one JSON line, ``{"state_report": ...}``), then every
thread's Python stack (``faulthandler``). What a stalled run is waiting for, without stopping it.
"""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
import time
from typing import Any

_INSTALLED = False


def pool_state() -> dict[str, Any]:
    """The gates, reservations and large shares of this process now (read without their locks:
    a stuck one must not block the report)."""
    from . import admission
    from .gate import gates_state

    return {
        "t": round(time.time(), 3),
        "gates": gates_state(),
        "reserved_bytes": admission.LEDGER.state(),
        "large_shares": admission.LARGE_SHARES.state(),
    }


def _report(signum: int, frame: Any) -> None:
    try:
        line = json.dumps({"state_report": pool_state()}, default=str)
    except Exception as e:  # noqa: BLE001 - a report must never end the run
        line = json.dumps({"state_report": {"error": repr(e)}})
    print(line, file=sys.stderr, flush=True)


def install() -> bool:
    """Make SIGUSR1 write :func:`pool_state` and the threads' stacks to stderr (once per
    process; the main thread only, where signal handlers can be set). True when installed."""
    global _INSTALLED
    if _INSTALLED:
        return True
    try:
        signal.signal(signal.SIGUSR1, _report)
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=True)
    except (ValueError, OSError, AttributeError, RuntimeError):  # not the main thread; no USR1
        return False
    _INSTALLED = True
    return True
