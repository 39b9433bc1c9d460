import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from cuda_agent.agent.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


class DirEnv:
    """A workspace that is only a directory (no Bash, no evaluation): enough to test episodes'
    tokens and messages without the sandbox."""

    backend = "cpu"

    def __init__(self):
        from cuda_agent.agent.tools import DEFAULT_PROTECTED

        self.protected = DEFAULT_PROTECTED

    def make_workspace(self, task, root):
        root.mkdir(parents=True)
        (root / "SKILL.md").write_text("You write kernels.")
        (root / "model.py").write_text(task.ref_code)
        return root

    def bash(self, root, command, timeout):
        raise AssertionError("not used")

    def evaluate(self, candidate):
        raise AssertionError("not used")


@pytest.fixture
def dir_env():
    return DirEnv()
