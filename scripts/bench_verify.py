#!/usr/bin/env python
"""Wrapper kept for recorded commands: the benchmark is the module ``swarmnode.benchmarks.verify``
(``swarmnode bench verify``, or ``python -m swarmnode.benchmarks.verify``)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("swarmnode.benchmarks.verify", run_name="__main__", alter_sys=True)
