"""Classification of ATen operator names: allocation, view/metadata, copy, random, compute.

Used by the runtime dispatch recorder and by the static C++ scan, so both agree on what
"allocation and metadata only" means.
"""

from __future__ import annotations

from typing import Literal

OpClass = Literal["alloc", "view", "copy", "random", "compute"]

ALLOC_OPS = frozenset(
    [
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "empty_permuted",
        "zeros",
        "zeros_like",
        "new_zeros",
        "zero_",
        "ones",
        "ones_like",
        "new_ones",
        "full",
        "full_like",
        "new_full",
        "fill_",
        "from_blob",
        "resize_",
        "scalar_tensor",
        "lift_fresh",
        "lift_fresh_copy",
        "record_stream",
    ]
)

VIEW_OPS = frozenset(
    [
        "view",
        "_unsafe_view",
        "reshape",
        "_reshape_alias",
        "as_strided",
        "expand",
        "expand_as",
        "permute",
        "transpose",
        "t",
        "unsqueeze",
        "squeeze",
        "select",
        "slice",
        "narrow",
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "alias",
        "detach",
        "view_as",
        "unflatten",
        "flatten",
        "movedim",
        "moveaxis",
        "swapaxes",
        "swapdims",
        "contiguous",
        "_local_scalar_dense",
        "item",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "size",
        "stride",
        "dim",
        "numel",
        "is_contiguous",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
        "is_nonzero",
        "storage_offset",
        "_nested_tensor_size",
        "view_as_real",
        "view_as_complex",
        "real",
        "imag",
        "conj",
        "_conj",
        "_neg_view",
        "_conj_physical",
        "resolve_conj",
        "resolve_neg",
        "unfold",
        "diagonal",
        "tensor_split",
        "hsplit",
        "vsplit",
        "dsplit",
        "ravel",
        "data_ptr",
        "sizes",
        "strides",
        "options",
        "dtype",
        "scalar_type",
        "device",
        "is_cuda",
        "is_cpu",
        "get_device",
        "layout",
        "element_size",
        "itemsize",
        "nbytes",
        "ndimension",
        "defined",
        "is_floating_point",
        "requires_grad",
        "mutable_data_ptr",
        "const_data_ptr",
    ]
)

COPY_OPS = frozenset(
    [
        "clone",
        "copy_",
        "_to_copy",
        "to",
        "_copy_from",
        "_copy_from_and_resize",
        "copy",
        "cpu",
        "cuda",
        "index_put_",
        "_index_put_impl_",
        "slice_scatter",
        "select_scatter",
    ]
)

RANDOM_OPS = frozenset(
    [
        "rand",
        "rand_like",
        "randn",
        "randn_like",
        "randint",
        "randint_like",
        "randperm",
        "normal",
        "normal_",
        "uniform_",
        "bernoulli",
        "bernoulli_",
        "random_",
        "exponential_",
        "geometric_",
        "cauchy_",
        "log_normal_",
        "multinomial",
        "dropout",
        "native_dropout",
    ]
)

# Namespaces of ops that belong to torch itself (anything else is a candidate-registered op).
TORCH_NAMESPACES = frozenset(
    [
        "aten",
        "prim",
        "prims",
        "_c10d_functional",
        "c10d",
        "profiler",
        "quantized",
        "_quantized",
        "debugprims",
        "inductor",
        "triton",
        "higher_order",
    ]
)

HALF_DTYPE_NAMES = frozenset(
    [
        "float16",
        "half",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
    ]
)


def base_name(op: str) -> str:
    """``aten.add.Tensor`` / ``aten::add`` / ``add.Tensor`` -> ``add``."""
    s = op.replace("::", ".")
    parts = s.split(".")
    if len(parts) >= 2 and parts[0] in TORCH_NAMESPACES:
        return parts[1]
    return parts[0]


def classify(name: str) -> OpClass:
    """The class of one ATen op name (base name, overload and namespace are stripped)."""
    n = base_name(name)
    if n in ALLOC_OPS:
        return "alloc"
    if n in VIEW_OPS:
        return "view"
    if n in COPY_OPS:
        return "copy"
    if n in RANDOM_OPS:
        return "random"
    return "compute"


def aten_op_names() -> frozenset[str]:
    """Base names of every operator registered with the dispatcher (needs torch)."""
    import torch

    names = set()
    for full in torch._C._dispatch_get_all_op_names():
        ns, _, rest = full.partition("::")
        if ns == "aten":
            names.add(rest.split(".")[0])
    return frozenset(names)
