"""The benchmarks behind ``swarmnode bench NAME [ARGS...]`` (docs/reference/design.md §8), one module each.

They are modules of the package, so they run from an installed wheel as from a checkout. How the package is
organized:

=================  ==========================================  =========================================
module             what it measures                            run it
=================  ==========================================  =========================================
``swarm/``         swarm vs isolated learning at equal         ``swarmnode bench swarm``
                   generation compute (± a hostile peer);
                   a subpackage split by concern: ``plan``
                   (arms, node configs), ``worker`` (a node
                   process), ``run`` (processes, the whole
                   run), ``results`` (reading an arm dir),
                   ``per_node``, ``report``, ``plots``, ``cli``
``tree``           tree vs independent sampling at equal       ``swarmnode bench tree``
                   leaves: tokens, forwards, wall time
``tree_learning``  tree vs chain held-out accuracy at equal    ``swarmnode bench tree-learning``
                   generated tokens
``gossip``         propagation latency and bytes per bundle    ``swarmnode bench gossip``
                   in an N-node loopback swarm
``verify``         verification throughput (bundles/s/core)    ``swarmnode bench verify``
=================  ==========================================  =========================================

One entry: every benchmark has ``main(argv=None, prog=None) -> int`` with its own argparse parser (``argv``
defaults to ``sys.argv[1:]``; ``prog`` is the command its ``--help`` and its report name). :data:`BENCHMARKS` maps
the command's names to the modules, :func:`run` is what ``swarmnode bench NAME ARGS...`` calls (in the same
process), :func:`summary` is what ``swarmnode bench --help`` lists. ``python -m swarmnode.bench.<module>`` runs a
benchmark too; ``scripts/bench_*.py`` are one-line wrappers kept for the commands recorded in docs/lab/.
Results go into docs/lab/benchmarks.md with their command.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Sequence

#: ``swarmnode bench NAME`` -> (module, one line for ``swarmnode bench --help``)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "swarm": ("swarmnode.bench.swarm",
              "swarm vs isolated learning at equal generation compute per node (± a hostile peer)"),
    "tree": ("swarmnode.bench.tree", "tree vs independent sampling at equal leaves: tokens, forwards, wall time"),
    "tree-learning": ("swarmnode.bench.tree_learning",
                      "tree vs chain held-out accuracy at equal generated tokens"),
    "gossip": ("swarmnode.bench.gossip", "gossip propagation latency and bytes per bundle on loopback"),
    "verify": ("swarmnode.bench.verify", "verification throughput (bundles/s per core)"),
}

__all__ = ["BENCHMARKS", "load", "run", "summary"]


def load(name: str) -> ModuleType:
    """The module of benchmark ``name`` (``"tree-learning"``, ``"tree_learning"`` and the old script name
    ``"bench_tree_learning"`` all name :mod:`swarmnode.bench.tree_learning`).

    Raises:
        ValueError: no such benchmark (the message lists them).
    """
    key = name.removeprefix("bench_").replace("_", "-")
    if key not in BENCHMARKS:
        raise ValueError(f"no benchmark {name!r}; benchmarks: {', '.join(BENCHMARKS)}")
    return importlib.import_module(BENCHMARKS[key][0])


def run(name: str, args: Sequence[str], prog: str | None = None) -> int:
    """Run benchmark ``name`` with command-line ``args`` in this process: its ``main(args, prog)``, with ``prog``
    ``swarmnode bench <name>`` unless given. Returns the exit code (argparse's ``SystemExit`` for ``--help`` or a
    bad flag passes through).

    Raises:
        ValueError: no such benchmark.
    """
    mod = load(name)
    return int(mod.main(list(args), prog=prog or f"swarmnode bench {name.removeprefix('bench_').replace('_', '-')}")
               or 0)


def summary() -> str:
    """One line per benchmark, ``NAME  what it measures`` (``swarmnode bench --help``)."""
    width = max(map(len, BENCHMARKS))
    return "\n".join(f"{n:<{width}}  {line}" for n, (_, line) in BENCHMARKS.items())
