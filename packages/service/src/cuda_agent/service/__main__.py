"""``python -m cuda_agent.kernel-service serve ...``: the ``service`` command."""

from .cli import main

main()
