#!/usr/bin/env python
"""Wrapper kept for recorded commands: the benchmark is the module ``swarmnode.benchmarks.tree_learning``
(``swarmnode bench tree-learning``, or ``python -m swarmnode.benchmarks.tree_learning``)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("swarmnode.benchmarks.tree_learning", run_name="__main__", alter_sys=True)
