"""The swarm benchmark's command lines: :func:`main` is ``swarmnode bench swarm`` (and ``scripts/bench_swarm.py``),
:func:`report_main` is ``scripts/swarm_bench_report.py``, :func:`role_main` is what every node and hostile-peer
process of an arm runs (``python -m swarmnode.bench.swarm worker|hostile SPEC.json``, started by
:func:`~swarmnode.bench.swarm.run.run_arm`).

Errors a user can fix (bad splits, a bad ``--swarm-set``, a failed node) are one line on stderr,
``error: ...``, and exit code 2; SIGTERM ends a running benchmark with 143 after killing its node processes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Sequence

from swarmnode.bench.swarm.plan import DEFAULT_PAYLOAD
from swarmnode.bench.swarm.report import report_from_arm_dirs
from swarmnode.bench.swarm.run import run_bench
from swarmnode.bench.swarm.worker import hostile_main, worker_main


def _command(prog: str, argv: Sequence[str]) -> str:
    return " ".join([prog, *(shlex.quote(a) for a in argv)])


def parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The options of ``swarmnode bench swarm`` (each maps to a keyword of
    :func:`~swarmnode.bench.swarm.run.run_bench`)."""
    ap = argparse.ArgumentParser(
        prog=prog, description="Swarm vs isolated learning at equal generation compute per node (held-out accuracy "
        "curves, AUC, endpoint, steps to the solo final accuracy; per node with --models or --per-node; cumulative "
        "reward). docs/reference/design.md §8.")
    ap.add_argument("--nodes", type=int, default=2, help="N nodes in the swarm and N isolated nodes")
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps (rounds) per node")
    ap.add_argument("--model", default=None, help='"embedded" (default), a local HF model dir or a hub id')
    ap.add_argument("--models", default=None, help="a model per node, comma-separated (node i runs the i mod len-th, "
                    "in every arm), e.g. embedded,embedded-bpe; wins over --model")
    ap.add_argument("--config", "-c", default=None, help="YAML config of every node (default: packaged)")
    ap.add_argument("--splits", default="8/0,4/4", help="local/external prompts per step, e.g. 8/0,6/2,4/4,2/6")
    ap.add_argument("--normalization", default="per_source,joint", help="per_source,joint")
    ap.add_argument("--off-policy", default="none", help="none,luffy,tis")
    ap.add_argument("--eval-size", type=int, default=100, help="held-out tasks per evaluation")
    ap.add_argument("--eval-every", type=int, default=50, help="held-out evaluation every K steps (0: before/after)")
    ap.add_argument("--out", default="docs/lab", help="directory of the markdown table and PNG plots")
    ap.add_argument("--work-dir", default="runs/bench_swarm", help="run directories of the nodes")
    ap.add_argument("--prefix", default="swarm_bench_results", help="file name prefix of the outputs")
    ap.add_argument("--hostile", default="none", help="also run every swarm arm with one hostile peer "
                    "(swarmnode.testing.adversary.HostilePeer) in the swarm: none, network (every protocol attack, "
                    "labelled +hostile), poison (poisoned but correct groups carrying --payload, labelled +poison) or "
                    "rescue_poison (answers to the honest nodes' rescue requests, every leaf correct and carrying "
                    "--payload, labelled +rescue-poison; with --levers rescue)")
    ap.add_argument("--screen-off-arm", dest="screen_off", action="store_true", help="with --hostile, also run each "
                    "hostile arm with the honest nodes' likelihood screen off (what the attack does without it)")
    ap.add_argument("--isolated", action=argparse.BooleanOptionalAction, default=True,
                    help="run the isolated arms (--no-isolated: swarm arms only)")
    ap.add_argument("--payload", default=DEFAULT_PAYLOAD, help="the string the poison peer plants")
    ap.add_argument("--repeats", type=int, default=1, help="runs of every arm with other seeds and question streams "
                    "(the report adds mean ± standard error)")
    ap.add_argument("--first-repeat", type=int, default=0, help="index of the first repeat: with --repeats R runs "
                    "repeats K..K+R-1, to add repeats to an earlier benchmark in the same --work-dir "
                    "(scripts/swarm_bench_report.py reports them together)")
    ap.add_argument("--levers", default="none", help="swarm arms with the swarm levers: a comma-separated subset of "
                    "none,curriculum,expansion,both,specialize,rescue (levers.curriculum / levers.expansion; "
                    "specialize: node i weights task source i mod T by 4; rescue: levers.rescue.enabled, peers "
                    "answer a node's all-wrong questions)")
    ap.add_argument("--swarm-set", action="append", default=None, help="KEY=VALUE[,KEY=VALUE] config overrides "
                    "(dotted keys) of the swarm arms only, e.g. train.learning_rate=2e-5 for the larger batch; shown "
                    "in the arm's name and label; repeatable")
    ap.add_argument("--per-node", action=argparse.BooleanOptionalAction, default=None, help="start the report with "
                    "each node against itself alone (held-out endpoint, gain, AUC, gain in the swarm minus gain "
                    "alone, steps to its solo twin's final accuracy) and a learning-curve PNG per node; default: on "
                    "when --models names several models")
    ap.add_argument("--linger", action=argparse.BooleanOptionalAction, default=True, help="with --levers rescue, a "
                    "node that has done its steps keeps answering its peers' rescue requests (not training, at its "
                    "own pace) until every node of the arm is done, as a volunteer's node keeps running "
                    "(--no-linger: it stops at its last step)")
    ap.add_argument("--arm-timeout", type=float, default=1800.0, help="seconds an arm's nodes may run before they "
                    "are killed and the benchmark stops (0: no limit); a loaded machine needs more")
    return ap


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """``swarmnode bench swarm [OPTIONS]``: parse ``argv`` (default ``sys.argv[1:]``), run
    :func:`~swarmnode.bench.swarm.run.run_bench`, print the markdown report and the files written.

    ``prog`` is the command named in ``--help`` and recorded in the report (default ``swarmnode bench swarm``).
    Returns the exit code: 0, or 2 after a one-line ``error: ...`` on stderr (ValueError / RuntimeError of
    :func:`run_bench`, a bad config).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or "swarmnode bench swarm"
    a = parser(prog).parse_args(argv)
    try:
        res = run_bench(nodes=a.nodes, steps=a.steps, model=a.model, config=a.config, splits=a.splits,
                        normalization=a.normalization, off_policy=a.off_policy, eval_size=a.eval_size,
                        eval_every=a.eval_every, out=a.out, work_dir=a.work_dir, prefix=a.prefix,
                        hostile="" if a.hostile == "none" else a.hostile, isolated=a.isolated,
                        screen_off=a.screen_off, payload=a.payload, repeats=a.repeats, levers=a.levers,
                        arm_timeout=a.arm_timeout, first_repeat=a.first_repeat, models=a.models,
                        swarm_set=a.swarm_set, per_node=a.per_node, linger=a.linger, command=_command(prog, argv),
                        log=lambda s: print(s, flush=True))
    except (ValueError, RuntimeError) as e:  # ConfigError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(res.markdown.read_text())
    print(f"wrote {res.markdown} and {', '.join(str(p) for p in res.plots)}")
    return 0


def report_main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """``scripts/swarm_bench_report.py ARM_DIR|WORK_DIR ... [OPTIONS]``: write a ``swarmnode bench swarm`` report
    again from finished arm directories (:func:`~swarmnode.bench.swarm.report.report_from_arm_dirs`).

    Each arm directory holds the ``summary.json`` the benchmark wrote after that arm; the summaries are recomputed
    from the nodes' ``metrics.jsonl``, so this also reports the arms of an interrupted benchmark, or joins the arms
    of several benchmark commands into one table. A work directory (``--work-dir``) may be given instead of its arm
    directories. Returns the exit code (2 after a one-line ``error: ...`` on stderr).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or "python scripts/swarm_bench_report.py"
    ap = argparse.ArgumentParser(prog=prog, description="Write a `swarmnode bench swarm` report again from "
                                 "finished arm directories.")
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
                                        command=_command(prog, argv))
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(md)
    for p in pngs:
        print(p)
    return 0


def role_main(argv: Sequence[str] | None = None) -> int:
    """``python -m swarmnode.bench.swarm worker SPEC.json`` (:func:`~swarmnode.bench.swarm.worker.worker_main`) or
    ``... hostile SPEC.json`` (:func:`~swarmnode.bench.swarm.worker.hostile_main`): one process of an arm.
    Anything else prints the usage and returns 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "worker":
        return worker_main(argv[1])
    if len(argv) == 2 and argv[0] == "hostile":
        return hostile_main(argv[1])
    print("usage: python -m swarmnode.bench.swarm {worker,hostile} SPEC.json  (use `swarmnode bench swarm` for the "
          "benchmark)", file=sys.stderr)
    return 2
