"""The paper's KernelBench metrics, per level and overall.

Definitions (also printed in every report):
- a *problem* counts once; when several solutions of one problem were evaluated, the best one is
  used (highest reward, then highest speed-up vs eager); a problem with no result is a failure;
- *pass rate*: problems whose best result has status ``ok`` (compiled, correct, no guard reject);
- *faster than X*: correct and ``t < t_X`` (speed-up > 1); *>5% faster than X*: correct and
  ``(t_X - t) / t_X > threshold`` (the reward's bar);
- *geomean speed-up, all*: geometric mean over all problems, a failure (or a correct result with no
  baseline) counted as 1.0x; *geomean speed-up, correct*: over correct problems with a baseline;
- *mean reward*: over all problems, a problem with no result scoring -1;
- *overall*: the same definitions pooled over all problems, i.e. levels weighted by problem count;
- with ``--shape-check`` (results carrying ``meta.shape_check``): *correct at the task's shape*:
  status ``ok``, or failed only at a resized instance; *passes at resized shapes*: status ``ok``
  and verified again at the resized instance (of all problems); *not resizable*: ``ok`` but the
  task has no size that can change (the check was skipped);
- with results against several ``torch.compile`` baselines (``meta.baseline_compile_mode``:
  ``default``, ``max-autotune``, ...): the main table is one mode's results, and *by compile
  mode* gives, per mode, the compile columns above over that mode's results.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from cuda_agent.records import EvalResult, Status, Task
from cuda_agent.reward import beats


@dataclass(frozen=True)
class ProblemOutcome:
    level: int
    problem_id: int
    name: str
    status: str  # an EvalResult status, or "missing"
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    reward: float | None = None
    # the shape check's verdict (meta.shape_check): passed | failed | skipped; None: not run
    shape_check: str | None = None

    @property
    def correct(self) -> bool:
        return self.status == Status.OK.value


@dataclass
class LevelMetrics:
    level: str  # "1", "2", "3" or "overall"
    problems: int
    correct: int
    pass_rate: float
    faster_than_eager: float
    faster_than_eager_5pct: float
    faster_than_compile: float
    faster_than_compile_5pct: float
    geomean_speedup_vs_eager_all: float
    geomean_speedup_vs_compile_all: float
    geomean_speedup_vs_eager_correct: float | None
    geomean_speedup_vs_compile_correct: float | None
    mean_reward: float
    # with the shape check (None where no result of the group carries it)
    correct_at_task_shape: int | None = None
    passes_at_resized_shapes: int | None = None
    passes_at_resized_shapes_rate: float | None = None
    not_resizable: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _geomean(xs: list[float]) -> float | None:
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _usable(s: float | None) -> bool:
    return s is not None and math.isfinite(s) and s > 0


def level_metrics(label: str, outs: list[ProblemOutcome], threshold: float = 0.05) -> LevelMetrics:
    """Metrics of one group of problems (see the module docstring for every definition)."""
    n = len(outs)
    if n == 0:
        raise ValueError(f"level {label}: no problems")
    ok = [o for o in outs if o.correct]

    def frac(pred) -> float:
        return sum(1 for o in ok if pred(o)) / n

    def all_geo(attr: str) -> float:
        vals = []
        for o in outs:
            s = getattr(o, attr)
            vals.append(s if (o.correct and _usable(s)) else 1.0)
        return _geomean(vals) or 1.0

    def correct_geo(attr: str) -> float | None:
        return _geomean([getattr(o, attr) for o in ok if _usable(getattr(o, attr))])

    shaped = any(o.shape_check is not None for o in outs)
    resized = sum(1 for o in ok if o.shape_check == "passed")

    return LevelMetrics(
        level=label,
        problems=n,
        correct=len(ok),
        pass_rate=len(ok) / n,
        faster_than_eager=frac(lambda o: _usable(o.speedup_vs_eager) and o.speedup_vs_eager > 1.0),
        faster_than_eager_5pct=frac(lambda o: beats(o.speedup_vs_eager, threshold)),
        faster_than_compile=frac(
            lambda o: _usable(o.speedup_vs_compile) and o.speedup_vs_compile > 1.0
        ),
        faster_than_compile_5pct=frac(lambda o: beats(o.speedup_vs_compile, threshold)),
        geomean_speedup_vs_eager_all=all_geo("speedup_vs_eager"),
        geomean_speedup_vs_compile_all=all_geo("speedup_vs_compile"),
        geomean_speedup_vs_eager_correct=correct_geo("speedup_vs_eager"),
        geomean_speedup_vs_compile_correct=correct_geo("speedup_vs_compile"),
        mean_reward=sum(-1.0 if o.reward is None else o.reward for o in outs) / n,
        correct_at_task_shape=(
            len(ok) + sum(1 for o in outs if not o.correct and o.shape_check == "failed")
            if shaped
            else None
        ),
        passes_at_resized_shapes=resized if shaped else None,
        passes_at_resized_shapes_rate=resized / n if shaped else None,
        not_resizable=sum(1 for o in ok if o.shape_check == "skipped") if shaped else None,
    )


def shape_verdict(r: EvalResult) -> str | None:
    """``passed``, ``failed`` or ``skipped`` from ``meta.shape_check``; None when it did not run
    (or ended without a verdict)."""
    sc = r.meta.get("shape_check")
    if not isinstance(sc, dict):
        return None
    if sc.get("passed") is True:
        return "passed"
    if sc.get("passed") is False:
        return "failed"
    return "skipped" if sc.get("skipped") else None


def _rank(o: ProblemOutcome) -> tuple[float, float]:
    return (
        -math.inf if o.reward is None else o.reward,
        o.speedup_vs_eager if (o.correct and _usable(o.speedup_vs_eager)) else 0.0,
    )


def compile_mode_of(result: EvalResult) -> str:
    """The torch.compile mode of the baseline ``result``'s ``speedup_vs_compile`` is against
    (``meta.baseline_compile_mode``; results from before it was recorded: ``default``)."""
    return str(result.meta.get("baseline_compile_mode") or "default")


def outcomes(tasks: Iterable[Task], results: Iterable[EvalResult]) -> list[ProblemOutcome]:
    """One outcome per task (best of its results; ``missing`` when it has none).

    Rewards are taken from the results; a result not yet scored is scored with the paper scheme.
    """
    from cuda_agent.reward import score

    best: dict[str, ProblemOutcome] = {}
    task_list = [t for t in tasks if t.level is not None and t.problem_id is not None]
    by_id = {t.id: t for t in task_list}
    for r in results:
        t = by_id.get(r.task_id)
        if t is None:
            continue
        reward = r.reward if r.reward is not None else score(r).value
        o = ProblemOutcome(
            level=t.level,
            problem_id=t.problem_id,
            name=t.name,
            status=str(r.status),
            speedup_vs_eager=r.speedup_vs_eager,
            speedup_vs_compile=r.speedup_vs_compile,
            reward=reward,
            shape_check=shape_verdict(r),
        )
        if t.id not in best or _rank(o) > _rank(best[t.id]):
            best[t.id] = o
    out = []
    for t in task_list:
        out.append(best.get(t.id) or ProblemOutcome(t.level, t.problem_id, t.name, "missing"))
    return sorted(out, key=lambda o: (o.level, o.problem_id))


def compute_metrics(outs: list[ProblemOutcome], threshold: float = 0.05) -> list[LevelMetrics]:
    """Per-level metrics in level order, then ``overall`` (levels weighted by problem count)."""
    levels = sorted({o.level for o in outs})
    rows = [level_metrics(str(lv), [o for o in outs if o.level == lv], threshold) for lv in levels]
    if outs:
        rows.append(level_metrics("overall", outs, threshold))
    return rows
