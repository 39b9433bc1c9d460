"""The nested inputs and outputs of a model call: leaves (tensors above all) inside tuples,
lists and dicts. One walk for every package that looks inside them (guards, profiler, sandbox,
opsynth), so that all of them see the same leaves in the same order.

Order: tuples and lists in their order, dicts by ``str(key)`` (two calls that build the same
dict in different insertion orders give the same leaves). Imports torch only where it must tell
tensors apart (:func:`tensor_leaves`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def leaves(obj: Any) -> list[Any]:
    """Every leaf of ``obj`` (anything that is not a tuple, list or dict), in walk order."""
    if isinstance(obj, tuple | list):
        return [x for o in obj for x in leaves(o)]
    if isinstance(obj, dict):
        return [x for k in sorted(obj, key=str) for x in leaves(obj[k])]
    return [obj]


def tensor_leaves(obj: Any) -> list[Any]:
    """The ``torch.Tensor`` leaves of ``obj``, in walk order."""
    import torch

    return [x for x in leaves(obj) if isinstance(x, torch.Tensor)]


def map_leaves(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """``obj`` with every leaf replaced by ``fn(leaf)``: tuples stay tuples, lists lists, dicts
    dicts (with their keys in their own order)."""
    if isinstance(obj, list):
        return [map_leaves(x, fn) for x in obj]
    if isinstance(obj, tuple):
        return tuple(map_leaves(x, fn) for x in obj)
    if isinstance(obj, dict):
        return {k: map_leaves(v, fn) for k, v in obj.items()}
    return fn(obj)
