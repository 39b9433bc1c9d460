"""The agent workspace (template + task) and the fresh directory an evaluation builds in.

Layout (infrastructure files are read-only and always come from this package, never from a
solution)::

    SKILL.md            rules, workflow, Hopper advice, how to call the tools
    model.py            the task's reference (read-only)
    model_new.py        the solution's module: class ModelNew          (solution file)
    kernels/            *.cu / *.cpp kernels and *_binding.cpp bindings   (solution files)
    binding.cpp, binding_registry.h, sandbox_prelude.h    binding infrastructure (read-only)
    utils/compile.py verify.py profile.py ncu.py         tools (read-only)
    .sandbox/task.json  the task record the tools evaluate against (read-only)
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path, PurePosixPath

from cuda_agent.records import Solution, Task
from cuda_agent.records.jsonl import decode, encode

TEMPLATE = Path(__file__).with_name("template")
INFRA_FILES = ("binding.cpp", "binding_registry.h", "sandbox_prelude.h")
TOOLS = ("compile.py", "verify.py", "profile.py", "ncu.py")
SOLUTION_EXT = (".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp", ".inl")
MAX_SOLUTION_BYTES = 4 << 20


class SolutionError(ValueError):
    """A solution whose files cannot be placed (bad path, wrong kind of file, too large)."""


def _read_only(p: Path) -> None:
    p.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)


def check_solution_files(sol: Solution) -> dict[str, str]:
    """The files of ``sol`` that belong in a workdir, validated: relative paths inside
    ``kernels/`` (sources and headers) plus ``model_new.py``; anything else is an error."""
    files: dict[str, str] = {}
    total = 0
    for name, text in sol.files.items():
        p = PurePosixPath(name)
        if p.is_absolute() or ".." in p.parts or not p.parts or name != str(p):
            raise SolutionError(f"bad file path {name!r}")
        if sol.format == "kernelbench":
            if name != "model_new.py":
                raise SolutionError(f"a kernelbench solution is one model_new.py, got {name!r}")
        elif name != "model_new.py" and not (p.parts[0] == "kernels" and p.suffix in SOLUTION_EXT):
            raise SolutionError(
                f"{name!r} is not a solution file (allowed: model_new.py, kernels/*{{.cu,.cpp,.h,.cuh}})"
            )
        total += len(text.encode())
        files[name] = text
    if total > MAX_SOLUTION_BYTES:
        raise SolutionError(f"solution files are {total} bytes (limit {MAX_SOLUTION_BYTES})")
    if "model_new.py" not in files:
        raise SolutionError("the solution has no model_new.py")
    return files


def _copy_infra(dest: Path, backend: str) -> None:
    for name in INFRA_FILES:
        shutil.copy(TEMPLATE / name, dest / name)
        _read_only(dest / name)
    (dest / "utils").mkdir(exist_ok=True)
    for name in TOOLS:
        shutil.copy(TEMPLATE / "utils" / name, dest / "utils" / name)
        _read_only(dest / "utils" / name)


def materialise(task: Task, sol: Solution, dest: str | os.PathLike[str], backend: str) -> Path:
    """A fresh directory ``dest``: infrastructure from the template, ``model.py`` from the task,
    and only the solution's own files. Raises :class:`SolutionError` for unplaceable files."""
    files = check_solution_files(sol)
    d = Path(dest)
    d.mkdir(parents=True, exist_ok=False)
    _copy_infra(d, backend)
    (d / "model.py").write_text(task.ref_code)
    _read_only(d / "model.py")
    for name, text in files.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return d


def starter_model_new(ref_code: str) -> str:
    """A starting ``model_new.py``: the reference renamed to ``ModelNew`` with the steps to take."""
    body = re.sub(r"\bclass\s+Model\s*\(", "class ModelNew(", ref_code, count=1)
    body = re.sub(r"\bsuper\(\s*Model\s*,", "super(ModelNew,", body)
    head = (
        "# model_new.py -- YOUR solution. Starter: a copy of the reference, renamed ModelNew.\n"
        "# It still computes with PyTorch operators, which the rules forbid in a submission:\n"
        "# write kernels in kernels/, bind them (see kernels/example_axpby_*), build with\n"
        "# `python utils/compile.py`, then call them here through `cuda_extension`.\n"
        "# Keep the constructor's arguments and parameter names: the evaluator copies the\n"
        "# reference model's state_dict into ModelNew.\n"
        "import cuda_extension  # noqa: F401  (built by utils/compile.py)\n"
    )
    return head + body


_PRECISION_ADVICE = {
    "reject": "fp32 tasks: compute in fp32. TF32 tensor cores and bf16/fp16 arithmetic change "
    "results by about 1e-3 relative and are **rejected** under this policy (`G-PRECISION`), even "
    "inside the tolerance.",
    "flag": "fp32 tasks: TF32 tensor cores and bf16/fp16 arithmetic change results by about 1e-3 "
    "relative, usually inside the tolerance; this policy flags them (`G-PRECISION`) without "
    "rejecting. Check with `utils/verify.py`.",
    None: "fp32 tasks: any precision that stays inside the tolerance passes (no guards); check "
    "with `utils/verify.py`.",
}


