"""Paired A/B of the output comparison's fp32 fast path (same process, same tensors, alternating,
median of ROUNDS).

    python packages/sandbox/benchmarks/compare_ab.py [ROUNDS] [ROWS] [CASE]   (default 7 8192 passing)

CASE ``passing``: a candidate that differs by 1e-4 noise, with and without the two isfinite()
passes the fast path used to start with. CASE ``incorrect``: a candidate computing the wrong
function (``0.5 * r + 0.25``), decided by the fast path's failure branch vs the float64 exact
path that decided every failing output before (the old fast path's own first passes are not
counted, so the ratio is conservative). Prints one JSON line: medians in seconds and their ratio."""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from paired import paired_medians, print_ab

import cuda_agent.sandbox.compare as cmp
from cuda_agent.sandbox.compare import Tolerance, compare


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    case = sys.argv[3] if len(sys.argv) > 3 else "passing"
    g = torch.Generator().manual_seed(0)
    r = torch.randn(rows, rows, generator=g)
    tol = Tolerance(1e-2, 1e-2, 1e-2)
    if case == "incorrect":
        c = r * 0.5 + 0.25

        def before() -> bool:  # the exact path, as every failing output took until this change
            fast, cmp._compare_float_fast = cmp._compare_float_fast, lambda *a: None
            try:
                return not compare(r, c, tol).passed
            finally:
                cmp._compare_float_fast = fast

        def after() -> bool:
            return not compare(r, c, tol).passed
    else:
        c = r + 1e-4 * torch.randn(rows, rows, generator=g)

        def before() -> bool:  # what the fast path did first until the isfinite change
            ok = bool(torch.isfinite(r).all()) and bool(torch.isfinite(c).all())
            return ok and compare(r, c, tol).passed

        def after() -> bool:
            return compare(r, c, tol).passed

    def check(fn: Callable[[], bool]) -> Callable[[], None]:
        def run() -> None:
            assert fn()

        return run

    med = paired_medians({"before": check(before), "after": check(after)}, rounds)
    print_ab(med, case=case, rows=rows, rounds=rounds, threads=torch.get_num_threads())
    return 0


if __name__ == "__main__":
    sys.exit(main())
