"""A tiny random-weight Llama and synthetic trajectories with varied rewards, once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from cuda_agent.agent.models import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("tiny-llama"), hidden_size=32, num_layers=2, num_heads=2, seed=0
    )


@pytest.fixture(scope="session")
def trajectories(tiny_model):
    from cuda_agent.rft.modeling import load_tokenizer
    from cuda_agent.rft.synthetic import synthetic_trajectories

    tok = load_tokenizer(tiny_model)
    return synthetic_trajectories(tok, 6, turns=3, tool_output_lines=4, seed=1)


@pytest.fixture(scope="session")
def data_file(tmp_path_factory, trajectories):
    from cuda_agent.records import RecordWriter

    path = tmp_path_factory.mktemp("data") / "trajectories.jsonl"
    with RecordWriter(path, append=False) as w:
        w.write_all(trajectories)
    return path
