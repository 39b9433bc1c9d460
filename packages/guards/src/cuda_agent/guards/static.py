"""Static checks on a whole candidate: every Python file through the AST, every C/C++/CUDA text
(files and ``load_inline`` strings) through the preprocessor, plus solution-level rules."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from cuda_agent.records import Candidate, GuardViolation

from .checks import Findings
from .cstatic import C_EXTS, CSource, scan_sources
from .pystatic import scan_python

_DOC_EXTS = (".md", ".txt", ".rst", ".json", ".toml", ".yaml", ".yml", ".sh", ".ptx", ".sass")
_LOWP_RE = re.compile(
    r"float16|bfloat16|\.half\(|\.bfloat16\(|torch\.half|float64|\.double\(|"
    r"torch\.double|float8|int8|uint8"
)


@dataclass
class StaticReport:
    """Findings plus what the runtime needs: the candidate's kernel and module names."""

    findings: list[GuardViolation] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)  # __global__ and Triton kernel names
    functions: list[str] = field(default_factory=list)  # bound functions (pybind / load_inline)
    modules: list[str] = field(default_factory=list)  # extension module names (load_inline name=)
    preprocessed: bool = True


def task_is_float32(ref_code: str) -> bool:
    """Whether the reference computes in float32 (no half/bfloat16/float64/int8 in its source)."""
    return not _LOWP_RE.search(ref_code or "")


def analyze(
    candidate: Candidate, policy: str = "strict", own_modules: tuple[str, ...] = ()
) -> StaticReport:
    """Every static rule on ``candidate`` under ``policy``; no candidate code is run."""
    fs = Findings(policy)
    rep = StaticReport()
    if policy == "off":
        return rep
    files = candidate.solution.files
    f32 = task_is_float32(candidate.task.ref_code)
    csources: list[CSource] = []
    own = tuple(own_modules) + ("cuda_extension", "kernels", "binding", "bindings")
    has_model_new = False
    for path, text in sorted(files.items()):
        norm = os.path.normpath(path)
        if norm.startswith("..") or os.path.isabs(path):
            fs.add("G-FILE-IO", f"solution file path outside its directory: {path}", path)
        if path.endswith(".py"):
            if (
                path != "model_new.py"
                and os.path.basename(path) in ("model.py",)
                or path.startswith("utils/")
            ):
                fs.add("G-HARNESS-PATCH", f"solution ships {path}, an infrastructure file", path)
            r = scan_python(text, path, fs, f32, own)
            has_model_new |= r.has_model_new
            csources += r.c_sources
            rep.kernels += r.triton_kernels
            rep.functions += r.inline_functions
            rep.modules += r.inline_modules
            for src in r.source_files:
                match = _find_file(files, src)
                if match is None:
                    fs.add(
                        "G-FILE-IO",
                        f"{path}: load(sources=[{src!r}]) is not a file of the solution",
                        src,
                    )
        elif path.endswith(C_EXTS):
            csources.append(CSource(path, text))
        elif not path.endswith(_DOC_EXTS):
            fs.add("G-FILE-IO", f"solution ships a data file {path}", path, severity="flag")
    if not has_model_new:
        fs.add(
            "G-NO-KERNEL",
            "no file defines class ModelNew",
            ", ".join(sorted(files)),
            severity="flag",
        )
    if csources:
        cres = scan_sources(csources, fs, f32)
        rep.kernels += [k for k in cres.kernels if k not in rep.kernels]
        rep.functions += [f for f in cres.functions if f not in rep.functions]
        rep.preprocessed = cres.preprocessed
        has_code = cres.has_code
    else:
        has_code = False
    if not has_code and not rep.kernels:
        fs.add(
            "G-NO-KERNEL",
            "the solution has no C/C++/CUDA source and no Triton kernel",
            ", ".join(sorted(files)),
        )
    rep.findings = fs.items
    return rep


def _find_file(files: dict[str, str], src: str) -> str | None:
    norm = os.path.normpath(src).lstrip("./")
    for k in files:
        if (
            os.path.normpath(k) == norm
            or k.endswith("/" + norm)
            or os.path.basename(k) == os.path.basename(src)
        ):
            return k
    return None
