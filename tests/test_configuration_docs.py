"""docs/ answers from the code: docs/configuration.md holds every setting (and is what
bin/config_docs.py writes), and every result status and guard code is explained."""

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
