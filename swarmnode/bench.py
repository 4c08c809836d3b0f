"""Compatibility names for the benchmarks, which live in :mod:`swarmnode.benchmarks` (so that `swarmnode bench` works from an installed wheel).

``from swarmnode.bench import run_bench, Arm, ...`` keeps working (the swarm benchmark is
:mod:`swarmnode.benchmarks.swarm`); :func:`load_script` / :func:`run_script` import or run a benchmark module by
its old script name (``"bench_tree"``, ``"bench_gossip"``, ...) -- by module name, never by file path, so they
work from an installed wheel.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Sequence

from swarmnode.benchmarks import load_module, run_module
from swarmnode.benchmarks.swarm import (  # noqa: F401  (re-exported)
    Arm,
    BenchResult,
    BufferedSwarm,
    hostile_main,
    PayloadCounter,
    hostile_report,
    node_config,
    payload_start_probability,
    poison_report,
    repeats_report,
    parse_splits,
    plan_arms,
    rounds_to_reach,
    run_arm,
    run_bench,
    summarize_arm,
    worker_main,
    write_report,
)


def load_script(name: str) -> ModuleType:
    """The benchmark module of an old script name: ``load_script("bench_tree")`` is
    :mod:`swarmnode.benchmarks.tree`.

    Raises:
        ValueError: no such benchmark.
    """
    return load_module(name)


def run_script(name: str, args: Sequence[str]) -> int:
    """Run the benchmark of an old script name in a child process (``python -m swarmnode.benchmarks.<name>``)."""
    return run_module(name, args)


if __name__ == "__main__":  # pragma: no cover - `python -m swarmnode.bench worker SPEC` of older runs
    from swarmnode.benchmarks.swarm import _main

    sys.exit(_main())
