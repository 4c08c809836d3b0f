#!/usr/bin/env python
"""``swarmnode bench swarm`` as a script, kept for the commands recorded in docs/lab/.

Same flags (``swarmnode bench swarm --help``); the benchmark is :mod:`swarmnode.bench.swarm`."""

import sys

from swarmnode.bench import run

if __name__ == "__main__":
    sys.exit(run("swarm", sys.argv[1:], prog="python scripts/bench_swarm.py"))
