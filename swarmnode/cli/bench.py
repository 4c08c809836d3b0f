"""``swarmnode bench NAME [ARGS...]``: a passthrough to the benchmarks of swarmnode/bench/, each with its own
parser."""

from __future__ import annotations

import typer

from swarmnode.cli.common import _fail

#: the context settings of ``bench``: every argument after NAME, ``--help`` included, goes to the benchmark
_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def bench(ctx: typer.Context) -> None:
    """Benchmarks: swarm vs isolated learning, tree sampling, gossip, verify (`swarmnode bench NAME --help`).

    `swarmnode bench NAME [ARGS...]` hands ARGS to the benchmark's own parser (swarmnode/bench/); `swarmnode bench
    --help` lists the benchmarks.
    """
    from swarmnode.bench import load, run, summary

    args = list(ctx.args)
    if not args or args[0] in ("-h", "--help"):
        print("usage: swarmnode bench NAME [ARGS...]\n\nBenchmarks (`swarmnode bench NAME --help` shows the options "
              "of one; results: docs/lab/benchmarks.md):\n")
        print("\n".join("  " + line for line in summary().splitlines()))
        raise typer.Exit(0 if args else 2)
    try:
        load(args[0])
    except ValueError as e:
        _fail(str(e))
        return
    raise typer.Exit(run(args[0], args[1:]))
