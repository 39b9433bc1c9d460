"""cuda_agent.profiler"""
