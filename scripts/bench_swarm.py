"""Swarm vs isolated learning at equal generation compute per node (docs/reference/design.md §8).

Same as ``swarmnode bench swarm`` (see ``swarmnode/bench.py`` for the method): N nodes in a loopback swarm
versus N isolated nodes, splits I/J local/external prompts per step, per-source vs joint normalization,
off-policy modes; writes a markdown table and PNG plots under ``--out``. ``--hostile network|poison`` adds, for every swarm arm,
the same arm with one hostile peer in the swarm (``swarmnode.testing.adversary.HostilePeer``) and reports the honest
nodes' rejections of its input by reason.

Example (the bounded run recorded in docs/lab/benchmarks.md):

    nice python scripts/bench_swarm.py --nodes 2 --steps 200 --splits 8/0,4/4 \
        --normalization per_source,joint --off-policy none,luffy --eval-size 100 --eval-every 50 --out docs/lab
"""

from __future__ import annotations

import argparse
import shlex
import sys

from swarmnode.benchmarks.swarm import run_bench


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--model", default=None, help='"embedded" (default), a local HF model dir or a hub id')
    ap.add_argument("--config", default=None, help="YAML config of every node (default: the packaged one)")
    ap.add_argument("--splits", default="8/0,4/4", help="I/J local/external prompts, e.g. 8/0,6/2,4/4,2/6")
    ap.add_argument("--normalization", default="per_source,joint")
    ap.add_argument("--off-policy", default="none", help="none,luffy,tis")
    ap.add_argument("--eval-size", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--out", default="docs/lab")
    ap.add_argument("--work-dir", default="runs/bench_swarm")
    ap.add_argument("--prefix", default="swarm_bench_results")
    ap.add_argument("--hostile", default="none", choices=["none", "network", "poison"],
                    help="also run every swarm arm with one hostile peer in the swarm: network (+hostile) or "
                         "poison (poisoned but correct groups, +poison)")
    ap.add_argument("--screen-off-arm", action="store_true", help="with --hostile, also the hostile arm without the screen")
    ap.add_argument("--no-isolated", action="store_true", help="swarm arms only")
    ap.add_argument("--payload", default="pwned!")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--first-repeat", type=int, default=0,
                    help="index of the first repeat (add repeats to an earlier benchmark in the same --work-dir)")
    ap.add_argument("--levers", default="none", help="none,curriculum,expansion,both")
    ap.add_argument("--arm-timeout", type=float, default=1800.0,
                    help="seconds an arm's nodes may run before they are killed (0: no limit)")
    a = ap.parse_args(argv)
    argv_list = sys.argv[1:] if argv is None else argv
    try:
        res = run_bench(nodes=a.nodes, steps=a.steps, model=a.model, config=a.config, splits=a.splits,
                        normalization=a.normalization, off_policy=a.off_policy, eval_size=a.eval_size,
                        eval_every=a.eval_every, out=a.out, work_dir=a.work_dir, prefix=a.prefix,
                        hostile="" if a.hostile == "none" else a.hostile, isolated=not a.no_isolated,
                        screen_off=a.screen_off_arm, payload=a.payload, repeats=a.repeats, levers=a.levers,
                        arm_timeout=a.arm_timeout, first_repeat=a.first_repeat,
                        command=" ".join(shlex.quote(x) for x in ["python", "scripts/bench_swarm.py", *argv_list]))
    except (ValueError, RuntimeError) as e:  # the same one-line errors as `swarmnode bench swarm`
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(res.markdown.read_text())
    print("plots:", ", ".join(str(p) for p in res.plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
