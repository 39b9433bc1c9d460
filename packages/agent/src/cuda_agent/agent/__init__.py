"""The ReAct agent: tools, tool-call parsing, policy backends, episodes."""
