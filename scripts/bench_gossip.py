#!/usr/bin/env python
"""Wrapper kept for recorded commands: the benchmark is the module ``swarmnode.benchmarks.gossip``
(``swarmnode bench gossip``, or ``python -m swarmnode.benchmarks.gossip``)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("swarmnode.benchmarks.gossip", run_name="__main__", alter_sys=True)
