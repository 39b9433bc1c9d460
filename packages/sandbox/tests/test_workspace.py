"""Agent workspace creation, solution extraction and materialisation."""

import os
import stat

import pytest

from cuda_agent.records import Solution
from cuda_agent.sandbox.workspace import (
    SolutionError,
    create_workspace,
    load_workspace_task,
    materialise,
    solution_from_workspace,
)


def test_workspace_layout(tmp_path, scale_add_task):
    ws = create_workspace(scale_add_task, tmp_path / "ws", backend="cpu")
    for f in (
        "SKILL.md",
        "model.py",
        "model_new.py",
        "binding.cpp",
        "binding_registry.h",
        "utils/compile.py",
        "utils/verify.py",
        "utils/profile.py",
        "utils/ncu.py",
        "kernels/example_axpby.cpp",
        "kernels/example_axpby_binding.cpp",
    ):
        assert (ws / f).exists(), f
    for f in ("model.py", "binding.cpp", "binding_registry.h", "utils/verify.py", "SKILL.md"):
        assert not (ws / f).stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), f
    assert "class ModelNew(" in (ws / "model_new.py").read_text()
    assert "cpu" in (ws / "SKILL.md").read_text()
    task, backend = load_workspace_task(ws)
    assert task.id == scale_add_task.id and backend == "cpu"
    sol = solution_from_workspace(ws)
    assert set(sol.files) == {
        "model_new.py",
        "kernels/example_axpby.cpp",
        "kernels/example_axpby_binding.cpp",
    }
    with pytest.raises(FileExistsError):
        create_workspace(scale_add_task, ws, backend="cpu")


def test_materialise_takes_only_solution_files(tmp_path, scale_add_task, scale_add_files):
    sol = Solution.make("workdir", scale_add_files)
    d = materialise(scale_add_task, sol, tmp_path / "m", "cpu")
    assert (d / "model.py").read_text() == scale_add_task.ref_code
    assert (d / "binding_registry.h").exists() and (d / "kernels" / "ops.cpp").exists()
    for bad in (
        {"../x.cpp": ""},
        {"/etc/x.cpp": ""},
        {"binding.cpp": "evil"},
        {"utils/verify.py": ""},
        {"model.py": ""},
    ):
        with pytest.raises(SolutionError):
            materialise(
                scale_add_task,
                Solution.make("workdir", {**scale_add_files, **bad}),
                tmp_path / f"b{len(os.listdir(tmp_path))}",
                "cpu",
            )
    with pytest.raises(SolutionError):
        materialise(
            scale_add_task,
            Solution.make("kernelbench", {"model_new.py": "", "kernels/a.cu": ""}),
            tmp_path / "k",
            "cpu",
        )
