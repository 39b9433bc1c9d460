"""KernelBench-format programs: load a reference source, build its model, draw its inputs.

A program defines ``class Model(nn.Module)``, ``get_inputs()`` and ``get_init_inputs()``; a
solution defines ``ModelNew`` with the same constructor arguments. Inputs are drawn on the target
device under a seeded generator (``torch.device`` as the default device), so multi-GB inputs are
not generated on the CPU and the same seed gives the same values.
"""

from __future__ import annotations

import ast
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


class ProgramError(ValueError):
    """A source that does not follow the KernelBench contract."""


def check_contract(source: str, required: Sequence[str] = REQUIRED_NAMES) -> list[str]:
    """Names of ``required`` that ``source`` does not define at module level (static, no exec).

    Raises :class:`ProgramError` when the source does not parse.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ProgramError(f"syntax error at line {e.lineno}: {e.msg}") from None
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    defined.add(t.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            for a in node.names:
                defined.add((a.asname or a.name).split(".")[0])
    return [n for n in required if n not in defined]


def load_module(
    source: str, name: str = "kb_program", filename: str | None = None
) -> types.ModuleType:
    """Execute ``source`` as a fresh module named ``name`` (registered in ``sys.modules``)."""
    mod = types.ModuleType(name)
    mod.__file__ = filename or f"<{name}>"
    sys.modules[name] = mod
    code = compile(source, mod.__file__, "exec")
    exec(code, mod.__dict__)  # noqa: S102 - running the program is the point
    return mod


@dataclass
class Program:
    """A loaded KernelBench-format module."""

    module: types.ModuleType
    model_cls: type

    @staticmethod
    def from_source(source: str, name: str = "kb_program", cls_name: str = "Model") -> Program:
        """Load ``source`` and check it defines ``cls_name``, ``get_inputs``, ``get_init_inputs``."""
        missing = check_contract(source, (cls_name, "get_inputs", "get_init_inputs"))
        if missing:
            raise ProgramError(f"missing {', '.join(missing)}")
        mod = load_module(source, name)
        return Program(module=mod, model_cls=getattr(mod, cls_name))

    def init_inputs(self) -> list[Any]:
        return list(self.module.get_init_inputs())

    def make_model(self, device: str = "cpu", seed: int = 0, init_inputs: list[Any] | None = None):
        """Instantiate the model with its init inputs under ``seed``, in eval mode on ``device``."""
        import torch

        torch.manual_seed(seed)
        args = self.init_inputs() if init_inputs is None else init_inputs
        with torch.device(device):
            model = self.model_cls(*args)
        return model.to(device).eval()

    def make_inputs(self, device: str = "cpu", seed: int = 0) -> list[Any]:
        """Call ``get_inputs()`` with ``device`` as default device and all RNGs seeded by ``seed``."""
        return make_inputs(self.module, device=device, seed=seed)


def make_inputs(module: types.ModuleType, device: str = "cpu", seed: int = 0) -> list[Any]:
    """``module.get_inputs()`` drawn on ``device`` under ``seed``; tensors end up on ``device``."""
    import random

    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    with torch.device(device):
        inputs = list(module.get_inputs())
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
