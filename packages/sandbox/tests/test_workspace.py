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


@pytest.mark.parametrize("policy", ["strict", "kernelbench", "off"])
def test_skill_states_the_rules_of_the_policy_it_is_evaluated_under(
    tmp_path, scale_add_task, policy
):
    from cuda_agent.guards.checks import CHECKS
    from cuda_agent.sandbox.workspace import workspace_guard_policy

    ws = create_workspace(scale_add_task, tmp_path / "ws", backend="cuda", guard_policy=policy)
    skill = (ws / "SKILL.md").read_text()
    assert "{{" not in skill and workspace_guard_policy(ws) == policy
    assert f"guard policy `{policy}`" in skill
    precision = next(ln for ln in skill.splitlines() if ln.startswith("- fp32 tasks:"))
    if policy == "off":
        assert "no guard runs" in skill and "`G-" not in skill
        return
    for c in CHECKS.values():  # every check the policy applies, with what it does with it
        sev = c.severity(policy)
        row = next((ln for ln in skill.splitlines() if ln.startswith(f"| `{c.code}` |")), None)
        assert (row is None) == (sev is None), c.code
        if row is not None:
            assert ("**rejected**" in row) == (sev == "reject"), row
    # the precision advice never coaches toward what the policy rejects
    if policy == "strict":
        assert "**rejected**" in precision and "usually inside" not in precision
    else:
        assert "flags them" in precision
    with pytest.raises(ValueError, match="unknown guard policy"):
        create_workspace(scale_add_task, tmp_path / "bad", backend="cpu", guard_policy="lenient")


@pytest.mark.slow
def test_the_workspace_tools_verify_under_the_workspaces_policy(
    tmp_path, scale_add_task, scale_add_files, warm_build, monkeypatch, capsys
):
    """The same solution (its own kernel, then torch arithmetic in forward): rejected by
    utils/verify.py in a `strict` workspace (G-TORCH-COMPUTE), passed in a `kernelbench` one."""
    from cuda_agent.sandbox import tools

    src = scale_add_files["model_new.py"].replace(
        "return cuda_extension.run(x, self.w, self.b)",
        "return cuda_extension.run(x, self.w, self.b) * 1.0",
    )
    assert "* 1.0" in src
    codes = {}
    for policy in ("strict", "kernelbench"):
        ws = create_workspace(scale_add_task, tmp_path / policy, backend="cpu", guard_policy=policy)
        for name, text in scale_add_files.items():
            if name.startswith("kernels/"):
                (ws / name).write_text(text)
        for p in ws.glob("kernels/example_axpby*"):
            p.unlink()
        (ws / "model_new.py").chmod(0o644)
        (ws / "model_new.py").write_text(src)
        assert tools._compile(ws, []) == 0
        monkeypatch.chdir(ws)
        codes[policy] = tools._verify(ws, [])
        out = capsys.readouterr().out
        want = (
            "guard G-TORCH-COMPUTE (reject)"
            if policy == "strict"
            else "guard G-TORCH-COMPUTE (flag)"
        )
        assert want in out, out
    assert codes == {"strict": 1, "kernelbench": 0}, codes


def test_a_solution_is_read_from_regular_files_only(tmp_path, scale_add_task):
    """A confined command can plant links and FIFOs in the workspace; the evaluator (often
    root) must not read through them: a link to a secret outside is left out, not copied."""
    secret = tmp_path / "secret.txt"
    secret.write_text("root's secret")
    ws = create_workspace(scale_add_task, tmp_path / "ws", backend="cpu")
    (ws / "kernels" / "leak.cpp").symlink_to(secret)
    os.mkfifo(ws / "kernels" / "hang.cu")  # opening it for reading would block
    (ws / "kernels" / "sub").mkdir()
    (ws / "kernels" / "sub" / "ok.h").write_text("// a header\n")
    (ws / "kernels" / "outside").symlink_to(tmp_path, target_is_directory=True)
    (ws / "kernels" / "big.cpp").write_bytes(b"x" * ((4 << 20) + 1))
    sol = solution_from_workspace(ws)
    assert not any("secret" in t for t in sol.files.values())
    assert set(sol.files) == {
        "model_new.py",
        "kernels/example_axpby.cpp",
        "kernels/example_axpby_binding.cpp",
        "kernels/sub/ok.h",
    }


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_skill_states_the_module_mode_of_the_task(tmp_path, scale_add_task, mode):
    import msgspec

    task = msgspec.structs.replace(scale_add_task, model_mode=mode)
    skill = (create_workspace(task, tmp_path / "ws", backend="cpu") / "SKILL.md").read_text()
    assert f"**{mode} mode**" in skill and "{{" not in skill
    assert ("batch's own mean" in skill) == (mode == "train")
