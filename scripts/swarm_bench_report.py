"""Write a ``swarmnode bench swarm`` report again from finished arm directories.

Each arm directory holds the ``summary.json`` the benchmark wrote after that arm; the summaries are recomputed
from the nodes' ``metrics.jsonl``, so this also reports the arms of an interrupted benchmark, or joins the arms
of several benchmark commands into one table (with the run-to-run spread and the external-sample supply). A
benchmark work directory (``--work-dir``) may be given instead of its arm directories: all arms in it are
reported, isolated first. Repeats are paired by the repeat index in each ``summary.json``: swarm node ``i`` of
repeat ``k`` is compared with isolated node ``i`` of repeat ``k`` (same model, seed and questions).

Example (isolated and swarm arms run side by side by two commands in one work dir, then one report):

    swarmnode bench swarm --models embedded,embedded-bpe --splits 8/0 --repeats 3 --work-dir runs/pair ... &
    swarmnode bench swarm --models embedded,embedded-bpe --splits 8/8 --no-isolated --repeats 3 \
        --work-dir runs/pair ... &
    wait
    python scripts/swarm_bench_report.py runs/pair --out docs/lab --prefix swarm_bench_pair
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
    ap.add_argument("arm_dirs", nargs="+", type=Path,
                    help="arm directories (with summary.json), in row order, or work dirs holding them")
    ap.add_argument("--out", type=Path, default=Path("docs/lab"), help="directory of the markdown table and plots")
    ap.add_argument("--prefix", default="swarm_bench_results", help="file name prefix of the outputs")
    ap.add_argument("--per-node", dest="per_node", action="store_true", default=None,
                    help="start with each node against itself alone and a learning-curve PNG per node (default: "
                         "when the nodes run more than one model)")
    ap.add_argument("--no-per-node", dest="per_node", action="store_false", help="node-mean tables only")
    ap.add_argument("--max-step", type=int, default=None,
                    help="compare every arm at this step: later training steps and evaluations are left out (arms "
                         "stopped before their horizon; the learning-rate schedule stays the full run's)")
    ap.add_argument("--unfinished", action="store_true",
                    help="also report arms without summary.json (interrupted or still running), from the arm.json "
                         "they wrote when they started; give --max-step so that every arm is read at one step")
    args = ap.parse_args(argv)
    if args.max_step is not None and args.max_step < 1:
        ap.error(f"--max-step must be >= 1; got {args.max_step}")
    dirs = [d for d in args.arm_dirs if d.is_dir()]
    missing = [d for d in args.arm_dirs if not d.is_dir()]
    if missing:  # a shell glob that matched files too is fine; name what was skipped
        print(f"skipped (not directories): {', '.join(str(d) for d in missing)}", file=sys.stderr)
    if not dirs:
        print("error: no arm directory given", file=sys.stderr)
        return 2
    try:
        md, pngs = report_from_arm_dirs(dirs, args.out, prefix=args.prefix, per_node=args.per_node,
                                        max_step=args.max_step, unfinished=args.unfinished,
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
