from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "KernelBench"

TINY = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x @ x.T) * self.scale


n = 96


def get_inputs():
    return [torch.randn(n, n)]


def get_init_inputs():
    return [2.0]
"""


@pytest.fixture
def tiny_src() -> str:
    return TINY


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
