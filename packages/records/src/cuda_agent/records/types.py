"""Record types of the pipeline: tasks, solutions, candidates, evaluation results, trajectories.

Every record is a tagged ``msgspec.Struct``: the ``kind`` field names its type and ``schema``
its version, so a JSONL stream can mix kinds and old streams can be recognised.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Any, Literal

import msgspec

SCHEMA_VERSION = 1


class _Record(msgspec.Struct, kw_only=True, tag_field="kind", omit_defaults=False):
    schema: int = SCHEMA_VERSION


def content_id(*parts: str, length: int = 16) -> str:
    """Stable short hex id of the given strings (sha256 over NUL-joined parts)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:length]


# ---------------------------------------------------------------- timing


class TimingStats(msgspec.Struct, kw_only=True):
    """Summary of repeated timings of one program, in milliseconds."""

    median_ms: float
    n: int
    iqr_ms: float = 0.0
    min_ms: float | None = None
    mean_ms: float | None = None
    ci95_low_ms: float | None = None
    ci95_high_ms: float | None = None
    discarded: int = 0  # samples dropped (throttled clock, outliers the protocol rejects)
    flags: list[str] = []  # protocol findings, e.g. "async_work", "cuda_graph", "time_cap"
    # the median NVML SM and memory clocks over the kept samples and the physical GPU (NVML
    # UUID) they were taken on; None where NVML is not there (CPU)
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    gpu_uuid: str | None = None


class Baseline(msgspec.Struct, kw_only=True):
    """Reference timings of a task on one device: eager and torch.compile."""

    device: str
    torch_version: str
    protocol_version: str
    eager: TimingStats | None = None
    compile: TimingStats | None = None
    # set when eager/compile were replayed from CUDA graphs: the same programs timed without
    # graphs, the figures for a candidate that cannot be graph-timed (every side alike)
    eager_nograph: TimingStats | None = None
    compile_nograph: TimingStats | None = None
    compile_mode: str = "default"
    backend: str = "cuda"
    error: str | None = None


# ---------------------------------------------------------------- task and solution


class Task(_Record, tag="task"):
    """A reference program in KernelBench format (``Model``, ``get_inputs``, ``get_init_inputs``)."""

    id: str
    name: str
    ref_code: str
    source: Literal["opsynth", "kernelbench", "ops6k", "user"] = "user"
    level: int | None = None
    problem_id: int | None = None
    ops: list[str] = []
    baseline: Baseline | None = None
    # the module mode both the reference and the candidate run in: "eval" (``model.eval()``:
    # BatchNorm with its running statistics, Dropout off) or "train" (the mode a module is
    # constructed in, KernelBench's semantics: BatchNorm with the batch's statistics)
    model_mode: Literal["eval", "train"] = "eval"
    meta: dict[str, Any] = {}

    @staticmethod
    def make(name: str, ref_code: str, **kw: Any) -> Task:
        """A task whose id is the hash of its reference source (and of its module mode where
        that is not "eval": the same program in train mode is another task)."""
        mode = kw.get("model_mode", "eval")
        tid = content_id(ref_code) if mode == "eval" else content_id(ref_code, f"model_mode={mode}")
        return Task(id=tid, name=name, ref_code=ref_code, **kw)


class Solution(msgspec.Struct, kw_only=True):
    """A candidate implementation: relative path -> file text."""

    id: str
    format: Literal["workdir", "kernelbench"]
    files: dict[str, str]
    origin: str = "user"  # e.g. "agent:<run>", "import:<dir>"

    @staticmethod
    def make(
        format: Literal["workdir", "kernelbench"], files: dict[str, str], origin: str = "user"
    ) -> Solution:
        """A solution whose id is the hash of its files."""
        parts = [format] + [f"{k}\n{files[k]}" for k in sorted(files)]
        return Solution(id=content_id(*parts), format=format, files=files, origin=origin)


class Candidate(_Record, tag="candidate"):
    """A task paired with one solution to evaluate."""

    task: Task
    solution: Solution
    meta: dict[str, Any] = {}

    @property
    def key(self) -> str:
        return f"{self.task.id}:{self.solution.id}"


# ---------------------------------------------------------------- evaluation


class Status(enum.StrEnum):
    OK = "ok"
    COMPILE_ERROR = "compile_error"
    INCORRECT = "incorrect"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    GUARD_VIOLATION = "guard_violation"
    INFRA_ERROR = "infra_error"


class CompileDetail(msgspec.Struct, kw_only=True):
    ok: bool
    seconds: float = 0.0
    log_tail: str = ""
    cached: bool = False


