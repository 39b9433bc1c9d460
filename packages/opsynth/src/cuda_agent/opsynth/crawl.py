"""Seed crawl: each catalogue operator that exists in the installed torch -> a single-op Task.

The crawl resolves every seed's qualified name (``nn.Conv2d``, ``F.gelu``, ``torch.cumsum``)
against the installed torch, builds a KernelBench-style program with legal arguments and a
realistic shape for the chosen size preset, and probes a tiny instance of it on the CPU: it must
run, and its RNG use in train and eval mode is measured (``meta.stochastic``), not guessed from
the name. :func:`coverage` lists the torch operators the catalogue does not cover.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Iterator
from typing import Any

from cuda_agent.records.types import Task

from .builder import NotApplicable
from .catalog import SEEDS, Seed
from .compose import build_chain, task_from_builder

_PREFIX = {"nn": "torch.nn", "F": "torch.nn.functional", "torch": "torch"}


def resolve(op: str) -> Any | None:
    """The object a qualified op name refers to in the installed torch (None if absent).

    ``transformers.*`` names are not resolved (those seeds are written in plain PyTorch).
    """
    head, _, rest = op.partition(".")
    if head == "transformers":
        return None
    mod = importlib.import_module(_PREFIX.get(head, head))
    obj: Any = mod
    for part in rest.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def available(s: Seed) -> bool:
    """Whether the seed's operator exists in the installed torch (transformers-style: always)."""
    if s.origin == "transformers":
        return True
    try:
        return resolve(s.op) is not None
    except ImportError:
        return False


def seed_task(s: Seed, size: str = "gpu", rng_seed: int = 0, tries: int = 20) -> Task:
    """A single-op Task for ``s`` (raises :class:`NotApplicable` when no shape works)."""
    last: Exception | None = None
    for t in range(tries):
        rng = random.Random(f"{s.name}:{rng_seed}:{t}")
        try:
            b = build_chain([s.name], rng, size=size)
        except NotApplicable as e:
            last = e
            continue
        return task_from_builder(b, [s], {"origin": s.origin, "category": s.category})
    raise NotApplicable(f"{s.name}: {last}")


def probe_seed(s: Seed, rng_seed: int = 0) -> dict[str, Any]:
    """Run a tiny instance of the seed on the CPU: ``{"ok", "stochastic", "rng_train",
    "rng_eval", "error"}``."""
    from cuda_agent.profiler.program import Program

    from .checks import probe_stochastic

    try:
        t = seed_task(s, size="tiny", rng_seed=rng_seed)
        prog = Program.from_source(t.ref_code, name=f"opsynth_seed_{s.name}")
        rng = probe_stochastic(prog, device="cpu")
    except Exception as e:  # noqa: BLE001 - reported per seed
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
    return {
        "ok": True,
        "stochastic": rng["train"] or rng["eval"],
        "rng_train": rng["train"],
        "rng_eval": rng["eval"],
    }


def crawl(
    size: str = "gpu",
    categories: list[str] | None = None,
    rng_seed: int = 0,
    probe: bool = True,
    log: Any = None,
) -> Iterator[Task]:
    """Single-op tasks for every available seed; ``meta`` has category, origin, stochastic."""
    for s in SEEDS.values():
        if categories and s.category not in categories:
            continue
        if not available(s):
            if log:
                log(f"crawl: {s.op} is not in this torch; seed {s.name} skipped")
            continue
        try:
            task = seed_task(s, size=size, rng_seed=rng_seed)
        except NotApplicable as e:
            if log:
                log(f"crawl: seed {s.name} has no legal shape at size {size}: {e}")
            continue
        task.meta["op"] = s.op
        task.meta["heavy"] = s.heavy
        task.meta["terminal"] = s.terminal
        if probe:
            p = probe_seed(s, rng_seed)
            if not p["ok"]:
                if log:
                    log(f"crawl: seed {s.name} failed its CPU probe: {p['error']}")
                continue
            task.meta.update(
                stochastic=p["stochastic"], rng_train=p["rng_train"], rng_eval=p["rng_eval"]
            )
        yield task


def coverage() -> dict[str, list[str]]:
    """torch operators (nn modules, F functions) the catalogue covers and does not cover."""
    import inspect

    import torch.nn as nn
    import torch.nn.functional as F

    def norm(n: str) -> str:
        n = n.lower().replace("_", "")
        return n[:-4] if n.endswith("loss") else n

    covered = {norm(s.op.split(".")[-1]) for s in SEEDS.values()}
    modules = sorted(
        n
        for n, o in vars(nn).items()
        if inspect.isclass(o) and issubclass(o, nn.Module) and not n.startswith("_")
    )
    funcs = sorted(n for n, o in vars(F).items() if callable(o) and not n.startswith("_"))
    return {
        "covered": sorted(covered),
        "nn_not_covered": [m for m in modules if norm(m) not in covered],
        "F_not_covered": [f for f in funcs if norm(f) not in covered],
    }
