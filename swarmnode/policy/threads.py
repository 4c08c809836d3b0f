"""How many intra-op CPU threads torch uses, and how they wait: chosen for the machine.

Why: torch's CPU kernels run on an OpenMP pool. With the OpenMP runtime's default wait policy its threads spin
for a while after every parallel region; on a busy machine (a volunteer's desktop, CI) those spinning threads
compete with the process's own main thread and with everything else, and a run of the embedded model took 42-71 s
a step beside two busy processes instead of 1-2 s (docs/lab/benchmarks.md, "Threads on a busy machine"). So:

* waiting OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, :func:`passive_openmp_wait`),
  which must be set before torch starts its pool: the CLI calls it before it imports torch; an
  ``OMP_WAIT_POLICY`` already in the environment is kept;
* the intra-op thread count is torch's default (one per physical core), capped at the CPUs this process may use
  (its affinity mask and its cgroup's CPU quota, :func:`available_cpus`: a container limited to 2 CPUs on a
  64-core host gets 2 threads, not 32), or ``OMP_NUM_THREADS`` when the environment sets it;
* ``threads`` in the config (``--threads``) overrides both.

One thread was tried as the default for small models and measured slower beside busy processes than two
sleeping threads (docs/lab/benchmarks.md); ``--threads 1`` is the way to leave the other cores alone.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
"""cgroup v2 CPU quota of this process's cgroup: ``"<quota> <period>"`` in microseconds, or ``"max <period>"``."""


def passive_openmp_wait() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the environment already sets it.

    Only effective before the OpenMP runtime starts (before ``import torch`` in this process); children inherit
    it."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def cgroup_cpu_limit(path: Path = CGROUP_CPU_MAX) -> int | None:
    """CPUs allowed by the cgroup v2 quota in ``path`` (rounded up), or None without a quota or a readable file."""
    try:
        quota, period = path.read_text().split()[:2]
        if quota == "max":
            return None
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask (``os.cpu_count()`` where there is none), capped by the
    cgroup v2 CPU quota (:func:`cgroup_cpu_limit`); at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        n = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return max(1, min(n, limit) if limit is not None else n)


def choose_threads(requested: int | None, torch_default: int, cpus: int | None = None,
                   env: dict[str, str] | None = None) -> tuple[int, str]:
    """The intra-op thread count to set, and why (one phrase for the log).

    Args:
        requested: the config's ``threads`` (``--threads``); ``None`` chooses.
        torch_default: torch's own count (``torch.get_num_threads()`` before anything set it).
        cpus: the available CPUs (default :func:`available_cpus`).
        env: the environment (default ``os.environ``): an ``OMP_NUM_THREADS`` there is kept.

    Returns:
        ``(threads, reason)``.

    Raises:
        ValueError: ``requested`` below 1.
    """
    env = os.environ if env is None else env
    if requested is not None:
        if requested < 1:
            raise ValueError(f"threads must be >= 1, got {requested}")
        return requested, "set by threads / --threads"
    if env.get("OMP_NUM_THREADS", "").strip().isdigit() and int(env["OMP_NUM_THREADS"]) >= 1:
        return int(env["OMP_NUM_THREADS"]), "OMP_NUM_THREADS in the environment"
    cpus = available_cpus() if cpus is None else cpus
    n = max(1, min(torch_default, cpus))
    return n, f"torch's default {torch_default}, capped at the {cpus} CPU(s) available to this process"


def apply_threads(requested: int | None) -> int:
    """Choose (:func:`choose_threads`) and set torch's intra-op thread count; log the choice at INFO.

    Returns:
        the number of intra-op threads torch uses afterwards."""
    import torch

    n, reason = choose_threads(requested, torch.get_num_threads())
    torch.set_num_threads(n)
    used = torch.get_num_threads()
    log.info("CPU threads: %d (%s; OMP_WAIT_POLICY=%s; --threads N overrides)", used, reason,
             os.environ.get("OMP_WAIT_POLICY", "unset"))
    return used
