"""Repository-wide pytest setup: ``gpu`` tests are skipped where CUDA is absent; under xdist,
every test process (and what it starts) uses one CPU thread per worker."""

import os

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


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
