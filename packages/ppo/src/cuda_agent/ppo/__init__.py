"""Single-turn warm-up and multi-turn agentic PPO."""
