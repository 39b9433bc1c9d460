"""Evaluate solutions on a KernelBench checkout and report the CUDA Agent paper's table."""

from .metrics import LevelMetrics, ProblemOutcome, compute_metrics
from .solutions import import_solutions
from .tree import iter_problems, parse_ranges

__all__ = [
    "LevelMetrics",
    "ProblemOutcome",
    "compute_metrics",
    "import_solutions",
    "iter_problems",
    "parse_ranges",
]
