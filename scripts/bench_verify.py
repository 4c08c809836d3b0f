#!/usr/bin/env python
"""``swarmnode bench verify`` as a script, kept for the commands recorded in docs/lab/.

Same flags (``swarmnode bench verify --help``); the benchmark is :mod:`swarmnode.bench.verify`."""

import sys

from swarmnode.bench import run

if __name__ == "__main__":
    sys.exit(run("verify", sys.argv[1:], prog="python scripts/bench_verify.py"))
