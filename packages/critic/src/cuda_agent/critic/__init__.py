"""Critic: value model, token-level GAE, value pretraining."""
