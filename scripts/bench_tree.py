#!/usr/bin/env python
"""Wrapper kept for recorded commands: the benchmark is the module ``swarmnode.benchmarks.tree``
(``swarmnode bench tree``, or ``python -m swarmnode.benchmarks.tree``)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("swarmnode.benchmarks.tree", run_name="__main__", alter_sys=True)
