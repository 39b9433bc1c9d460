import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from cuda_agent.agent.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)
