"""Anti-reward-hacking checks applied by the sandbox to every candidate."""

from .api import POLICIES, RuntimeGuard, output_checks, static_checks, timing_checks
from .checks import CHECKS, Check, finding
from .shapes import resize_task_source, resized_candidate, shape_check

__all__ = [
    "CHECKS",
    "POLICIES",
    "Check",
    "RuntimeGuard",
    "finding",
    "output_checks",
    "resize_task_source",
    "resized_candidate",
    "shape_check",
    "static_checks",
    "timing_checks",
]
