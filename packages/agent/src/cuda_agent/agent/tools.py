"""The agent's tools, with OpenAI-style JSON schemas, confined to one workspace directory.

Tools: Bash (through the sandbox's command runner: time limit, output capped head+tail), Read,
Write, Edit, MultiEdit (all or nothing), Glob, Grep, TodoWrite, Submit. Paths are relative to the
workspace; a path that resolves outside it, or onto a protected file, is refused with a message
the model can act on. Every tool returns a :class:`ToolResult`; none raises for a bad call.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Files the agent may read but never change (the sandbox's infrastructure and the reference).
DEFAULT_PROTECTED = ("model.py", "SKILL.md", "binding.cpp", "binding_registry.h", "utils/")
MAX_TOOL_OUTPUT = 12_000


@dataclass
class ToolResult:
    text: str
    ok: bool = True
    error: str | None = None  # a short class of failure: "schema", "path", "not_found", ...
    submit: bool = False


@dataclass
class BashOutput:
    """What a bash runner returns."""

    exit_code: int | None
    output: str
    timed_out: bool = False


BashRunner = Callable[[Path, str, float], BashOutput]


def cap_text(text: str, limit: int = MAX_TOOL_OUTPUT) -> str:
    """``text`` if short, else its head and tail with the cut stated."""
    if len(text) <= limit:
        return text
    head = text[: limit // 2]
    tail = text[-limit // 2 :]
    cut = len(text) - len(head) - len(tail)
    return f"{head}\n[... {cut} characters cut ...]\n{tail}"


def _schema(name: str, desc: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


_S = {"type": "string"}
_EDIT = {
    "type": "object",
    "properties": {"old_string": _S, "new_string": _S, "replace_all": {"type": "boolean"}},
    "required": ["old_string", "new_string"],
}
TOOL_SCHEMAS: list[dict[str, Any]] = [
    _schema(
        "Bash",
        "Run a shell command in the workspace (e.g. python utils/compile.py). Output is capped.",
        {"command": _S, "timeout": {"type": "number", "description": "seconds (default 300)"}},
        ["command"],
    ),
    _schema(
        "Read",
        "Read a file with line numbers; offset is the first line (1-based), limit the line count.",
        {"path": _S, "offset": {"type": "integer"}, "limit": {"type": "integer"}},
        ["path"],
    ),
    _schema(
        "Write", "Create or overwrite a file.", {"path": _S, "content": _S}, ["path", "content"]
    ),
    _schema(
        "Edit",
        "Replace old_string by new_string in a file; old_string must occur exactly once unless "
        "replace_all is true.",
        {"path": _S, "old_string": _S, "new_string": _S, "replace_all": {"type": "boolean"}},
        ["path", "old_string", "new_string"],
    ),
    _schema(
        "MultiEdit",
        "Several Edit operations on one file, applied in order; all succeed or none is applied.",
        {"path": _S, "edits": {"type": "array", "items": _EDIT}},
        ["path", "edits"],
    ),
    _schema(
        "Glob",
        "List workspace files matching a glob pattern (e.g. kernels/*.cu).",
        {"pattern": _S},
        ["pattern"],
    ),
    _schema(
        "Grep",
        "Search file contents with a regular expression; optional path (file or folder) and glob.",
        {"pattern": _S, "path": _S, "glob": _S},
        ["pattern"],
    ),
    _schema(
        "TodoWrite",
        "Replace your task list; each item has content and status (pending|in_progress|done).",
        {
            "todos": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"content": _S, "status": _S},
                    "required": ["content", "status"],
                },
            }
        },
        ["todos"],
    ),
    _schema(
        "Submit",
        "End the episode: the workspace's model_new.py and kernels/ are evaluated as your solution.",
        {"summary": _S},
        [],
    ),
]
TOOL_NAMES = [s["function"]["name"] for s in TOOL_SCHEMAS]


def check_tool_names(names: list[str] | tuple[str, ...], where: str) -> tuple[str, ...]:
    """``names`` as a tuple when it is a non-empty list of known tools; otherwise a
    ``ValueError`` naming the setting (``where``) and the known tools."""
    unknown = [n for n in names if n not in TOOL_NAMES]
    if unknown or not names:
        raise ValueError(
            f"{where}: unknown tool(s) {unknown or '(none given)'}; known: {', '.join(TOOL_NAMES)}"
        )
    return tuple(names)


_REQUIRED = {s["function"]["name"]: s["function"]["parameters"]["required"] for s in TOOL_SCHEMAS}
_PROPS = {s["function"]["name"]: s["function"]["parameters"]["properties"] for s in TOOL_SCHEMAS}
_PYTYPE = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list}


def check_arguments(name: str, args: dict[str, Any]) -> str | None:
    """A schema violation message, or ``None`` when the call fits the tool's schema."""
    if name not in _REQUIRED:
        return f"unknown tool {name!r}; available: {', '.join(TOOL_NAMES)}"
    missing = [k for k in _REQUIRED[name] if k not in args]
    if missing:
        return f"{name}: missing required argument(s) {', '.join(missing)}"
    unknown = [k for k in args if k not in _PROPS[name]]
    if unknown:
        return (
            f"{name}: unknown argument(s) {', '.join(unknown)}; allowed: {', '.join(_PROPS[name])}"
        )
    for k, v in args.items():
        want = _PYTYPE.get(_PROPS[name][k].get("type", ""))
        if want is not None and (not isinstance(v, want) or (want is int and isinstance(v, bool))):
            return f"{name}: argument {k!r} must be of type {_PROPS[name][k]['type']}"
    return None


