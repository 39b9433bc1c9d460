"""The interface between ``sandbox`` and ``guards`` (agreed first; the guards issue fills it in).

Parent side (trusted, before compiling): :func:`static_checks`.
Candidate side (inside the candidate's process, during verification): :class:`RuntimeGuard`.
Parent side (after timing): :func:`timing_checks`.
Every finding is a ``GuardViolation`` with a stable code; ``severity == "reject"`` makes the
result's status ``guard_violation``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from cuda_agent.records import Candidate, GuardViolation, TimingDetail

POLICIES = ("strict", "kernelbench", "off")


def static_checks(candidate: Candidate, policy: str = "strict") -> list[GuardViolation]:
    """Static findings on the candidate's files (no code is run). Stub: finds nothing yet."""
    return []


class RuntimeGuard:
    """Dynamic checks run in the candidate's process around each verification call.

    Usage by the sandbox's candidate runner::

        guard = RuntimeGuard(policy, backend="cuda", own_kernels=[...])
        guard.install()                      # once, after ModelNew is built, before any call
        for inputs in trials:
            with guard.watch(inputs):        # records dispatched ops / launched kernels
                out = model(*inputs)
            guard.after_call(inputs, out)    # mutation, aliasing, output types
        findings = guard.finish()            # list[GuardViolation]
    """

    def __init__(
        self, policy: str = "strict", backend: str = "cuda", own_kernels: Sequence[str] = ()
    ):
        self.policy = policy
        self.backend = backend
        self.own_kernels = list(own_kernels)
        self.findings: list[GuardViolation] = []

    def install(self) -> None:
        """Snapshot what must not change (timers, sync functions, thread count)."""

    @contextmanager
    def watch(self, inputs: Sequence[Any]) -> Iterator[None]:
        """Wrap one forward call."""
        yield

    def after_call(self, inputs: Sequence[Any], outputs: Any) -> None:
        """Checks on one call's inputs and outputs."""

    def finish(self) -> list[GuardViolation]:
        """All findings of this process."""
        return list(self.findings)


def timing_checks(
    timing: TimingDetail, lower_bound_ms: float | None = None
) -> list[GuardViolation]:
    """Findings on the measured times (e.g. faster than speed-of-light). Stub: finds nothing yet."""
    return []
