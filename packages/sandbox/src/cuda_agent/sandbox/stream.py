"""A stream of Candidate records evaluated through a :class:`~.pool.SandboxPool`: what
``sandbox eval`` and ``kernelbench-eval run`` share.

:func:`eval_stream` reads candidates lazily, keeps at most ``window`` of them in flight in the
pool (compiles in its CPU pool ahead of the device workers; correctness phases overlapping on a
device, timing alone on it) and writes one result per candidate as soon as it is done (or, with
``--in-order``, in input order), with the CLI conventions of ``cuda_agent.records.cli_helpers``:
``-o FILE --resume`` (each result appended and flushed as one line; a candidate whose key is in
FILE is skipped, so a killed run loses only what was in flight), ``--on-error``, ``--shard``,
``--claim``. Progress goes to stderr. The option types below are the flags both commands give
the pool; :class:`EvalStreamFlags` bundles them (``bundle_options``) for :func:`evaluate_stream`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cuda_agent.records import Candidate, ErrorRecord, EvalResult
from cuda_agent.records.cli_helpers import (
    OnError,
    StreamFlags,
    StreamStats,
    fail,
    in_shard,
    log,
    parse_shard,
    type_name,
)
from cuda_agent.records.jsonl import DecodeError, RecordWriter, done_keys, read_records

from .config import SandboxConfig
from .pool import SandboxPool

if TYPE_CHECKING:
    from cuda_agent.records.claims import Claims

GpusOpt = Annotated[
    str | None,
    typer.Option(
        "--gpus",
        help="GPUs to use: 'all' or '0,1' (--workers-per-gpu workers each). Default: the first "
        "visible.",
    ),
]
CompileJobsOpt = Annotated[
    int | None,
    typer.Option(
        "--compile-jobs",
        min=1,
        help="Candidates compiled at once (CPU pool; default: half the cores, at most 8).",
    ),
]
CpuWorkersOpt = Annotated[
    int, typer.Option("--cpu-workers", min=1, help="cpu backend: candidates verified at once.")
]
WorkersPerGpuOpt = Annotated[
    int,
    typer.Option(
        "--workers-per-gpu",
        min=1,
        help="Device workers per GPU: their correctness phases overlap; anything timed holds "
        "the GPU alone; each gets 0.9/N of its memory.",
    ),
]
WindowOpt = Annotated[
    int | None,
    typer.Option(
        "--window",
        min=1,
        help="Candidates in flight at once (input read only that far ahead of the results "
        "written). Default: 2 per device worker + 2 per compile worker; 1: one at a time.",
    ),
]

RayOpt = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="ADDRESS",
        envvar="CUDA_AGENT_RAY_ADDRESS",
        help="Evaluate on a Ray cluster (RayPool; needs the `ray` extra): 'auto' (the "
        "running cluster), 'local' (start one here), HOST:PORT or ray://...; a worker per "
        "GPU (cuda) or per CPU (cpu), each compiling on its node; a job lost with its "
        "worker or node is sent again.",
    ),
]
RayWorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--ray-workers",
        min=1,
        help="With --ray: workers to start (default: the cluster's GPUs; CPUs on cpu).",
    ),
]

InOrderOpt = Annotated[
    bool,
    typer.Option(
        "--in-order/--as-done",
        help="Write results in input order (a slow candidate then holds back the results after "
        "it, and a kill loses them) instead of each as soon as it is done (the default; results "
        "are keyed by task and solution id).",
    ),
]

TimingCpusOpt = Annotated[
    str,
    typer.Option(
        "--timing-cpus",
        help="Cores kept for the exclusive timed sections, every other sandbox process running on the rest: auto (2 on a host of 8+ cores, else none) | off | N | a,b (core ids).",
    ),
]


PairedEagerOpt = Annotated[
    bool | None,
    typer.Option(
        "--paired-eager/--no-paired-eager",
        help="Time the reference's eager program again right after each candidate, in its "
        "exclusive hold (a trusted process), and divide the speed-up over eager by that time "
        "instead of the cached baseline's. Default: on for the cuda backend, off for cpu.",
    ),
]


class EvalStreamFlags(StreamFlags, kw_only=True):
    """The stream and pool flags of a command that evaluates a candidate stream (``sandbox
    eval``, ``kernelbench-eval run``), named as the commands' parameters: the command declares
    each (``--help`` order is its own) and takes them whole with
    ``bundle_options("stream", EvalStreamFlags)``."""

    gpus: str | None = None
    compile_jobs: int | None = None
    cpu_workers: int = 1
    workers_per_gpu: int = 2
    window: int | None = None
    in_order: bool = False
    ray_address: str | None = None
    ray_workers: int | None = None


def sandbox_config(**settings: Any) -> SandboxConfig:
    """``SandboxConfig(**settings)``; a setting out of its range ends the command with its
    message (exit 2), no traceback."""
    try:
        return SandboxConfig(**settings)
    except ValueError as e:
        raise fail(str(e)) from None


def open_pool(
    cfg: SandboxConfig,
    *,
    gpus: str | None = None,
    ray_address: str | None = None,
    ray_workers: int | None = None,
    compile_workers: int | None = None,
    cpu_workers: int = 1,
    workers_per_device: int | None = None,
) -> SandboxPool:
    """The pool a stream command's flags ask for: a local :class:`SandboxPool` on ``gpus``
    (``--gpus``), or with ``ray_address`` (``--ray``) a :class:`~.fleet.RayPool` (the same API).
    A bad combination or an unreachable cluster ends the command with a clear error (exit 2)."""
    from .pool import parse_gpus

    if ray_address and gpus is not None:
        raise fail("--gpus is for the local pool: with --ray, Ray gives each worker its GPU")
    if ray_address:
        try:
            from .fleet import RayPool

            return RayPool(  # type: ignore[return-value]  # the SandboxPool API
                cfg,
                address=ray_address,
                workers=ray_workers,
                compile_workers=compile_workers,
                cpu_workers=cpu_workers,
                workers_per_device=workers_per_device,
            )
        except (ImportError, RuntimeError, ConnectionError, ValueError) as e:
            raise fail(f"--ray {ray_address}: {e}") from None
    try:
        gpu_list = parse_gpus(gpus)
    except ValueError as e:
        raise fail(str(e)) from None
    return SandboxPool(
        cfg,
        gpus=gpu_list,
        compile_workers=compile_workers,
        cpu_workers=cpu_workers,
        workers_per_device=workers_per_device,
    )


@dataclass
class EvalStats(StreamStats):
    """What :func:`eval_stream` did; ``statuses`` counts the results written by status."""

    statuses: dict[str, int] = field(default_factory=dict)

    @property
    def evaluated(self) -> int:
        return sum(self.statuses.values())

    def verdicts(self) -> str:
        return ", ".join(f"{v} {k}" for k, v in sorted(self.statuses.items())) or "none"

    def summary(self, what: str = "eval") -> str:
        skipped = self.skipped_done + self.skipped_shard + self.skipped_claimed
        why = [
            f"{n} {w}"
            for n, w in (
                (self.skipped_done, "already done"),
                (self.skipped_shard, "in other shards"),
                (self.skipped_claimed, "taken by other processes or done"),
            )
            if n
        ]
        parts = [
            f"{self.read} read",
            f"{self.written} written ({self.verdicts()})",
            f"{skipped} skipped" + (f" ({', '.join(why)})" if why else ""),
            f"{self.bad_lines} malformed",
        ]
        if self.failed:
            parts.append(f"{self.failed} failed")
        return f"{what}: " + ", ".join(parts) + f" in {self.seconds:.1f}s"


def _rate(n: int, seconds: float) -> str:
    return f"{3600.0 * n / seconds:.0f}/h" if seconds > 0 else "-"


def eval_stream(
    pool: SandboxPool,
    *,
    input: Path | None = None,
    output: Path | None = None,
    resume: bool = False,
    on_error: OnError = OnError.stop,
    shard: tuple[int, int] | None = None,
    claim: Path | None = None,
    window: int | None = None,
    in_order: bool = False,
    finish: Callable[[Candidate, EvalResult], EvalResult] | None = None,
    desc: str = "eval",
    summary_every: int = 10,
) -> EvalStats:
    """Evaluate the Candidate records of ``input`` (stdin when None) through ``pool``, at most
    ``window`` in flight (default: the pool's), and write one EvalResult per candidate to
    ``output`` (stdout when None) as soon as it is done (``in_order``: in input order), each line
    flushed as it is written.
    ``finish(candidate, result)`` may rewrite a result before it is written.

    With ``resume`` the candidates whose key is already in ``output`` are skipped. A malformed
    line (or a record that is not a candidate) and an evaluation that raised are handled per
    ``on_error``: ``stop`` reads no further input, writes the results still in flight and then
    raises ``typer.Exit`` (2 for a malformed line, 1 for a raised evaluation); ``skip`` logs it;
    ``emit`` writes an ErrorRecord in its place. With ``claim`` a candidate is evaluated only if
    this process claims it, and marked done once its result is written.
    """
    if resume and output is None:
        raise fail("--resume needs -o FILE (the file whose results are already done)")
    t0 = time.monotonic()
    done = _already_done(output if resume else None)
    claims = _claims(claim)
    run = _Run(
        pool,
        input=input,
        on_error=on_error,
        shard=shard,
        window=window,
        in_order=in_order,
        finish=finish,
        desc=desc,
        summary_every=summary_every,
        t0=t0,
        done=done,
        claims=claims,
    )
    log(
        f"{desc}: backend={pool.backend} devices={','.join(pool.devices)}"
        f" workers per {'GPU' if pool.backend == 'cuda' else 'host'}={pool.workers_per_device}"
        f" compile workers={pool.compile_workers} window={window or pool.default_window}"
    )
    with RecordWriter(output, append=True) as writer:
        for n, cand, res in run.results():
            run.write(writer, n, cand, res)
    run.stats.seconds = time.monotonic() - t0
    log(run.stats.summary(desc))
    if run.stop:
        raise fail(*run.stop[0])
    return run.stats


def _already_done(output: Path | None) -> set[str]:
    """The keys of the results already in ``output`` (``--resume``), said on stderr."""
    done = done_keys(output) if output is not None else set()
    if done:
        log(f"resume: {len(done)} results already in {output}")
    return done


def _claims(claim: Path | None) -> Claims | None:
    """The claims of this process on the queue ``claim`` (``--claim``), if any."""
    if claim is None:
        return None
    from cuda_agent.records.claims import Claims  # several processes of a host share the stream

    return Claims(claim)


@dataclass
class _Run:
    """One :func:`eval_stream` call: its arguments, and what it holds while the stream runs."""

    pool: SandboxPool
    input: Path | None
    on_error: OnError
    shard: tuple[int, int] | None
    window: int | None
    in_order: bool
    finish: Callable[[Candidate, EvalResult], EvalResult] | None
    desc: str
    summary_every: int
    t0: float  # time.monotonic() at the start
    done: set[str]  # keys already in the output (--resume)
    claims: Claims | None  # --claim
    stats: EvalStats = field(default_factory=EvalStats)
    stop: list[tuple[str, int]] = field(default_factory=list)  # the first stop: message, exit code
    inflight: deque[tuple[int, Candidate]] = field(default_factory=deque)  # line, candidate

    def error_record(self, n: int, message: str, raw: bytes = b"") -> ErrorRecord:
        text = raw.decode(errors="replace")[:2000]
        source = str(self.input) if self.input is not None else "<stdin>"
        return ErrorRecord(line=n, message=message, raw=text, source=source)

    def items(self) -> Iterator[Candidate | ErrorRecord]:
        """The candidates to evaluate, read lazily (each kept in ``inflight``, in input order),
        and under ``--on-error emit`` an ErrorRecord for each malformed line."""
        stats = self.stats
        for n, rec in read_records(self.input):
            if self.stop:
                return
            stats.read += 1
            if isinstance(rec, DecodeError) or not isinstance(rec, Candidate):
                stats.bad_lines += 1
                if isinstance(rec, DecodeError):
                    msg, raw = rec.message, rec.raw
                else:
                    msg, raw = f"expected kind candidate, got {rec.__struct_config__.tag!r}", b""
                if self.on_error is OnError.stop:
                    self.stop.append((f"line {n}: {msg}", 2))
                    return
                if self.on_error is OnError.emit:
                    yield self.error_record(n, msg, raw)
                else:
                    log(f"line {n}: {msg} (skipped)")
                continue
            k = rec.key
            if k in self.done:
                stats.skipped_done += 1
            elif not in_shard(k, self.shard):
                stats.skipped_shard += 1
            elif self.claims is not None and not self.claims.take(k):  # another process has it
                stats.skipped_claimed += 1
            else:
                self.inflight.append((n, rec))
                yield rec

    def results(self) -> Iterator[tuple[int, Candidate, EvalResult | BaseException | ErrorRecord]]:
        """(input line, candidate, result) as the pool gives them back."""
        inflight = self.inflight
        if self.in_order:
            for res in self.pool.map(self.items(), self.window, return_exceptions=True):
                if isinstance(res, ErrorRecord):
                    yield 0, None, res  # type: ignore[misc]
                else:
                    yield *inflight.popleft(), res
            return
        for item, res in self.pool.map_unordered(self.items(), self.window, return_exceptions=True):
            if isinstance(res, ErrorRecord):
                yield 0, None, res  # type: ignore[misc]
                continue
            i = next(i for i, (_, c) in enumerate(inflight) if c is item)
            n, cand = inflight[i]
            del inflight[i]
            yield n, cand, res

    def write(
        self,
        writer: RecordWriter,
        n: int,
        cand: Candidate,
        res: EvalResult | BaseException | ErrorRecord,
    ) -> None:
        """Write what the pool gave back for the candidate of line ``n`` (through ``finish``),
        or handle its failure per ``on_error``."""
        if isinstance(res, ErrorRecord):  # a malformed line under --on-error emit
            writer.write(res)
            self.stats.written += 1
            return
        try:
            if isinstance(res, BaseException):
                raise res
            if self.finish is not None:
                res = self.finish(cand, res)
        except Exception as e:  # noqa: BLE001 - reported with the line number
            self.failed(writer, n, cand, e)
            return
        writer.write(res)
        self.stats.written += 1
        if self.claims is not None:
            self.claims.done(cand.key)  # after the result is written
        self.progress(res)

    def failed(self, writer: RecordWriter, n: int, cand: Candidate, e: Exception) -> None:
        """An evaluation (or ``finish``) that raised: stop, emit or skip per ``on_error``."""
        self.stats.failed += 1
        msg = f"line {n}: {type_name(e)}: {e}"
        if self.on_error is OnError.stop:
            if self.claims is not None:  # a later run takes it again
                self.claims.release(cand.key)
            if not self.stop:
                self.stop.append((msg, 1))
            log(f"{msg} (stopping after the candidates in flight)")
            return
        if self.on_error is OnError.emit:
            writer.write(self.error_record(n, msg))
            self.stats.written += 1
        else:
            log(f"{msg} (skipped)")
        if self.claims is not None:
            self.claims.done(cand.key)

    def progress(self, res: EvalResult) -> None:
        """Count a written result by status; its line on stderr, and every ``summary_every``
        results the verdicts so far."""
        stats = self.stats
        st = res.status.value
        stats.statuses[st] = stats.statuses.get(st, 0) + 1
        k, dt = stats.evaluated, time.monotonic() - self.t0
        log(f"[{k} {_rate(k, dt)}] {res.key} {st} {res.seconds:.1f}s {res.message[:160]}")
        if self.summary_every and k % self.summary_every == 0:
            log(f"{self.desc}: {k} evaluated in {dt:.0f}s ({_rate(k, dt)}): {stats.verdicts()}")


def evaluate_stream(
    cfg: SandboxConfig,
    flags: EvalStreamFlags,
    *,
    finish: Callable[[Candidate, EvalResult], EvalResult] | None = None,
    desc: str = "eval",
) -> EvalStats:
    """Evaluate the candidate stream ``flags`` ask for (:func:`eval_stream`) through the pool
    they ask for (:func:`open_pool`), the pool closed at the end; see those two for what is
    guaranteed. ``kill -USR1`` of the process reports what its pool is doing
    (:mod:`.state_report`)."""
    from . import state_report

    state_report.install()
    with open_pool(
        cfg,
        gpus=flags.gpus,
        ray_address=flags.ray_address,
        ray_workers=flags.ray_workers,
        compile_workers=flags.compile_jobs,
        cpu_workers=flags.cpu_workers,
        workers_per_device=flags.workers_per_gpu,
    ) as pool:
        return eval_stream(
            pool,
            input=flags.input,
            output=flags.output,
            resume=flags.resume,
            on_error=flags.on_error,
            shard=parse_shard(flags.shard),
            claim=flags.claim,
            window=flags.window,
            in_order=flags.in_order,
            finish=finish,
            desc=desc,
        )
