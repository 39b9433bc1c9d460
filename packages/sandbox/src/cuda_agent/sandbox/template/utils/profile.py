#!/usr/bin/env python3
"""Workspace tool 'profile' -- DO NOT EDIT (read-only; part of the evaluation infrastructure).

Run from the workspace root: python utils/profile.py [--help]
"""

import sys

from cuda_agent.sandbox.tools import main

if __name__ == "__main__":
    sys.exit(main("profile", sys.argv[1:]))
