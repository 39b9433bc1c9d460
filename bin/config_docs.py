"""Write docs/configuration.md from the code: every config key, command-line option, Python
configuration object and environment variable of the toolkit, with its type, default and meaning.

    python bin/config_docs.py > docs/configuration.md

The tables come from the sources themselves (the config structs' fields, defaults and comments;
each typer command's parameters; the variables the code reads), so the page changes when the
code does; ``tests/test_configuration_docs.py`` fails when the page is not what this script
writes. Prose that no code holds (what an environment variable does, what a script option does)
is kept here, and this script stops with an error when the code has a setting it does not
describe.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "packages"

# ------------------------------------------------------------------ the commands

# (command name, module of its typer app, the package folder)
CLIS: list[tuple[str, str]] = [
    ("records", "cuda_agent.records.cli"),
    ("profiler", "cuda_agent.profiler.cli"),
    ("guards", "cuda_agent.guards.cli"),
    ("sandbox", "cuda_agent.sandbox.cli"),
    ("reward", "cuda_agent.reward.cli"),
    ("opsynth", "cuda_agent.opsynth.cli"),
    ("agent", "cuda_agent.agent.cli"),
    ("rft", "cuda_agent.rft.cli"),
    ("critic", "cuda_agent.critic.cli"),
    ("ppo", "cuda_agent.ppo.cli"),
    ("kernelbench-eval", "cuda_agent.kernelbench_eval.cli"),
    ("kernel-service", "cuda_agent.service.cli"),
]


@dataclass
class Opt:
    name: str  # the Python parameter name
    flags: str  # "--a/--no-a", "-o, --output", or "INPUT" for an argument
    type: str
    default: str
    help: str
    argument: bool
    hidden: bool
    envvar: str | None


@dataclass
class Cmd:
    path: str  # "sandbox eval"
    help: str
    opts: list[Opt]
    callback: Any = None


def _type_name(ann: Any) -> str:
    import enum
    import types
    import typing

    if ann is None:
        return ""
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(ann)[0])
    if origin in (typing.Union, types.UnionType):
        parts = [_type_name(a) for a in typing.get_args(ann) if a is not type(None)]
        return " | ".join(parts)
    if origin is list:
        return f"list[{_type_name(typing.get_args(ann)[0])}]"
    if origin is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(ann))
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return " | ".join(str(m.value) for m in ann)
    if isinstance(ann, type):
        return {"Path": "path", "str": "text", "int": "int", "float": "float", "bool": "flag"}.get(
            ann.__name__, ann.__name__
        )
    return str(ann)


def _default(p: Any) -> str:
    import enum

    d = p.default
    if p.required:
        return "required"
    if d is None or (isinstance(d, (list, tuple)) and not d):
        return ""
    if isinstance(d, enum.Enum):
        d = d.value
    if isinstance(d, bool) and p.secondary_opts:
        return p.opts[0] if d else p.secondary_opts[0]
    if isinstance(d, bool):
        return "on" if d else "off"
    return str(d)


def _clean(text: str | None) -> str:
    return re.sub(r"\s+", " ", (text or "").strip())


def commands() -> list[Cmd]:
    """Every command and subcommand of the toolkit's CLIs, with its parameters."""
    import typer.main

    out: list[Cmd] = []
    for name, module in CLIS:
        app = importlib.import_module(module).app
        root = typer.main.get_command(app)
        callbacks = {}
        for rc in app.registered_commands:
            cname = rc.name or rc.callback.__name__.replace("_", "-")
            callbacks[cname] = rc.callback
        for sub, cmd in root.commands.items():
            opts = []
            for p in cmd.params:
                argument = type(p).__name__.endswith("Argument")
                if argument:
                    flags = p.name.upper()
                else:
                    flags = ", ".join(p.opts)
                    if p.secondary_opts:
                        flags = f"{p.opts[-1]}/{p.secondary_opts[0]}"
                        if len(p.opts) > 1:
                            flags = ", ".join(p.opts[:-1]) + ", " + flags
                ann = getattr(p, "type_descriptor", None)
                tname = _type_name(ann.annotation if ann is not None else None)
                if getattr(p, "metavar", None):
                    tname = p.metavar
                opts.append(
                    Opt(
                        name=p.name,
                        flags=flags,
                        type="flag" if getattr(p, "is_flag", False) else tname,
                        default=_default(p),
                        help=_clean(p.help),
                        argument=argument,
                        hidden=bool(getattr(p, "hidden", False)),
                        envvar=p.envvar if isinstance(p.envvar, str) else None,
                    )
                )
            out.append(
                Cmd(
                    f"{name} {sub}",
                    _clean((cmd.help or "").split("\n\n")[0]),
                    opts,
                    callbacks.get(sub),
                )
            )
    return out


# ------------------------------------------------------------------ config structs from source


@dataclass
class Field:
    name: str
    type: str
    default: str
    doc: str


@dataclass
class Struct:
    name: str
    path: Path
    doc: str
    fields: list[Field] = field(default_factory=list)


def _comments(src: str) -> dict[int, tuple[str, bool]]:
    """line -> (comment text, whether the line holds only the comment)."""
    out = {}
    lines = src.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            row = tok.start[0]
            only = lines[row - 1].strip().startswith("#")
            text = tok.string.lstrip("#").strip()
            out[row] = (text, only)
    return out


def _heading(text: str) -> bool:
    """A one-line comment naming a group of fields ("# correctness", "# build")."""
    return len(text.split()) <= 3 and not re.search(r"[.:;,()=]", text)


