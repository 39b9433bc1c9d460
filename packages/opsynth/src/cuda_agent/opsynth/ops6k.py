"""CUDA-Agent-Ops-6K interchange: read the released parquet into Task records, write ours in the
same three-column layout (``ops`` JSON list, ``data_source``, ``code``), and find its problems
statically (no execution): randomness in ``forward``, operator labels that the code does not
use, sources that break the KernelBench contract, resize-edit traces left by the LLM.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from cuda_agent.records.types import Task

# calls that draw random numbers when executed in forward
RANDOM_CALLS = {
    "randn",
    "rand",
    "randint",
    "randn_like",
    "rand_like",
    "randint_like",
    "randperm",
    "bernoulli",
    "multinomial",
    "normal",
    "normal_",
    "uniform_",
    "exponential_",
    "poisson",
    "rrelu",
    "alpha_dropout",
    "feature_alpha_dropout",
    "gumbel_softmax",
}
DROPOUT_F = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout"}
DROPOUT_MODULES = {"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "RReLU"}
_RESIZE_NOTE = re.compile(r"#.*\b(increas|decreas|chang|reduc|adjust|modif|ensur)", re.I)


def parse_ops(raw: Any) -> list[str]:
    """The ``ops`` cell as a list (a JSON string in the released file)."""
    if isinstance(raw, list):
        return [str(x) for x in raw]
    try:
        v = json.loads(raw)
        return [str(x) for x in v] if isinstance(v, list) else [str(v)]
    except (TypeError, ValueError):
        return [str(raw)] if raw else []


def task_name(ops: list[str]) -> str:
    """``["nn.Conv2d", "F.gelu"]`` -> ``Conv2d_gelu`` (KernelBench-like)."""
    parts = [re.sub(r"\W", "", o.split(".")[-1]) or "op" for o in ops]
    return "_".join(parts) or "task"


def read_parquet(path: str | Path) -> list[dict[str, Any]]:
    """Rows of an Ops-6K-layout parquet file (columns ops, data_source, code)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    missing = {"ops", "code"} - set(table.column_names)
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
    return table.to_pylist()


def row_to_task(row: dict[str, Any], index: int) -> Task:
    """One parquet row -> Task (source ``ops6k``; meta: row, data_source, n_ops, issues)."""
    ops = parse_ops(row.get("ops"))
    code = row.get("code") or ""
    meta: dict[str, Any] = {
        "row": index,
        "data_source": row.get("data_source"),
        "n_ops": len(ops),
        "issues": static_issues(code, ops),
    }
    return Task.make(task_name(ops), code, source="ops6k", ops=ops, meta=meta)


def _forward_and_init(tree: ast.Module) -> tuple[ast.FunctionDef | None, ast.FunctionDef | None]:
    fwd = init = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for m in node.body:
                if isinstance(m, ast.FunctionDef) and m.name == "forward":
                    fwd = m
                elif isinstance(m, ast.FunctionDef) and m.name == "__init__":
                    init = m
    return fwd, init


def _leaf(call: ast.Call) -> str:
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    return ""


def randomness(code: str) -> list[str]:
    """Static evidence that ``forward`` is random: RNG calls, functional dropout in training
    mode (``F.dropout`` defaults to ``training=True``), dropout-like modules used in forward."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    fwd, init = _forward_and_init(tree)
    if fwd is None:
        return []
    found: list[str] = []
    for node in ast.walk(fwd):
        if not isinstance(node, ast.Call):
            continue
        leaf = _leaf(node)
        if leaf in RANDOM_CALLS:
            found.append(leaf)
        elif leaf in DROPOUT_F:
            training = next((k.value for k in node.keywords if k.arg == "training"), None)
            if training is None and len(node.args) >= 3:
                training = node.args[2]
            if training is None or not (
                isinstance(training, ast.Constant) and training.value is False
            ):
                found.append(f"F.{leaf}(training)")
        elif leaf in DROPOUT_MODULES:
            found.append(f"nn.{leaf} in forward")
    modules: dict[str, str] = {}
    if init is not None:
        for node in ast.walk(init):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                leaf = _leaf(node.value)
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and leaf in DROPOUT_MODULES:
                        p = next((k.value for k in node.value.keywords if k.arg == "p"), None)
                        if p is None and node.value.args:
                            p = node.value.args[0]
                        if isinstance(p, ast.Constant) and p.value == 0:
                            continue
                        modules[t.attr] = leaf
    used = {
        n.attr
        for n in ast.walk(fwd)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    }
    found += [f"nn.{modules[a]} (train mode)" for a in modules if a in used]
    return found


def label_mismatch(code: str, ops: list[str]) -> list[str]:
    """Declared ops whose name does not occur in the code at all (``torch.bmm`` without bmm)."""
    text = code.lower().replace("_", "")
    out = []
    for o in ops:
        leaf = o.split(".")[-1]
        if leaf in ("functional", "Parameter", "Module") or not leaf:
            continue
        if leaf.lower().replace("_", "") not in text:
            out.append(o)
    return out


def static_issues(code: str, ops: list[str]) -> dict[str, Any]:
    """Problems visible without running the code (empty dict: none found)."""
    from cuda_agent.profiler.program import ProgramError, check_contract

    issues: dict[str, Any] = {}
    try:
        missing = check_contract(code)
        if missing:
            issues["missing"] = missing
    except ProgramError as e:
        issues["syntax"] = str(e)
        return issues
    r = randomness(code)
    if r:
        issues["random_forward"] = sorted(set(r))
    m = label_mismatch(code, ops)
    if m:
        issues["ops_not_in_code"] = m
    notes = [ln.strip() for ln in code.splitlines() if _RESIZE_NOTE.search(ln)]
    if notes:
        issues["resize_notes"] = len(notes)
    return issues


def import_parquet(path: str | Path) -> Iterator[Task]:
    """Every row of the released file as a Task."""
    for i, row in enumerate(read_parquet(path)):
        yield row_to_task(row, i)


def export_parquet(tasks: Iterable[Task], path: str | Path) -> int:
    """Write tasks in the Ops-6K layout; ``data_source`` is ``<source>#<n_ops>``. Returns rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ops, src, code = [], [], []
    for t in tasks:
        ops.append(json.dumps(list(t.ops)))
        src.append(t.meta.get("data_source") or f"{t.source}#{len(t.ops)}")
        code.append(t.ref_code)
    table = pa.table({"ops": ops, "data_source": src, "code": code})
    pq.write_table(table, path)
    return len(code)
