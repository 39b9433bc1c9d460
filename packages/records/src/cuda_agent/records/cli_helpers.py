"""The CLI conventions of ARCHITECTURE.md as reusable pieces for every package's typer app.

- stdout carries records only; messages and progress go to stderr.
- ``--on-error stop|skip|emit``: a malformed line stops with exit code 2 naming the line, is
  skipped and counted, or is passed downstream as an ``ErrorRecord``.
- ``-o FILE --resume``: inputs whose key is already in FILE are skipped; results are appended and
  flushed one line at a time.
- ``--shard i/n``: keep only the records whose key hashes to shard i of n.
- ``--claim DIR``: several processes share one input as a work queue (:mod:`.claims`).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import sys
import time
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from .jsonl import DecodeError, RecordWriter, done_keys, read_records
from .types import AnyRecord, ErrorRecord, record_key


class OnError(enum.StrEnum):
    stop = "stop"
    skip = "skip"
    emit = "emit"


InputArg = Annotated[
    Path | None,
    typer.Argument(help="Input JSONL file; stdin when omitted or '-'.", show_default=False),
]
OutputOpt = Annotated[
    Path | None,
    typer.Option("-o", "--output", help="Write records to FILE (appended) instead of stdout."),
]
ResumeOpt = Annotated[
    bool, typer.Option("--resume", help="Skip inputs whose key is already in the -o FILE.")
]
OnErrorOpt = Annotated[
    OnError,
    typer.Option(
        "--on-error",
        help="Malformed input line: stop (exit 2), skip (count it) or emit (pass an error record).",
    ),
]
ShardOpt = Annotated[
    str | None, typer.Option("--shard", help="Process only shard i of n (e.g. 0/4) by record key.")
]


ClaimOpt = Annotated[
    Path | None,
    typer.Option(
        "--claim",
        help="Share the input with other processes as a work queue: each record goes to the first "
        "process to claim it in DIR (one host; a fresh run needs a fresh DIR; a stopped run "
        "started again redoes only its unfinished records).",
    ),
]


def log(msg: str) -> None:
    """A message for people: always stderr, never stdout."""
    print(msg, file=sys.stderr, flush=True)


def fail(msg: str, code: int = 2) -> typer.Exit:
    """Print ``msg`` to stderr and return the ``typer.Exit`` to raise."""
    log(msg)
    return typer.Exit(code)


def bundle_options(name: str, bundle: Callable[..., Any]) -> Callable[[Callable[..., Any]], Any]:
    """Decorator for a typer command ``fn(..., <name>: <bundle>)``: typer sees ``fn``'s signature
    without ``name`` (every option where ``fn`` declares it: ``--help`` is ``fn``'s own), and
    ``fn`` gets every option as declared plus ``<name>=bundle(**the values of its options named
    as bundle's parameters)``, for a helper that takes a group of options whole instead of each
    command passing them one by one."""
    fields = set(inspect.signature(bundle).parameters)

    def decorate(fn: Callable[..., Any]) -> Any:
        hints = typing.get_type_hints(fn, include_extras=True)
        params = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(fn).parameters.values()
            if p.name != name
        ]
        grouped = [p.name for p in params if p.name in fields]

        @functools.wraps(fn)
        def command(**kw: Any) -> Any:
            return fn(**kw, **{name: bundle(**{n: kw[n] for n in grouped})})

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # typer must read the signature above, not fn's
        command.bundled_fn = fn  # type: ignore[attr-defined]  # for tools that read fn's source
        return command

    return decorate


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """``"i/n"`` -> ``(i, n)`` with 0 <= i < n; ``None`` passes through."""
    if spec is None:
        return None
    try:
        i_s, n_s = spec.split("/")
        i, n = int(i_s), int(n_s)
    except ValueError:
        raise typer.BadParameter(f"--shard must look like i/n, got {spec!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise typer.BadParameter(f"--shard {spec}: need 0 <= i < n")
    return i, n


def in_shard(key: str, shard: tuple[int, int] | None) -> bool:
    """Whether ``key`` belongs to ``shard`` (stable across processes and machines)."""
    if shard is None:
        return True
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return h % shard[1] == shard[0]


def progress(iterable: Iterable[Any], desc: str, total: int | None = None) -> Iterable[Any]:
    """Wrap an iterable in a progress bar on stderr, only when stderr is a terminal."""
    if not sys.stderr.isatty():
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, unit="rec", dynamic_ncols=True)


@dataclass
class StreamStats:
    read: int = 0
    written: int = 0
    skipped_done: int = 0
    skipped_shard: int = 0
    skipped_claimed: int = 0
    bad_lines: int = 0
    failed: int = 0
    seconds: float = 0.0
    by_kind: dict[str, int] = field(default_factory=dict)

    def summary(self, what: str = "records") -> str:
        parts = [f"{self.read} read", f"{self.written} written"]
        if self.skipped_done:
            parts.append(f"{self.skipped_done} already done")
        if self.skipped_shard:
            parts.append(f"{self.skipped_shard} in other shards")
        if self.skipped_claimed:
            parts.append(f"{self.skipped_claimed} taken by other processes or done")
        if self.bad_lines:
            parts.append(f"{self.bad_lines} malformed")
        if self.failed:
            parts.append(f"{self.failed} failed")
        return f"{what}: " + ", ".join(parts) + f" in {self.seconds:.1f}s"


def run_stream(
    process: Callable[[Any], Iterable[Any]],
    *,
    input: Path | None = None,
    output: Path | None = None,
    resume: bool = False,
    on_error: OnError = OnError.stop,
    type: Any = AnyRecord,
    expect: tuple[type, ...] | None = None,
    key: Callable[[Any], str] = record_key,
    shard: tuple[int, int] | None = None,
    claim: Path | None = None,
    desc: str = "records",
    quiet: bool = False,
) -> StreamStats:
    """Read records, call ``process`` on each, write what it yields; the conventions above.
    With ``claim`` a record is processed only if this process claims it, and marked done after
    its results are written.

    ``expect`` restricts the accepted record kinds (a wrong kind is a malformed line). An
    exception raised by ``process`` is handled like a malformed line but stops with exit code 1.
    Raises ``typer.Exit`` on a stop.
    """
    if resume and output is None:
        raise fail("--resume needs -o FILE (the file whose records are already done)")
    stats = StreamStats()
    t0 = time.monotonic()
    done = done_keys(output) if (resume and output is not None) else set()
    if done:
        log(f"resume: {len(done)} records already in {output}")
    source = str(input) if input is not None else "<stdin>"
    claims = None
    if claim is not None:
        from .claims import Claims

        claims = Claims(claim)
    with RecordWriter(output, append=True) as writer:

        def handle_bad(n: int, message: str, raw: bytes | str, code: int) -> None:
            stats.bad_lines += 1 if code == 2 else 0
            stats.failed += 1 if code != 2 else 0
            if on_error is OnError.stop:
                raise fail(f"line {n}: {message}", code)
            if on_error is OnError.emit:
                raw_s = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
                writer.write(ErrorRecord(line=n, message=message, raw=raw_s[:2000], source=source))
                stats.written += 1
            else:
                log(f"line {n}: {message} (skipped)")

        for n, rec in progress(read_records(input, type), desc=desc):
            stats.read += 1
            if isinstance(rec, DecodeError):
                handle_bad(n, rec.message, rec.raw, 2)
                continue
            if expect is not None and not isinstance(rec, expect):
                kinds = " or ".join(t.__struct_config__.tag for t in expect)
                got = rec.__struct_config__.tag
                handle_bad(n, f"expected kind {kinds}, got {got!r}", "", 2)
                continue
            k = key(rec)
            if k in done:
                stats.skipped_done += 1
                continue
            if not in_shard(k, shard):
                stats.skipped_shard += 1
                continue
            if claims is not None and not claims.take(k):
                stats.skipped_claimed += 1
                continue
            kind = rec.__struct_config__.tag
            stats.by_kind[kind] = stats.by_kind.get(kind, 0) + 1
            try:
                outs = list(process(rec))
            except typer.Exit:
                if claims is not None:
                    claims.release(k)
                raise
            except Exception as e:  # noqa: BLE001 - reported with the line number
                handle_bad(n, f"{type_name(e)}: {e}", "", 1)  # raises on --on-error stop
                if claims is not None:
                    claims.done(k)
                continue
            for out in outs:
                writer.write(out)
                stats.written += 1
            if claims is not None:
                claims.done(k)
    stats.seconds = time.monotonic() - t0
    if not quiet:
        log(stats.summary(desc))
    return stats


class StreamFlags(msgspec.Struct, kw_only=True):
    """The stream flags of a command (:data:`InputArg`, :data:`OutputOpt`, :data:`ResumeOpt`,
    :data:`OnErrorOpt`, :data:`ShardOpt`, :data:`ClaimOpt`), named as its parameters: the
    command declares those it takes (``--help`` shows them in its order) and gets them whole
    with ``bundle_options("stream", StreamFlags)``; those it does not take keep these defaults."""

    input: Path | None = None
    output: Path | None = None
    resume: bool = False
    on_error: OnError = OnError.stop
    shard: str | None = None
    claim: Path | None = None

    def check(self) -> None:
        """End the command (exit 2) on what these flags alone get wrong, before anything
        starts: ``--resume`` without ``-o FILE``, a malformed ``--shard``."""
        if self.resume and self.output is None:
            raise fail("--resume needs -o FILE")
        parse_shard(self.shard)

    def run(
        self,
        process: Callable[[Any], Iterable[Any]],
        *,
        expect: tuple[type, ...] | None = None,
        desc: str = "records",
    ) -> StreamStats:
        """:func:`run_stream` of ``process`` over the stream these flags name, with their
        conventions (resume, on-error, shard, claim)."""
        return run_stream(
            process,
            input=self.input,
            output=self.output,
            resume=self.resume,
            on_error=self.on_error,
            expect=expect,
            shard=parse_shard(self.shard),
            claim=self.claim,
            desc=desc,
        )


def type_name(e: BaseException) -> str:
    return e.__class__.__name__