def struct(path: Path, cls: str) -> Struct:
    """The fields of class ``cls`` in ``path``: name, annotation, default, and the comments on
    and above it (a comment above a run of fields speaks for the run)."""
    src = path.read_text()
    tree = ast.parse(src)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    comments = _comments(src)
    s = Struct(cls, path, _clean(ast.get_docstring(node) or ""))
    prev_end = node.lineno
    group = ""  # a heading comment: the group of the fields below it
    run_head = ""  # the first field of a run that a comment above describes
    run_end = -1
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            above: list[str] = []
            ln = stmt.lineno - 1
            while ln > prev_end and ln in comments and comments[ln][1]:
                above.insert(0, comments[ln][0])
                ln -= 1
            if len(above) == 1 and _heading(above[0]):
                group, above = above[0], []
            inline = [
                comments[i][0]
                for i in range(stmt.lineno, stmt.end_lineno + 1)
                if i in comments and not comments[i][1]
            ]
            inner = [
                comments[i][0]
                for i in range(stmt.lineno + 1, stmt.end_lineno + 1)
                if i in comments and comments[i][1]
            ]
            doc = " ".join(above + inline + inner)
            name = stmt.target.id
            if above:
                run_head, run_end = name, stmt.end_lineno
            elif not doc and run_head and stmt.lineno == run_end + 1:
                doc = f"with `{run_head}` above"
                run_end = stmt.end_lineno
            else:
                run_head = ""
            if not doc and group:
                doc = f"({group})"
            default = "required" if stmt.value is None else ast.unparse(stmt.value)
            m = re.fullmatch(r"(?:msgspec\.)?field\(default_factory=(\w+)\)", default)
            if m:
                default = f"{m.group(1)}()"
            s.fields.append(Field(name, ast.unparse(stmt.annotation), default, _clean(doc)))
        elif not isinstance(stmt, ast.Expr):  # a method, a blank: a run of fields ends
            run_head = ""
        prev_end = stmt.end_lineno
    return s


# ------------------------------------------------------------------ which flag reaches a field


def long_flag(o: Opt) -> str:
    """The option's long name (``--category``, not ``-c``)."""
    return max(o.flags.split(", "), key=len)


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _chains(node: ast.AST) -> set[str]:
    """``cfg.rollout.max_turns`` -> ``rollout.max_turns`` for every such chain in ``node``."""
    out = set()
    for n in ast.walk(node):
        if (
            isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Attribute)
            and isinstance(n.value.value, ast.Name)
            and n.value.value.id == "cfg"
        ):
            out.add(f"{n.value.attr}.{n.attr}")
    return out


def _calls(fn_node: ast.AST, cls: str) -> list[dict[str, ast.AST]]:
    """The keyword arguments of every ``cls(...)`` call (or of its snake-case factory, e.g.
    ``sandbox_config(...)`` for ``SandboxConfig``), and dict literals handed to
    ``cls.from_dict`` (their string keys), in ``fn_node``."""
    factory = re.sub(r"(?<!^)(?=[A-Z])", "_", cls).lower()
    out = []
    for n in ast.walk(fn_node):
        if isinstance(n, ast.Call):
            f = n.func
            fname = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if fname in (cls, factory):
                out.append({k.arg: k.value for k in n.keywords if k.arg})
        if isinstance(n, ast.Dict) and cls + ".from_dict" in ast.unparse(fn_node):
            keys = [k.value for k in n.keys if isinstance(k, ast.Constant)]
            if keys and all(isinstance(k, str) for k in keys):
                out.append(dict(zip(keys, n.values, strict=False)))
    return out


HELP: dict[str, str] = {}  # "`sandbox eval --atol`" -> that option's help


def reached_by(cls: str, cmds: list[Cmd]) -> dict[str, list[str]]:
    """field -> the command-line options and ``ppo train`` config keys that set it (from the
    commands' sources and ``ppo/trainer.py``)."""
    import inspect
    import textwrap

    out: dict[str, list[str]] = {}
    for c in cmds:
        if c.callback is None:
            continue
        try:
            fn = getattr(c.callback, "bundled_fn", c.callback)  # records.bundle_options
            fn_node = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError):
            continue
        by_param = {o.name: o for o in c.opts}
        for kws in _calls(fn_node, cls):
            for key, value in kws.items():
                for n in sorted(_names(value)):
                    if n in by_param and not by_param[n].argument:
                        flag = long_flag(by_param[n])
                        out.setdefault(key, []).append(f"`{c.path} {flag}`")
                        HELP.setdefault(f"`{c.path} {flag}`", by_param[n].help)
    ppo_src = ast.parse((PKG / "ppo/src/cuda_agent/ppo/trainer.py").read_text())
    for kws in _calls(ppo_src, cls):
        for key, value in kws.items():
            for chain in sorted(_chains(value)):
                out.setdefault(key, []).append(f"`{chain}`")
    return {k: sorted(set(v), key=v.index) for k, v in out.items()}


# ------------------------------------------------------------------ Markdown helpers


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def code(text: Any) -> str:
    t = str(text)
    return f"`{cell(t)}`" if t else ""


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def anchor(title: str) -> str:
    a = re.sub(r"[^\w\- ]", "", title.lower()).strip().replace(" ", "-")
    return a


# ------------------------------------------------------------------ prose the code does not hold

