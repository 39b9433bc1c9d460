"""Chain seed operators into fused KernelBench-style tasks whose shapes agree.

:func:`build_chain` appends seeds one by one to a :class:`Builder`; before each seed the running
tensor is reshaped to a rank the seed accepts, the seed picks legal arguments for the current
shape (channels, features, divisibility), and a meta-device run gives the new shape. A seed that
does not fit is rolled back and another is drawn. :func:`compose` samples lengths and seeds the
KernelBench level-2 way: a heavy operator (GEMM, conv, attention) followed by epilogues.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cuda_agent.records.types import Task

from .builder import FAMILIES, RANK_FAMILIES, Builder, NotApplicable
from .catalog import HEAVY, SEEDS, Seed

# default length distribution: favour 2-4 operators (Ops-6K: 84% two-op tasks)
DEFAULT_LENGTH_WEIGHTS: dict[int, float] = {1: 0.05, 2: 0.25, 3: 0.35, 4: 0.25, 5: 0.10}

# element-count cap of any intermediate tensor per size preset (fp32: 4 bytes each)
MAX_NUMEL = {"gpu": 1 << 28, "cpu": 1 << 22, "tiny": 1 << 14}


class ComposeError(RuntimeError):
    """No valid chain could be built (after all retries)."""


@dataclass
class ComposeConfig:
    """Knobs of :func:`compose`; defaults give KernelBench-level-2-like tasks."""

    max_ops: int = 5
    length_weights: dict[int, float] = field(default_factory=lambda: dict(DEFAULT_LENGTH_WEIGHTS))
    heavy_first: float = 0.75  # probability that the chain starts with a heavy op
    second_heavy: float = 0.15  # probability of a further heavy op later in the chain
    size: str = "gpu"
    include_stochastic: bool = False
    categories: list[str] | None = None  # restrict the pool (None: all)
    attempts: int = 40  # seed draws per position before giving up on the chain
    llm: Any = None  # an llm.LLMConfig: the model writes each composition (validated)
    seed_names: set[str] | None = None  # restrict the pool (e.g. to the seeds a crawl kept)


def _fits_first(s: Seed) -> list[str]:
    """Input families a seed can start from."""
    if s.family:
        return [s.family]
    ranks = s.ranks or (2, 3, 4)
    return [f for r in ranks for f in RANK_FAMILIES.get(r, [])]


def try_add(b: Builder, s: Seed, first: bool) -> Builder:
    """A copy of ``b`` with ``s`` appended, or raise :class:`NotApplicable`."""
    nb = copy.deepcopy(b)
    nb.rng = b.rng
    if first:
        fams = _fits_first(s)
        nb.start(nb.rng.choice(fams))
    if s.first_only and not first:
        raise NotApplicable("seed must come first")
    try:
        if s.ranks and nb.rank not in s.ranks:
            if nb.rank > max(s.ranks) and 2 in s.ranks:
                target = 2  # flatten into features (conv -> GEMM, KernelBench style)
            else:
                target = min(s.ranks, key=lambda r: (abs(r - nb.rank), r))
            # only natural adapters: flatten into features (conv -> GEMM), or split features
            # into channels for a heavy op (GEMM -> conv / attention)
            if not (target == 2 or (nb.rank == 2 and s.heavy)):
                raise NotApplicable(f"no natural reshape from rank {nb.rank} to {target}")
            nb.to_rank(target)
        if nb.rank < 2 and not (s.ranks and nb.rank in s.ranks):
            raise NotApplicable("tensor has fewer than 2 dims")
        names = s.build(nb)
        nb.update_shape(names or {})
    except NotApplicable:
        raise
    except Exception as e:  # noqa: BLE001 - any failure (incl. the meta run) means "does not fit"
        raise NotApplicable(f"{type(e).__name__}: {e}") from None
    if nb.numel > MAX_NUMEL[nb.size]:
        raise NotApplicable(f"intermediate of {nb.numel} elements is too large")
    if 0 in [d.value for d in nb.shape]:
        raise NotApplicable("empty tensor")
    nb.ops.append(s.name)
    return nb


def build_chain(names: Sequence[str], rng: random.Random, size: str = "gpu") -> Builder:
    """A builder with exactly the seeds ``names`` chained (raises :class:`NotApplicable`)."""
    b = Builder(rng=rng, size=size)
    for i, n in enumerate(names):
        b = try_add(b, SEEDS[n], first=(i == 0))
    return b


def task_from_builder(b: Builder, seeds: list[Seed], extra_meta: dict[str, Any]) -> Task:
    """The Task record of a finished chain."""
    name = "_".join(s.name for s in seeds)
    code = b.render(name)
    meta = {
        "seeds": [s.name for s in seeds],
        "categories": [s.category for s in seeds],
        "n_ops": len(seeds),
        "heavy": any(s.heavy for s in seeds),
        "size": b.size,
        "input_shapes": _input_shapes(b),
        "output_shape": [d.value for d in b.shape],
        "origins": sorted({s.origin for s in seeds}),
        **extra_meta,
    }
    return Task.make(name, code, source="opsynth", ops=[s.op for s in seeds], meta=meta)


def _input_shapes(b: Builder) -> list[str]:
    return [e for _, e in b.inputs]


def sample_length(rng: random.Random, cfg: ComposeConfig) -> int:
    ws = {k: v for k, v in cfg.length_weights.items() if 1 <= k <= cfg.max_ops and v > 0}
    if not ws:
        raise ValueError("length distribution has no mass in 1..max_ops")
    ks = sorted(ws)
    return rng.choices(ks, weights=[ws[k] for k in ks])[0]


def compose_one(rng: random.Random, cfg: ComposeConfig) -> tuple[Builder, list[Seed]]:
    """One chain of a sampled length; raises :class:`ComposeError` when none fits."""
    pool = [
        s
        for s in SEEDS.values()
        if (cfg.include_stochastic or not s.stochastic_hint)
        and (not cfg.categories or s.category in cfg.categories)
        and (cfg.seed_names is None or s.name in cfg.seed_names)
    ]
    if not pool:
        raise ValueError("no seed left in the pool (check --category / --seeds)")
    heavy = [s for s in pool if s.category in HEAVY]
    light = [s for s in pool if s.category not in HEAVY]
    length = sample_length(rng, cfg)
    b = Builder(rng=rng, size=cfg.size)
    chosen: list[Seed] = []
    for pos in range(length):
        last = pos == length - 1
        if pos == 0:
            group = heavy if (heavy and rng.random() < cfg.heavy_first) else light or heavy
        else:
            group = heavy if (heavy and rng.random() < cfg.second_heavy) else light or heavy
        for _ in range(cfg.attempts):
            s = rng.choice(group)
            if s in chosen or (s.terminal and not last) or (s.first_only and pos > 0):
                continue
            if s.not_last and last:
                continue
            try:
                b = try_add(b, s, first=(pos == 0))
            except NotApplicable:
                continue
            chosen.append(s)
            break
        else:
            # no seed fits here: redraw the whole chain (keeps the length distribution honest)
            raise ComposeError(f"no seed fits position {pos} after {cfg.attempts} draws")
    return b, chosen


def compose(n: int, seed: int, cfg: ComposeConfig | None = None) -> Iterator[Task]:
    """``n`` distinct fused tasks, reproducible from ``seed``.

    Each task is a KernelBench-format module named after its operators (``Conv2d_GELU_GroupNorm``);
    ``meta`` records seeds, categories, length, shapes and the draw index.
    """
    cfg = cfg or ComposeConfig()
    rng = random.Random(seed)
    seen: set[str] = set()
    made = 0
    draws = 0
    while made < n:
        draws += 1
        if draws > 20 * n + 100:
            raise ComposeError(f"only {made} of {n} distinct tasks after {draws} draws")
        try:
            b, chosen = compose_one(rng, cfg)
        except ComposeError:
            continue
        task = task_from_builder(b, chosen, {"compose_seed": seed, "draw": draws})
        if cfg.llm is not None:
            task = _llm_rewrite(task, cfg)
        if task.id in seen:
            continue
        seen.add(task.id)
        made += 1
        yield task


def _llm_rewrite(task: Task, cfg: ComposeConfig) -> Task:
    """The task written by the LLM when its answer validates, else the programmatic one."""
    from .llm import llm_compose

    code, info = llm_compose(cfg.llm, list(task.ops), task.ref_code)
    if code is None:
        return Task.make(
            task.name,
            task.ref_code,
            source="opsynth",
            ops=list(task.ops),
            meta={**task.meta, "composer": "program", "llm": info},
        )
    meta = {**task.meta, "composer": "llm", "llm": info, "output_shape": info["output_shape"]}
    meta.pop("input_shapes", None)
    return Task.make(task.name, code, source="opsynth", ops=list(task.ops), meta=meta)


__all__ = [
    "ComposeConfig",
    "ComposeError",
    "build_chain",
    "compose",
    "task_from_builder",
    "FAMILIES",
]
