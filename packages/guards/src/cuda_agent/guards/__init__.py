"""Anti-reward-hacking checks applied by the sandbox to every candidate."""

from .api import POLICIES, RuntimeGuard, static_checks, timing_checks

__all__ = ["POLICIES", "RuntimeGuard", "static_checks", "timing_checks"]
