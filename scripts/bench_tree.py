#!/usr/bin/env python
"""``swarmnode bench tree`` as a script, kept for the commands recorded in docs/lab/.

Same flags (``swarmnode bench tree --help``); the benchmark is :mod:`swarmnode.bench.tree`."""

import sys

from swarmnode.bench import run

if __name__ == "__main__":
    sys.exit(run("tree", sys.argv[1:], prog="python scripts/bench_tree.py"))
