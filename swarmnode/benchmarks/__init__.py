"""Benchmarks, as modules of the package (docs/reference/design.md §8): they run from an installed wheel as from a checkout.

=================  ==========================================  ============================================
module             what it measures                            run it
=================  ==========================================  ============================================
``swarm``          swarm vs isolated learning at equal         ``swarmnode bench swarm``
                   generation compute (± a hostile peer)
``tree``           tree vs independent sampling at equal       ``swarmnode bench tree`` /
                   leaves: tokens, forwards, wall time         ``python -m swarmnode.benchmarks.tree``
``tree_learning``  tree vs chain held-out accuracy at equal    ``swarmnode bench tree-learning``
                   generated tokens
``gossip``         propagation latency and bytes per bundle    ``swarmnode bench gossip``
                   in an N-node loopback swarm
``verify``         verification throughput (bundles/s/core)    ``swarmnode bench verify``
=================  ==========================================  ============================================

Every module has ``main(argv=None)`` (or reads ``sys.argv``) and runs as ``python -m swarmnode.benchmarks.<name>``;
:func:`run_module` and :func:`load_module` are what the CLI uses. ``scripts/bench_*.py`` are one-line wrappers
kept for the commands recorded in docs/lab/benchmarks.md. Results go into docs/lab/benchmarks.md with their command.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from types import ModuleType
from typing import Sequence

#: benchmark names (``swarmnode bench <name>``, dashes for underscores) -> module names
MODULES = {"swarm": "swarm", "tree": "tree", "tree-learning": "tree_learning", "gossip": "gossip", "verify": "verify"}

__all__ = ["MODULES", "module_name", "load_module", "run_module"]


def module_name(name: str) -> str:
    """``"tree-learning"``, ``"tree_learning"`` or ``"bench_tree_learning"`` ->
    ``"swarmnode.benchmarks.tree_learning"``.

    Raises:
        ValueError: no such benchmark (the message lists them).
    """
    key = name.removeprefix("bench_").replace("_", "-")
    if key not in MODULES:
        raise ValueError(f"no benchmark {name!r}; benchmarks: {', '.join(MODULES)}")
    return f"swarmnode.benchmarks.{MODULES[key]}"


def load_module(name: str) -> ModuleType:
    """Import and return a benchmark's module (see :func:`module_name`)."""
    return importlib.import_module(module_name(name))


def run_module(name: str, args: Sequence[str]) -> int:
    """Run ``python -m swarmnode.benchmarks.<name> args...`` with this interpreter in a child process (its own
    process, so a benchmark's threads, signals and ``sys.argv`` are its own); returns the exit code."""
    return subprocess.call([sys.executable, "-m", module_name(name), *args])