# the Python configuration objects, in page order: (package-relative path, class, how a
# setting reaches it, how unknown keys are treated)
STRUCTS: list[tuple[str, str, str, str]] = [
    (
        "sandbox/src/cuda_agent/sandbox/config.py",
        "SandboxConfig",
        "`sandbox eval`, `kernelbench-eval run` and `kernel-service serve` flags; every field "
        "through `kernel-service serve --sandbox-config JSON`; the `[sandbox]` keys of a "
        "training config; Python: `SandboxConfig(...)`, `SandboxConfig.from_dict(d)`",
        "an unknown key is an error (`from_dict`: `unknown SandboxConfig key(s)`; the "
        "constructor: `TypeError`); out-of-range values raise `ValueError` naming the field",
    ),
    (
        "profiler/src/cuda_agent/profiler/config.py",
        "TimingConfig",
        "`--timing-config JSON` of `sandbox eval` and `kernelbench-eval run` (any field); "
        "`profiler time` / `profiler baseline` flags (`--time-cap`, `--target-rse`, "
        "`--warmup-ms`, `--cuda-graph`, `--flush`); `SandboxConfig.timing_config`",
        "`--timing-config` and `SandboxConfig` reject unknown keys; `TimingConfig.from_dict` "
        "itself ignores them (it reads settings the trusted parent wrote, possibly from a newer "
        "version)",
    ),
    (
        "reward/src/cuda_agent/reward/schemes.py",
        "RewardConfig",
        "`reward score` flags; the `[reward]` keys of a training config",
        "the constructor rejects unknown names (`TypeError`)",
    ),
    (
        "agent/src/cuda_agent/agent/episode.py",
        "EpisodeConfig",
        "`agent rollout` flags; the `[rollout]` keys of a training config",
        "the constructor rejects unknown names (`TypeError`)",
    ),
    (
        "rft/src/cuda_agent/rft/select.py",
        "SelectConfig",
        "`rft select` flags",
        "the constructor rejects unknown names (`TypeError`)",
    ),
    (
        "training/src/cuda_agent/training/trainer.py",
        "TrainConfig",
        "the shared options of `rft train` and `critic pretrain` (same names, `--` and dashes); "
        "`ppo train` builds one for its actor and critic from the `[train]` and `[ppo]` keys",
        "the constructor rejects unknown names (`TypeError`)",
    ),
    (
        "service/src/cuda_agent/service/server.py",
        "ServiceSettings",
        "`kernel-service serve` flags",
        "the constructor rejects unknown names; values out of range raise `ValueError`",
    ),
    (
        "opsynth/src/cuda_agent/opsynth/compose.py",
        "ComposeConfig",
        "`opsynth compose` flags",
        "the constructor rejects unknown names (`TypeError`)",
    ),
    (
        "opsynth/src/cuda_agent/opsynth/filter.py",
        "FilterConfig",
        "`opsynth filter` flags",
        "the constructor rejects unknown names (`TypeError`)",
    ),
    (
        "opsynth/src/cuda_agent/opsynth/probe.py",
        "ProbeConfig",
        "built by `FilterConfig` for each task's probe process (no flag of its own)",
        "the constructor rejects unknown names (`TypeError`)",
    ),
    (
        "opsynth/src/cuda_agent/opsynth/dedup.py",
        "DedupConfig",
        "`opsynth dedup` and `opsynth import-ops6k` flags",
        "the constructor rejects unknown names (`TypeError`)",
    ),
    (
        "opsynth/src/cuda_agent/opsynth/llm.py",
        "LLMConfig",
        "`opsynth compose --llm URL --llm-model NAME`",
        "the constructor rejects unknown names (`TypeError`)",
    ),
    (
        "adapters/src/cuda_agent/adapters/trl.py",
        "WorkspaceEnvConfig",
        "Python only: `WorkspaceEnvFactory(..., config=WorkspaceEnvConfig(...))` (TRL, OpenRLHF)",
        "the constructor rejects unknown names (`TypeError`)",
    ),
    (
        "adapters/src/cuda_agent/adapters/openrlhf.py",
        "AgentSettings",
        "the environment variables `CUDA_AGENT_OPENRLHF_<FIELD>` (upper case), read by "
        "`AgentSettings.from_env()` in OpenRLHF's agent function",
        "an unknown `CUDA_AGENT_OPENRLHF_*` variable is an error naming the known ones",
    ),
    (
        "adapters/src/cuda_agent/adapters/verifiers.py",
        "KernelTasksetConfig",
        "verifiers' `--env.taskset.*` options, or `load_environment(...)` keywords",
        "an unknown name is an error (verifiers' pydantic config: `extra_forbidden`)",
    ),
    (
        "adapters/src/cuda_agent/adapters/verifiers.py",
        "KernelTaskConfig",
        "verifiers' `--env.taskset.task.*` options, or `load_environment(...)` keywords",
        "an unknown name is an error (verifiers' pydantic config: `extra_forbidden`)",
    ),
]

# what an option without a help text of its own does ("command --option" -> text)
OPTION_NOTES: dict[str, str] = {
    "sandbox eval --atol": "Absolute tolerance: an element is correct when |c - r| <= atol + rtol * |r|.",
    "sandbox eval --rtol": "Relative tolerance (see --atol).",
    "opsynth import-ops6k --ref-threshold": "Drop a task whose Jaccard similarity to a KernelBench "
    "problem is at least this (with --kernelbench).",
}

# what a field without a comment does, for the packages whose sources this page does not edit
FIELD_NOTES: dict[str, dict[str, str]] = {
    "SandboxConfig": {
        "timing_sets": "how many of the trials' input sets the timing uses",
        "tmp_root": "where each evaluation's scratch directory is made (None: the system temp dir)",
        "no_network": "candidates' processes run without network",
        "drop_user": "started as root, run candidates as a leased unprivileged uid",
    },
    "FilterConfig": {
        "window_ms": "the eager-time window a task must fall in (None: the backend's default, "
        "`opsynth filter --min-ms/--max-ms`)",
        "max_rescales": "how many times a task outside the window is rescaled before it is dropped",
    },
    "ProbeConfig": {
        "device": "cpu or cuda",
        "time": "time the task's eager forward",
        "time_budget_s": "seconds of eager timing",
    },
    "DedupConfig": {
        "num_perm": "MinHash permutations per signature",
        "bands": "LSH bands (num_perm / bands rows each)",
    },
    "LLMConfig": {
        "api_key_env": "the environment variable holding the API key",
        "temperature": "sampling temperature of the composing model",
        "timeout_s": "seconds per request",
        "retries": "retries of a failed request",
    },
}

# flags that reach a field but are not found in a constructor call (computed first)
EXTRA_REACH: dict[str, dict[str, list[str]]] = {
    "SandboxConfig": {"backend": ["`sandbox.backend`"]},
}

