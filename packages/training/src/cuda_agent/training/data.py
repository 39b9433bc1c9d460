"""Training data from ``Trajectory`` records: token-exact examples, length buckets, padded batches.

Length bucketing: examples are sorted by length and cut into micro-batches whose padded size
(rows x longest row) stays within a token budget, so little compute goes to padding; the order
of micro-batches is shuffled per epoch with a seed, so a run is reproducible and resumable from
any step.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.records import Trajectory
from cuda_agent.records.cli_helpers import log
from cuda_agent.records.jsonl import DecodeError, read_records


@dataclass(frozen=True)
class Example:
    """One trajectory as training data: tokens, policy mask (1 = train on it), reward."""

    key: str
    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    reward: float = 0.0

    def __len__(self) -> int:
        return len(self.input_ids)


def example_from_trajectory(t: Trajectory) -> Example:
    """The trainable view of a trajectory; raises ``ValueError`` when its arrays disagree."""
    if len(t.token_ids) != len(t.loss_mask):
        raise ValueError(
            f"trajectory {t.id}: {len(t.token_ids)} token_ids but {len(t.loss_mask)} loss_mask"
        )
    if any(m not in (0, 1) for m in t.loss_mask):
        raise ValueError(f"trajectory {t.id}: loss_mask must hold only 0 and 1")
    return Example(
        key=t.id,
        input_ids=tuple(t.token_ids),
        loss_mask=tuple(t.loss_mask),
        reward=float(t.reward) if t.reward is not None else 0.0,
    )


def load_examples(
    path: str | Path | None,
    *,
    max_len: int,
    need_reward: bool = False,
    min_policy_tokens: int = 1,
) -> list[Example]:
    """Read trajectories from JSONL (``None`` = stdin) and return trainable examples.

    Examples longer than ``max_len`` or with fewer than ``min_policy_tokens`` policy tokens are
    left out and counted on stderr (never silently); a malformed line raises ``DecodeError``.
    With ``need_reward`` a trajectory without a reward is an error, and one whose evaluation
    failed in the sandbox (``infra_error``) is left out and counted: its reward is no value. An
    episode ended by an error of the harness (``stop_reason == "error"``) is always left out.
    """
    out: list[Example] = []
    too_long = few = other = infra = errored = 0
    for n, rec in read_records(path):
        if isinstance(rec, DecodeError):
            raise rec
        if not isinstance(rec, Trajectory):
            other += 1
            continue
        if need_reward and rec.reward is None:
            raise ValueError(f"line {n}: trajectory {rec.id} has no reward (run `reward score`)")
        if need_reward and rec.infra_failed:  # its reward is the sandbox's failure, not a value
            infra += 1
            continue
        if rec.stop_reason == "error":  # cut short by a failure of the harness, not the policy's
            errored += 1
            continue
        ex = example_from_trajectory(rec)
        if len(ex) > max_len:
            too_long += 1
            continue
        # the first token is never predicted, so it cannot be trained on
        if sum(ex.loss_mask[1:]) < min_policy_tokens:
            few += 1
            continue
        out.append(ex)
    if too_long:
        log(f"data: left out {too_long} trajectories longer than --max-len {max_len}")
    if few:
        log(f"data: left out {few} trajectories without policy tokens")
    if other:
        log(f"data: ignored {other} records that are not trajectories")
    if errored:
        log(f"data: left out {errored} trajectories ended by an error (stop_reason error)")
    if infra:
        log(
            f"data: left out {infra} trajectories whose evaluation failed in the sandbox (infra_error)"
        )
    return out


def fingerprint(examples: Iterable[Example]) -> str:
    """A short hash of the examples' keys and tokens (a resume must see the same data)."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(ex.key.encode())
        h.update(len(ex).to_bytes(4, "little"))
        h.update(hashlib.sha256(repr((ex.input_ids, ex.loss_mask)).encode()).digest())
    return h.hexdigest()[:16]


def bucket(examples: list[Example], batch_tokens: int) -> list[list[int]]:
    """Indices of ``examples`` grouped into micro-batches of padded size <= ``batch_tokens``.

    Sorted by length so rows of one micro-batch are of similar length; an example longer than
    the budget gets a micro-batch of its own. Deterministic.
    """
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i]), examples[i].key))
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        n = len(examples[i])
        if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    return batches


@dataclass(frozen=True)
class Schedule:
    """Which micro-batches each optimizer step uses, on every rank."""

    batches: list[list[int]]
    grad_accum: int
    world_size: int
    seed: int

    @property
    def steps_per_epoch(self) -> int:
        per_step = self.grad_accum * self.world_size
        return max(1, -(-len(self.batches) // per_step))

    def epoch_order(self, epoch: int) -> list[list[int]]:
        order = list(self.batches)
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        # pad the epoch to a whole number of steps by repeating its micro-batches cyclically, so
        # every rank gets exactly ``grad_accum`` micro-batches in every step
        total = self.steps_per_epoch * self.grad_accum * self.world_size
        reps = -(-total // len(order))
        return (order * reps)[:total]

    def step_batches(self, step: int, rank: int = 0) -> list[list[int]]:
        """The micro-batches (lists of example indices) of 0-based ``step`` for ``rank``."""
        epoch, within = divmod(step, self.steps_per_epoch)
        order = self.epoch_order(epoch)
        per_step = self.grad_accum * self.world_size
        chunk = order[within * per_step : (within + 1) * per_step]
        return chunk[rank :: self.world_size]

    def all_step_batches(self, step: int) -> list[list[int]]:
        """The micro-batches of ``step`` over all ranks (for global normalisers)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        per_step = self.grad_accum * self.world_size
        return self.epoch_order(epoch)[within * per_step : (within + 1) * per_step]


def collate(examples: list[Example], pad_id: int = 0) -> dict[str, Any]:
    """Right-padded tensors: input_ids, attention_mask, loss_mask [B, T] and rewards [B]."""
    import torch

    T = max(len(e) for e in examples)
    B = len(examples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    att = torch.zeros((B, T), dtype=torch.long)
    msk = torch.zeros((B, T), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e)
        ids[i, :n] = torch.tensor(e.input_ids, dtype=torch.long)
        att[i, :n] = 1
        msk[i, :n] = torch.tensor(e.loss_mask, dtype=torch.long)
    rewards = torch.tensor([e.reward for e in examples], dtype=torch.float32)
    return {"input_ids": ids, "attention_mask": att, "loss_mask": msk, "rewards": rewards}
