"""Evaluating a stream of candidates through any ``submit(candidate) -> Future`` with at most a
window of them in flight: what :class:`~.pool.SandboxPool` and :class:`~.fleet.RayPool` share
as their ``map`` (input order) and ``map_unordered`` (each as it is done)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from cuda_agent.records import Candidate, EvalResult

Submit = Callable[[Candidate], "Future[EvalResult]"]


def map_in_order(
    submit: Submit, items: Iterable[Any], window: int, return_exceptions: bool = False
) -> Iterator[Any]:
    """Results in input order, at most ``window`` candidates in flight, ``items`` read only as
    far as that allows. Items that are not ``Candidate`` pass through unchanged, in their place.
    An evaluation that raised raises here, or with ``return_exceptions`` is yielded as its
    exception in its place."""
    pending: deque[Any] = deque()
    for item in items:
        pending.append(submit(item) if isinstance(item, Candidate) else item)
        while len(pending) >= window or (pending and _ready(pending[0])):
            yield _value(pending.popleft(), return_exceptions)
    while pending:
        yield _value(pending.popleft(), return_exceptions)


def map_as_done(
    submit: Submit, items: Iterable[Any], window: int, return_exceptions: bool = False
) -> Iterator[tuple[Any, Any]]:
    """``(item, result)`` as each evaluation finishes (one slow candidate holds back no other),
    at most ``window`` candidates in flight. Items that are not ``Candidate`` come back at once
    as ``(item, item)``."""
    pending: dict[Future[EvalResult], Any] = {}

    def finished(block: bool) -> Iterator[tuple[Any, Any]]:
        done = wait(pending, return_when=FIRST_COMPLETED).done if block else None
        for f in list(done if done is not None else pending):
            if f.done():
                yield pending.pop(f), _value(f, return_exceptions)

    for item in items:
        if not isinstance(item, Candidate):
            yield item, item
            continue
        pending[submit(item)] = item
        while len(pending) >= window:
            yield from finished(block=True)
        yield from finished(block=False)
    while pending:
        yield from finished(block=True)


def _ready(x: Any) -> bool:
    return not isinstance(x, Future) or x.done()


def _value(x: Any, return_exceptions: bool = False) -> Any:
    if not isinstance(x, Future):
        return x
    if return_exceptions and (e := x.exception()) is not None:
        return e
    return x.result()
