"""Static checks on the candidate's Python (``model_new.py``) through its AST.

What it finds: imports and calls of forbidden facilities (threads, timers, files, network,
dynamic code, introspection), monkeypatching, torch compute reachable from ``forward``, try/except
fallbacks, precision downcasts, RNG seeding, access to the reference. It also extracts the C++/CUDA
strings passed to ``load_inline`` (resolving names, concatenations and constant f-strings) and
the names of Triton kernels, for the C-side scan and for the runtime's kernel tracing.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field

from .checks import Findings
from .cstatic import CSource, aten_names
from .opclass import HALF_DTYPE_NAMES, classify

# top-level module -> (code, severity or None for policy default); None code = allowed
_MODULES: dict[str, tuple[str | None, str | None]] = {}


def _mods(code: str | None, names: str, severity: str | None = None) -> None:
    for n in names.split():
        _MODULES[n] = (code, severity)


_mods(
    None,
    """torch triton math typing typing_extensions __future__ functools itertools
    collections dataclasses enum abc numbers operator warnings contextlib copy re string textwrap
    logging os pathlib json""",
)
_mods(
    "G-THREAD",
    "threading _thread concurrent multiprocessing asyncio subprocess sched signal queue selectors",
)
_mods("G-TIMER-PATCH", "time timeit", "flag")
_mods("G-INTROSPECTION", "inspect gc traceback dis faulthandler tracemalloc sys", "flag")
_mods("G-INTROSPECTION", "trace")
_mods(
    "G-DYNAMIC-CODE",
    """importlib runpy pickle marshal dill cloudpickle shelve ctypes cffi code
    codeop zipimport imp _pickle joblib""",
)
_mods("G-FILE-IO", "shutil tempfile glob h5py io mmap fileinput", "flag")
_mods(
    "G-NETWORK",
    """socket ssl urllib urllib2 urllib3 http requests httpx aiohttp ftplib smtplib
    telnetlib xmlrpc websocket websockets paramiko grpc""",
)
_mods(
    "G-LIBRARY",
    """numpy scipy cupy jax jaxlib tensorflow apex xformers flash_attn
    transformer_engine cutlass cuda pycuda numba taichi tilelang thunderkittens tvm onnx
    onnxruntime sklearn einops timm torchvision liger_kernel bitsandbytes deepspeed megatron vllm
    flashinfer sgl_kernel mamba_ssm causal_conv1d cuda_python nvmath cudnn""",
)
_mods("G-REFERENCE", "model reference kernelbench utils verification profiling")
_mods("G-RNG", "random")
_mods("G-CACHE-HINT", "hashlib weakref", "flag")
_mods("G-ENV", "platform getpass", "flag")

_TIMING_NAMES = frozenset(
    [
        "perf_counter",
        "perf_counter_ns",
        "time",
        "time_ns",
        "monotonic",
        "monotonic_ns",
        "process_time",
        "process_time_ns",
        "thread_time",
        "sleep",
        "synchronize",
        "Event",
        "elapsed_time",
        "record",
        "query",
        "wait",
        "Stream",
        "current_stream",
        "default_stream",
        "do_bench",
        "Timer",
        "cudaEventElapsedTime",
        "get_time",
        "benchmark",
    ]
)
_TORCH_NONCOMPUTE = frozenset(
    [
        "empty",
        "empty_like",
        "empty_strided",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "full",
        "full_like",
        "Size",
        "device",
        "dtype",
        "no_grad",
        "inference_mode",
        "is_tensor",
        "numel",
        "tensor",
        "as_tensor",
        "from_numpy",
        "is_grad_enabled",
        "float32",
        "float64",
        "float",
        "int32",
        "int64",
        "long",
        "int",
        "bool",
        "uint8",
        "int8",
        "int16",
        "get_default_dtype",
        "is_floating_point",
        "Tensor",
        "Generator",
        "set_grad_enabled",
        "enable_grad",
    ]
)
_PY_METHOD_EXCLUDE = frozenset(
    [
        "add",
        "sort",
        "index",
        "values",
        "copy",
        "split",
        "round",
        "conj",
        "real",
        "imag",
        "pop",
        "insert",
        "count",
        "update",
        "get",
        "fill",
        "view",
        "any",
        "all",
        "clear",
        "remove",
        "append",
        "extend",
        "keys",
        "items",
        "join",
        "format",
        "replace",
        "strip",
        "startswith",
        "endswith",
        "encode",
        "decode",
        "lower",
        "upper",
        "find",
        "lstrip",
        "rstrip",
        "partition",
        "setdefault",
        "reverse",
        "max",
        "min",
        "abs",
        "where",
        "to",
        "item",
        "size",
        "numel",
        "type",
    ]
)
_FRAME_ATTRS = frozenset(
    [
        "f_back",
        "f_locals",
        "f_globals",
        "f_code",
        "tb_frame",
        "tb_next",
        "gi_frame",
        "cr_frame",
        "__globals__",
        "__code__",
        "__closure__",
        "__builtins__",
        "__subclasses__",
        "__subclasshook__",
        "f_trace",
    ]
)


@dataclass
class PyScanResult:
    """What the Python scan extracted besides findings."""

    c_sources: list[CSource] = field(default_factory=list)
    inline_functions: list[str] = field(default_factory=list)  # load_inline functions=[...]
    inline_modules: list[str] = field(default_factory=list)  # load_inline/load name=
    source_files: list[str] = field(default_factory=list)  # load(sources=[...]) paths
    triton_kernels: list[str] = field(default_factory=list)
    has_model_new: bool = False


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if isinstance(node, ast.Call):
        inner = _dotted(node.func)
        if inner is not None:
            parts.append(inner + "()")
            return ".".join(reversed(parts))
    return None


class _Scope:
    """Import aliases and module-level constant assignments of one file."""

    def __init__(self, tree: ast.Module):
        self.alias: dict[str, str] = {}
        self.assigns: dict[str, ast.AST] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.alias[a.asname] = a.name
                    else:
                        top = a.name.split(".")[0]
                        self.alias[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    self.alias[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.assigns[t.id] = node.value
            elif (
                isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value
            ):
                self.assigns[node.target.id] = node.value

    def resolve(self, node: ast.AST) -> str | None:
        """Fully qualified dotted name of an expression like ``F.relu`` (through import aliases)."""
        d = _dotted(node)
        if d is None:
            return None
        head, _, rest = d.partition(".")
        if head in self.alias:
            full = self.alias[head]
            return f"{full}.{rest}" if rest else full
        return d

    def is_module_root(self, name: str) -> bool:
        return name in self.alias or name in ("builtins", "__builtins__")

    def strings(self, node: ast.AST | None, depth: int = 0) -> list[str] | None:
        """Constant string value(s) of an expression; ``None`` when not statically known."""
        if node is None or depth > 20:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Constant) and node.value is None:
            return []
        if isinstance(node, ast.List | ast.Tuple):
            out: list[str] = []
            for e in node.elts:
                v = self.strings(e, depth + 1)
                if v is None:
                    return None
                out += v
            return out
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            a, b = self.strings(node.left, depth + 1), self.strings(node.right, depth + 1)
            if a is None or b is None:
                return None
            if isinstance(node.left, ast.List | ast.Tuple):
                return a + b
            return ["".join(a) + "".join(b)]
        if isinstance(node, ast.JoinedStr):
            out_s = ""
            for v in node.values:
                if isinstance(v, ast.Constant):
                    out_s += str(v.value)
                elif isinstance(v, ast.FormattedValue):
                    inner = self.strings(v.value, depth + 1)
                    if inner is None:
                        c = self._const(v.value)
                        if c is None:
                            return None
                        inner = [str(c)]
                    out_s += "".join(inner)
            return [out_s]
        if isinstance(node, ast.Name) and node.id in self.assigns:
            return self.strings(self.assigns[node.id], depth + 1)
        if isinstance(node, ast.Call):
            fn = self.resolve(node.func) or ""
            if fn.endswith("dedent") or fn.endswith("strip") and node.args:
                return self.strings(node.args[0] if node.args else None, depth + 1)
            if isinstance(node.func, ast.Attribute) and node.func.attr in (
                "strip",
                "lstrip",
                "rstrip",
            ):
                return self.strings(node.func.value, depth + 1)
            if isinstance(node.func, ast.Attribute) and node.func.attr == "join" and node.args:
                sep = self.strings(node.func.value, depth + 1)
                parts = self.strings(node.args[0], depth + 1)
                if sep is None or parts is None:
                    return None
                return ["".join(sep).join(parts)]
        return None

    def _const(self, node: ast.AST) -> object | None:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name) and node.id in self.assigns:
            v = self.assigns[node.id]
            return v.value if isinstance(v, ast.Constant) else None
        return None


def _func_defs(tree: ast.Module) -> dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]:
    defs: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            defs.setdefault(node.name, []).append(node)
    return defs


def _reachable(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Functions reachable from any ``forward`` method by name (calls and ``Function.apply``)."""
    defs = _func_defs(tree)
    todo = list(defs.get("forward", []))
    seen: set[int] = set()
    out = []
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        out.append(f)
        for node in ast.walk(f):
            if not isinstance(node, ast.Call):
                continue
            name = None
            if isinstance(node.func, ast.Name):
                name = node.func.id
            elif isinstance(node.func, ast.Attribute):
                name = node.func.attr
                if name == "apply":
                    name = "forward"
            if name and name in defs and name != "__init__":
                todo.extend(defs[name])
            # classes instantiated or called: their __call__/forward
    return out


