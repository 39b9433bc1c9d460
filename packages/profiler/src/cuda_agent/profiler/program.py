"""KernelBench-format programs: load a reference source, build its model, draw its inputs.

A program defines ``class Model(nn.Module)``, ``get_inputs()`` and ``get_init_inputs()``; a
solution defines ``ModelNew`` with the same constructor arguments. Inputs are drawn on the target
device under a seeded generator (``torch.device`` as the default device), so multi-GB inputs are
not generated on the CPU and the same seed gives the same values.
"""

from __future__ import annotations

import ast
import re
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

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

    def make_model(
        self,
        device: str = "cpu",
        seed: int = 0,
        init_inputs: list[Any] | None = None,
        mode: str = "eval",
    ):
        """Instantiate the model with its init inputs under ``seed`` on ``device``, in ``mode``
        (:func:`set_mode`)."""
        import torch

        torch.manual_seed(seed)
        args = self.init_inputs() if init_inputs is None else init_inputs
        with torch.device(device):
            model = self.model_cls(*args)
        return set_mode(model.to(device), mode)

    def make_inputs(self, device: str = "cpu", seed: int = 0) -> list[Any]:
        """Call ``get_inputs()`` with ``device`` as default device and all RNGs seeded by ``seed``."""
        return make_inputs(self.module, device=device, seed=seed)


MODEL_MODES = ("eval", "train")


def set_mode(model: Any, mode: str) -> Any:
    """``model`` in module mode ``mode``: "eval" (``model.eval()``) or "train" (``model.train()``,
    the mode a module is constructed in); anything that is not an ``nn.Module`` unchanged."""
    import torch

    if mode not in MODEL_MODES:
        raise ValueError(f"model mode {mode!r}: one of {', '.join(MODEL_MODES)}")
    if not isinstance(model, torch.nn.Module):
        return model
    return model.train() if mode == "train" else model.eval()


# source text through which a forward reads the module mode without a mode-dependent submodule:
# the flag itself, or a functional call that takes it (random ones apart)
_MODE_FLAG = re.compile(r"\.training\b|\btraining\s*=")
_MODE_STATS_CALL = re.compile(r"\b(?:F|functional|torch)\.(?:batch_norm|instance_norm)\s*\(")
_MODE_RANDOM_CALL = re.compile(r"\b(?:F|functional|torch)\.(?:\w*dropout\w*|rrelu\w*)\s*\(")
# the module classes whose forward may read the mode, for a model not built on the meta device
_RANDOM_MODULES = re.compile(r"\b(?:\w*Dropout\w*|RReLU)\b")
_STATS_MODULES = re.compile(
    r"\b(?:\w*BatchNorm\w*|InstanceNorm\w*|LSTM|GRU|RNN|MultiheadAttention|Transformer\w*)\b"
)


class ModeDependence(msgspec.Struct):
    """How a program's output may depend on the module mode (train vs eval), with reasons.
    ``statistics``: it normalises with the batch's statistics in train mode (BatchNorm,
    InstanceNorm with running statistics) or reads the mode itself; ``random``: it draws random
    numbers in train mode (Dropout with p > 0, RReLU, an RNN's or attention's dropout)."""

    statistics: list[str] = []
    random: list[str] = []

    @property
    def matters(self) -> bool:
        """Whether train and eval mode may compute different outputs."""
        return bool(self.statistics or self.random)


def _has_dropout(mod: Any) -> bool:
    """A multi-layer RNN's dropout between layers, or an attention's dropout, is on."""
    from torch import nn

    if isinstance(mod, nn.RNNBase):
        return mod.dropout > 0 and mod.num_layers > 1
    return isinstance(mod, nn.MultiheadAttention) and mod.dropout > 0


def mode_dependence(source: str, name: str = "kb_mode_probe") -> ModeDependence:
    """How the output of the program ``source`` may differ between train and eval mode (nothing:
    it computes the same in both, so the mode it runs in does not matter). Conservative, and a
    function of the source and torch alone: the submodules of the model built on the meta
    device, the mode or a functional that takes it named in the source, and for a model that
    cannot be built on the meta device the mode-dependent module classes its source names."""
    import torch
    from torch import nn

    dep = ModeDependence()
    for pattern, into in (
        (_MODE_FLAG, dep.statistics),
        (_MODE_STATS_CALL, dep.statistics),
        (_MODE_RANDOM_CALL, dep.random),
    ):
        if m := pattern.search(source):
            into.append(f"the source: {m.group(0).strip()}")
    try:
        model = Program.from_source(source, name=name).make_model(device="meta")
    except Exception as e:  # noqa: BLE001 - judged from the source alone
        for pattern, into in ((_STATS_MODULES, dep.statistics), (_RANDOM_MODULES, dep.random)):
            if named := sorted(set(pattern.findall(source))):
                into.append(f"not built on meta ({type(e).__name__}); names {', '.join(named)}")
        return dep
    if not isinstance(model, torch.nn.Module):
        return dep
    norms = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)
    for path, mod in model.named_modules():
        what = f"{path or 'model'}: {type(mod).__name__}"
        if isinstance(mod, norms) and mod.track_running_stats:
            dep.statistics.append(f"{what} with running statistics")
        elif isinstance(mod, nn.modules.dropout._DropoutNd) and mod.p > 0:
            dep.random.append(f"{what}(p={mod.p})")
        elif isinstance(mod, nn.RReLU):
            dep.random.append(what)
        elif _has_dropout(mod):
            dep.random.append(f"{what}(dropout={mod.dropout})")
    return dep


def make_inputs(module: types.ModuleType, device: str = "cpu", seed: int = 0) -> list[Any]:
    """``module.get_inputs()`` drawn on ``device`` under ``seed``; tensors end up on ``device``."""
    import random

    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    with torch.device(device):
        inputs = list(module.get_inputs())
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