@dataclass
class Toolbox:
    """The tools bound to one workspace."""

    root: Path
    bash: BashRunner | None = None
    protected: tuple[str, ...] = DEFAULT_PROTECTED
    bash_timeout: float = 300.0
    todos: list[dict[str, str]] = field(default_factory=list)
    allowed: tuple[str, ...] | None = None  # the tools this episode offers (None: all)

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()

    # ------------------------------------------------------------ paths
    def _path(self, rel: str, *, write: bool = False) -> Path | ToolResult:
        if not isinstance(rel, str) or not rel.strip():
            return ToolResult("path must be a non-empty string", ok=False, error="path")
        p = (self.root / rel).resolve()
        if p != self.root and self.root not in p.parents:
            return ToolResult(f"{rel}: outside the workspace", ok=False, error="path")
        if write:
            r = p.relative_to(self.root).as_posix()
            for prot in self.protected:
                if r == prot.rstrip("/") or (prot.endswith("/") and r.startswith(prot)):
                    return ToolResult(
                        f"{r}: protected file (read-only)", ok=False, error="protected"
                    )
        return p

    # ------------------------------------------------------------ dispatch
    def call(self, name: str, args: dict[str, Any]) -> ToolResult:
        """Run one tool call; schema violations (a tool not offered included) come back as
        ``error="schema"``."""
        if self.allowed is not None and name not in self.allowed:
            return ToolResult(
                f"tool {name!r} is not offered here; available: {', '.join(self.allowed)}",
                ok=False,
                error="schema",
            )
        problem = check_arguments(name, args)
        if problem:
            return ToolResult(problem, ok=False, error="schema")
        try:
            return getattr(self, f"t_{name.lower()}")(**args)
        except OSError as e:
            return ToolResult(f"{name}: {e.strerror or e}", ok=False, error="os")

    # ------------------------------------------------------------ tools
    def t_bash(self, command: str, timeout: float | None = None) -> ToolResult:
        if self.bash is None:
            return ToolResult(
                "Bash is not available in this episode", ok=False, error="unavailable"
            )
        t = min(float(timeout or self.bash_timeout), self.bash_timeout)
        out = self.bash(self.root, command, t)
        status = "timed out" if out.timed_out else f"exit code {out.exit_code}"
        return ToolResult(
            f"{cap_text(out.output)}\n[{status}]", ok=out.exit_code == 0 and not out.timed_out
        )

    def t_read(self, path: str, offset: int = 1, limit: int = 400) -> ToolResult:
        p = self._path(path)
        if isinstance(p, ToolResult):
            return p
        if not p.is_file():
            return ToolResult(f"{path}: no such file", ok=False, error="not_found")
        lines = p.read_text(errors="replace").splitlines()
        start = max(1, offset)
        chunk = lines[start - 1 : start - 1 + max(1, limit)]
        body = "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(chunk, start=start))
        more = len(lines) - (start - 1 + len(chunk))
        tail = f"\n[{more} more lines; use offset={start + len(chunk)}]" if more > 0 else ""
        return ToolResult(cap_text(body) + tail if body else f"{path}: empty or past the end")

    def t_write(self, path: str, content: str) -> ToolResult:
        p = self._path(path, write=True)
        if isinstance(p, ToolResult):
            return p
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
        return ToolResult(f"wrote {path} ({len(content.splitlines())} lines)")

    def _apply_edits(self, text: str, edits: list[dict[str, Any]], path: str) -> str | ToolResult:
        for i, e in enumerate(edits, start=1):
            old, new = e.get("old_string"), e.get("new_string")
            if not isinstance(old, str) or not isinstance(new, str):
                return ToolResult(
                    f"edit {i}: old_string and new_string must be strings", ok=False, error="schema"
                )
            if old == new:
                return ToolResult(f"edit {i}: old_string equals new_string", ok=False, error="noop")
            n = text.count(old) if old else 0
            if n == 0:
                return ToolResult(
                    f"edit {i}: old_string not found in {path}", ok=False, error="not_found"
                )
            if n > 1 and not e.get("replace_all"):
                return ToolResult(
                    f"edit {i}: old_string occurs {n} times in {path}; add context or set replace_all",
                    ok=False,
                    error="ambiguous",
                )
            text = text.replace(old, new) if e.get("replace_all") else text.replace(old, new, 1)
        return text

    def t_edit(
        self, path: str, old_string: str, new_string: str, replace_all: bool = False
    ) -> ToolResult:
        edit = {"old_string": old_string, "new_string": new_string, "replace_all": replace_all}
        return self.t_multiedit(path, [edit])

    def t_multiedit(self, path: str, edits: list[dict[str, Any]]) -> ToolResult:
        p = self._path(path, write=True)
        if isinstance(p, ToolResult):
            return p
        if not p.is_file():
            return ToolResult(
                f"{path}: no such file (use Write to create it)", ok=False, error="not_found"
            )
        if not edits:
            return ToolResult("edits is empty", ok=False, error="schema")
        out = self._apply_edits(p.read_text(), edits, path)
        if isinstance(out, ToolResult):
            return out  # nothing was written
        p.write_text(out)
        return ToolResult(f"applied {len(edits)} edit(s) to {path}")

    def _files(self) -> list[Path]:
        return sorted(
            q for q in self.root.rglob("*") if q.is_file() and "__pycache__" not in q.parts
        )

    def t_glob(self, pattern: str) -> ToolResult:
        hits = [
            q.relative_to(self.root).as_posix()
            for q in self._files()
            if fnmatch.fnmatch(q.relative_to(self.root).as_posix(), pattern)
        ]
        return ToolResult("\n".join(hits[:500]) if hits else f"no files match {pattern!r}")

    def t_grep(self, pattern: str, path: str = ".", glob: str | None = None) -> ToolResult:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            return ToolResult(f"bad regular expression: {e}", ok=False, error="schema")
        base = self._path(path)
        if isinstance(base, ToolResult):
            return base
        files = [base] if base.is_file() else [q for q in self._files() if base in q.parents]
        out = []
        for f in files:
            rel = f.relative_to(self.root).as_posix()
            if glob and not fnmatch.fnmatch(rel, glob):
                continue
            try:
                lines = f.read_text(errors="strict").splitlines()
            except (UnicodeDecodeError, OSError):
                continue
            out += [f"{rel}:{i}: {line}" for i, line in enumerate(lines, 1) if rx.search(line)]
        return ToolResult(cap_text("\n".join(out)) if out else "no matches")

    def t_todowrite(self, todos: list[dict[str, Any]]) -> ToolResult:
        items = []
        for i, t in enumerate(todos, 1):
            if not isinstance(t, dict) or not isinstance(t.get("content"), str):
                return ToolResult(f"todo {i}: needs a string 'content'", ok=False, error="schema")
            status = t.get("status", "pending")
            if status not in ("pending", "in_progress", "done"):
                return ToolResult(
                    f"todo {i}: status must be pending, in_progress or done",
                    ok=False,
                    error="schema",
                )
            items.append({"content": t["content"], "status": status})
        self.todos = items
        mark = {"pending": "[ ]", "in_progress": "[~]", "done": "[x]"}
        return ToolResult(
            "\n".join(f"{mark[t['status']]} {t['content']}" for t in items) or "(empty list)"
        )

    def t_submit(self, summary: str = "") -> ToolResult:
        return ToolResult("submitted; the episode ends and your solution is evaluated", submit=True)