# bin/ scripts: option -> (value, default, meaning)
SCRIPT_OPTIONS: dict[str, dict[str, tuple[str, str, str]]] = {
    "bin/train_all.sh": {
        "--config": ("FILE", "required", "the training config (TOML; the keys above)"),
        "--run-dir": (
            "DIR",
            "required",
            "where every stage writes `DIR/<stage>/` and `DIR/logs/<stage>.log`",
        ),
        "--set": (
            "section.key=VALUE",
            "",
            "override a config key with a TOML value (repeatable); it reaches every stage",
        ),
        "--only": ("STAGE", "", "run this stage alone (still skipped when it is done)"),
        "--force": (
            "STAGE",
            "",
            "delete `DIR/<stage>/` and run it from scratch (repeatable; `all`: every stage); "
            "later stages are not redone unless forced too",
        ),
        "-h": ("", "", "print the usage (also `--help`)"),
    },
    "bin/eval_kernelbench.sh": {
        "--kernelbench": ("PATH", "required", "a KernelBench checkout (`KernelBench/level1/...`)"),
        "--solutions": (
            "DIR",
            "",
            "a folder of solutions (KernelBench-named files or CUDA-Agent workdirs); exactly "
            "one of `--solutions` and `--model`",
        ),
        "--model": (
            "SPEC",
            "",
            "an agent policy (`hf:DIR`, `openai:URL#MODEL`, `server:URL#MODEL`, `smollm2`) that "
            "solves each problem in one greedy episode",
        ),
        "--out": (
            "DIR",
            "runs/kernelbench",
            "where tasks, results, `report.md`, `report.json`, `speedup.png` go",
        ),
        "--levels": ("LIST", "1,2,3", "KernelBench levels"),
        "--problems": ("RANGE", "", "problem ids, e.g. `1-20` (all when empty)"),
        "--backend": ("cuda | cpu | auto", "auto", "the sandbox backend"),
        "--guard-policy": (
            "strict | kernelbench | off",
            "kernelbench",
            "the guard policy of `--solutions` runs (`--model` runs use `strict`)",
        ),
        "--gpus": ("all | LIST", "", "GPUs that evaluate `--solutions` (default: the sandbox's)"),
        "--max-turns": ("N", "200", "turn limit of a `--model` episode"),
        "--device": ("auto | cuda | cpu", "auto", "where a `--model hf:` policy runs"),
        "-h": ("", "", "print the usage (also `--help`)"),
    },
}
SCRIPT_ARGS = {
    "bin/demo.sh": [("RUN_DIR", "runs/demo", "the run directory (rerun to continue)")],
    "bin/synth_data.sh": [("OUTDIR", "data", "where the synthesis files and `tasks.jsonl` go")],
}
# bin/synth_data.sh's environment: name -> (default, meaning)
SYNTH_ENV: dict[str, tuple[str, str]] = {
    "N": ("6000", "composed tasks before filtering (`pipeline.synth_n`)"),
    "SEED": ("0", "compose seed"),
    "BACKEND": ("cuda when a GPU is visible, else cpu", "the filter's backend (`sandbox.backend`)"),
    "SIZE": ("gpu for cuda, cpu for cpu", "task sizes (`pipeline.synth_size`)"),
    "GPUS": ("every visible GPU", "GPUs used by the filter workers and the baseline shards"),
    "WORKERS_PER_GPU": (
        "cuda: min(12, (cores - 2) / GPUS); cpu: 1",
        "filter processes per GPU, all taking tasks from one queue",
    ),
    "MEM_GB": ("cuda: 90% of a GPU's memory / WORKERS_PER_GPU; cpu: 16", "memory cap per task"),
    "KB": ("", "a KernelBench checkout to decontaminate against (`pipeline.kernelbench`)"),
    "COMPILE": ("1", "also check `torch.compile` in the filter (`pipeline.synth_compile_check`)"),
    "BASELINE": (
        "1 on cuda",
        "fill `Task.baseline` with `profiler baseline` (`train_all.sh` sets 0: its `baselines` stage does it)",
    ),
}

