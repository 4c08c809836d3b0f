"""How many intra-op CPU threads torch uses, chosen for the machine and the model.

Why: torch's CPU kernels run on an OpenMP pool with one thread per core by default. On a small model every
operation is a few microseconds of work, so the pool's fork/join costs more than the split saves, and on a busy
machine (a volunteer's desktop, CI) one of the threads is often descheduled: every operation then waits a full
scheduler slice for the straggler while the other threads spin. Measured on 2 cores beside two busy processes
(docs/benchmarks.md), the embedded model's run was several times slower with the default two threads than with
one. So:

* below :data:`SMALL_MODEL_PARAMS` parameters the node uses **one** thread;
* above it torch's own default (one per available core) stays;
* ``threads`` in the config (``--threads``) overrides both;
* waiting OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, :func:`passive_openmp_wait`),
  which must be set before torch starts its pool: the CLI calls it before it imports torch.

GPU runs are not affected beyond the CPU-side work (tokenization, verifiers, the host side of the kernels).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

#: parameter count below which one intra-op thread is the default (the embedded model has 0.4M; a 0.5B model
#: is far above). Small models' operations are too short for intra-op parallelism to pay its synchronization.
SMALL_MODEL_PARAMS = 50_000_000


def passive_openmp_wait() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the environment already sets it.

    Only effective before the OpenMP runtime starts (before ``import torch`` in this process); children inherit
    it. An explicit ``OMP_WAIT_POLICY`` in the environment is left as it is."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def choose_threads(n_params: int, requested: int | None, cpus: int | None = None) -> tuple[int | None, str]:
    """The intra-op thread count to set, and why (one phrase for the log).

    Args:
        n_params: the model's parameter count.
        requested: the config's ``threads`` (``--threads``); ``None`` chooses by model size.
        cpus: the available CPUs (default :func:`available_cpus`).

    Returns:
        ``(threads, reason)``: ``threads`` is the count to pass to ``torch.set_num_threads``, or ``None`` to keep
        torch's default (a large model with no request).

    Raises:
        ValueError: ``requested`` below 1, or ``n_params`` negative.
    """
    if n_params < 0:
        raise ValueError(f"n_params must be >= 0, got {n_params}")
    cpus = available_cpus() if cpus is None else cpus
    if requested is not None:
        if requested < 1:
            raise ValueError(f"threads must be >= 1, got {requested}")
        return requested, f"threads: {requested} (set in the config or with --threads)"
    if n_params < SMALL_MODEL_PARAMS:
        return 1, (f"1 thread: a {n_params / 1e6:.1f}M-parameter model runs fastest on one thread, most of all on a "
                   f"busy machine (threads: N or --threads N overrides)")
    return None, f"torch's default ({cpus} available CPUs) for a {n_params / 1e6:.0f}M-parameter model"


def apply_threads(n_params: int, requested: int | None) -> int:
    """Choose (:func:`choose_threads`) and set torch's intra-op thread count; log the choice at INFO.

    Returns:
        the number of intra-op threads torch uses afterwards."""
    import torch

    n, reason = choose_threads(n_params, requested)
    if n is not None:
        torch.set_num_threads(n)
    used = torch.get_num_threads()
    log.info("CPU threads: %d (%s; OMP_WAIT_POLICY=%s)", used, reason, os.environ.get("OMP_WAIT_POLICY", "unset"))
    return used
