"""cuda_agent.opsynth"""
