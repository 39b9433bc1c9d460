"""The interface between ``sandbox`` and ``guards`` (agreed first; keep the signatures stable).

Parent side (trusted, before compiling): :func:`static_checks`.
Candidate side (inside the candidate's process, during verification): :class:`RuntimeGuard`.
Parent side (after verification and timing): :func:`output_checks`, :func:`timing_checks`.
Every finding is a ``GuardViolation`` with a stable code (see ``cuda_agent.guards.checks``);
``severity == "reject"`` makes the result's status ``guard_violation``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from cuda_agent.records import Candidate, GuardViolation, TimingDetail

from .checks import POLICIES, check_policy

__all__ = [
    "POLICIES",
    "RuntimeGuard",
    "output_checks",
    "policy_rules",
    "static_checks",
    "timing_checks",
]


def policy_rules(policy: str) -> str:
    """The checks of guard policy ``policy`` as a Markdown table (code, what it catches, what the
    policy does with it: rejected or flagged), generated from ``cuda_agent.guards.checks`` so
    that what an agent is told cannot drift from what the evaluator does. ``off``: one line."""
    from .checks import CHECKS

    check_policy(policy)
    if policy == "off":
        return "Guard policy `off`: no guard runs; only correctness decides.\n"
    rows = ["| code | rejected when | under this policy |", "| --- | --- | --- |"]
    for c in CHECKS.values():
        sev = c.severity(policy)
        if sev is None:
            continue
        what = "**rejected** (scores as failed)" if sev == "reject" else "flagged (reported only)"
        rows.append(f"| `{c.code}` | {c.description} | {what} |")
    return "\n".join(rows) + "\n"


def static_checks(
    candidate: Candidate, policy: str = "strict", *, own_modules: Sequence[str] = ()
) -> list[GuardViolation]:
    """Static findings on the candidate's files; no candidate code is run. Python through its
    AST, C/C++/CUDA (files and ``load_inline`` strings) after the real preprocessor.
    ``own_modules``: names of extension modules the sandbox builds (imports of them are fine).
    Use :func:`cuda_agent.guards.static.analyze` to also get the kernel names for the runtime."""
    from .static import analyze

    return analyze(candidate, check_policy(policy), tuple(own_modules)).findings


class RuntimeGuard:
    """Dynamic checks run in the candidate's process around each verification call.

    Usage by the sandbox's candidate runner::

        guard = RuntimeGuard(policy, backend="cuda", own_kernels=[...])  # BEFORE importing the
                                                                         # candidate's module
        model = build ModelNew; load weights
        guard.install()                      # once, after ModelNew is built, before any call
        for inputs in trials:
            with guard.watch(inputs):        # records dispatched ops / own calls / kernels
                out = model(*inputs)
            guard.after_call(inputs, out)    # mutation, aliasing, output types, threads, ...
        guard.probe(model, inputs, out)      # optional, once: poisoned allocator, caches, observer
        findings = guard.finish()            # list[GuardViolation]

    ``own_kernels``: kernel names from the candidate's sources (``analyze(candidate).kernels``);
    ``own_modules``: extension module names (extension modules imported after the guard was
    constructed from outside site-packages are added automatically); ``protect``: harness modules
    whose functions must not be replaced; ``float32_task``: whether half/bf16 casts are
    downcasts (default: inferred from the inputs).
    """

    def __init__(
        self,
        policy: str = "strict",
        backend: str = "cuda",
        own_kernels: Sequence[str] = (),
        *,
        own_modules: Sequence[str] = (),
        protect: Sequence[Any] = (),
        float32_task: bool | None = None,
        trace_kernels: bool | None = None,
    ):
        from .runtime import RuntimeGuardImpl

        self.policy = check_policy(policy)
        self.backend = backend
        self.own_kernels = list(own_kernels)
        self._impl = RuntimeGuardImpl(
            policy,
            backend,
            own_kernels,
            own_modules=own_modules,
            protect=protect,
            float32_task=float32_task,
            trace_kernels=trace_kernels,
        )

    @property
    def findings(self) -> list[GuardViolation]:
        return list(self._impl.fs.items)

    @property
    def timings(self) -> dict[str, float]:
        """Seconds spent in each guard stage so far (install, trace_setup (part of install: the
        kernel tracer's one-time set-up), pre, post, after_call, probe)."""
        return dict(self._impl.timings)

    def install(self) -> None:
        """Snapshot what must not change (timers, sync functions, harness, threads); report what
        the candidate's import or constructor already changed."""
        self._impl.install()

    @contextmanager
    def watch(self, inputs: Sequence[Any]) -> Iterator[None]:
        """Wrap one forward call."""
        with self._impl.watch(inputs):
            yield

    def after_call(self, inputs: Sequence[Any], outputs: Any) -> None:
        """Checks on one call's inputs and outputs (call right after the watched call)."""
        self._impl.after_call(inputs, outputs)

    def probe(
        self, model: Any, inputs: Sequence[Any], outputs: Any = None, seed: int = 1234
    ) -> None:
        """Extra calls of ``model``: poisoned allocator (NaN, random), unobserved call, inputs
        rewritten in place vs fresh, repeated values (content cache). ``outputs``: the output of
        a watched call on ``inputs``. Costs about five forward calls."""
        self._impl.probe(model, inputs, outputs, seed)

    def finish(self) -> list[GuardViolation]:
        """All findings of this process."""
        return self._impl.finish()


def timing_checks(
    timing: TimingDetail,
    lower_bound_ms: float | None = None,
    *,
    policy: str = "strict",
    slack: float = 0.8,
    estimate_ms: float | None = None,
) -> list[GuardViolation]:
    """Findings on the measured times: a median below ``slack`` x ``lower_bound_ms`` rejects
    (``G-SOL``), below the bound itself flags; the bound must hold for every correct
    implementation (``profiler.sol.output_floor_ms``). A median below ``slack`` x
    ``estimate_ms`` (the roofline of the reference's work) only flags."""
    from .timing import timing_findings

    return timing_findings(timing, lower_bound_ms, check_policy(policy), slack, estimate_ms)


def output_checks(
    ref_outputs: Sequence[Any], cand_outputs: Sequence[Any], *, policy: str = "strict"
) -> list[GuardViolation]:
    """Parent-side checks over several trials (same order in both lists, one output per trial):
    structure and count, degenerate (constant) outputs, and input sensitivity (the candidate's
    output must change between trials where the reference's does)."""
    from .behaviour import output_findings

    return output_findings(ref_outputs, cand_outputs, check_policy(policy))
