"""Reward functions over evaluation results (the CUDA Agent schedule and ablations)."""

from .schemes import SCHEMES, Reward, RewardConfig, apply, beats, score

__all__ = ["SCHEMES", "Reward", "RewardConfig", "apply", "beats", "score"]
