"""docs/ answers from the code: docs/configuration.md holds every setting (and is what
bin/config_docs.py writes), every result status and guard code is explained, and every command
and option the docs' shell blocks use exists."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGE = DOCS / "configuration.md"


def _generator():
    spec = importlib.util.spec_from_file_location("config_docs", ROOT / "bin" / "config_docs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["config_docs"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gen():
    return _generator()


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text()


def _sections(page: str) -> dict[str, str]:
    """``### title`` -> the text up to the next heading."""
    out = {}
    for m in re.finditer(r"^### ([^\n]+)\n(.*?)(?=^##)", page + "\n##", re.M | re.S):
        out[m.group(1).strip()] = m.group(2)
    return out


def test_page_is_what_the_generator_writes(gen, page):
    assert gen.render() == page, (
        "docs/configuration.md is out of date: run `python bin/config_docs.py > "
        "docs/configuration.md` (a setting was added, removed or changed)"
    )


def test_every_training_config_key_is_on_the_page(page):
    import msgspec

    from cuda_agent.ppo.config import PPOConfig

    missing = [
        f"{sec}.{key}"
        for sec, values in msgspec.to_builtins(PPOConfig()).items()
        for key in values
        if f"`{sec}.{key}`" not in page
    ]
    assert not missing, f"config keys missing from docs/configuration.md: {missing}"


def test_every_command_option_is_on_the_page(gen, page):
    sections = _sections(page)
    missing = []
    for cmd in gen.commands():
        text = sections.get(cmd.path)
        if text is None:
            missing.append(cmd.path)
            continue
        for opt in cmd.opts:
            names = [opt.name.upper()] if opt.argument else re.split(r"[/, ]+", opt.flags)
            missing += [f"{cmd.path} {n}" for n in names if n and f"{n}" not in text]
    assert not missing, f"missing from docs/configuration.md: {missing}"


# the Python configuration objects and where they live (import path, class)
STRUCTS = [
    ("cuda_agent.sandbox.config", "SandboxConfig"),
    ("cuda_agent.profiler.config", "TimingConfig"),
    ("cuda_agent.reward.schemes", "RewardConfig"),
    ("cuda_agent.agent.episode", "EpisodeConfig"),
    ("cuda_agent.rft.select", "SelectConfig"),
    ("cuda_agent.training.trainer", "TrainConfig"),
    ("cuda_agent.service.server", "ServiceSettings"),
    ("cuda_agent.opsynth.compose", "ComposeConfig"),
    ("cuda_agent.opsynth.filter", "FilterConfig"),
    ("cuda_agent.opsynth.probe", "ProbeConfig"),
    ("cuda_agent.opsynth.dedup", "DedupConfig"),
    ("cuda_agent.opsynth.llm", "LLMConfig"),
    ("cuda_agent.adapters.trl", "WorkspaceEnvConfig"),
    ("cuda_agent.adapters.openrlhf", "AgentSettings"),
]


@pytest.mark.parametrize("module,cls", STRUCTS, ids=[c for _, c in STRUCTS])
def test_every_config_object_field_is_on_the_page(page, module, cls):
    obj = getattr(importlib.import_module(module), cls)
    text = _sections(page).get(cls)
    assert text is not None, f"no section `### {cls}` in docs/configuration.md"
    missing = [f.name for f in dataclasses.fields(obj) if f"| `{f.name}` |" not in text]
    assert not missing, f"{cls} fields missing from docs/configuration.md: {missing}"


def test_every_config_object_is_generated(gen):
    assert {c for _, c in STRUCTS} <= {c for _, c, _, _ in gen.STRUCTS}


def test_every_environment_variable_read_is_on_the_page(gen, page):
    env = page.split("## Environment variables", 1)[1]
    missing = [v for v in gen.env_vars_read() if f"`{v}" not in env and f"`{v}<FIELD>`" not in env]
    assert not missing, f"environment variables missing from docs/configuration.md: {missing}"


def test_every_script_option_is_on_the_page(gen, page):
    sections = _sections(page)
    for script in gen.SCRIPT_OPTIONS:
        text = sections[f"`{script}`"]
        missing = [f for f in gen.script_flags(ROOT / script) if f"`{f}`" not in text]
        assert not missing, f"{script} options missing from docs/configuration.md: {missing}"
    text = sections["`bin/synth_data.sh`"]
    missing = [v for v in gen.script_env(ROOT / "bin/synth_data.sh") if f"`{v}`" not in text]
    assert not missing, f"bin/synth_data.sh variables missing: {missing}"


