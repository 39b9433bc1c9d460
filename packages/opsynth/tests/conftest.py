"""The filter tests' device gates in a directory of their own."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def own_gate_dir(tmp_path_factory) -> None:
    """``$CUDA_AGENT_GATE_DIR`` for every probe of this run (a test may name another): a timer
    of someone else's on this host (their sandbox runs and tests share the default directory)
    never holds up a filter test's timing."""
    os.environ["CUDA_AGENT_GATE_DIR"] = str(tmp_path_factory.mktemp("gates"))
