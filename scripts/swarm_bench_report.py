"""Write a ``swarmnode bench swarm`` report again from finished arm directories.

Each arm directory holds the ``summary.json`` the benchmark wrote after that arm; the summaries are recomputed
from the nodes' ``metrics.jsonl``, so this also reports the arms of an interrupted benchmark, or joins the arms
of several benchmark commands into one table (with the run-to-run spread and the external-sample supply).

Example (the N = 4 runs of docs/lab/benchmarks.md):

    python scripts/swarm_bench_report.py runs/bench_n4/* runs/bench_n4_iso4/* --out docs/lab --prefix swarm_bench_n4
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from swarmnode.benchmarks.swarm import report_from_arm_dirs


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("arm_dirs", nargs="+", type=Path, help="arm directories (with summary.json), in row order")
    ap.add_argument("--out", type=Path, default=Path("docs/lab"), help="directory of the markdown table and plots")
    ap.add_argument("--prefix", default="swarm_bench_results", help="file name prefix of the outputs")
    args = ap.parse_args(argv)
    dirs = [d for d in args.arm_dirs if d.is_dir()]
    try:
        md, pngs = report_from_arm_dirs(dirs, args.out, prefix=args.prefix,
                                        command=" ".join(shlex.quote(a) for a in ["python", sys.argv[0], *argv]))
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(md)
    for p in pngs:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