# environment variables the code reads: name -> (read by, meaning, the flag or key that sets it)
ENV_VARS: dict[str, tuple[str, str, str]] = {
    "CUDA_AGENT_CACHE": (
        "profiler, agent",
        "root of the profiler's caches (`baselines/`, `ceilings/`) and of the converted "
        "embedded model (`models/`); default `~/.cache/cuda-agent`",
        "none (environment only)",
    ),
    "CUDA_AGENT_SANDBOX_CACHE": (
        "sandbox",
        "the sandbox's build cache; default `$XDG_CACHE_HOME/cuda-agent/sandbox` "
        "(`~/.cache/cuda-agent/sandbox`)",
        "`sandbox eval --cache-dir`, `SandboxConfig.cache_dir` (they win)",
    ),
    "CUDA_AGENT_TIMING_CPUS": (
        "profiler, sandbox",
        "the CPU cores kept for the process that times on a device (comma-separated ids); set "
        "by the evaluator for the processes it starts, and when set it wins over the setting",
        "`--timing-cpus`, `SandboxConfig.timing_cpus` (when the variable is unset)",
    ),
    "CUDA_AGENT_GATE_DIR": (
        "sandbox",
        "directory of the host-wide per-GPU lock files that keep timed sections of all "
        "evaluators on one host apart; default `<temp dir>/cuda-agent-gates`; `off`: locks per "
        "process only",
        "none (environment only)",
    ),
    "CUDA_AGENT_ARCH": (
        "sandbox",
        "the GPU architecture to compile for (e.g. `9.0`) instead of the visible GPU's: "
        "cross-compiling without a GPU (the sandbox sets `TORCH_CUDA_ARCH_LIST` from it or from "
        "the GPU for `load_inline` builds)",
        "none (environment only)",
    ),
    "CUDA_AGENT_LINKER": (
        "sandbox",
        "the linker of extension modules: `fast` (the first of mold, lld, gold that links; the "
        "default for cpu modules), `default` (the compiler's own; the default for cuda "
        "modules), or a `-fuse-ld` name",
        "none (environment only)",
    ),
    "CUDA_AGENT_LINK_STUBS": (
        "sandbox",
        "`0`: link modules against torch's real libraries instead of symbol-less stand-ins "
        "(slower links, same result)",
        "none (environment only)",
    ),
    "CUDA_AGENT_NVCC_SPLIT": (
        "sandbox",
        "`0`: compile every `.cu` with one nvcc call instead of nvcc's steps in two chains",
        "none (environment only); `sandbox flags` shows the state",
    ),
    "CUDA_AGENT_PCH_AFTER": (
        "sandbox",
        "on the cpu backend, precompile the bindings' prelude after this many bindings built "
        "(default 3; 0: at once)",
        "`sandbox eval --pch/--no-pch` turns it on or off for every build",
    ),
    "CUDA_AGENT_STANDIN": (
        "sandbox",
        "`0`: compile heavy workdir units against the real torch headers at once instead of "
        "trying lighter stand-in headers first",
        "none (environment only)",
    ),
    "CUDA_AGENT_KB_LIGHT_HEADERS": (
        "sandbox",
        "KernelBench `load_inline` builds: `2` (default) tries stand-in torch headers first, "
        "`1` only `torch/types.h` for the CUDA sources, `0` the sources as given",
        "none (environment only)",
    ),
    "CUDA_AGENT_SANDBOX_READ_CACHE": (
        "sandbox (set by it)",
        "set by the sandbox for an agent's tool commands: the evaluation's build cache they "
        "may read",
        "internal: not for users",
    ),
    "CUDA_AGENT_RUN": (
        "sandbox (set by it)",
        "a mark in the environment of every process the sandbox starts, so that a run's "
        "leftovers can be found and killed",
        "internal: not for users",
    ),
    "CUDA_AGENT_RAY_ADDRESS": (
        "sandbox, kernelbench-eval",
        "the Ray cluster to evaluate on",
        "`sandbox eval --ray`, `kernelbench-eval run --ray` (the flag wins)",
    ),
    "CUDA_AGENT_SERVICE_TOKEN": (
        "service, adapters",
        "the bearer token of `kernel-service serve` and of its clients",
        "`kernel-service serve --token-file` (wins); adapters: their `token_env` setting names "
        "another variable",
    ),
    "CUDA_AGENT_DEEPSPEED_CPU": (
        "training",
        "`1`: run DeepSpeed on the CPU over gloo (a slow smoke test)",
        "none (environment only)",
    ),
    "CUDA_AGENT_CUDNN_SDPA": (
        "agent, training",
        "`1`: keep cuDNN among torch's attention backends (by default it is taken out: it "
        "builds a plan for every new shape, which made generation 15x slower)",
        "none (environment only)",
    ),
    "CUDA_AGENT_VERL_SERVICE": (
        "adapters (verl)",
        "`compute_score`'s kernel-service URL when `reward_kwargs` has no `service_url`",
        "`custom_reward_function.reward_kwargs.service_url` (wins)",
    ),
    "CUDA_AGENT_VERL_BACKEND": (
        "adapters (verl)",
        "`compute_score`'s sandbox backend (default `auto`)",
        "`reward_kwargs.backend` (wins)",
    ),
    "CUDA_AGENT_VERL_GUARD_POLICY": (
        "adapters (verl)",
        "`compute_score`'s guard policy (default `strict`)",
        "`reward_kwargs.guard_policy` (wins)",
    ),
    "CUDA_AGENT_VERL_TIMING": (
        "adapters (verl)",
        "`0`: `compute_score` evaluates without timing (rewards up to 1)",
        "`reward_kwargs.timing` (wins)",
    ),
    "CUDA_AGENT_OPENRLHF_": (
        "adapters (OpenRLHF)",
        "`CUDA_AGENT_OPENRLHF_<FIELD>`: one field of `AgentSettings` each (below)",
        "none: these variables are the settings",
    ),
    "OPENAI_API_KEY": (
        "agent, opsynth",
        "the API key of `openai:` / `server:` policies and of `opsynth compose --llm`",
        "none (environment only; `LLMConfig.api_key_env` names another variable)",
    ),
    "NCU": ("profiler", "the Nsight Compute binary of `profiler ncu`", "none (environment only)"),
    "CXX": ("sandbox", "the host C++ compiler (default `g++`)", "none (environment only)"),
    "CUDA_HOME": (
        "sandbox",
        "where nvcc and the CUDA headers are (also `CUDA_PATH`; default: nvcc on `PATH`, "
        "`/usr/local/cuda`)",
        "none (environment only)",
    ),
    "CUDA_VISIBLE_DEVICES": (
        "sandbox, training",
        "the GPUs a process may use; `--gpus` picks among them, and an empty value means no GPU",
        "`sandbox eval --gpus` (a subset)",
    ),
    "LOCAL_RANK": (
        "training, ppo",
        "the rank's GPU, set by `torchrun` / `deepspeed` (with `RANK`, `WORLD_SIZE`, "
        "`MASTER_ADDR`, `MASTER_PORT`)",
        "the launcher",
    ),
    "OMP_NUM_THREADS": (
        "sandbox, opsynth",
        "CPU threads of the candidate's and the filter's processes (default: up to 8)",
        "`opsynth filter --threads`",
    ),
}
# read from the environment but documented with another entry
ENV_ALIASES = {
    "CUDA_PATH": "CUDA_HOME",
    "RANK": "LOCAL_RANK",
    "WORLD_SIZE": "LOCAL_RANK",
    "MASTER_PORT": "LOCAL_RANK",
    "XDG_CACHE_HOME": "CUDA_AGENT_SANDBOX_CACHE",
    "TORCH_CUDA_ARCH_LIST": "CUDA_AGENT_ARCH",
}
# read, but only to pass them on to child processes or set for a library
ENV_IGNORED = {
    "PATH",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
    "PYTEST_XDIST_WORKER",
}


def env_vars_read() -> set[str]:
    """Every environment variable the packages read (by name in the source)."""
    names: set[str] = set()
    pat_named = re.compile(
        r"(?:environ(?:\.get|\.setdefault)?|getenv)\(?\[?\s*[\"']([A-Z][A-Z0-9_]+)[\"']"
    )
    pat_ours = re.compile(r"\bCUDA_AGENT_[A-Z0-9_]*")
    for p in PKG.glob("*/src/cuda_agent/**/*.py"):
        if "/template/" in str(p):  # files of the agent's workspace, not the toolkit's
            continue
        text = p.read_text()
        names |= set(pat_named.findall(text))
        names |= {n for n in pat_ours.findall(text)}
    names.discard("CUDA_AGENT_")
    return {n for n in names if n not in ENV_IGNORED}


def argparse_options(path: Path) -> list[tuple[str, str, str]]:
    """(flag, default, help) of every ``add_argument`` call in ``path``."""
    out = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument":
            flag = n.args[0].value if n.args and isinstance(n.args[0], ast.Constant) else "?"
            kw = {k.arg: k.value for k in n.keywords}
            default = ""
            if "default" in kw:
                d = ast.literal_eval(kw["default"])
                default = "" if d is None else str(d)
            if "action" in kw and ast.literal_eval(kw["action"]) == "store_true":
                default = "off"
            help_ = ast.literal_eval(kw["help"]) if "help" in kw else ""
            out.append((flag, default, help_))
    return out


