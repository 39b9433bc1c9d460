"""The one walk over nested model inputs and outputs (records.nested)."""

import torch

from cuda_agent.records.nested import leaves, map_leaves, tensor_leaves


def test_leaves_order_and_dicts_by_key():
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    obj = (a, [1, {"z": c, "b": b}], "s")
    assert [x if not isinstance(x, torch.Tensor) else float(x) for x in leaves(obj)] == [
        0.0, 1, 1.0, 2.0, "s",
    ]  # fmt: skip
    assert leaves({"b": 1, "a": 2}) == leaves({"a": 2, "b": 1}) == [2, 1]
    assert [float(t) for t in tensor_leaves(obj)] == [0.0, 1.0, 2.0]
    assert leaves(a) == [a] and tensor_leaves(3) == []


def test_map_leaves_keeps_the_structure():
    obj = (1, [2, {"k": 3, "a": (4,)}])
    got = map_leaves(obj, lambda x: x * 10)
    assert got == (10, [20, {"k": 30, "a": (40,)}])
    assert isinstance(got, tuple) and isinstance(got[1], list)
    assert list(got[1][1]) == ["k", "a"]  # a dict keeps its own key order
