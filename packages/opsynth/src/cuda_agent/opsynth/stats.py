"""Statistics of a task set: length and category histograms, op vocabulary, filter reasons.

Categories of ops outside our catalogue (e.g. Ops-6K's ``torch.diag``) come from name rules
(:func:`categorize`), so both sets are described with the same vocabulary.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from cuda_agent.records.types import Task

from .catalog import SEEDS
from .normalize import canon

_RULES: list[tuple[str, str]] = [
    (r"attention|sdpa|transformer", "attention"),
    (r"lstm|gru|rnn", "recurrent"),
    (r"conv|unfold|fold", "conv"),
    (
        r"linear|matmul|^mm$|bmm|einsum|addmm|baddbmm|bilinear|gemm|^dot$|outer|tensordot|kron",
        "gemm",
    ),
    (r"loss|crossentropy|nll|kldiv", "loss"),
    (r"norm(?!al)|rmsnorm|layernorm|batchnorm|groupnorm|instancenorm|normalize", "norm"),
    (r"pool", "pooling"),
    (r"upsample|interpolate|pixelshuffle|pixelunshuffle|gridsample|affinegrid", "resample"),
    (r"^cum|logcumsumexp", "scan"),
    (
        r"^(sum|mean|max|min|prod|amax|amin|argmax|argmin|std|var|logsumexp|norm|median|mode|all|any|count)",
        "reduction",
    ),
    (r"distance|similarity|cdist|pdist", "distance"),
    (
        r"gather|scatter|index|select|narrow|flip|roll|tril|triu|masked|topk|sort|embedding|take|where|diag|cat|stack|repeat|tile|split|chunk|transpose|permute|pad|slice|nonzero|unique|bucketize|searchsorted",
        "indexing",
    ),
    (
        r"relu|gelu|silu|swish|mish|sigmoid|tanh|softmax|softmin|softplus|softsign|elu|selu|celu|glu|hardtanh|hardswish|hardsigmoid|hardshrink|softshrink|tanhshrink|threshold|logsigmoid|prelu|dropout|activation",
        "activation",
    ),
]
_COMPILED = [(re.compile(p), c) for p, c in _RULES]
_BY_OP = {canon(s.op.split(".")[-1]): s.category for s in SEEDS.values()}


def categorize(op: str) -> str:
    """Category of an operator name (catalogue first, then name rules; else elementwise)."""
    leaf = canon(op.split(".")[-1])
    if leaf in _BY_OP and leaf not in ("add", "mul", "mean"):
        return _BY_OP[leaf]
    for rx, cat in _COMPILED:
        if rx.search(leaf):
            return cat
    return "elementwise"


def task_categories(t: Task) -> list[str]:
    cats = t.meta.get("categories")
    if cats:
        return list(cats)
    return [categorize(o) for o in t.ops if o.split(".")[-1] not in ("Parameter", "functional")]


def describe(tasks: Iterable[Task]) -> dict[str, Any]:
    """Counts of one task set: n, length histogram, category shares, heavy share, vocabulary."""
    n = 0
    lengths: Counter[int] = Counter()
    cats: Counter[str] = Counter()
    first: Counter[str] = Counter()
    vocab: Counter[str] = Counter()
    heavy = 0
    for t in tasks:
        n += 1
        lengths[len(t.ops)] += 1
        tc = task_categories(t)
        cats.update(tc)
        if tc:
            first[tc[0]] += 1
        heavy += any(c in ("gemm", "conv", "attention", "recurrent") for c in tc)
        vocab.update(canon(o.split(".")[-1]) for o in t.ops)
    return {
        "tasks": n,
        "lengths": dict(sorted(lengths.items())),
        "categories": dict(cats.most_common()),
        "first_category": dict(first.most_common()),
        "heavy_share": heavy / n if n else 0.0,
        "distinct_ops": len(vocab),
        "top_ops": vocab.most_common(10),
    }


def pct(c: dict[Any, int], total: int) -> dict[Any, str]:
    return {k: f"{100 * v / total:.1f}%" for k, v in c.items()} if total else {}


def markdown_compare(named: dict[str, dict[str, Any]]) -> str:
    """A side-by-side markdown table of :func:`describe` results."""
    names = list(named)
    lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]

    def row(label: str, f) -> None:
        lines.append(f"| {label} | " + " | ".join(f(named[k]) for k in names) + " |")

    row("tasks", lambda d: str(d["tasks"]))
    for k in range(1, 6):
        row(f"{k} op(s)", lambda d, k=k: pct(d["lengths"], d["tasks"]).get(k, "0.0%"))
    row("contains GEMM/conv/attention/RNN", lambda d: f"{100 * d['heavy_share']:.1f}%")
    row("distinct ops", lambda d: str(d["distinct_ops"]))
    cats = sorted({c for d in named.values() for c in d["categories"]})
    for c in cats:
        row(
            f"ops in category {c}",
            lambda d, c=c: pct(d["categories"], sum(d["categories"].values())).get(c, "0.0%"),
        )
    return "\n".join(lines)


RUNTIME_BUCKETS_MS = (0.1, 1.0, 10.0, 100.0, 1000.0)


def filter_report(kept: list[Task], rejected: list[Task]) -> dict[str, Any]:
    """Pass rate, rejection reasons (in check order) and eager runtime histogram of a filter run."""
    reasons = Counter(str(t.meta.get("rejected", {}).get("reason")) for t in rejected)
    times = [
        float(t.meta["filter"]["eager_ms"])
        for t in kept
        if t.meta.get("filter", {}).get("eager_ms")
    ]
    hist: Counter[str] = Counter()
    for ms in times:
        edges = [b for b in RUNTIME_BUCKETS_MS if ms >= b]
        lo = edges[-1] if edges else 0.0
        hist[f">= {lo:g} ms" if edges else f"< {RUNTIME_BUCKETS_MS[0]:g} ms"] += 1
    total = len(kept) + len(rejected)
    times.sort()
    return {
        "tasks": total,
        "passed": len(kept),
        "pass_rate": len(kept) / total if total else 0.0,
        "reasons": dict(reasons.most_common()),
        "rescaled": sum(bool(t.meta.get("filter", {}).get("rescaled")) for t in kept),
        "eager_ms_median": times[len(times) // 2] if times else None,
        "eager_ms_hist": dict(hist),
    }
