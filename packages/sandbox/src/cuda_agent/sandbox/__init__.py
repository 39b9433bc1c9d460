"""cuda_agent.sandbox"""
