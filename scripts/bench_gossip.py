#!/usr/bin/env python
"""``swarmnode bench gossip`` as a script, kept for the commands recorded in docs/lab/.

Same flags (``swarmnode bench gossip --help``); the benchmark is :mod:`swarmnode.bench.gossip`."""

import sys

from swarmnode.bench import run

if __name__ == "__main__":
    sys.exit(run("gossip", sys.argv[1:], prog="python scripts/bench_gossip.py"))