class TrialDetail(msgspec.Struct, kw_only=True):
    """One correctness trial: which input variant, and how far the output was."""

    variant: str
    passed: bool
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    rel_norm_err: float | None = None
    message: str = ""


class CorrectnessDetail(msgspec.Struct, kw_only=True):
    passed: bool
    atol: float
    rtol: float
    trials: list[TrialDetail] = []
    seconds: float = 0.0
    message: str = ""


class GuardViolation(msgspec.Struct, kw_only=True):
    """A guard finding: stable code (e.g. ``G-STREAM``), severity and evidence."""

    code: str
    severity: Literal["reject", "flag"]
    message: str
    evidence: str = ""


class TimingDetail(msgspec.Struct, kw_only=True):
    """Timings of candidate and baselines measured in one run, plus speed-up CIs."""

    protocol_version: str
    candidate: TimingStats | None = None
    eager: TimingStats | None = None
    compile: TimingStats | None = None
    speedup_vs_eager_ci: tuple[float, float] | None = None
    speedup_vs_compile_ci: tuple[float, float] | None = None
    flags: list[str] = []
    seconds: float = 0.0


class EvalResult(_Record, tag="eval_result"):
    """Outcome of evaluating one candidate. Failures of the candidate are results, not errors."""

    task_id: str
    solution_id: str
    backend: Literal["cuda", "cpu"]
    device: str
    status: Status
    message: str = ""
    compile: CompileDetail | None = None
    correctness: CorrectnessDetail | None = None
    guards: list[GuardViolation] = []
    timing: TimingDetail | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    reward: float | None = None
    reward_reason: str | None = None
    seconds: float = 0.0
    meta: dict[str, Any] = {}

    @property
    def key(self) -> str:
        return f"{self.task_id}:{self.solution_id}"


# ---------------------------------------------------------------- trajectories


class Message(msgspec.Struct, kw_only=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_call_id: str | None = None
    name: str | None = None


class ToolCall(msgspec.Struct, kw_only=True):
    """One tool invocation by the policy and what the environment answered."""

    turn: int
    name: str
    arguments: dict[str, Any] = {}
    result: str = ""
    ok: bool = True
    error: str | None = None
    seconds: float = 0.0


class Trajectory(_Record, tag="trajectory"):
    """One agent episode, token-exact for training.

    ``token_ids``, ``loss_mask`` (1 on policy tokens) and ``logprobs`` (rollout log-probs, 0.0 on
    non-policy tokens) have the same length.
    """

    id: str
    task: Task
    messages: list[Message] = []
    token_ids: list[int] = []
    loss_mask: list[int] = []
    logprobs: list[float] = []
    tool_calls: list[ToolCall] = []
    solution: Solution | None = None
    eval_result: EvalResult | None = None
    reward: float | None = None
    reward_reason: str | None = None
    stop_reason: str = ""  # submit | max_turns | context_overflow | error | ...
    counters: dict[str, int] = {}
    meta: dict[str, Any] = {}

    @property
    def key(self) -> str:
        return self.id

    @property
    def infra_failed(self) -> bool:
        """The sandbox, not the policy, failed this episode's evaluation (``infra_error``): its
        reward says nothing about the policy, so training leaves the episode out."""
        return self.eval_result is not None and self.eval_result.status == Status.INFRA_ERROR

    @property
    def harness_failed(self) -> bool:
        """Something other than the policy's output ended or scored this episode: the sandbox
        failed its evaluation (:attr:`infra_failed`), or the episode raised (``stop_reason ==
        "error"``: the model endpoint, a tool, the workspace; ``meta["error"]`` says where).
        Its reward says nothing about the policy: training leaves the episode out."""
        return self.infra_failed or self.stop_reason == "error"


class ErrorRecord(_Record, tag="error"):
    """Passed downstream by ``--on-error emit`` in place of a line that could not be processed."""

    line: int
    message: str
    raw: str = ""
    source: str = ""

    @property
    def key(self) -> str:
        return f"error:{self.source}:{self.line}"


AnyRecord = Task | Candidate | EvalResult | Trajectory | ErrorRecord

KINDS: dict[str, type] = {
    "task": Task,
    "candidate": Candidate,
    "eval_result": EvalResult,
    "trajectory": Trajectory,
    "error": ErrorRecord,
}


def record_key(rec: Any) -> str:
    """The key used by ``--resume``: task id, candidate/result task:solution, trajectory id."""
    if isinstance(rec, Task):
        return rec.id
    key = getattr(rec, "key", None)
    if key is None:
        raise TypeError(f"record of type {type(rec).__name__} has no key")
    return key