def test_every_status_is_explained():
    from cuda_agent.records import Status

    text = (DOCS / "evaluating.md").read_text()
    table = text.split("## Statuses", 1)[1].split("\n## ", 1)[0]
    missing = [s.value for s in Status if f"| `{s.value}` |" not in table]
    assert not missing, f"statuses missing from docs/evaluating.md's table: {missing}"


def test_every_guard_code_is_explained():
    from cuda_agent.guards.checks import CHECKS

    codes = list(CHECKS)
    assert codes
    guards = (DOCS / "guards.md").read_text()
    evaluating = (DOCS / "evaluating.md").read_text()
    todo = evaluating.split("### What to do about a guard finding", 1)[1].split("\n## ", 1)[0]
    assert not [c for c in codes if f"| `{c}` |" not in guards], "docs/guards.md"
    missing = [c for c in codes if f"`{c}`" not in todo]
    assert not missing, f"guard codes missing from docs/evaluating.md's advice: {missing}"


def _doc_commands(text: str):
    """(line, command path, options) of every toolkit command in the fenced shell blocks."""
    for block in re.finditer(r"```(?:bash|sh|shell|console)\n(.*?)```", text, re.S):
        body = re.sub(r"\\\n\s*", " ", block.group(1))
        first = text[: block.start()].count("\n") + 2
        for i, line in enumerate(body.splitlines()):
            line = line.split(" #", 1)[0]
            for seg in re.split(r"\|\||&&|[|;&]|\$\(|\)", line):
                yield first + i, seg.split()


def test_documented_commands_use_real_options(gen):
    """Every `COMMAND SUBCOMMAND --option` in a shell block of the user docs exists."""
    cmds = {c.path: c for c in gen.commands()}
    names = {n for n, _ in gen.CLIS}
    modules = {m: n for n, m in gen.CLIS}
    known = {
        p: {f for o in c.opts for f in re.split(r"[/, ]+", o.flags) if f.startswith("-")}
        for p, c in cmds.items()
    }
    files = [
        ROOT / "README.md",
        *sorted(DOCS.glob("*.md")),
        *sorted(ROOT.glob("packages/*/README.md")),
    ]
    scripts = {s: gen.script_flags(ROOT / s) for s in gen.SCRIPT_OPTIONS}
    wrong = []
    for f in files:
        for ln, toks in _doc_commands(f.read_text()):
            for k, tok in enumerate(toks):
                script = next((s for s in scripts if tok.endswith(s)), None)
                if script:
                    for t in toks[k + 1 :]:
                        opt = t.split("=", 1)[0]
                        if opt.startswith("-") and opt not in scripts[script] + ["--help"]:
                            wrong.append(f"{f.name}:{ln}: `{script}` has no option {opt}")
                    break
                cli = modules.get(toks[k + 1]) if tok == "-m" and k + 1 < len(toks) else None
                if tok in names and (k == 0 or toks[k - 1] in ("run", "time", "nice")):
                    cli, start = tok, k + 1
                elif cli:
                    start = k + 2
                else:
                    continue
                if start >= len(toks) or f"{cli} {toks[start]}" not in cmds:
                    if start < len(toks) and not toks[start].startswith("-"):
                        wrong.append(f"{f.name}:{ln}: no command `{cli} {toks[start]}`")
                    break
                path = f"{cli} {toks[start]}"
                for t in toks[start + 1 :]:
                    opt = t.split("=", 1)[0]
                    bad = re.fullmatch(r"--?[A-Za-z][\w-]*", opt) and opt not in known[path]
                    if bad and opt not in ("--help", "-h"):
                        wrong.append(f"{f.name}:{ln}: `{path}` has no option {opt}")
                break
    assert not wrong, "\n".join(wrong)


def test_every_option_says_what_it_does(gen):
    """An option without a help text (and no note in bin/config_docs.py) is undocumented."""
    bare = [
        f"{c.path} {gen.long_flag(o)}"
        for c in gen.commands()
        for o in c.opts
        if not o.help and not o.hidden and f"{c.path} {gen.long_flag(o)}" not in gen.OPTION_NOTES
    ]
    assert not bare, f"options without a help text: {bare}"


def test_every_row_of_the_page_says_what_it_does(page):
    """No key, option, field or variable without a meaning (a comment in the source, a help
    text, or a note in bin/config_docs.py)."""
    empty = [ln for ln in page.splitlines() if ln.startswith("| `") and ln.endswith("|  |")]
    assert not empty, "rows without a meaning:\n" + "\n".join(empty)
