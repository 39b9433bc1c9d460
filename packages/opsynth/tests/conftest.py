"""The filter tests' device gates in a directory of their own."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def own_gate_dir(tmp_path_factory, reach_for_other_users) -> None:
    """``$CUDA_AGENT_GATE_DIR`` for every probe of this run (a test may name another): a timer
    of someone else's on this host (their sandbox runs and tests share the default directory)
    never holds up a filter test's timing. Reachable by the uid probes run as."""
    d = tmp_path_factory.mktemp("gates")
    reach_for_other_users(d)
    os.environ["CUDA_AGENT_GATE_DIR"] = str(d)
