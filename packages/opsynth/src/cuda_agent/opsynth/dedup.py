"""Decontamination and near-duplicate removal.

A task is dropped when, against the reference set (a KernelBench tree or any task stream):

- ``ref_signature``: its operator signature (ordered ops + non-shape hyper-parameters, see
  :mod:`cuda_agent.opsynth.normalize`) equals a reference's, or
- ``ref_similar``: the Jaccard similarity of its normalised ``__init__``/``forward`` token
  n-grams with a reference's is >= ``ref_threshold``;

and against the tasks already kept from the same stream (``dup_signature`` / ``near_duplicate``
with ``self_threshold``). Candidates are found with MinHash + LSH banding and confirmed with the
exact Jaccard of the n-gram sets; the nearest match (name and similarity) is recorded in
``meta.dedup`` (kept tasks) or ``meta.rejected`` (dropped ones).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .normalize import code_tokens, op_signature

_MASK = np.uint64((1 << 64) - 1)


def shingles(tokens: list[str], n: int = 5) -> frozenset[int]:
    """Hashes (64-bit) of the token n-grams (the whole sequence when shorter than n)."""
    if len(tokens) < n:
        grams = [" ".join(tokens)]
    else:
        grams = [" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return frozenset(
        int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "little") for g in grams
    )


class MinHasher:
    """``num_perm`` multiply-shift hash functions; signatures are uint32 arrays."""

    def __init__(self, num_perm: int = 128, seed: int = 1):
        rng = np.random.default_rng(seed)
        self.a = rng.integers(1, 1 << 63, size=num_perm, dtype=np.uint64) | np.uint64(1)
        self.b = rng.integers(0, 1 << 63, size=num_perm, dtype=np.uint64)
        self.num_perm = num_perm

    def __call__(self, sh: frozenset[int]) -> np.ndarray:
        x = np.fromiter(sh, dtype=np.uint64, count=len(sh))
        with np.errstate(over="ignore"):
            h = (self.a[None, :] * x[:, None] + self.b[None, :]) >> np.uint64(32)
        return h.min(axis=0).astype(np.uint32)


def jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


@dataclass
class Doc:
    key: str
    name: str
    sig: tuple[str, ...]
    sig_ops: tuple[str, ...]
    sh: frozenset[int]
    mh: np.ndarray


@dataclass
class Index:
    """Docs with an LSH table (``bands`` x ``rows`` = ``num_perm``) and a signature table."""

    hasher: MinHasher
    bands: int = 32
    docs: list[Doc] = field(default_factory=list)
    buckets: dict[tuple[int, bytes], list[int]] = field(default_factory=lambda: defaultdict(list))
    by_sig: dict[tuple[str, ...], int] = field(default_factory=dict)
    by_sig_ops: dict[tuple[str, ...], int] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return self.hasher.num_perm // self.bands

    def _bands(self, mh: np.ndarray):
        r = self.rows
        for i in range(self.bands):
            yield i, mh[i * r : (i + 1) * r].tobytes()

    def add(self, d: Doc) -> None:
        i = len(self.docs)
        self.docs.append(d)
        for b in self._bands(d.mh):
            self.buckets[b].append(i)
        if d.sig:
            self.by_sig.setdefault(d.sig, i)
            self.by_sig_ops.setdefault(d.sig_ops, i)

    def nearest(self, d: Doc) -> tuple[Doc | None, float]:
        """The most similar indexed doc among LSH candidates (exact Jaccard), or (None, 0)."""
        cand: set[int] = set()
        for b in self._bands(d.mh):
            cand.update(self.buckets.get(b, ()))
        best, best_j = None, 0.0
        for i in cand:
            j = jaccard(d.sh, self.docs[i].sh)
            if j > best_j:
                best, best_j = self.docs[i], j
        return best, best_j

    def signature_match(self, d: Doc, mode: str) -> Doc | None:
        if mode == "off" or not d.sig:
            return None
        i = self.by_sig.get(d.sig) if mode == "full" else self.by_sig_ops.get(d.sig_ops)
        return None if i is None else self.docs[i]


@dataclass
class DedupConfig:
    """Thresholds and signature modes (``full``: ops + hyper-parameters; ``ops``; ``off``)."""

    ref_threshold: float = 0.8
    self_threshold: float = 0.9
    ref_signature: str = "full"
    self_signature: str = "full"
    ngram: int = 5
    num_perm: int = 128
    bands: int = 32


class Deduplicator:
    """Streams tasks through the reference index and the index of kept tasks."""

    def __init__(self, cfg: DedupConfig | None = None):
        self.cfg = cfg or DedupConfig()
        self.hasher = MinHasher(self.cfg.num_perm)
        self.ref = Index(self.hasher, self.cfg.bands)
        self.kept = Index(self.hasher, self.cfg.bands)
        self.reasons: dict[str, int] = defaultdict(int)
        self.n_kept = 0

    def doc(self, key: str, name: str, source: str) -> Doc:
        """The normalised view of one source (raises ``SyntaxError`` if it does not parse)."""
        sh = shingles(code_tokens(source), self.cfg.ngram)
        return Doc(
            key=key,
            name=name,
            sig=op_signature(source, hparams=True),
            sig_ops=op_signature(source, hparams=False),
            sh=sh,
            mh=self.hasher(sh),
        )

    def add_reference(self, key: str, name: str, source: str) -> None:
        self.ref.add(self.doc(key, name, source))

    def add_kept(self, key: str, name: str, source: str) -> None:
        self.kept.add(self.doc(key, name, source))

    def check(self, key: str, name: str, source: str) -> tuple[str | None, dict[str, Any]]:
        """``(reason or None, info)``; a kept task is added to the kept index."""
        d = self.doc(key, name, source)
        info: dict[str, Any] = {"signature": list(d.sig)}
        ref_near, ref_j = self.ref.nearest(d)
        if ref_near is not None:
            info["nearest_ref"] = ref_near.name
            info["ref_jaccard"] = round(ref_j, 4)
        m = self.ref.signature_match(d, self.cfg.ref_signature)
        if m is not None:
            return self._drop("ref_signature", {**info, "match": m.name})
        if ref_near is not None and ref_j >= self.cfg.ref_threshold:
            return self._drop("ref_similar", {**info, "match": ref_near.name})
        near, j = self.kept.nearest(d)
        if near is not None:
            info["nearest_kept"] = near.name
            info["jaccard"] = round(j, 4)
        m = self.kept.signature_match(d, self.cfg.self_signature)
        if m is not None:
            return self._drop("dup_signature", {**info, "match": m.name, "match_key": m.key})
        if near is not None and j >= self.cfg.self_threshold:
            return self._drop("near_duplicate", {**info, "match": near.name, "match_key": near.key})
        self.kept.add(d)
        self.n_kept += 1
        return None, info

    def _drop(self, reason: str, info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.reasons[reason] += 1
        return reason, info

    def summary(self) -> str:
        total = self.n_kept + sum(self.reasons.values())
        parts = [f"{self.n_kept}/{total} kept", f"{len(self.ref.docs)} references"]
        parts += [f"{r} {n}" for r, n in sorted(self.reasons.items(), key=lambda kv: -kv[1])]
        return "dedup: " + ", ".join(parts)


def kernelbench_files(path: str | Path) -> list[Path]:
    """``level*/*.py`` of a KernelBench checkout (the repo root or its ``KernelBench/`` dir)."""
    p = Path(path)
    if (p / "KernelBench").is_dir():
        p = p / "KernelBench"
    files = sorted(p.glob("level*/*.py"))
    if not files:
        raise FileNotFoundError(f"no level*/*.py under {p}")
    return files


def reference_sources(path: str | Path) -> Iterable[tuple[str, str, str]]:
    """``(key, name, source)`` of a KernelBench tree or a JSONL task stream."""
    p = Path(path)
    if p.is_file():
        from cuda_agent.records.jsonl import load_records
        from cuda_agent.records.types import Task

        for t in load_records(p):
            if isinstance(t, Task):
                yield t.id, t.name, t.ref_code
        return
    for f in kernelbench_files(p):
        yield str(f), f"{f.parent.name}/{f.stem}", f.read_text()