def script_flags(path: Path) -> list[str]:
    """The options a bin/ script's argument loop accepts (``--name)`` case arms)."""
    found = []
    for m in re.finditer(r"^\s*(-[-\w]+)(?:\|[-\w]+)*\)", path.read_text(), re.M):
        found.append(m.group(1))
    return found


def script_env(path: Path) -> list[str]:
    """The variables a script takes from its environment (``${NAME:-default}``)."""
    text = path.read_text()
    return sorted(set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):[-+]", text)) - {"CUDA_VISIBLE_DEVICES"})


# ------------------------------------------------------------------ the page

CONFIGS = ["configs/tiny-cpu.toml", "configs/h200-smoke.toml", "configs/paper-8xh100.toml"]

INTRO = """\
# Configuration

Every setting of the toolkit, in one place: the keys of a training config, the options of every
command and script, the fields of the Python configuration objects, and the environment
variables the code reads. This page is written from the code by `bin/config_docs.py`
(`python bin/config_docs.py > docs/configuration.md`), and a test fails when it is out of date,
so what is here is what the code does. How to use the settings:
[evaluating.md](evaluating.md) (kernels), [training.md](training.md) (the recipe),
[performance.md](performance.md) (which settings change the speed).

Unknown names are errors everywhere a user writes settings: a misspelt config key or section
(`ppo train`, `bin/train_all.sh`: exit 2 naming it), an unknown option of a command or a script
(exit 2), an unknown field in `--timing-config` or `--sandbox-config` JSON, an unknown
`CUDA_AGENT_OPENRLHF_*` variable. The exceptions are listed at the end
([Where unknown names are not errors](#where-unknown-names-are-not-errors)).

| kind of setting | where | jump to |
| --- | --- | --- |
| the training recipe and `ppo train` | a TOML file (`configs/*.toml`), overridden by `--set section.key=value` | [Training config](#training-config) |
| `bin/train_all.sh`, `bin/eval_kernelbench.sh`, `bin/demo.sh`, `bin/synth_data.sh` | options, and for `synth_data.sh` environment variables | [Scripts](#scripts) |
| every command (`sandbox eval`, `kernelbench-eval run`, `agent rollout`, ...) | command-line options (`uv run COMMAND SUBCOMMAND --help`) | [Commands](#commands) |
| the library (`cuda_agent.sandbox.evaluate`, `SandboxPool`, the adapters) | configuration objects (`SandboxConfig`, `TimingConfig`, ...) | [Python configuration objects](#python-configuration-objects) |
| machine-level choices (caches, compilers, locks, tokens) | environment variables | [Environment variables](#environment-variables) |

## Which setting do I need?

| to ... | set |
| --- | --- |
| evaluate on the GPU or the CPU | `--backend cuda\\|cpu\\|auto` (`sandbox eval`, `kernelbench-eval run`); `sandbox.backend` in a training config |
| use every GPU, or some | `--gpus all` or `--gpus 0,1`; `--workers-per-gpu` (2) device workers per GPU |
| continue a killed evaluation | the same command with `-o FILE --resume` |
| choose the rules a kernel must follow | `--guard-policy strict\\|kernelbench\\|off` ([guards.md](guards.md)) |
| loosen or tighten correctness | `--atol`, `--rtol` (1e-2), `--norm-tol` (`sandbox eval`), `--trials` (5) |
| a robust evaluation (numerics and shapes) | `--stress-trials --shape-check` |
| skip timing (correctness only) | `--no-timing` |
| skip the `torch.compile` baseline | `kernelbench-eval run --no-compile-baseline`; `sandbox eval --no-baselines` (eager too); `sandbox.compile_baseline = false` in a training config |
| change the timing protocol | `--timing-config '{"time_cap_s": 3}'` (fields of [TimingConfig](#timingconfig)) |
| move the build cache / the baseline cache | `--cache-dir` or `CUDA_AGENT_SANDBOX_CACHE`; `CUDA_AGENT_CACHE` |
| the model to train | `model.actor = "/models/DIR"` and `model.tiny = false`; `--model DIR` for `rft train`, `critic pretrain` |
| the model to evaluate as an agent | `agent rollout --policy hf:DIR` or `openai:URL#MODEL`; `bin/eval_kernelbench.sh --model ...` |
| train without DeepSpeed | `--set 'train.deepspeed=""' --set 'pipeline.deepspeed=""'` |
| a bigger or smaller run | `ppo.steps`, `data.tasks_per_step`, `data.samples_per_task`, `rollout.max_turns`, `pipeline.synth_n` ([training.md](training.md)) |
"""


def section_training(cmds: list[Cmd]) -> str:
    import msgspec

    from cuda_agent.ppo.config import load_config

    values = [msgspec.to_builtins(load_config(ROOT / c)) for c in CONFIGS]
    parts = [
        "## Training config",
        "",
        "A TOML file with the sections below, read by `ppo train --config FILE` and by "
        "`bin/train_all.sh --config FILE` (which reads every section through "
        "`ppo config-env`). `--set section.key=value` overrides one key with a TOML value "
        "(numbers and booleans as they are, strings in double quotes: "
        "`--set 'model.actor=\"/models/x\"'`; a value that is not TOML is taken as a string; "
        "an empty string turns an optional path off). An unknown section or key, or a value of "
        "the wrong type, stops with exit code 2 naming it. "
        "`uv run ppo check-config --config FILE [--set ...]` prints the config with every "
        "default filled in; `ppo config-env` prints it as `CA_<SECTION>_<KEY>` shell variables "
        "(what `bin/train_all.sh` uses). `RUN` in the shipped configs' paths is not expanded: "
        "`bin/train_all.sh` sets `data.tasks` and `train.out` for its stages, and a command run "
        "alone needs them set. The source of every key is "
        "[packages/ppo/src/cuda_agent/ppo/config.py](../packages/ppo/src/cuda_agent/ppo/config.py); "
        "the reason for each paper-scale value is in "
        "[configs/paper-8xh100.toml](../configs/paper-8xh100.toml).",
        "",
        "Which stage reads which key: [training.md](training.md#the-stages). In short, "
        "`[pipeline]` is read only by `bin/train_all.sh`; every other section is read by "
        "`ppo train` (the `warmup` and `ppo` stages), and the `collect`, `rft`, `critic` and "
        "`eval` stages take the few keys training.md lists as command-line options.",
        "",
    ]
    from cuda_agent.ppo.config import PPOConfig

    defaults = msgspec.to_builtins(PPOConfig())
    path = PKG / "ppo/src/cuda_agent/ppo/config.py"
    top = struct(path, "PPOConfig")
    head = ["key", "type", "default", "tiny-cpu", "h200-smoke", "paper-8xh100", "meaning"]
    for sec in top.fields:
        cls = re.search(r"default_factory=(\w+)", sec.default) or re.match(r"(\w+)", sec.default)
        st = struct(path, cls.group(1))
        parts += [f"### `[{sec.name}]`", ""]
        if st.doc:
            parts += [st.doc, ""]
        rows = []
        for f in st.fields:
            vals = []
            for v in values:
                x = v[sec.name][f.name]
                vals.append(code("none" if x is None else _toml(x)))
            d = defaults[sec.name][f.name]
            rows.append(
                [
                    code(f"{sec.name}.{f.name}"),
                    code(pytype(f.type)),
                    code("none" if d is None else _toml(d)),
                    *vals,
                    cell(f.doc),
                ]
            )
        parts += [table(head, rows), ""]
    return "\n".join(parts)


