"""Settings of an evaluation (one object, passed to :func:`evaluate` and :class:`SandboxPool`)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True)
class SandboxConfig:
    """How a candidate is built, verified and timed. Defaults follow the paper where it says."""

    backend: str = "auto"  # cuda | cpu | auto (cuda when a GPU and nvcc exist)
    # correctness
    atol: float = 1e-2
    rtol: float = 1e-2
    norm_tol: float = (
        2e-2  # max ||cand - ref|| / ||ref|| (stops all-zero outputs on small-valued tasks)
    )
    trials: int = 5  # >= 5; variants: base, shift, base, scale, base, ...
    # numerics stress trials, one each after the trials above (runner.STRESS_VARIANTS: nan_inf,
    # denormal, near_max, offset): () off (the paper's protocol), True all four, or a tuple of
    # their names; stored as the tuple. The "robust" setting: ``stress_trials=True``
    stress_trials: tuple[str, ...] | bool = ()
    # shape generalisation (off by default): a candidate that passed is verified once more (no
    # timing, no stress trials) at each resized instance of its task, the module-level sizes
    # get_inputs uses scaled by each factor as `guards resize-task` does (guards.shapes); every
    # factor is in (0, 0.9], so each size shrinks and the working set is at most the original's.
    # A wrong result or a crash there makes the result `incorrect` with the
    # G-SHAPE-GENERALISATION flag; meta.shape_check says what ran. With ``stress_trials``:
    # the "robust" setting
    shape_check: bool = False
    shape_factors: tuple[float, ...] = (0.75,)
    # CPU cores kept for the process holding a device's exclusive timed section (the candidate's
    # timing, and the profiler's baselines): every other process the sandbox starts runs on the
    # rest, so that compiles and verifications beside it cannot slow a launch-bound program's
    # host side (profiler.cpus). "auto": 2 on a host of 8 or more cores, else none; "off";
    # a count; or "a,b" (core ids). $CUDA_AGENT_TIMING_CPUS, set by a parent, wins
    timing_cpus: str = "auto"
    # wall-clock limits (seconds)
    compile_timeout_s: float = 300.0
    reference_timeout_s: float = 600.0
    verify_timeout_s: float = 300.0
    time_timeout_s: float = 600.0
    baseline_timeout_s: float = 1200.0
    # how long a verification waits for the GPU memory, host memory and disk it needs (other
    # evaluations freeing theirs) before it is an infra_error naming the resource (admission.py)
    admission_timeout_s: float = 900.0
    # timing
    timing: bool = True
    timing_config: dict[str, Any] | None = (
        None  # profiler TimingConfig fields; None: protocol default (cpu: quick)
    )
    timing_sets: int = 2
    baselines: bool = True
    compile_baseline: bool | None = None  # None: on for cuda, off for cpu
    # torch.compile mode of that baseline (what speedup_vs_compile and the reward's compile bar
    # compare with): default | max-autotune | max-autotune-no-cudagraphs | reduce-overhead
    baseline_compile_mode: str = "default"
    # paired eager (None: on for cuda, off for cpu): the reference's eager program is timed
    # again in the candidate's own exclusive hold, right after it, on the same input sets, by a
    # trusted process started beside the candidate's timing process (it builds only once that
    # one has ended, in the memory it freed); speedup_vs_eager divides that time instead of the
    # cached baseline's (taken in another run, under other host and device load), so both sides
    # see the same conditions. Where the eager timer fails, the cached baseline is used;
    # meta.eager_paired says which. The compile baseline stays the cached one. On the H200:
    # about 0.4 s more of each candidate's exclusive hold; honest speed-ups of four runs within
    # 0.8-3.3% (34% over the eager time of another run for a 0.08 ms program: docs/lab/session24)
    paired_eager: bool | None = None
    # concurrency (SandboxPool): device workers per GPU; their reference and verification
    # processes overlap, anything timed holds the GPU alone (see ``gate``)
    workers_per_gpu: int = 2
    rerun_alone: bool = True  # re-run, alone, a memory failure met while sharing the device
    # start the verification process while the reference runs (it waits, after `import torch`,
    # for the reference's weights); only where a mount namespace hides the reference's outputs
    early_verify: bool = True
    # start the timing process when the verification process has ended well (it waits, after
    # `import torch`, while the parent compares the outputs; cancelled if they fail)
    early_time: bool = True
    # with ``fork_server`` off: runner processes started ahead of need, per environment (see
    # warm.py; 0: each phase starts cold and imports torch on its own clock). None: 3 (one per
    # phase of an evaluation) where the host has at least 8 cores, else 0: a spare's import
    # takes a core for seconds, which a small machine's running phases need (and a one-off
    # evaluation leaves spares unused)
    warm_processes: int | None = None
    # every phase's launcher forked from a process per environment that imported the runner and
    # torch once (forkserver.py): the import is saved, not only moved; where the server cannot
    # start, phases start cold. Off: ``warm_processes`` decides
    fork_server: bool = True

    def __post_init__(self) -> None:
        from cuda_agent.profiler.cpus import resolve

        from .runner import STRESS_VARIANTS

        resolve(self.timing_cpus)  # a ValueError naming the setting and this host's cores
        from cuda_agent.guards.checks import check_policy

        try:  # a misspelt policy would make every candidate an infra_error: refused here
            check_policy(self.guard_policy)
        except ValueError as e:
            raise ValueError(f"guard_policy: {e}") from None

        st = self.stress_trials
        names = STRESS_VARIANTS if st is True else () if st is False else tuple(st)
        unknown = [v for v in names if v not in STRESS_VARIANTS]
        if unknown or len(set(names)) != len(names):
            raise ValueError(
                f"stress_trials={st!r}: expected True, False or distinct names among "
                f"{', '.join(STRESS_VARIANTS)}"
            )
        object.__setattr__(self, "stress_trials", names)
        factors = tuple(float(f) for f in self.shape_factors)
        if not factors or any(not 0.0 < f <= 0.9 for f in factors):
            raise ValueError(
                f"shape_factors={self.shape_factors!r}: expected one or more factors in (0, 0.9] "
                "(resized instances are smaller than the task's own)"
            )
        object.__setattr__(self, "shape_factors", factors)
        if self.baseline_compile_mode not in COMPILE_MODES:
            raise ValueError(
                f"baseline_compile_mode={self.baseline_compile_mode!r}: expected one of "
                f"{', '.join(COMPILE_MODES)}"
            )
        if self.warm_processes is not None and self.warm_processes < 0:
            raise ValueError(f"warm_processes={self.warm_processes}: expected 0 or more (or None)")
        if self.timing_config:
            from cuda_agent.profiler.config import TimingConfig

            bad = TimingConfig.unknown_keys(self.timing_config)
            if bad:
                raise ValueError(
                    f"timing_config: unknown key(s) {', '.join(bad)} (the fields of "
                    "cuda_agent.profiler.TimingConfig)"
                )

    def warm_spares(self) -> int:
        """``warm_processes`` resolved for this host."""
        if self.warm_processes is not None:
            return self.warm_processes
        return 3 if (os.cpu_count() or 1) >= 8 else 0

    # guards
    guard_policy: str = "strict"  # strict | kernelbench | off
    # build
    cache_dir: str | None = None
    compile_jobs: int = 4  # parallel compiler processes per candidate
    pch: bool | None = None  # precompile the bindings' prelude (None: cuda; cpu after 3 bindings)
    # isolation
    tmp_root: str | None = None
    keep_dirs: bool = False
    nproc: int = 512
    # largest file a candidate's process may write: twice today's largest KernelBench output
    # (L1/38-39, 8.6 GB) handed to the judge; the trusted reference and judge have no cap
    fsize_mb: int = 16384
    host_mem_mb: int = 32768  # resident memory of a candidate's process tree (cpu: also RLIMIT_AS)
    no_network: bool = True
    drop_user: bool = True

    def with_(self, **kw: Any) -> SandboxConfig:
        """A copy with some fields replaced."""
        return replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SandboxConfig:
        """A config from a dict; an unknown key is an error (a typo must not be ignored)."""
        names = {f.name for f in fields(SandboxConfig)}
        bad = sorted(k for k in d if k not in names)
        if bad:
            raise ValueError(f"unknown SandboxConfig key(s): {', '.join(bad)}")
        return SandboxConfig(**d)


BACKENDS = ("cuda", "cpu")
COMPILE_MODES = ("default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead")


def resolve_backend(backend: str) -> str:
    """'auto' -> 'cuda' when nvidia-smi sees a GPU and nvcc exists, else 'cpu'. Any name other
    than cuda, cpu or auto raises ValueError (it used to be taken for 'auto')."""
    if backend in BACKENDS:
        return backend
    if backend != "auto":
        raise ValueError(f"backend {backend!r}: expected cuda, cpu or auto")
    from .toolchain import device_capability, nvcc

    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return "cpu"
    return "cuda" if (nvcc() and device_capability()) else "cpu"


_ = field
