"""A tiny random-weight Llama and realistic synthetic trajectories, built once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def setup(tmp_path_factory):
    from cuda_agent.training.synthetic import tiny_training_setup

    return tiny_training_setup(
        tmp_path_factory.mktemp("tiny"), 6, turns=3, tool_output_lines=4, reward=1.0
    )


@pytest.fixture(scope="session")
def tiny_model(setup):
    return setup[0]


@pytest.fixture(scope="session")
def trajectories(setup):
    return setup[1]


@pytest.fixture(scope="session")
def data_file(setup):
    return setup[2]