def pytype(t: str) -> str:
    """``Literal['a', 'b']`` -> ``a | b``."""
    return re.sub(
        r"Literal\[([^\]]*)\]",
        lambda m: " | ".join(x.strip().strip("'\"") for x in m.group(1).split(",")),
        t,
    )


def runtime_defaults(path: Path, cls: str) -> dict[str, str]:
    """The fields' defaults as the running code has them (``repr``), where the module imports
    (an optional dependency missing: none, and the source's text is shown)."""
    import dataclasses

    rel = path.relative_to(PKG).parts  # pkg/src/cuda_agent/x/y.py
    module = ".".join(rel[2:])[: -len(".py")]
    try:
        obj = getattr(importlib.import_module(module), cls)
    except Exception:  # noqa: BLE001 - verifiers, trl: not installed
        return {}
    out = {}
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            if f.default is not dataclasses.MISSING:
                out[f.name] = _repr(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = _repr(f.default_factory())
            else:
                out[f.name] = "required"
    return out


def _repr(x: Any) -> str:
    import enum

    if isinstance(x, enum.Enum):
        return repr(x.value)
    if isinstance(x, (set, frozenset)):
        return "{" + ", ".join(sorted(map(repr, x))) + "}" if x else "set()"
    return repr(x)


def _toml(x: Any) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, str):
        return f'"{x}"'
    return str(x)


def section_scripts() -> str:
    parts = [
        "## Scripts",
        "",
        "Run them from the repository root as `uv run bin/NAME.sh ...` (the toolkit's commands "
        "must be on `PATH`). An unknown option stops with exit code 2.",
        "",
    ]
    for script, opts in SCRIPT_OPTIONS.items():
        found = script_flags(ROOT / script)
        missing = [f for f in found if f not in opts]
        stale = [f for f in opts if f not in found]
        if missing or stale:
            raise SystemExit(f"config_docs: {script}: undocumented {missing}, gone {stale}")
        parts += [f"### `{script}`", ""]
        rows = [
            [code(f), code(v), code(d) if d not in ("", "required") else d, cell(m)]
            for f, (v, d, m) in opts.items()
        ]
        parts += [table(["option", "value", "default", "meaning"], rows), ""]
    for script, args in SCRIPT_ARGS.items():
        parts += [f"### `{script}`", ""]
        rows = [[code(a), code(d), cell(m)] for a, d, m in args]
        parts += [table(["argument", "default", "meaning"], rows), ""]
        if script == "bin/demo.sh":
            parts += [
                "`bin/demo.sh` is `bin/train_all.sh --config configs/tiny-cpu.toml --run-dir "
                "RUN_DIR`, with the cuda backend when a GPU and nvcc are present.",
                "",
            ]
        if script == "bin/synth_data.sh":
            found = script_env(ROOT / script)
            missing = [v for v in found if v not in SYNTH_ENV]
            stale = [v for v in SYNTH_ENV if v not in found]
            if missing or stale:
                raise SystemExit(f"config_docs: {script}: undocumented {missing}, gone {stale}")
            parts += [
                "Its settings are environment variables (`bin/train_all.sh`'s `data` stage sets "
                "them from `[pipeline]`):",
                "",
                table(
                    ["variable", "default", "meaning"],
                    [[code(k), cell(d), cell(m)] for k, (d, m) in SYNTH_ENV.items()],
                ),
                "",
            ]
    parts += [
        "The `bin/gpu-check-*.sh` scripts and `bin/prepare-gpu-data.sh` are the measurement "
        "runs behind [performance.md](performance.md); each one's settings (environment "
        "variables such as `STAGES`, `BUDGET_S`, `OUT`) are in its header.",
        "",
    ]
    return "\n".join(parts)


def section_commands(cmds: list[Cmd]) -> str:
    parts = [
        "## Commands",
        "",
        "Every command's options, as `uv run COMMAND SUBCOMMAND --help` prints them. A flag "
        "written `--a/--no-a` is on or off; its default is the one shown. `INPUT` (a file, or "
        "stdin when omitted or `-`) and `-o FILE` / `--resume` / `--on-error` / `--shard` / "
        "`--claim` follow the stream conventions of "
        "[packages/records](../packages/records/README.md).",
        "",
    ]
    parts += [" · ".join(f"[`{c.path}`](#{anchor(c.path)})" for c in cmds), ""]
    for c in cmds:
        parts += [f"### {c.path}", ""]
        if c.help:
            parts += [cell(c.help), ""]
        if not c.opts:
            parts += ["No options.", ""]
            continue
        rows = []
        for o in c.opts:
            meaning = o.help or OPTION_NOTES.get(f"{c.path} {long_flag(o)}", "")
            if o.hidden:
                meaning = (meaning + " (hidden from `--help`)").strip()
            if o.envvar:
                meaning += f" Environment: `{o.envvar}`."
            rows.append([code(o.flags), cell(o.type), code(o.default), cell(meaning)])
        parts += [table(["option", "type", "default", "meaning"], rows), ""]
    serve = PKG / "agent/src/cuda_agent/agent/serve.py"
    parts += [
        "### python -m cuda_agent.agent.serve",
        "",
        "The reference inference server (OpenAI-compatible completions with token ids, and "
        'SGLang\'s weight reload) for `rollout.engine = "server"` and `--policy server:URL`.',
        "",
        table(
            ["option", "default", "meaning"],
            [[code(f), code(d), cell(h)] for f, d, h in argparse_options(serve)],
        ),
        "",
    ]
    return "\n".join(parts)


