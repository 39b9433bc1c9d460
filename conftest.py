"""Repository-wide pytest setup: ``gpu`` tests are skipped where CUDA is absent; under xdist,
every test process (and what it starts) uses one CPU thread per worker; one sandbox build cache
serves the whole run."""

import contextlib
import os
import tempfile
from pathlib import Path

import pytest

if "PYTEST_XDIST_WORKER" in os.environ:
    # N workers on N cores: torch's default (one OpenMP thread per core) in every worker and in
    # every subprocess a test starts oversubscribes the cores, and spinning OpenMP threads make
    # the contended tests several times slower. Set before any test module imports torch.
    _cores = os.cpu_count() or 1
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    _threads = str(max(1, _cores // max(1, _workers)))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, _threads)


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def _long_tests_first(items: list, workers: int) -> list:
    """``items`` reordered so that each xdist worker starts with its share of the ``slow`` tests
    (the rest in file order). Started last, a two-minute test leaves the other workers idle at the
    end of the run. ``--dist worksteal`` hands worker i the i-th of ``workers`` contiguous chunks
    (sizes as computed here), so the slow tests are dealt round-robin to the chunks' heads."""
    slow = [it for it in items if it.get_closest_marker("slow") is not None]
    fast = [it for it in items if it.get_closest_marker("slow") is None]
    workers = max(1, workers)
    out: list = []
    left = len(items)
    for i in range(workers):
        size = left // (workers - i)  # what the scheduler sends the i-th idle worker
        head = slow[i::workers][:size]
        take = size - len(head)
        out += head + fast[:take]
        fast = fast[take:]
        left -= size
    out += [it for it in slow if it not in out] + fast  # chunks smaller than their slow share
    return out


def pytest_collection_modifyitems(config, items):
    items[:] = _long_tests_first(items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    if any("gpu" in item.keywords for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def let_other_users_reach(d: Path) -> None:
    """pytest's temporary dirs are 0700: let the sandbox's unprivileged uids through to ``d``."""
    for parent in (d, *d.parents):
        if parent == Path(tempfile.gettempdir()):
            break
        parent.chmod(parent.stat().st_mode | 0o111)


@pytest.fixture(scope="session")
def reach_for_other_users():
    """:func:`let_other_users_reach`, for test modules (conftest files are not importable)."""
    return let_other_users_reach


@pytest.fixture(scope="session", autouse=True)
def run_sandbox_cache(tmp_path_factory) -> Path:
    """The sandbox build cache of this test run (``$CUDA_AGENT_SANDBOX_CACHE`` for every test and
    what it starts), shared by the xdist workers: the infrastructure binding, the fixtures'
    objects and the cpu backend's precompiled prelude are built once per run instead of once per
    worker and per package (and never in the user's own cache).
    ``$CUDA_AGENT_SANDBOX_TEST_CACHE`` names one to keep across runs."""
    keep = os.environ.get("CUDA_AGENT_SANDBOX_TEST_CACHE")
    if keep:
        d = Path(keep)
    else:
        base = tmp_path_factory.getbasetemp()
        # under xdist each worker's base is <run>/popen-gwN: the run's directory is shared
        d = (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / "sandbox-cache"
    d.mkdir(parents=True, exist_ok=True)
    if not keep:
        let_other_users_reach(d)
    os.environ["CUDA_AGENT_SANDBOX_CACHE"] = str(d)
    # a run compiles a dozen bindings into it: the cpu backend's precompiled prelude pays at once
    os.environ.setdefault("CUDA_AGENT_PCH_AFTER", "0")
    return d


def pytest_sessionfinish(session):
    """The run's sandbox cache holds the cpu backend's precompiled prelude (about 0.5 GB), and
    pytest keeps the last three runs' directories: drop the prelude when the run ends (in the
    process that started the workers, after they are done), unless a kept cache was named."""
    if hasattr(session.config, "workerinput") or os.environ.get("CUDA_AGENT_SANDBOX_TEST_CACHE"):
        return
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    import shutil

    with contextlib.suppress(OSError, ValueError):
        shutil.rmtree(factory.getbasetemp() / "sandbox-cache" / "build" / "pch", ignore_errors=True)
