"""Normalised views of a KernelBench-format source, for similarity and signatures.

- :func:`op_signature`: the ordered operators of ``forward`` (``self.conv(x)`` resolved through
  ``__init__`` to ``conv2d``; ``F.gelu``/``nn.GELU``/``torch.nn.functional.gelu`` all -> ``gelu``;
  ``a / b`` -> ``div``), each with its non-shape hyper-parameters (``kernel_size=3``,
  ``dim=1``, ``negative_slope=0.01``) resolved through module-level constants. Layout-only calls
  (view, reshape, flatten, contiguous, ...) are left out.
- :func:`code_tokens`: the tokens of ``Model.__init__`` and ``Model.forward`` with local names,
  attributes and numbers canonicalised (``v0``, ``a0``, ``NUM``) and import aliases expanded,
  so renaming variables or resizing a problem does not hide a copy.

Hyper-parameter extraction is a heuristic (a name or keyword that looks like kernel size,
stride, dim, eps, ... counts; channel and feature counts do not); see ``HP_NAME``.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import re
import tokenize
from typing import Any

LAYOUT = {
    "view",
    "reshape",
    "flatten",
    "contiguous",
    "squeeze",
    "unsqueeze",
    "size",
    "expand",
    "expand_as",
    "to",
    "float",
    "half",
    "clone",
    "detach",
    "permute",
    "view_as",
    "reshape_as",
    "type_as",
    "chunk",
    "split",
    "item",
    "dim",
    "numel",
    "super",
    "len",
    "range",
    "int",
    "tuple",
    "list",
    "getattr",
    "isinstance",
    "float32",
    "tensor",
    "zeros_like",
    "ones_like",
    "empty_like",
}
ALIASES = {
    "amax": "max",
    "amin": "min",
    "multiply": "mul",
    "divide": "div",
    "subtract": "sub",
    "truedivide": "div",
    "linear": "linear",
    "swish": "silu",
    "clip": "clamp",
    "vectornorm": "norm",
    "mm": "matmul",
    "bmm": "matmul",
    "einsum": "matmul",
    "addmm": "linear",
}
BINOPS = {
    ast.Add: "add",
    ast.Sub: "sub",
    ast.Mult: "mul",
    ast.Div: "div",
    ast.FloorDiv: "div",
    ast.Pow: "pow",
    ast.MatMult: "matmul",
    ast.Mod: "mod",
}
HP_NAME = re.compile(
    r"(kernel|stride|padding|dilation|groups|^dim$|dims|eps|slope|alpha|beta|^p$|prob|scale|"
    r"factor|mode|momentum|threshold|lambd|margin|delta|reduction|approximate|^min|^max|"
    r"value|heads|^k$|diagonal|shifts|causal|keepdim|divisor|constant)",
    re.I,
)
SHAPE_KW = re.compile(
    r"(channels|features|shape|embed_dim|hidden|(?<!kernel_)(?<!pool_)(?<!window_)size$|^num_features|^in_|^out_|vocab)",
    re.I,
)


def canon(name: str) -> str:
    """``ConvTranspose2d`` / ``conv_transpose2d`` -> ``convtranspose2d``; aliases folded."""
    n = name.lower().replace("_", "")
    return ALIASES.get(n, n)


def _module_consts(tree: ast.Module) -> dict[str, Any]:
    consts: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    with contextlib.suppress(ValueError, SyntaxError, TypeError):
                        consts[t.id] = ast.literal_eval(node.value)
                elif isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for a, b in zip(t.elts, node.value.elts, strict=False):
                        if isinstance(a, ast.Name):
                            with contextlib.suppress(ValueError, SyntaxError, TypeError):
                                consts[a.id] = ast.literal_eval(b)
    return consts


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> qualified torch name (``F`` -> ``torch.nn.functional``, ``max`` -> ``torch.max``)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _qualname(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _qualname(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _model_class(tree: ast.Module) -> ast.ClassDef | None:
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    for c in classes:
        if c.name == "Model":
            return c
    return classes[-1] if classes else None


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for n in cls.body:
        if isinstance(n, ast.FunctionDef) and n.name == name:
            return n
    return None


def _literal(node: ast.AST, consts: dict[str, Any], name_hint: str | None = None) -> Any:
    """Value of an argument when it is a hyper-parameter; ``None`` when it is not."""
    try:
        v = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        v = None
    if v is not None:
        if name_hint is not None:
            return v
        if isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool) and abs(v) <= 8):
            return v
        if isinstance(v, str | bool):
            return v
        return None
    if isinstance(node, ast.Name):
        if HP_NAME.search(node.id) and not SHAPE_KW.search(node.id):
            return consts.get(node.id, node.id)
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _literal(node.operand, consts, name_hint)
        return -inner if isinstance(inner, int | float) else None
    return None


_PARAMS: dict[str, list[str] | None] = {}
_TORCH_HEADS = {"torch", "nn", "F"}


def _param_names(qualname: str, imports: dict[str, str]) -> list[str] | None:
    """Parameter names of a torch class/function (``nn.Conv2d`` -> in_channels, ...), cached."""
    head, _, rest = qualname.partition(".")
    full = imports.get(head, head) + (f".{rest}" if rest else "")
    if not full.startswith("torch"):
        return None
    if full in _PARAMS:
        return _PARAMS[full]
    names: list[str] | None = None
    try:
        import importlib
        import inspect

        parts = full.split(".")
        obj: Any = importlib.import_module(parts[0])
        for part in parts[1:]:
            obj = getattr(obj, part)
        fn = obj.__init__ if inspect.isclass(obj) else obj
        names = [p for p in inspect.signature(fn).parameters if p not in ("self", "args", "kwargs")]
    except (ImportError, AttributeError, TypeError, ValueError):
        names = None
    _PARAMS[full] = names
    return names


def _hparams(
    call: ast.Call, consts: dict[str, Any], skip_first: bool, names: list[str] | None = None
) -> list[str]:
    """Non-shape hyper-parameters of a call as ``name=value`` strings.

    With ``names`` (the callee's parameter names) positional arguments are named by position;
    without them a positional argument counts when it looks like a hyper-parameter.
    """
    out = []
    start = 1 if skip_first else 0
    for i, a in enumerate(call.args[start:], start=start):
        if names is not None and i < len(names):
            pname = names[i]
            if SHAPE_KW.search(pname) or pname in ("input", "self"):
                continue
            v = _value(a, consts)
            if v is not None:
                out.append(f"{pname}={v}")
            continue
        v = _literal(a, consts)
        if v is not None:
            hint = a.id if isinstance(a, ast.Name) else ""
            out.append(f"{hint}={v}" if hint else repr(v))
    for kw in call.keywords:
        if kw.arg is None or SHAPE_KW.search(kw.arg):
            continue
        if names is None and not HP_NAME.search(kw.arg) and kw.arg not in ("bias", "affine"):
            continue
        v = _value(kw.value, consts)
        if v is not None:
            out.append(f"{kw.arg}={v}")
    return out


def _value(node: ast.AST, consts: dict[str, Any]) -> Any:
    """A literal, a module constant's value, or the name of an unresolved variable."""
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        pass
    if isinstance(node, ast.Name):
        return consts.get(node.id, node.id)
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return consts.get(node.attr, f"self.{node.attr}")
    return None


class _OpVisitor(ast.NodeVisitor):
    """Post-order walk of forward: operands first, then the operator (evaluation order)."""

    def __init__(self, attrs: dict[str, tuple[str, list[str]]], imports: dict[str, str], consts):
        self.attrs = attrs
        self.imports = imports
        self.consts = consts
        self.ops: list[tuple[str, list[str]]] = []

    def visit_BinOp(self, node: ast.BinOp) -> None:  # noqa: N802
        self.visit(node.left)
        self.visit(node.right)
        op = BINOPS.get(type(node.op))
        if op:
            self.ops.append((op, []))

    def visit_Call(self, node: ast.Call) -> None:  # noqa: N802
        f = node.func
        if isinstance(f, ast.Attribute) and not (
            isinstance(f.value, ast.Name) and f.value.id in ("self",) + tuple(self.imports)
        ):
            self.visit(f.value)  # method call: receiver first
        for a in node.args:
            self.visit(a)
        for kw in node.keywords:
            self.visit(kw.value)
        if isinstance(f, ast.Call):  # nn.Hardtanh(min_val=-1.0)(x): module built in forward
            inner = _qualname(f.func)
            if inner and canon(inner.split(".")[-1]) not in LAYOUT:
                names = _param_names(inner, self.imports)
                hp = _hparams(f, self.consts, False, names)
                self.ops.append((canon(inner.split(".")[-1]), hp))
            return
        qn = _qualname(f)
        if qn is None:
            return
        if qn.startswith("self."):
            attr = qn.split(".", 1)[1]
            if attr in self.attrs:
                name, hp = self.attrs[attr]
                if canon(name) not in LAYOUT:
                    self.ops.append((canon(name), hp))
            return
        head = qn.split(".")[0]
        leaf = qn.split(".")[-1]
        if head in self.imports or isinstance(f, ast.Attribute):
            if canon(leaf) in LAYOUT or leaf in LAYOUT:
                return
            is_method = isinstance(f, ast.Attribute) and head not in self.imports
            names = None if is_method else _param_names(qn, self.imports)
            hp = _hparams(node, self.consts, skip_first=not is_method, names=names)
            self.ops.append((canon(leaf), hp))


def _init_attrs(init: ast.FunctionDef | None, imports, consts) -> dict[str, tuple[str, list[str]]]:
    attrs: dict[str, tuple[str, list[str]]] = {}
    if init is None:
        return attrs
    for node in ast.walk(init):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for t in node.targets:
                qn = _qualname(t)
                if qn and qn.startswith("self."):
                    fq = _qualname(node.value.func) or ""
                    leaf = fq.split(".")[-1]
                    if leaf in ("Parameter", "register_buffer"):
                        continue
                    names = _param_names(fq, imports) if fq else None
                    hp = _hparams(node.value, consts, False, names)
                    attrs[qn.split(".", 1)[1]] = (leaf, hp)
    return attrs


def op_signature(source: str, hparams: bool = True) -> tuple[str, ...]:
    """Ordered canonical ops of ``Model.forward`` (with hyper-parameters when ``hparams``).

    Raises ``SyntaxError`` for sources that do not parse; ``()`` when there is no model class.
    """
    tree = ast.parse(source)
    cls = _model_class(tree)
    if cls is None:
        return ()
    consts = _module_consts(tree)
    imports = _imports(tree)
    attrs = _init_attrs(_method(cls, "__init__"), imports, consts)
    fwd = _method(cls, "forward")
    if fwd is None:
        return ()
    v = _OpVisitor(attrs, imports, consts)
    for stmt in fwd.body:
        v.visit(stmt)
    if hparams:
        return tuple(f"{n}({','.join(h)})" if h else n for n, h in v.ops)
    return tuple(n for n, _ in v.ops)


_BUILTINS = set(dir(builtins))


class _Canon(ast.NodeTransformer):
    """Rename locals to v0.., self attributes to a0.., numbers to NUM; expand import aliases."""

    def __init__(self, imports: dict[str, str]):
        self.imports = imports
        self.locals: dict[str, str] = {}
        self.attrs: dict[str, str] = {}

    def _alias(self, qn: str) -> str:
        head, _, rest = qn.partition(".")
        full = self.imports.get(head, head)
        full = full.replace("torch.nn.functional", "F").replace("torch.nn", "nn")
        return f"{full}.{rest}" if rest else full

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:  # noqa: N802
        qn = _qualname(node)
        if qn and qn.startswith("self.") and qn.count(".") == 1:
            a = self.attrs.setdefault(node.attr, f"a{len(self.attrs)}")
            return ast.copy_location(ast.Name(id=f"self_{a}", ctx=node.ctx), node)
        if qn and qn.split(".")[0] in self.imports:
            return ast.copy_location(ast.Name(id=self._alias(qn), ctx=node.ctx), node)
        self.generic_visit(node)
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:  # noqa: N802
        if node.id in self.imports:
            return ast.copy_location(ast.Name(id=self._alias(node.id), ctx=node.ctx), node)
        if node.id in ("self", "True", "False", "None") or node.id in _BUILTINS:
            return node
        v = self.locals.setdefault(node.id, f"v{len(self.locals)}")
        return ast.copy_location(ast.Name(id=v, ctx=node.ctx), node)

    def visit_arg(self, node: ast.arg) -> ast.AST:  # noqa: N802
        if node.arg != "self":
            node.arg = self.locals.setdefault(node.arg, f"v{len(self.locals)}")
        node.annotation = None
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:  # noqa: N802
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            node.args = []  # super(Model, self) == super()
        self.generic_visit(node)
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:  # noqa: N802
        if isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return ast.copy_location(ast.Name(id="NUM", ctx=ast.Load()), node)
        if isinstance(node.value, str) and len(node.value) > 30:  # docstrings, messages
            return ast.copy_location(ast.Constant(value=""), node)
        return node


def code_tokens(source: str) -> list[str]:
    """Canonical tokens of ``Model.__init__`` + ``Model.forward`` (whole module as fallback)."""
    tree = ast.parse(source)
    imports = _imports(tree)
    cls = _model_class(tree)
    parts: list[ast.AST] = []
    if cls is not None:
        for name in ("__init__", "forward"):
            m = _method(cls, name)
            if m is not None:
                m = ast.fix_missing_locations(m)
                first = m.body[0] if m.body else None
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    m.body = m.body[1:] or [ast.Pass()]  # docstring
                parts.append(m)
    if not parts:
        parts = [tree]
    canon_t = _Canon(imports)
    text = "\n".join(ast.unparse(canon_t.visit(p)) for p in parts)
    toks = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue
        if tok.type == tokenize.ENDMARKER or not tok.string:
            continue
        toks.append(tok.string)
    return toks
