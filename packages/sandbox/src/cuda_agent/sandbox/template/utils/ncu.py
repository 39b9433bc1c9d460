#!/usr/bin/env python3
"""Workspace tool 'ncu' -- DO NOT EDIT (read-only; part of the evaluation infrastructure).

Run from the workspace root: python utils/ncu.py [--help]
"""

import sys

from cuda_agent.sandbox.tools import main

if __name__ == "__main__":
    sys.exit(main("ncu", sys.argv[1:]))
