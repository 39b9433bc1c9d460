"""CPU cores kept for timed sections.

A program that takes tens of microseconds on the GPU is timed with its host-side launches in the
measurement (above the CUDA-graph threshold). When the compilers of other candidates, other
references' ``torch.compile`` or verification processes run on every core of the host, those
launches queue behind them and the same kernel reads several percent slower from one run to the
next. So, on a host with enough cores, a few are kept for the process holding a device's
exclusive timed section: every process the sandbox starts runs on the other cores
(:func:`other_cpus`), and a timed process moves its timing thread onto the kept ones once it
holds the section (:func:`enter_timed`), and back after (:func:`leave_timed`).

The set is decided once by the evaluating parent (:func:`resolve`) and handed to its children
in ``$CUDA_AGENT_TIMING_CPUS`` (a comma-separated list of core ids; empty: none kept). Affinity
is not a boundary: a process can move itself (a hostile candidate can make its neighbours'
timings noisier, as it could by burning CPU before); it keeps the toolkit's own work apart.
"""

from __future__ import annotations

import contextlib
import os
import sys

ENV = "CUDA_AGENT_TIMING_CPUS"
AUTO_MIN_CORES = 8  # "auto" keeps cores only on hosts with at least this many
AUTO_KEEP = 2
_overridden: set[str | int | None] = set()  # settings install() has said it did not apply


def _allowed() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return []


def resolve(setting: str | int | None = "auto") -> tuple[int, ...]:
    """The cores to keep for timed sections under ``setting``: ``"auto"`` (the last
    :data:`AUTO_KEEP` of this process's allowed cores when it has at least
    :data:`AUTO_MIN_CORES`, else none), ``0``/``"off"``/``None`` (none), an int ``n`` (the last
    ``n``, leaving at least one), or ``"a,b,..."`` (those, which must be allowed). Raises
    ``ValueError`` for anything else."""
    allowed = _allowed()
    if setting is None or setting in ("off", "", 0, "0"):
        return ()
    if setting == "auto":
        return tuple(allowed[-AUTO_KEEP:]) if len(allowed) >= AUTO_MIN_CORES else ()
    if isinstance(setting, int) or (isinstance(setting, str) and setting.isdigit()):
        n = int(setting)
        if n < 0 or n >= len(allowed):
            raise ValueError(
                f"timing_cpus={setting!r}: keep 0 to {len(allowed) - 1} of {len(allowed)} cores"
            )
        return tuple(allowed[-n:]) if n else ()
    if isinstance(setting, str):
        try:
            cores = tuple(sorted({int(x) for x in setting.split(",") if x.strip()}))
        except ValueError:
            cores = ()
        if cores and set(cores) <= set(allowed) and len(cores) < len(allowed):
            return cores
    raise ValueError(
        f"timing_cpus={setting!r}: expected auto, off, a count or a list of allowed cores "
        f"(allowed: {allowed}), leaving at least one for the rest"
    )


def kept() -> tuple[int, ...]:
    """The kept cores handed down in ``$CUDA_AGENT_TIMING_CPUS`` (empty: none)."""
    raw = os.environ.get(ENV, "")
    try:
        return tuple(sorted({int(x) for x in raw.split(",") if x.strip()}))
    except ValueError:
        return ()


def other_cpus(keep: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
    """This process's allowed cores without the kept ones (``keep``, default :func:`kept`);
    None when none are kept (run anywhere)."""
    keep = kept() if keep is None else keep
    if not keep:
        return None
    rest = tuple(c for c in _allowed() if c not in keep)
    return rest or None


def enter_timed(cores: tuple[int, ...] | list[int] | None = None) -> tuple[int, ...] | None:
    """Move the calling thread onto the kept cores (``cores``, default :func:`kept`; call it
    once the device's exclusive timed section is held); returns the cores it ran on before (for
    :func:`leave_timed`), or None when none are kept or the move failed (the timing goes on
    where it is)."""
    keep = tuple(cores) if cores is not None else kept()
    if not keep:
        return None
    before = tuple(_allowed())
    try:
        os.sched_setaffinity(0, keep)
    except OSError:
        return None
    return before


def leave_timed(before: tuple[int, ...] | None) -> None:
    """Undo :func:`enter_timed` (no-op for None)."""
    if before:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, before)


def install(setting: str | int | None = "auto") -> tuple[int, ...]:
    """Decide the kept cores for this process and everything it starts: an explicit
    ``$CUDA_AGENT_TIMING_CPUS`` (a parent's decision) wins, else :func:`resolve` of
    ``setting``, written to the environment. Returns the kept cores. A setting other than
    ``auto`` that the decision already in force overrides is said once on stderr."""
    if ENV in os.environ:
        keep = kept()
        if setting != "auto" and resolve(setting) != keep and setting not in _overridden:
            _overridden.add(setting)
            print(
                f"timing_cpus={setting!r} not applied: {ENV}={os.environ[ENV]!r} is in force "
                "for this process (set by its parent or by its first pool)",
                file=sys.stderr,
            )
        return keep
    keep = resolve(setting)
    os.environ[ENV] = ",".join(map(str, keep))
    return keep


def pin_to_other_cpus(pid: int, env: dict[str, str] | None = None) -> None:
    """Run process ``pid`` (just started) on the cores not kept for timing, by the kept set
    in ``env`` (default: this process's environment); a no-op when none are kept."""
    raw = (env if env is not None else os.environ).get(ENV, "")
    try:
        keep = tuple(int(x) for x in raw.split(",") if x.strip())
    except ValueError:
        return
    rest = other_cpus(keep)
    if rest:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(pid, rest)
