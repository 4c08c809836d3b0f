#!/usr/bin/env python
"""``swarmnode bench tree-learning`` as a script, kept for the commands recorded in docs/lab/.

Same flags (``swarmnode bench tree-learning --help``); the benchmark is :mod:`swarmnode.bench.tree_learning`."""

import sys

from swarmnode.bench import run

if __name__ == "__main__":
    sys.exit(run("tree-learning", sys.argv[1:], prog="python scripts/bench_tree_learning.py"))
