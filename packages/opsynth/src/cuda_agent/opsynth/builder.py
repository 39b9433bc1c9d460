"""Assemble a KernelBench-format program stage by stage, tracking shapes with meta tensors.

A :class:`Builder` collects module-level size constants, ``__init__`` parameters and lines,
``forward`` lines and ``get_inputs`` expressions, then renders one readable module::

    class Model(nn.Module): __init__(<init params>) / forward(x, ...)
    <size constants>
    def get_inputs(): ...
    def get_init_inputs(): ...

The running tensor in ``forward`` is always ``x``. After each stage the partial program is
executed on the ``meta`` device to learn the new shape of ``x`` (no memory, no compute), so the
next stage can adapt its arguments (channel counts, feature sizes, reshapes).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

# ----------------------------------------------------------------------------- sizes

SIZE_PRESETS: dict[str, dict[str, Any]] = {
    # eager forward of ~1-100 ms on an H100/H200-class GPU: calibrated so that the median
    # speed-of-light floor (datasheet H200) is close to Ops-6K's (~0.1 ms), see the README
    "gpu": {
        "batch": [128, 256, 512],
        "channels": [16, 32, 64, 128],
        "in_channels": [3, 8, 16, 32],
        "hw": [64, 128, 256],
        "len1d": [1024, 4096, 16384],
        "dhw": [16, 32, 48],
        "features": [1024, 2048, 4096, 8192],
        "seq": [256, 512, 1024],
        "embed": [512, 768, 1024],
        "heads": [8, 12, 16],
    },
    # a laptop CPU: a few ms to a few hundred ms per forward
    "cpu": {
        "batch": [8, 16, 32],
        "channels": [8, 16, 32],
        "in_channels": [3, 8, 16],
        "hw": [16, 32, 48],
        "len1d": [64, 128, 256],
        "dhw": [8, 12],
        "features": [128, 256, 512],
        "seq": [32, 64, 128],
        "embed": [64, 128, 256],
        "heads": [2, 4, 8],
    },
    # tests: sub-millisecond programs
    "tiny": {
        "batch": [2, 4],
        "channels": [4, 8],
        "in_channels": [3, 4],
        "hw": [8, 12],
        "len1d": [16, 32],
        "dhw": [4, 6],
        "features": [16, 32],
        "seq": [8, 16],
        "embed": [16, 32],
        "heads": [2, 4],
    },
}

# input families: the shape of the first input, as (constant name, size key) per dim
FAMILIES: dict[str, list[tuple[str, str]]] = {
    "matrix": [("batch_size", "batch"), ("in_features", "features")],
    "seq": [("batch_size", "batch"), ("seq_len", "seq"), ("embed_dim", "embed")],
    "image1d": [("batch_size", "batch"), ("in_channels", "in_channels"), ("length", "len1d")],
    "image2d": [
        ("batch_size", "batch"),
        ("in_channels", "in_channels"),
        ("height", "hw"),
        ("width", "hw"),
    ],
    "image3d": [
        ("batch_size", "batch"),
        ("in_channels", "in_channels"),
        ("depth", "dhw"),
        ("height", "dhw"),
        ("width", "dhw"),
    ],
}
RANK_FAMILIES = {2: ["matrix"], 3: ["seq", "image1d"], 4: ["image2d"], 5: ["image3d"]}


class NotApplicable(Exception):
    """A seed cannot follow the current shape (the composer then tries another seed)."""


@dataclass
class Dim:
    value: int
    name: str | None = None

    @property
    def expr(self) -> str:
        return self.name or str(self.value)


_IDENT = re.compile(r"[^a-z0-9_]+")


def snake(name: str) -> str:
    """``GroupNorm`` -> ``group_norm``; ``torch.cumsum`` -> ``cumsum``."""
    name = name.split(".")[-1]
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()
    s = _IDENT.sub("_", s).strip("_")
    return s or "op"


@dataclass
class Builder:
    """Mutable program under construction; see the module docstring."""

    rng: random.Random
    size: str = "gpu"
    consts: dict[str, Any] = field(default_factory=dict)
    init_params: list[str] = field(default_factory=list)
    init_lines: list[str] = field(default_factory=list)
    fwd_lines: list[str] = field(default_factory=list)
    inputs: list[tuple[str, str]] = field(default_factory=list)
    attrs: set[str] = field(default_factory=set)
    ops: list[str] = field(default_factory=list)
    hparams: list[dict[str, Any]] = field(default_factory=list)
    shape: list[Dim] = field(default_factory=list)
    imports: set[str] = field(default_factory=set)

    # ------------------------------------------------------------------ sizes and constants
    def pick(self, key: str) -> int:
        """A size drawn from the preset's list for ``key`` (e.g. ``"channels"``)."""
        return self.rng.choice(SIZE_PRESETS[self.size][key])

    def choice(self, seq: list[Any]) -> Any:
        return self.rng.choice(seq)

    def const(self, base: str, value: Any, init: bool = True) -> str:
        """Register a module-level constant; ``init`` also makes it an ``__init__`` parameter."""
        name = base
        i = 2
        while name in self.consts or name in ("x", "self"):
            if self.consts.get(name) == value and name in self.init_params and init:
                return name
            name = f"{base}_{i}"
            i += 1
        self.consts[name] = value
        if init:
            self.init_params.append(name)
        return name

    def attr(self, base: str, expr: str) -> str:
        """Add ``self.<attr> = expr`` to ``__init__``; returns the unique attribute name."""
        name = base
        i = 2
        while name in self.attrs:
            name = f"{base}{i}"
            i += 1
        self.attrs.add(name)
        self.init_lines.append(f"self.{name} = {expr}")
        return name

    def emit(self, line: str) -> None:
        self.fwd_lines.append(line)

    def extra_input(self, base: str, expr: str) -> str:
        """A further ``forward`` argument drawn by ``get_inputs`` with ``expr``."""
        names = {n for n, _ in self.inputs}
        name = base
        i = 2
        while name in names:
            name = f"{base}{i}"
            i += 1
        self.inputs.append((name, expr))
        return name

    def shape_expr(self, dims: list[Dim] | None = None) -> str:
        dims = self.shape if dims is None else dims
        return ", ".join(d.expr for d in dims)

    # ------------------------------------------------------------------ starting and adapting
    def start(self, family: str) -> None:
        """Create the first input ``x`` of ``family`` with named size constants."""
        dims = []
        drawn: dict[str, int] = {}  # spatial dims of one family share a size (square images)
        for cname, key in FAMILIES[family]:
            value = (
                drawn.setdefault(key, self.pick(key)) if key in ("hw", "dhw") else self.pick(key)
            )
            name = self.const(cname, value, init=False)
            dims.append(Dim(value, name))
        self.inputs.append(("x", f"torch.randn({self.shape_expr(dims)})"))
        self.shape = dims

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d.value
        return n

    def to_rank(self, rank: int) -> None:
        """Reshape ``x`` to ``rank`` dims keeping the batch dim (flatten or split the rest).

        Raises :class:`NotApplicable` when no sensible reshape exists.
        """
        if self.rank == rank:
            return
        if self.rank < 2:
            raise NotApplicable("scalar-like tensor")
        if rank == 2:
            self.emit("x = torch.flatten(x, 1)")
            self.update_shape()
            return
        rest = self.numel // self.shape[0].value
        if self.rank == 2 or rank > self.rank:
            # split features into (C, spatial...) : C * s^(rank-2)
            for s in (8, 6, 4, 2):
                spatial = s ** (rank - 2)
                if rest % spatial == 0 and rest // spatial >= 1:
                    dims = ", ".join(["-1", *[str(s)] * (rank - 2)])
                    self.emit(f"x = x.reshape(x.shape[0], {dims})")
                    self.update_shape()
                    return
            raise NotApplicable(f"cannot split {rest} features into rank {rank}")
        # rank < self.rank, rank >= 3: merge trailing dims
        self.emit(f"x = torch.flatten(x, {rank - 1})")
        self.update_shape()

    # ------------------------------------------------------------------ rendering
    def used_init_params(self) -> list[str]:
        """Constants that ``__init__`` uses, in order of first use (they become its parameters)."""
        text = "\n".join(self.init_lines)
        found = []
        for m in re.finditer(r"\b[A-Za-z_][A-Za-z0-9_]*\b", text):
            w = m.group(0)
            if w in self.consts and w not in found:
                found.append(w)
        return found

    def render(self, name: str, doc: str | None = None) -> str:
        """The whole module as source text."""
        fwd_args = ", ".join(["self"] + [n for n, _ in self.inputs])
        params = self.used_init_params()
        init_args = ", ".join(["self", *params])
        lines = ["import torch", "import torch.nn as nn", "import torch.nn.functional as F"]
        lines += sorted(self.imports)
        lines += ["", "", "class Model(nn.Module):"]
        lines.append(f'    """{doc or name.replace("_", " -> ")}."""')
        lines += ["", f"    def __init__({init_args}):", "        super().__init__()"]
        lines += [f"        {ln}" for ln in self.init_lines]
        lines += ["", f"    def forward({fwd_args}):"]
        lines += [f"        {ln}" for ln in self.fwd_lines]
        lines += ["        return x", "", ""]
        for k, v in self.consts.items():
            lines.append(f"{k} = {v!r}")
        lines += ["", "", "def get_inputs():"]
        lines.append(f"    return [{', '.join(e for _, e in self.inputs)}]")
        lines += ["", "", "def get_init_inputs():"]
        lines.append(f"    return [{', '.join(params)}]")
        return "\n".join(lines) + "\n"

    def meta_shape(self) -> list[int] | None:
        """Run the partial program on the ``meta`` device; the shape of ``x`` (None: not a tensor).

        Raises whatever the program raises (the caller treats it as :class:`NotApplicable`).
        """
        import torch

        from cuda_agent.profiler.program import Program

        prog = Program.from_source(self.render("probe"), name="opsynth_meta_probe")
        model = prog.make_model(device="meta")
        inputs = prog.make_inputs(device="meta")
        with torch.no_grad():
            out = model(*inputs)
        if not isinstance(out, torch.Tensor):
            return None
        return list(out.shape)

    def update_shape(self, names: dict[int, str] | None = None) -> None:
        """Set ``shape`` from a meta run, keeping dim names where values are unchanged."""
        new = self.meta_shape()
        if new is None:
            raise NotApplicable("output is not a tensor")
        old = self.shape
        names = names or {}
        dims = []
        for i, v in enumerate(new):
            nm = names.get(i)
            if nm is None and len(new) == len(old) and old[i].value == v:
                nm = old[i].name
            if nm is None and i == 0 and old and old[0].value == v:
                nm = old[0].name
            dims.append(Dim(v, nm))
        self.shape = dims
