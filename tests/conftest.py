"""Test-suite setup shared by every test module.

One intra-op thread per process, and sleeping (not spinning) OpenMP waits: the suite runs many processes at
once (nodes, swarms, p2pd) on small CI machines, where torch's default of one spinning thread per core makes
every process wait on descheduled threads (docs/lab/benchmarks.md, "Threads on a busy machine"). Set here, at
import, before any test module imports torch; the child processes the tests start inherit the environment.
A value already in the environment is kept.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_configure(config) -> None:  # noqa: ARG001 - pytest hook signature
    """Pin torch to the thread count above in this process (torch may already be imported by a plugin)."""
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
