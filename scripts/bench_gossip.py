#!/usr/bin/env python
"""``swarmnode bench gossip`` as a script, kept for the commands recorded in docs/lab/.

Same flags (``swarmnode bench gossip --help``); the benchmark is :mod:`swarmnode.bench.gossip`."""

import sys

from swarmnode.bench import run


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark with ``argv`` (default: the command line); returns the exit code."""
    return run("gossip", sys.argv[1:] if argv is None else argv, prog="python scripts/bench_gossip.py")


if __name__ == "__main__":
    sys.exit(main())
