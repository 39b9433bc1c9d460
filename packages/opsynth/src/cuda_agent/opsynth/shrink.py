"""Shrink a GPU-sized task for a CPU check: halve its large module-level integer constants.

Sizes in KernelBench-format programs live in module-level constants (``batch_size = 512``,
``height, width = 512, 512``). :func:`shrink_source` halves every such integer >= 16 (floors at
8) until the inputs hold at most ``target_numel`` elements, measured on the ``meta`` device.
Literals inside ``get_inputs`` or ``forward`` are left alone, so a program that hard-codes a
size may break when shrunk; callers compare with the original (see the README's Ops-6K study).
"""

from __future__ import annotations

import ast
from typing import Any


def _int_consts(tree: ast.Module) -> list[tuple[ast.Constant, str]]:
    """Module-level integer literals assigned to names (also inside tuple assignments)."""
    found: list[tuple[ast.Constant, str]] = []
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        pairs: list[tuple[Any, Any]] = []
        for t in node.targets:
            if isinstance(t, ast.Name):
                pairs.append((t, node.value))
            elif isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs.extend(zip(t.elts, node.value.elts, strict=False))
        for t, v in pairs:
            if (
                isinstance(t, ast.Name)
                and isinstance(v, ast.Constant)
                and type(v.value) is int
                and v.value >= 16
            ):
                found.append((v, t.id))
    return found


def input_numel(source: str) -> int:
    """Total elements of ``get_inputs()`` (drawn on the meta device)."""
    import torch

    from cuda_agent.profiler.program import Program

    prog = Program.from_source(source, name="opsynth_shrink_probe")
    total = 0
    for x in prog.make_inputs(device="meta"):
        if isinstance(x, torch.Tensor):
            total += x.numel()
    return total


def shrink_source(
    source: str, target_numel: int = 1 << 20, max_rounds: int = 12
) -> tuple[str, dict[str, list[int]]]:
    """``(source with halved size constants, {name: [old, new]})``; unchanged when small enough
    or when nothing can be halved. Raises what loading the source raises."""
    changed: dict[str, list[int]] = {}
    for _ in range(max_rounds):
        if input_numel(source) <= target_numel:
            break
        tree = ast.parse(source)
        consts = [(c, n) for c, n in _int_consts(tree) if c.value > 8]
        if not consts:
            break
        lines = source.splitlines(keepends=True)
        # edit from the end so earlier offsets stay valid
        for c, name in sorted(consts, key=lambda p: (p[0].lineno, p[0].col_offset), reverse=True):
            new = max(8, c.value // 2)
            ln = lines[c.lineno - 1]
            lines[c.lineno - 1] = ln[: c.col_offset] + str(new) + ln[c.end_col_offset :]
            changed.setdefault(name, [c.value, new])[1] = new
        source = "".join(lines)
    return source, changed
