"""Run a corpus candidate the way the sandbox's candidate process does, in this process: the guard
is constructed before the candidate's module is imported, weights are copied from the reference,
several seeded trials are watched, then the probe runs. Globals the candidate patches are put back
afterwards so one test cannot poison the next."""

from __future__ import annotations

import contextlib
import itertools
import sys
from typing import Any

import torch

from cuda_agent.guards import RuntimeGuard
from cuda_agent.guards import harness as gh
from cuda_agent.guards.static import analyze
from cuda_agent.profiler.program import Program, load_module
from cuda_agent.records import Candidate, GuardViolation, Solution, Task

from .build import MODULE, build
from .corpus import CPU_CANDIDATES, Cand

_counter = itertools.count()


def candidate(c: Cand, fmt: str = "workdir") -> Candidate:
    return Candidate(task=Task.make(c.name, c.ref), solution=Solution.make(fmt, c.files))


def static(c: Cand, policy: str = "strict") -> list[GuardViolation]:
    return analyze(candidate(c), policy, (MODULE,)).findings


def kernels() -> Any:
    return build({c.name: c.cpp for c in CPU_CANDIDATES if c.cpp})


def _restore(snap: dict[str, Any]) -> None:
    for key, obj in snap.items():
        if key.startswith(("sys.modules", "builtins.")):
            continue
        head, _, attr = key.rpartition(".")
        parent = gh._resolve(head)
        if parent is gh._MISSING:
            continue
        cur = gh._resolve(key)
        if cur is not obj:
            with contextlib.suppress(AttributeError, TypeError):
                setattr(parent, attr, obj)


def run(
    c: Cand,
    policy: str = "strict",
    trials: int = 3,
    probe: bool = True,
    ref_code: str | None = None,
) -> tuple[list[GuardViolation], list[Any], list[Any]]:
    """(findings, reference outputs, candidate outputs) of ``trials`` seeded trials."""
    kernels()
    snap = gh.snapshot()
    ref_src = ref_code or c.ref
    n = next(_counter)
    ref = Program.from_source(ref_src, name=f"guards_ref_{n}")
    init = ref.init_inputs()
    ref_model = ref.make_model("cpu", seed=0, init_inputs=init)
    try:
        guard = RuntimeGuard(policy, backend="cpu", own_modules=[MODULE])
        mod = load_module(c.files["model_new.py"], name=f"guards_cand_{c.name}_{n}")
        model = mod.ModelNew(*init).eval()
        model.load_state_dict(ref_model.state_dict())
        guard.install()
        refs, outs = [], []
        with torch.no_grad():
            for s in range(trials):
                inputs = ref.make_inputs("cpu", seed=100 + s)
                refs.append(
                    ref_model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
                )
                with guard.watch(inputs):
                    out = model(*inputs)
                guard.after_call(inputs, out)
                outs.append(out)
            if probe:
                inputs = ref.make_inputs("cpu", seed=100)
                guard.probe(model, inputs, outs[0])
        return guard.finish(), refs, outs
    finally:
        _restore(snap)
        for k in [k for k in sys.modules if k.startswith(("guards_ref_", "guards_cand_"))]:
            del sys.modules[k]


def run_on(
    c: Cand, inputs_list: list[list[Any]], ref_code: str | None = None
) -> tuple[list[Any], list[Any]]:
    """Reference and candidate outputs on the given inputs (no guard): for the parent checks."""
    kernels()
    n = next(_counter)
    ref = Program.from_source(ref_code or c.ref, name=f"guards_ref_{n}")
    init = ref.init_inputs()
    ref_model = ref.make_model("cpu", seed=0, init_inputs=init)
    mod = load_module(c.files["model_new.py"], name=f"guards_cand_{c.name}_{n}")
    model = mod.ModelNew(*init).eval()
    model.load_state_dict(ref_model.state_dict())
    refs, outs = [], []
    with torch.no_grad():
        for inputs in inputs_list:
            refs.append(ref_model(*[x.clone() for x in inputs]))
            outs.append(model(*[x.clone() for x in inputs]))
    return refs, outs


def codes(findings: list[GuardViolation], severity: str = "reject") -> set[str]:
    return {f.code for f in findings if f.severity == severity}