def _last_name(func: ast.AST, resolved: str) -> str:
    """The called name: last part of the resolved name, or the attribute of ``x[...].name``."""
    if resolved:
        return resolved.split(".")[-1]
    return func.attr if isinstance(func, ast.Attribute) else ""


def _module_attrs(tree: ast.Module, scope: _Scope) -> dict[str, str]:
    """``self.X`` attributes assigned a torch.nn module constructor in any method."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            fn = scope.resolve(node.value.func) or ""
            if not fn.startswith("torch.nn.") or fn.split(".")[-1] in (
                "Parameter",
                "ParameterList",
                "ParameterDict",
                "Buffer",
                "Identity",
            ):
                continue
            for t in node.targets:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    out[t.attr] = fn
    return out


def scan_python(
    source: str,
    where: str,
    fs: Findings,
    float32_task: bool = True,
    own_modules: tuple[str, ...] = (),
) -> PyScanResult:
    """Run every Python rule on one file; return the sources and kernel names it defines."""
    res = PyScanResult()
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        fs.add("G-OPAQUE-SOURCE", f"{where}: does not parse (line {e.lineno}: {e.msg})", "")
        return res
    scope = _Scope(tree)
    res.has_model_new = any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)
    _imports(tree, where, fs, own_modules)
    _extract_sources(tree, scope, where, fs, res)
    reach = _reachable(tree)
    reach_ids = {id(n) for f in reach for n in ast.walk(f)}
    _calls_and_attrs(tree, scope, where, fs, float32_task, reach_ids)
    _assignments(tree, scope, where, fs, float32_task)
    _forward_rules(tree, scope, reach, where, fs, res)
    _fallbacks(tree, scope, reach, where, fs)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for b in node.bases:
                full = scope.resolve(b) or ""
                if full in ("torch.Tensor", "torch._C.TensorBase", "torch._C._TensorBase"):
                    fs.add(
                        "G-OUTPUT-TYPE",
                        f"{where}: class {node.name} subclasses {full}",
                        f"line {node.lineno}",
                    )
    return res


def _imports(tree: ast.Module, where: str, fs: Findings, own: tuple[str, ...]) -> None:
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level and node.level > 0:
                continue
            names = [node.module or ""]
            if node.module in ("time", "timeit"):
                names = [f"{node.module}.{a.name}" for a in node.names]
        for full in names:
            top = full.split(".")[0]
            line = f"line {node.lineno}: import {full}"
            if top in own:
                continue
            if top == "torch":
                _torch_import(full, where, fs, line)
                continue
            hit = _MODULES.get(top)
            if hit is None:
                if top in stdlib:
                    fs.add(
                        "G-LIBRARY", f"{where}: imports stdlib module {top}", line, severity="flag"
                    )
                else:
                    fs.add(
                        "G-LIBRARY", f"{where}: imports unknown module {top}", line, severity="flag"
                    )
                continue
            code, sev = hit
            if code is None:
                continue
            fs.add(code, f"{where}: imports {full}", line, severity=sev)  # type: ignore[arg-type]


def _torch_import(full: str, where: str, fs: Findings, line: str) -> None:
    if full.startswith(
        ("torch._dynamo", "torch._inductor", "torch.jit", "torch.compiler", "torch.fx")
    ):
        fs.add("G-TORCH-COMPILE", f"{where}: imports {full}", line)
    elif full.startswith(
        (
            "torch.utils._python_dispatch",
            "torch.overrides",
            "torch.profiler",
            "torch.autograd.profiler",
            "torch._C",
        )
    ):
        fs.add("G-INTROSPECTION", f"{where}: imports {full}", line)
    elif full.startswith(("torch.utils.benchmark", "torch.cuda.nvtx")):
        fs.add("G-TIMER-PATCH", f"{where}: imports {full}", line, severity="flag")
    elif full.startswith("torch.multiprocessing") or full.startswith("torch.distributed"):
        fs.add("G-THREAD", f"{where}: imports {full}", line)
    elif full.startswith("torch.cuda.amp") or full.startswith("torch.amp"):
        fs.add("G-PRECISION", f"{where}: imports {full}", line, severity="flag")


def _extract_sources(
    tree: ast.Module, scope: _Scope, where: str, fs: Findings, res: PyScanResult
) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
            (scope.resolve(d.func if isinstance(d, ast.Call) else d) or "").startswith("triton")
            and (scope.resolve(d.func if isinstance(d, ast.Call) else d) or "").split(".")[-1]
            in ("jit", "autotune", "heuristics")
            for d in node.decorator_list
        ):
            res.triton_kernels.append(node.name)
        if not isinstance(node, ast.Call):
            continue
        fn = scope.resolve(node.func) or ""
        last = _last_name(node.func, fn)
        if last not in ("load_inline", "load", "compile_source") or (
            last == "load" and "cpp_extension" not in fn
        ):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        pos = list(node.args)
        names = (
            ["name", "cpp_sources", "cuda_sources", "functions"]
            if last == "load_inline"
            else ["name", "sources"]
        )
        for k, v in zip(names, pos, strict=False):
            kw.setdefault(k, v)
        name = scope.strings(kw.get("name"))
        if name:
            res.inline_modules.append(name[0])
        if last == "load_inline":
            for arg in ("cpp_sources", "cuda_sources", "sycl_sources"):
                if arg not in kw:
                    continue
                vals = scope.strings(kw[arg])
                if vals is None:
                    fs.add(
                        "G-OPAQUE-SOURCE",
                        f"{where}: load_inline({arg}=...) is not a constant string",
                        f"line {node.lineno}",
                    )
                    continue
                for k, text in enumerate(vals):
                    res.c_sources.append(CSource(f"{where}:{arg}[{k}]", text))
            funcs = scope.strings(kw.get("functions"))
            if funcs:
                res.inline_functions += funcs
        else:
            vals = scope.strings(kw.get("sources"))
            if vals is None:
                fs.add(
                    "G-OPAQUE-SOURCE",
                    f"{where}: load(sources=...) is not constant",
                    f"line {node.lineno}",
                )
            else:
                res.source_files += vals


def _calls_and_attrs(
    tree: ast.Module, scope: _Scope, where: str, fs: Findings, f32: bool, reach_ids: set[int]
) -> None:
    for node in ast.walk(tree):
        line = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and node.attr in _FRAME_ATTRS:
            fs.add("G-INTROSPECTION", f"{where}: accesses .{node.attr}", line)
        if isinstance(node, ast.Name) and node.id in ("__builtins__",):
            fs.add("G-INTROSPECTION", f"{where}: uses {node.id}", line)
        if isinstance(node, ast.Attribute | ast.Name):
            full = scope.resolve(node) or ""
            _attribute_rules(full, where, fs, line, f32)
        if not isinstance(node, ast.Call):
            continue
        fn = scope.resolve(node.func) or ""
        last = _last_name(node.func, fn)
        if isinstance(node.func, ast.Name):
            b = node.func.id
            if (
                b in ("exec", "eval", "compile", "__import__", "breakpoint")
                and b not in scope.assigns
            ):
                fs.add("G-DYNAMIC-CODE", f"{where}: calls {b}()", line)
            elif b in ("globals", "vars", "locals"):
                fs.add("G-INTROSPECTION", f"{where}: calls {b}()", line, severity="flag")
            elif b in ("setattr", "delattr") and node.args:
                target = scope.resolve(node.args[0]) or ""
                root = target.split(".")[0]
                if scope.is_module_root(root) or root in ("torch", "time", "sys", "builtins"):
                    attr = scope.strings(node.args[1]) if len(node.args) > 1 else None
                    name = attr[0] if attr else "?"
                    code = "G-TIMER-PATCH" if name in _TIMING_NAMES else "G-HARNESS-PATCH"
                    fs.add(code, f"{where}: {b}({target}, {name!r})", line)
            elif b == "getattr" and len(node.args) > 1 and scope.strings(node.args[1]) is None:
                target = scope.resolve(node.args[0]) or ""
                if scope.is_module_root(target.split(".")[0]):
                    fs.add(
                        "G-DYNAMIC-CODE",
                        f"{where}: getattr({target}, <computed name>)",
                        line,
                        severity="flag",
                    )
            elif b == "open":
                _open_rule(node, scope, where, fs, line)
            elif b in ("id", "hash"):
                fs.add("G-CACHE-HINT", f"{where}: calls {b}()", line)
        if fn.startswith("os.") or fn.startswith("posix."):
            _os_rule(fn, where, fs, line)
        if fn.startswith(("pathlib.", "Path")) or last in (
            "write_text",
            "write_bytes",
            "unlink",
            "rmdir",
            "symlink_to",
        ):
            if last in (
                "write_text",
                "write_bytes",
                "unlink",
                "rmdir",
                "symlink_to",
                "touch",
                "chmod",
                "rename",
                "replace",
                "mkdir",
                "hardlink_to",
            ):
                fs.add("G-FILE-IO", f"{where}: {fn or last}()", line)
            elif last in ("read_text", "read_bytes", "open", "iterdir", "glob", "rglob"):
                fs.add("G-FILE-IO", f"{where}: {fn}()", line, severity="flag")
        if fn in (
            "torch.load",
            "torch.save",
            "numpy.load",
            "numpy.save",
            "numpy.fromfile",
            "torch.from_file",
            "torch.UntypedStorage.from_file",
            "torch.hub.load",
        ):
            fs.add("G-FILE-IO", f"{where}: {fn}()", line)
        if (
            fn
            in (
                "torch.manual_seed",
                "torch.seed",
                "torch.cuda.manual_seed",
                "torch.cuda.manual_seed_all",
                "torch.random.manual_seed",
                "numpy.random.seed",
                "random.seed",
                "torch.set_rng_state",
                "torch.cuda.set_rng_state",
            )
            or last == "manual_seed"
        ):
            fs.add("G-RNG", f"{where}: {fn or last}()", line)
        if fn in (
            "torch.compile",
            "torch.jit.script",
            "torch.jit.trace",
            "torch.cuda.jiterator._create_jit_fn",
        ):
            fs.add("G-TORCH-COMPILE", f"{where}: {fn}()", line)
        if fn == "torch.set_float32_matmul_precision":
            val = scope.strings(node.args[0]) if node.args else None
            if f32 and (val is None or val != ["highest"]):
                fs.add("G-PRECISION", f"{where}: torch.set_float32_matmul_precision({val})", line)
        if (
            fn
            in (
                "torch.autocast",
                "torch.cuda.amp.autocast",
                "torch.amp.autocast",
                "torch.cpu.amp.autocast",
            )
            and f32
        ):
            fs.add("G-PRECISION", f"{where}: {fn}()", line)
        if fn in ("torch.use_deterministic_algorithms", "torch.set_deterministic_debug_mode") or (
            fn.startswith("torch._C._set_") or fn.startswith("torch._C._jit_set")
        ):
            fs.add("G-HARNESS-PATCH", f"{where}: {fn}() changes global torch state", line)
        if (
            last in ("half", "bfloat16")
            and isinstance(node.func, ast.Attribute)
            and f32
            and not node.args
        ):
            fs.add("G-PRECISION", f"{where}: .{last}() on a float32 task", line)
        if last in ("to", "type", "view") and isinstance(node.func, ast.Attribute) and f32:
            for a in list(node.args) + [k.value for k in node.keywords]:
                dn = (scope.resolve(a) or "").split(".")[-1]
                if dn in HALF_DTYPE_NAMES and (scope.resolve(a) or "").startswith("torch"):
                    fs.add("G-PRECISION", f"{where}: .{last}(torch.{dn}) on a float32 task", line)
        if f32 and any(
            k.arg in ("dtype",)
            and (scope.resolve(k.value) or "").split(".")[-1] in HALF_DTYPE_NAMES
            for k in node.keywords
        ):
            fs.add("G-PRECISION", f"{where}: dtype=half/bfloat16 on a float32 task", line)
        if f32 and last == "dot" and fn.startswith("triton"):
            kws = {k.arg: k.value for k in node.keywords}
            prec = scope.strings(kws.get("input_precision")) if "input_precision" in kws else None
            tf32 = kws.get("allow_tf32")
            if (prec and prec[0] in ("tf32", "tf32x3", "bf16x3")) or (
                isinstance(tf32, ast.Constant) and tf32.value is True
            ):
                fs.add("G-PRECISION", f"{where}: tl.dot with TF32 inputs on a float32 task", line)
            elif prec is None and tf32 is None:
                fs.add(
                    "G-PRECISION",
                    f"{where}: tl.dot without input_precision='ieee' uses TF32 on float32",
                    line,
                    severity="flag",
                )
        if (
            isinstance(node.func, ast.Name)
            and node.func.id in ("get_inputs", "get_init_inputs", "Model")
            and id(node) in reach_ids
        ):
            fs.add("G-REFERENCE", f"{where}: calls {node.func.id}() from forward", line)
        if last in ("tobytes", "untyped_storage", "_cdata") and id(node) in reach_ids:
            fs.add("G-CACHE-HINT", f"{where}: .{last}() in forward", line)
        if last in ("lru_cache", "cache") and fn.startswith("functools"):
            fs.add("G-CACHE-HINT", f"{where}: functools.{last}", line)
        if last in ("wait_stream", "wait_event", "record_event", "record_stream") and isinstance(
            node.func, ast.Attribute
        ):
            fs.add("G-STREAM", f"{where}: .{last}()", line)


def _attribute_rules(full: str, where: str, fs: Findings, line: str, f32: bool) -> None:
    if not full:
        return
    parts = full.split(".")
    if (
        full.startswith("torch.cuda.")
        or full.startswith("torch.")
        and parts[-1] in ("Stream", "Event")
    ):
        last = parts[-1]
        if last in (
            "Stream",
            "stream",
            "Event",
            "set_stream",
            "ExternalStream",
            "StreamContext",
            "_set_stream_by_id",
            "Event.elapsed_time",
        ) and (len(parts) >= 2 and parts[-2] in ("cuda", "torch", "Event")):
            fs.add("G-STREAM", f"{where}: {full}", line)
        elif last in (
            "graph",
            "CUDAGraph",
            "make_graphed_callables",
            "graph_pool_handle",
            "graphs",
        ):
            fs.add("G-GRAPH", f"{where}: {full}", line)
        elif last in ("is_current_stream_capturing",):
            fs.add("G-INTROSPECTION", f"{where}: {full}", line, severity="flag")
    if parts[0] == "sys" and len(parts) > 1:
        if parts[1] in (
            "_getframe",
            "settrace",
            "setprofile",
            "gettrace",
            "getprofile",
            "modules",
            "_current_frames",
            "call_tracing",
            "meta_path",
            "path_hooks",
            "audit",
            "addaudithook",
            "_clear_type_cache",
            "setswitchinterval",
        ):
            fs.add("G-INTROSPECTION", f"{where}: {full}", line)
        elif parts[1] in ("argv", "orig_argv", "executable"):
            fs.add("G-ENV", f"{where}: {full}", line)
    if parts[0] in ("inspect", "gc", "traceback") and len(parts) > 1:
        fs.add("G-INTROSPECTION", f"{where}: {full}", line)
    if parts[0] in ("time", "timeit") and len(parts) > 1:
        fs.add("G-TIMER-PATCH", f"{where}: uses {full}", line, severity="flag")
    if full.startswith(
        (
            "torch.utils._python_dispatch",
            "torch.overrides",
            "torch._C._len_torch",
            "torch._C._get_dispatch",
            "torch._C._is_torch_function",
            "torch.profiler",
            "torch.autograd.profiler",
            "torch._C._autograd",
            "torch._C._get_function_stack",
            "torch._C._dispatch_tls",
            "torch._C._get_dispatch_mode",
        )
    ):
        fs.add("G-INTROSPECTION", f"{where}: {full}", line)
    elif (
        full.startswith("torch._C.")
        or full.startswith("torch._dynamo")
        or full.startswith("torch._inductor")
    ):
        code = "G-TORCH-COMPILE" if "_dynamo" in full or "_inductor" in full else "G-INTROSPECTION"
        fs.add(
            code, f"{where}: {full}", line, severity=None if code == "G-TORCH-COMPILE" else "flag"
        )
    if parts[0] in ("importlib", "runpy", "pickle", "marshal", "ctypes", "cffi") and len(parts) > 1:
        fs.add("G-DYNAMIC-CODE", f"{where}: {full}", line)
    if full in ("types.FunctionType", "types.CodeType", "types.ModuleType"):
        fs.add("G-DYNAMIC-CODE", f"{where}: {full}", line)
    if full.startswith(
        (
            "threading.",
            "_thread.",
            "concurrent.",
            "multiprocessing.",
            "asyncio.",
            "subprocess.",
            "torch.multiprocessing.",
        )
    ):
        fs.add("G-THREAD", f"{where}: {full}", line)
    if full.startswith(("socket.", "urllib.", "http.", "requests.", "httpx.")):
        fs.add("G-NETWORK", f"{where}: {full}", line)
    if full in ("os.environ", "os.getenv", "os.putenv", "os.environb", "os.unsetenv"):
        fs.add("G-ENV", f"{where}: {full}", line)
    if full.startswith("torch.ops.load_library") or full == "torch.classes.load_library":
        fs.add("G-DYNAMIC-CODE", f"{where}: {full}", line, severity="flag")
    if full.startswith("torch.ops.aten.") and len(parts) >= 4:
        op = parts[3]
        if classify(op) == "compute":
            fs.add("G-TORCH-COMPUTE", f"{where}: {full}", line, severity="flag")
    if f32 and full in (
        "torch.backends.cuda.matmul.allow_tf32",
        "torch.backends.cudnn.allow_tf32",
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
    ):
        pass  # judged where it is assigned
    if parts[0] == "random" and len(parts) > 1:
        fs.add("G-RNG", f"{where}: {full}", line)
    if full.startswith("numpy.random"):
        fs.add("G-RNG", f"{where}: {full}", line)
    if full.startswith("triton.testing") or full.startswith("torch.utils.benchmark"):
        fs.add("G-TIMER-PATCH", f"{where}: {full}", line, severity="flag")


def _os_rule(fn: str, where: str, fs: Findings, line: str) -> None:
    last = fn.split(".")[-1]
    if last in (
        "system",
        "popen",
        "fork",
        "forkpty",
        "kill",
        "killpg",
        "spawnl",
        "spawnv",
        "spawnve",
        "execv",
        "execve",
        "execl",
        "execlp",
        "execvp",
        "posix_spawn",
        "posix_spawnp",
        "_exit",
        "setsid",
        "setpgid",
        "abort",
    ):
        fs.add("G-THREAD", f"{where}: {fn}() (process control)", line)
    elif last in (
        "remove",
        "unlink",
        "rename",
        "replace",
        "makedirs",
        "mkdir",
        "rmdir",
        "removedirs",
        "chmod",
        "chown",
        "symlink",
        "link",
        "truncate",
        "write",
        "open",
        "utime",
        "mkfifo",
        "dup2",
        "chdir",
        "chroot",
        "memfd_create",
    ):
        fs.add("G-FILE-IO", f"{where}: {fn}()", line)
    elif last in ("listdir", "scandir", "walk", "stat", "lstat", "readlink", "access", "getcwd"):
        fs.add("G-FILE-IO", f"{where}: {fn}()", line, severity="flag")
    elif last in ("getenv", "putenv", "unsetenv", "getpid", "getppid", "uname"):
        fs.add("G-ENV", f"{where}: {fn}()", line)


def _open_rule(node: ast.Call, scope: _Scope, where: str, fs: Findings, line: str) -> None:
    mode = "r"
    if len(node.args) > 1:
        m = scope.strings(node.args[1])
        mode = m[0] if m else "?"
    for k in node.keywords:
        if k.arg == "mode":
            m = scope.strings(k.value)
            mode = m[0] if m else "?"
    path = scope.strings(node.args[0]) if node.args else None
    p = path[0] if path else None
    outside = p is not None and (p.startswith("/") or ".." in p or p.endswith("model.py"))
    if any(c in mode for c in "wax+?") or outside:
        fs.add("G-FILE-IO", f"{where}: open({p!r}, {mode!r})", line)
    else:
        fs.add("G-FILE-IO", f"{where}: open({p!r}) for reading", line, severity="flag")


def _assignments(tree: ast.Module, scope: _Scope, where: str, fs: Findings, f32: bool) -> None:
    """Monkeypatching: assignments to attributes or items of imported modules and torch classes."""
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        value: ast.AST | None = None
        if isinstance(node, ast.Assign):
            targets, value = list(node.targets), node.value
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets, value = [node.target], node.value
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        for t in targets:
            for sub in ast.walk(t) if isinstance(t, ast.Tuple | ast.List) else [t]:
                _target_rule(sub, value, scope, where, fs, f32, node)


def _target_rule(
    t: ast.AST,
    value: ast.AST | None,
    scope: _Scope,
    where: str,
    fs: Findings,
    f32: bool,
    node: ast.AST,
) -> None:
    line = f"line {getattr(node, 'lineno', '?')}"
    if isinstance(t, ast.Subscript):
        base = scope.resolve(t.value) or ""
        if (
            base in ("sys.modules", "os.environ")
            or base.endswith("__dict__")
            or base.startswith(("globals()", "vars()", "builtins"))
        ):
            code = "G-ENV" if base == "os.environ" else "G-HARNESS-PATCH"
            fs.add(code, f"{where}: assigns into {base}[...]", line)
        return
    if not isinstance(t, ast.Attribute):
        return
    full = scope.resolve(t) or ""
    root = full.split(".")[0]
    if t.attr == "__class__" or t.attr == "__dict__":
        fs.add("G-HARNESS-PATCH", f"{where}: assigns {full or t.attr}", line)
        return
    if not (
        scope.is_module_root(_dotted(t).split(".")[0] if _dotted(t) else "")
        or root in ("torch", "builtins")
    ):
        return
    if full.startswith("torch.backends."):
        if f32 and t.attr in (
            "allow_tf32",
            "allow_fp16_reduced_precision_reduction",
            "allow_bf16_reduced_precision_reduction",
            "fp32_precision",
        ):
            if not (isinstance(value, ast.Constant) and value.value in (False, "ieee", "highest")):
                fs.add("G-PRECISION", f"{where}: sets {full}", line)
            return
        if t.attr in ("benchmark", "deterministic", "enabled"):
            return
    if full.startswith("torch.utils.deterministic"):
        fs.add("G-HARNESS-PATCH", f"{where}: sets {full}", line)
        return
    code = (
        "G-TIMER-PATCH"
        if t.attr in _TIMING_NAMES or "time" in t.attr.lower()
        else "G-HARNESS-PATCH"
    )
    fs.add(code, f"{where}: assigns {full}", line)


def _forward_rules(
    tree: ast.Module,
    scope: _Scope,
    reach: list[ast.FunctionDef | ast.AsyncFunctionDef],
    where: str,
    fs: Findings,
    res: PyScanResult,
) -> None:
    nn_attrs = _module_attrs(tree, scope)
    own_callables = set(res.inline_functions)
    ext_names, self_ext = _extension_names(tree, scope)
    for f in reach:
        for node in ast.walk(f):
            line = f"line {getattr(node, 'lineno', '?')} in {f.name}()"
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                fs.add("G-TORCH-COMPUTE", f"{where}: '@' (matmul) in forward", line)
            if not isinstance(node, ast.Call):
                continue
            fn = scope.resolve(node.func) or ""
            last = _last_name(node.func, fn)
            if fn.startswith("torch.") and not fn.startswith(
                ("torch.ops.", "torch.cuda.", "torch.utils.", "torch.backends.", "torch.autograd.")
            ):
                if "functional" in fn or fn.startswith("torch.nn.") and last[:1].islower():
                    fs.add("G-TORCH-COMPUTE", f"{where}: {fn}() in forward", line)
                elif last not in _TORCH_NONCOMPUTE and last in aten_names():
                    cls = classify(last)
                    if cls == "compute":
                        fs.add("G-TORCH-COMPUTE", f"{where}: {fn}() in forward", line)
                    elif cls == "random":
                        fs.add("G-RNG", f"{where}: {fn}() in forward", line)
                elif last in ("einsum", "tensordot", "cdist", "stft", "fft"):
                    fs.add("G-TORCH-COMPUTE", f"{where}: {fn}() in forward", line)
            elif (
                fn.startswith("torch.ops.")
                and len(fn.split(".")) >= 4
                and fn.split(".")[2] == "aten"
            ):
                if classify(fn.split(".")[3]) == "compute":
                    fs.add("G-TORCH-COMPUTE", f"{where}: {fn}() in forward", line)
            elif (
                isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "self"
                and node.func.attr in nn_attrs
            ):
                fs.add(
                    "G-TORCH-COMPUTE",
                    f"{where}: self.{node.func.attr}() runs {nn_attrs[node.func.attr]} in forward",
                    line,
                )
            elif (
                isinstance(node.func, ast.Attribute)
                and last in aten_names()
                and last not in _PY_METHOD_EXCLUDE
                and last not in own_callables
                and classify(last) in ("compute", "random")
                and not _is_extension(node.func.value, ext_names, self_ext)
            ):
                code = "G-RNG" if classify(last) == "random" else "G-TORCH-COMPUTE"
                fs.add(code, f"{where}: .{last}() in forward", line)


def _extension_names(tree: ast.Module, scope: _Scope) -> tuple[set[str], set[str]]:
    """Names bound to the candidate's extension modules, and ``self`` attributes holding them."""
    names = {
        k
        for k, v in scope.alias.items()
        if v.split(".")[0] not in ("torch", "numpy", "math", "triton")
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            fn = scope.resolve(node.value.func) or ""
            if fn.split(".")[-1] in ("load_inline", "load", "import_module"):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    attrs: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        v = node.value
        src_ok = (isinstance(v, ast.Name) and v.id in names) or (
            isinstance(v, ast.Call)
            and (scope.resolve(v.func) or "").split(".")[-1] in ("load_inline", "load")
        )
        if src_ok:
            for t in node.targets:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    attrs.add(t.attr)
    return names, attrs


def _is_extension(recv: ast.AST, names: set[str], attrs: set[str]) -> bool:
    if isinstance(recv, ast.Name):
        return recv.id in names
    return (
        isinstance(recv, ast.Attribute)
        and isinstance(recv.value, ast.Name)
        and recv.value.id == "self"
        and recv.attr in attrs
    )


def _fallbacks(
    tree: ast.Module,
    scope: _Scope,
    reach: list[ast.FunctionDef | ast.AsyncFunctionDef],
    where: str,
    fs: Findings,
) -> None:
    reach_nodes = {id(n) for f in reach for n in ast.walk(f)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try | ast.TryStar):
            continue
        handlers_reraise = (
            all(all(isinstance(s, ast.Raise) for s in h.body) for h in node.handlers)
            and node.handlers
        )
        if handlers_reraise and not node.orelse:
            continue
        line = f"line {node.lineno}"
        if id(node) in reach_nodes:
            fs.add("G-FALLBACK", f"{where}: try/except in the forward path", line)
            continue
        # module level: a try around building or importing the extension with a fallback
        body_calls = {
            scope.resolve(c.func) or ""
            for s in node.body
            for c in ast.walk(s)
            if isinstance(c, ast.Call)
        }
        body_imports = any(
            isinstance(c, ast.Import | ast.ImportFrom) for s in node.body for c in ast.walk(s)
        )
        if body_imports or any(c.split(".")[-1] in ("load_inline", "load") for c in body_calls):
            fs.add(
                "G-FALLBACK", f"{where}: try/except around building or importing the kernels", line
            )
