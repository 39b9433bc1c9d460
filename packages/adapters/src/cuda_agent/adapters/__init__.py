"""Adapters from the kernel environment to other RL trainers (TRL: ``cuda_agent.adapters.trl``)."""
