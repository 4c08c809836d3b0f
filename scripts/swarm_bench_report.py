#!/usr/bin/env python
"""Write a ``swarmnode bench swarm`` report again from finished arm directories (or work dirs holding them).

The summaries are recomputed from the nodes' ``metrics.jsonl``, so this also reports the arms of an interrupted
benchmark, or joins the arms of several benchmark commands into one table; repeats are paired by index
(:func:`swarmnode.bench.swarm.report.report_from_arm_dirs`; ``--help`` lists the flags).

Example (isolated and swarm arms run side by side by two commands in one work dir, then one report):

    swarmnode bench swarm --models embedded,embedded-bpe --splits 8/0 --repeats 3 --work-dir runs/pair ... &
    swarmnode bench swarm --models embedded,embedded-bpe --splits 8/8 --no-isolated --repeats 3 \
        --work-dir runs/pair ... &
    wait
    python scripts/swarm_bench_report.py runs/pair --out docs/lab --prefix swarm_bench_pair
"""

import sys

from swarmnode.bench.swarm import report_main


def main(argv: list[str] | None = None) -> int:
    """Write the report for ``argv`` (default: the command line); returns the exit code."""
    return report_main(argv, prog="python scripts/swarm_bench_report.py")


if __name__ == "__main__":
    sys.exit(main())