def section_structs(cmds: list[Cmd]) -> str:
    parts = [
        "## Python configuration objects",
        "",
        "What the library takes (`from cuda_agent.sandbox import SandboxConfig`, ...). Each "
        "table gives the field, its type and default as the source writes them, the "
        "command-line options and training-config keys that set it, and its comment in the "
        "source.",
        "",
    ]
    ppo_path = PKG / "ppo/src/cuda_agent/ppo/config.py"
    for sec in struct(ppo_path, "PPOConfig").fields:
        name = re.search(r"default_factory=(\w+)", sec.default) or re.match(r"(\w+)", sec.default)
        for f in struct(ppo_path, name.group(1)).fields:
            HELP.setdefault(f"`{sec.name}.{f.name}`", f.doc)
    for rel, cls, how, unknown in STRUCTS:
        path = PKG / rel
        st = struct(path, cls)
        reach = reached_by(cls, cmds)
        for k, v in EXTRA_REACH.get(cls, {}).items():
            reach.setdefault(k, []).extend(x for x in v if x not in reach.get(k, []))
        if cls == "TrainConfig":
            for c in cmds:
                if c.path in ("rft train", "critic pretrain"):
                    for o in c.opts:
                        label = f"`{c.path} {long_flag(o)}`"
                        reach.setdefault(o.name, []).append(label)
                        HELP.setdefault(label, o.help)
        if cls == "AgentSettings":
            reach = {f.name: [f"`CUDA_AGENT_OPENRLHF_{f.name.upper()}`"] for f in st.fields}
        mod = path.relative_to(ROOT)
        parts += [f"### {cls}", "", f"[`{mod}`](../{mod})" + (f": {st.doc}" if st.doc else ""), ""]
        parts += [f"Set by: {how}. Unknown names: {unknown}.", ""]
        defaults = runtime_defaults(path, cls)
        rows = []
        for f in st.fields:
            by = reach.get(f.name, [])
            doc = f.doc
            if not doc or (doc.startswith("(") and doc.endswith(")")):
                # a command's help first: a config key's comment speaks for its own use
                ordered = sorted(by, key=lambda b: " " not in b)
                doc = next((HELP[b] for b in ordered if HELP.get(b)), doc)
            doc = doc or FIELD_NOTES.get(cls, {}).get(f.name, "")
            if doc.startswith("(") and f.name in FIELD_NOTES.get(cls, {}):
                doc = FIELD_NOTES[cls][f.name]
            default = defaults.get(f.name, f.default)
            rows.append(
                [code(f.name), code(pytype(f.type)), code(default), cell(", ".join(by)), cell(doc)]
            )
        parts += [table(["field", "type", "default", "set by", "meaning"], rows), ""]
    return "\n".join(parts)


def section_env() -> str:
    read = env_vars_read()
    missing = sorted(read - set(ENV_VARS) - set(ENV_ALIASES))
    stale = sorted((set(ENV_VARS) | set(ENV_ALIASES)) - read)
    if missing or stale:
        raise SystemExit(f"config_docs: environment variables undocumented {missing}, gone {stale}")
    aliases: dict[str, list[str]] = {}
    for a, to in ENV_ALIASES.items():
        aliases.setdefault(to, []).append(a)
    rows = []
    for name, (who, what, flag) in sorted(ENV_VARS.items()):
        shown = f"`{name}<FIELD>`" if name.endswith("_") else code(name)
        also = aliases.get(name)
        if also:
            what += " (also read: " + ", ".join(f"`{a}`" for a in sorted(also)) + ")"
        rows.append([shown, cell(who), cell(what), cell(flag)])
    return "\n".join(
        [
            "## Environment variables",
            "",
            'Every variable the toolkit\'s packages read. "none (environment only)" means no '
            "flag or key sets it: export it before the command (`CUDA_AGENT_LINKER=default uv "
            "run sandbox eval ...`). The evaluator passes only a fixed set of variables to the "
            "processes that run candidates.",
            "",
            table(["variable", "read by", "what it does", "flag or key that sets it"], rows),
            "",
        ]
    )


UNKNOWN = """\
## Where unknown names are not errors

- `TimingConfig.from_dict` ignores unknown keys: it reads settings that the trusted evaluator
  wrote for its own worker processes. Every path a user writes them through
  (`--timing-config`, `SandboxConfig.timing_config`) rejects an unknown key first.
- verl's `compute_score(..., **reward_kwargs)` accepts any further keyword and ignores it: check
  the spelling of `service_url`, `backend`, `guard_policy`, `timing`, `evaluator` and
  `reward_scheme` in `custom_reward_function.reward_kwargs`.
- `kernelbench-eval solutions --jsonl` reads `level`, `problem_id`, `code` or `files`, `format`,
  `sample` and `origin` from each line and ignores other keys, so that released corpora with
  columns of their own (CUDA-L1's `ref_code`, its claimed speed-ups) load as they are.
- The DeepSpeed JSON files (`configs/ds_zero2.json`, `ds_zero3.json`) are read by DeepSpeed,
  which has its own rules; their `"auto"` entries are filled from the trainer's options.
"""


def render() -> str:
    cmds = commands()
    return (
        "\n".join(
            [
                INTRO,
                section_training(cmds),
                section_scripts(),
                section_commands(cmds),
                section_structs(cmds),
                section_env(),
                UNKNOWN,
            ]
        ).rstrip()
        + "\n"
    )


if __name__ == "__main__":
    sys.stdout.write(render())
