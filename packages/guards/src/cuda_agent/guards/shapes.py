"""Shape generalisation: rewrite a task's module-level size constants to a second, unseen size.

Kernels that hard-code the published shape are common. With ``SandboxConfig.shape_check``
(``--shape-check``) the sandbox verifies a correct candidate once more with the resized
reference (and the same solution, from the same build): a wrong result or a crash there makes
the result ``incorrect``, explained by the ``G-SHAPE-GENERALISATION`` flag.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any


def _names_in(fn: ast.FunctionDef | None) -> set[str]:
    if fn is None:
        return set()
    return {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _new_size(v: int, factor: float, avoid_multiples: bool) -> int:
    new = max(1, int(round(v * factor)))
    if new == v:
        new = v + 1
    if avoid_multiples and v >= 16 and new % 8 == 0:
        new += 1 if factor < 1 or new + 1 != v else -1
    return new


# names that usually size a model's parameters even when get_init_inputs does not pass them
_STRUCTURAL = ("channel", "feature", "hidden", "embed", "head", "group", "vocab", "class", "kernel")


def size_constants(ref_code: str) -> dict[str, int]:
    """Module-level integer constants that ``get_inputs`` uses and ``get_init_inputs`` does not
    (so the model's parameters keep their shapes), with values >= 8, skipping names like
    ``channels`` or ``features`` that usually size parameters."""
    tree = ast.parse(ref_code)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    used = _names_in(funcs.get("get_inputs"))
    init = _names_in(funcs.get("get_init_inputs"))
    model_cls = next(
        (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None
    )
    in_model = (
        {n.id for n in ast.walk(model_cls) if isinstance(n, ast.Name)} if model_cls else set()
    )
    out: dict[str, int] = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        for tgt, val in _pairs(node):
            if (
                isinstance(val, ast.Constant)
                and type(val.value) is int
                and val.value >= 8
                and tgt.id in used
                and tgt.id not in init
                and tgt.id not in in_model
                and not any(w in tgt.id.lower() for w in _STRUCTURAL)
            ):
                out[tgt.id] = val.value
    return out


def _pairs(node: ast.Assign) -> list[tuple[ast.Name, ast.AST]]:
    pairs: list[tuple[ast.Name, ast.AST]] = []
    for t in node.targets:
        if isinstance(t, ast.Name):
            pairs.append((t, node.value))
        elif (
            isinstance(t, ast.Tuple)
            and isinstance(node.value, ast.Tuple)
            and len(t.elts) == len(node.value.elts)
        ):
            pairs += [
                (a, b)
                for a, b in zip(t.elts, node.value.elts, strict=True)
                if isinstance(a, ast.Name)
            ]
    return pairs


def _edits(
    ref_code: str, factor: float, avoid_multiples: bool
) -> tuple[list[tuple[int, int, int, str]], dict[str, tuple[int, int]]]:
    """The literal edits of a resize (line, start, end, new text) and the sizes they change
    (name -> (old, new)); both empty when nothing can change. Raises ``SyntaxError``."""
    tree = ast.parse(ref_code)
    sizes = size_constants(ref_code)
    edits: list[tuple[int, int, int, str]] = []
    plan: dict[str, tuple[int, int]] = {}
    for node in tree.body if sizes else []:
        if not isinstance(node, ast.Assign):
            continue
        for tgt, val in _pairs(node):
            if tgt.id in sizes and isinstance(val, ast.Constant) and val.lineno == val.end_lineno:
                new = _new_size(sizes[tgt.id], factor, avoid_multiples)
                edits.append((val.lineno - 1, val.col_offset, val.end_col_offset or 0, str(new)))
                plan[tgt.id] = (sizes[tgt.id], new)
    return edits, plan


def resize_plan(
    ref_code: str, factor: float = 0.75, avoid_multiples: bool = True
) -> dict[str, tuple[int, int]]:
    """The sizes :func:`resize_task_source` changes, ``{name: (old, new)}``; empty when it would
    return ``None``."""
    try:
        return _edits(ref_code, factor, avoid_multiples)[1]
    except SyntaxError:
        return {}


def resize_task_source(
    ref_code: str, factor: float = 0.75, avoid_multiples: bool = True
) -> str | None:
    """``ref_code`` with its input size constants scaled by ``factor`` (rounded; never equal to the
    original; nudged off multiples of 8 when ``avoid_multiples``); ``None`` when the task has no
    constant that can change or does not parse. Only the constants' literals are edited."""
    try:
        edits, _ = _edits(ref_code, factor, avoid_multiples)
    except SyntaxError:
        return None
    if not edits:
        return None
    lines = ref_code.splitlines(keepends=True)
    for ln, a, b, text in sorted(edits, reverse=True):
        line = lines[ln].encode()
        lines[ln] = (line[:a] + text.encode() + line[b:]).decode()
    out = "".join(lines)
    ast.parse(out)
    return out


def resized_candidate(candidate: Any, factor: float = 0.75) -> Any | None:
    """The same solution paired with the task resized by ``factor`` (``None`` when the task has no
    size constant to change). The new task's ``meta.resized_from`` names the original."""
    from cuda_agent.records import Candidate, Task

    new = resize_task_source(candidate.task.ref_code, factor)
    if new is None:
        return None
    t = candidate.task
    meta = dict(t.meta, resized_from=t.id, resize_factor=factor)
    task = Task.make(
        f"{t.name}@x{factor:g}",
        new,
        source=t.source,
        level=t.level,
        problem_id=t.problem_id,
        ops=t.ops,
        meta=meta,
    )
    return Candidate(task=task, solution=candidate.solution, meta=dict(candidate.meta))


def shape_check(
    candidate: Any, verify: Callable[[Any], Any], factor: float = 0.75, policy: str = "strict"
) -> list[Any]:
    """Verify ``candidate`` once more at an unseen size with ``verify`` (e.g. the sandbox's
    ``evaluate`` with timing off) and return a ``G-SHAPE-GENERALISATION`` flag when the result is
    ``incorrect`` or ``runtime_error`` there. Other outcomes (no resizable constant, the resized
    reference failing, infrastructure errors) give no finding: they say nothing about the kernel."""
    from .checks import Findings

    fs = Findings(policy)
    rc = resized_candidate(candidate, factor)
    if rc is None or policy == "off":
        return fs.items
    r = verify(rc)
    status = str(getattr(r, "status", ""))
    if status in ("incorrect", "runtime_error", "Status.INCORRECT", "Status.RUNTIME_ERROR"):
        fs.add(
            "G-SHAPE-GENERALISATION",
            f"{status} at the resized task (factor {factor:g})",
            (getattr(r, "message", "") or "")[:500],
        )
    return fs.items