_MODE_NOTE = {
    "eval": "`model.eval()`, so BatchNorm normalises with its running statistics and Dropout is "
    "off.",
    "train": "`model.train()`, the mode a module is built in (KernelBench's harness never calls "
    "`.eval()`), so BatchNorm normalises with the batch's own mean and biased variance; the "
    "running statistics need not be updated.",
}


def skill_text(backend: str, guard_policy: str, model_mode: str = "eval") -> str:
    """The workspace's SKILL.md for ``backend``, ``guard_policy`` and the task's module mode: its
    rules table and its precision advice generated from the guard policy
    (``cuda_agent.guards.api.policy_rules``), the mode both models run in stated."""
    from cuda_agent.guards.api import policy_rules
    from cuda_agent.guards.checks import CHECKS

    precision = CHECKS["G-PRECISION"].severity(guard_policy)
    return (
        (TEMPLATE / "SKILL.md")
        .read_text()
        .replace("{{BACKEND}}", backend)
        .replace("{{GUARD_POLICY}}", guard_policy)
        .replace("{{GUARD_RULES}}", policy_rules(guard_policy))
        .replace("{{PRECISION_ADVICE}}", _PRECISION_ADVICE[precision])
        .replace("{{MODEL_MODE}}", model_mode)
        .replace("{{MODEL_MODE_NOTE}}", _MODE_NOTE[model_mode])
    )


def create_workspace(
    task: Task,
    out_dir: str | os.PathLike[str],
    backend: str = "cuda",
    guard_policy: str = "strict",
) -> Path:
    """Create an agent workspace for ``task`` in ``out_dir`` (which must not exist or be empty),
    whose SKILL.md states the rules of ``guard_policy`` and whose tools verify under it."""
    from cuda_agent.guards.checks import check_policy

    check_policy(guard_policy)
    d = Path(out_dir)
    if d.exists() and any(d.iterdir()):
        raise FileExistsError(f"{d} exists and is not empty")
    d.mkdir(parents=True, exist_ok=True)
    _copy_infra(d, backend)
    (d / "SKILL.md").write_text(skill_text(backend, guard_policy, task.model_mode))
    _read_only(d / "SKILL.md")
    (d / "model.py").write_text(task.ref_code)
    _read_only(d / "model.py")
    (d / "model_new.py").write_text(starter_model_new(task.ref_code))
    (d / "kernels").mkdir(exist_ok=True)
    ex = TEMPLATE / "examples" / ("cuda" if backend == "cuda" else "cpu") / "kernels"
    for p in sorted(ex.iterdir()):
        shutil.copy(p, d / "kernels" / p.name)
    meta = d / ".sandbox"
    meta.mkdir(exist_ok=True)
    (meta / "task.json").write_bytes(encode(task))
    (meta / "backend").write_text(backend + "\n")
    (meta / "guard_policy").write_text(guard_policy + "\n")
    _read_only(meta / "task.json")
    return d


def workspace_guard_policy(ws: str | os.PathLike[str]) -> str:
    """The guard policy a workspace was created for (``strict`` for workspaces made before it
    was recorded)."""
    f = Path(ws) / ".sandbox" / "guard_policy"
    return f.read_text().strip() if f.exists() else "strict"


def load_workspace_task(ws: str | os.PathLike[str]) -> tuple[Task, str]:
    """The task and backend a workspace was created for."""
    d = Path(ws)
    task = decode((d / ".sandbox" / "task.json").read_bytes(), Task)
    backend = (
        (d / ".sandbox" / "backend").read_text().strip()
        if (d / ".sandbox" / "backend").exists()
        else "cuda"
    )
    return task, backend


MAX_SOLUTION_FILE_BYTES = 4 << 20


def _read_own_file(p: Path) -> str | None:
    """A solution file's text, read only when it is a regular file (never through a link, a
    FIFO or a device: the workspace is written by confined commands and read by the evaluator,
    often as root) of at most ``MAX_SOLUTION_FILE_BYTES``; None otherwise."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SOLUTION_FILE_BYTES:
            return None
        return f.read(MAX_SOLUTION_FILE_BYTES + 1)[:MAX_SOLUTION_FILE_BYTES].decode(
            errors="replace"
        )


def solution_from_workspace(ws: str | os.PathLike[str], origin: str = "workspace") -> Solution:
    """The solution an agent left in a workspace: ``model_new.py`` and ``kernels/`` sources.
    Only regular files are read (a link, e.g. to a file outside the workspace, a FIFO or a file
    over ``MAX_SOLUTION_FILE_BYTES`` is left out), and no directory link is followed."""
    d = Path(ws)
    files: dict[str, str] = {}
    text = _read_own_file(d / "model_new.py")
    if text is not None:
        files["model_new.py"] = text
    kd = d / "kernels"
    found: list[Path] = []
    if kd.is_dir() and not kd.is_symlink():
        for root, _, names in os.walk(kd):  # os.walk follows no directory link by default
            found += [Path(root) / n for n in names if Path(n).suffix in SOLUTION_EXT]
    for p in sorted(found):
        text = _read_own_file(p)
        if text is not None:
            files[str(p.relative_to(d))] = text
    return Solution.make("workdir", files, origin=origin)
