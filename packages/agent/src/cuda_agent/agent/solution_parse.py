"""Parse a single-turn answer's fenced code blocks (each naming its file) into solution files."""

from __future__ import annotations

import re

# ```lang path  or  ```path  (the path holds a '/' or a '.')
_FENCE = re.compile(r"^```[ \t]*([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
_PATH = re.compile(r"^[\w./-]+\.(py|cu|cuh|cpp|cc|h|hpp)$")
ALLOWED = re.compile(r"^(model_new\.py|kernels/[\w.-]+\.(cu|cuh|cpp|cc|h|hpp))$")


def parse_files(text: str) -> tuple[dict[str, str], list[str]]:
    """``(files, problems)``: files named on their fence line (or on the line just before it,
    as ``File: path`` / ``### path``); blocks without a usable name are reported, not guessed,
    except a lone unnamed Python block, taken as ``model_new.py``."""
    files: dict[str, str] = {}
    problems: list[str] = []
    unnamed_py: list[str] = []
    for m in _FENCE.finditer(text):
        info, body = m.group(1).strip(), m.group(2)
        words = info.split()
        path = next((w for w in words if _PATH.match(w)), None)
        if path is None:
            before = text[: m.start()].rstrip().splitlines()[-1:] or [""]
            cand = re.sub(r"^(#+|File:|file:|\*\*)\s*", "", before[0].strip()).strip("*` :")
            path = cand if _PATH.match(cand) else None
        if path is None:
            if words[:1] in (["python"], ["py"]):
                unnamed_py.append(body)
            else:
                problems.append(f"a ```{info} block names no file")
            continue
        path = path.lstrip("./")
        if not ALLOWED.match(path):
            problems.append(f"{path}: not a solution file (model_new.py or kernels/*)")
            continue
        files[path] = body
    if "model_new.py" not in files and len(unnamed_py) == 1:
        files["model_new.py"] = unnamed_py[0]
    if "model_new.py" not in files:
        problems.append("no model_new.py block")
    return files, problems
