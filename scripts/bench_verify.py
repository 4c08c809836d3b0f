#!/usr/bin/env python
"""``swarmnode bench verify`` as a script, kept for the commands recorded in docs/lab/.

Same flags (``swarmnode bench verify --help``); the benchmark is :mod:`swarmnode.bench.verify`."""

import sys

from swarmnode.bench import run


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark with ``argv`` (default: the command line); returns the exit code."""
    return run("verify", sys.argv[1:] if argv is None else argv, prog="python scripts/bench_verify.py")


if __name__ == "__main__":
    sys.exit(main())
