"""The nested inputs and outputs of a model call: leaves (tensors above all) inside tuples,
lists and dicts. One walk for every package that looks inside them (guards, profiler, sandbox,
opsynth), so that all of them see the same leaves in the same order.

Order: tuples and lists in their order, dicts by ``str(key)`` (two calls that build the same
dict in different insertion orders give the same leaves). Imports torch only where it must tell
tensors apart (:func:`tensor_leaves`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

#: Elements per slice of a whole-tensor computation that would otherwise make a temporary as
#: large as the tensor (a cast to int64 or float64 doubles it: 16 GiB for KernelBench's 8 GiB
#: reduction inputs, which made honest kernels fail under a GPU share). 2**24 elements: at
#: most 128 MiB of float64 or int64 per slice.
SLICE_ELEMENTS = 1 << 24


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


def flat_slices(flat: Any, size: int = SLICE_ELEMENTS) -> Iterator[tuple[int, Any]]:
    """``(start, flat[start:start + size])`` over a one-dimensional tensor, in order: views,
    never copies, so a per-slice cast or float64 copy bounds the temporary to ``size``
    elements."""
    if size <= 0:
        raise ValueError("size must be positive")
    for start in range(0, flat.numel(), size):
        yield start, flat[start : start + size]
