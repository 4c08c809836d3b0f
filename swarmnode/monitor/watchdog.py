"""Resilience of a long-running node: the stall watchdog, the memory watchdog, their knobs and exit codes.

Public RL-swarm reports are full of nodes stuck without a word and of processes the OS killed for memory.
Here neither happens silently:

* :class:`StallDetector` -- a round that makes no progress (no phase started or ended, no step finished) for
  ``stall_seconds`` is *stalled*. The detector names the phase it is stuck in (``sample``, ``score``,
  ``gossip``, ``verify``, ``train``, ``checkpoint``, ``evaluating`` or ``between phases``), the monitor logs it
  with the main thread's stack, and recovery is attempted: a stall in the swarm layer (``gossip``/``verify``)
  restarts the swarm's DHT through whatever hook the swarm offers (``recover``, ``restart`` or
  ``dht.restart``); any other stall is reported with what to do, and, if ``stall_exit_seconds`` is set, the
  node exits with :data:`EXIT_STALLED` once the stall lasts that long, so that a supervisor (systemd,
  docker ``--restart``, a shell loop) restarts it -- it resumes from its newest checkpoint.
* :class:`MemoryGuard` -- resident memory above the *soft* limit logs a warning (at most every
  ``warn_every`` seconds) that says what to lower; above the *hard* limit the node is asked to stop: it
  finishes the current step, checkpoints and exits with :data:`EXIT_MEMORY` before the OS's OOM killer
  would end it mid-write.

Knobs (:func:`knob`): each is read, first match wins, from the environment variable ``SWARMNODE_<NAME>``
(upper case), ``cfg.monitor.<name>``, ``cfg.<name>``, else the default in :data:`DEFAULTS`. That way a
config that gained the knobs and one that has not both work.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from swarmnode.config import MonitorConfig
from swarmnode.monitor.metrics import total_memory_bytes

EXIT_MEMORY = 3
"""Exit code of a node that stopped because its memory passed the hard limit (after checkpointing)."""
EXIT_STALLED = 4
"""Exit code of a node that stayed stalled for ``stall_exit_seconds`` (no checkpoint: the step never ended)."""

SWARM_PHASES = ("gossip", "verify")
"""Phases that belong to the swarm layer: a stall in one of them restarts the swarm's DHT."""

DEFAULTS: dict[str, Any] = {name: f.default for name, f in MonitorConfig.model_fields.items()}
"""Default of every monitor knob: the field defaults of :class:`swarmnode.config.MonitorConfig` (the one source;
``memory_limit_bytes=None``: 90% of the cgroup limit or physical RAM)."""

_CASTS: dict[str, Callable[[str], Any]] = {
    "status_host": str,
    "stall_seconds": float,
    "stall_exit_seconds": float,
    "memory_limit_bytes": lambda s: None if s.strip().lower() in ("", "none", "0") else int(float(s)),
    "memory_soft_fraction": float,
    "watchdog_interval": float,
    "no_signal_steps": int,
}


def knob(cfg: Any, name: str, default: Any = None, env: dict[str, str] | None = None) -> Any:
    """The value of monitor knob ``name``: env ``SWARMNODE_<NAME>`` > ``cfg.monitor.<name>`` > ``cfg.<name>`` > default.

    Args:
        cfg: the node's RunConfig (or anything with attributes; ``None`` skips the config).
        name: the knob, e.g. ``"stall_seconds"``.
        default: used when nothing sets it (``None``: :data:`DEFAULTS` ``[name]``).
        env: the environment to read (default ``os.environ``).

    Raises:
        ValueError: the environment variable is set but is not a valid value (the message names it).
    """
    env = os.environ if env is None else env
    var = "SWARMNODE_" + name.upper()
    if var in env:
        cast = _CASTS.get(name, str)
        try:
            return cast(env[var])
        except ValueError:
            raise ValueError(f"environment variable {var}={env[var]!r} is not a valid {name}") from None
    mon = getattr(cfg, "monitor", None) if cfg is not None else None
    for holder in (mon, cfg):
        if holder is not None and getattr(holder, name, None) is not None:
            return getattr(holder, name)
    return DEFAULTS.get(name) if default is None else default


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


# ------------------------------------------------------------------------------------------ stalls
@dataclass
class StallEvent:
    """What :meth:`StallDetector.check` reports when the state changes.

    Attributes:
        kind: ``"stalled"`` (a stall began), ``"recovered"`` (progress resumed) or ``"exit"`` (the stall
            lasted ``stall_exit_seconds``).
        phase: the phase the round was in when the stall began.
        seconds: how long the round had made no progress (s).
    """

    kind: str
    phase: str
    seconds: float


class StallDetector:
    """Decides from progress timestamps whether a node's round is stalled (no thread of its own).

    Args:
        stall_seconds: seconds without progress after which a round is stalled (> 0).
        stall_exit_seconds: seconds without progress after which the node should exit; 0 disables.

    Raises:
        ValueError: ``stall_seconds <= 0`` or ``stall_exit_seconds < 0``.
    """

    def __init__(self, stall_seconds: float, stall_exit_seconds: float = 0.0) -> None:
        if not stall_seconds > 0:
            raise ValueError(f"stall_seconds must be > 0 seconds, got {stall_seconds!r}")
        if not stall_exit_seconds >= 0:
            raise ValueError(f"stall_exit_seconds must be >= 0 (0 disables), got {stall_exit_seconds!r}")
        self.stall_seconds = float(stall_seconds)
        self.stall_exit_seconds = float(stall_exit_seconds)
        self.stalled = False
        self.phase: str | None = None
        self.since: float | None = None  # monotonic time of the last progress when the stall began
        self.count = 0
        self.last_cause: str | None = None
        self._exit_sent = False

    def check(self, last_progress: float, phase: str, now: float | None = None) -> StallEvent | None:
        """Update from the monotonic time of the last progress and the current phase; return a change or None."""
        now = time.monotonic() if now is None else now
        idle = max(0.0, now - last_progress)
        if idle >= self.stall_seconds:
            if not self.stalled:
                self.stalled, self.phase, self.since = True, phase, last_progress
                self.count += 1
                self.last_cause = f"no progress for {idle:.0f} s in phase {phase}"
                self._exit_sent = False
                return StallEvent("stalled", phase, idle)
            if self.stall_exit_seconds and idle >= self.stall_exit_seconds and not self._exit_sent:
                self._exit_sent = True
                return StallEvent("exit", self.phase or phase, idle)
            return None
        if self.stalled and (self.since is None or last_progress > self.since):
            stalled_for = max(0.0, last_progress - (self.since or last_progress))
            ev = StallEvent("recovered", self.phase or phase, stalled_for)
            self.stalled, self.phase, self.since = False, None, None
            return ev
        return None

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """JSON-ready state: ``stalled``, ``phase``, ``seconds`` (so far), ``threshold_s``, ``count``, ``last_cause``."""
        now = time.monotonic() if now is None else now
        return {
            "stalled": self.stalled,
            "phase": self.phase,
            "seconds": (now - self.since) if (self.stalled and self.since is not None) else 0.0,
            "threshold_s": self.stall_seconds,
            "exit_after_s": self.stall_exit_seconds or None,
            "count": self.count,
            "last_cause": self.last_cause,
        }


def stall_advice(phase: str, swarm_recovery: bool) -> str:
    """What a user should do about a stall in ``phase`` (one sentence, used in the log and the status)."""
    if phase in SWARM_PHASES:
        if swarm_recovery:
            return ("the swarm layer is being restarted (DHT and p2pd); training goes on solo meanwhile. If it recurs, "
                    "check the network (firewall, --initial-peers) and node.log for DHT errors")
        return "the swarm layer offers no restart hook; restart the node (it resumes from its newest checkpoint)"
    if phase == "evaluating":
        return ("held-out evaluation is slow or stuck: lower tasks.eval_size, or raise monitor.stall_seconds if it is "
                "legitimately this slow")
    if phase == "sample":
        return ("generation is slow or stuck: check GPU/CPU load (another process?), lower sampling.num_generations "
                "or max_completion_length, or raise monitor.stall_seconds if one step legitimately takes this long")
    if phase == "checkpoint":
        return "writing the checkpoint is slow or stuck: check free disk space and the disk of the run directory"
    return ("restart the node if it does not recover (it resumes from its newest checkpoint), or raise "
            "monitor.stall_seconds if one step legitimately takes this long")


# ------------------------------------------------------------------------------------------ memory
@dataclass
class MemoryEvent:
    """What :meth:`MemoryGuard.check` reports.

    Attributes:
        kind: ``"soft"`` (warn) or ``"hard"`` (checkpoint and exit).
        rss: resident set size in bytes.
        limit: the limit that was passed, in bytes.
        message: the log message, with what to do.
    """

    kind: str
    rss: int
    limit: int
    message: str


MEMORY_ADVICE = (
    "lower sampling.prompts_per_step, sampling.num_generations, sampling.max_completion_length or "
    "train.micro_batch_size, close other programs, or raise monitor.memory_limit_bytes "
    "(env SWARMNODE_MEMORY_LIMIT_BYTES)"
)


class MemoryGuard:
    """Compares resident memory with a soft and a hard limit (no thread of its own).

    Args:
        hard_limit: bytes; ``None`` uses 90% of :func:`~swarmnode.monitor.metrics.total_memory_bytes` (the
            cgroup limit or physical RAM); if that is unknown too, only an explicit limit is enforced.
        soft_fraction: the soft limit is ``soft_fraction * hard_limit`` (0 < f <= 1).
        warn_every: seconds between two soft-limit warnings.

    Raises:
        ValueError: ``hard_limit < 1`` or ``soft_fraction`` outside (0, 1].
    """

    def __init__(self, hard_limit: int | None = None, soft_fraction: float = 0.8, warn_every: float = 600.0) -> None:
        if hard_limit is not None and int(hard_limit) < 1:
            raise ValueError(f"memory hard limit must be >= 1 byte, got {hard_limit!r}")
        if not 0 < soft_fraction <= 1:
            raise ValueError(f"memory_soft_fraction must be in (0, 1], got {soft_fraction!r}")
        if hard_limit is None:
            total = total_memory_bytes()
            hard_limit = int(0.9 * total) if total else None
        self.hard_limit: int | None = None if hard_limit is None else int(hard_limit)
        self.soft_limit: int | None = None if self.hard_limit is None else int(soft_fraction * self.hard_limit)
        self.warn_every = float(warn_every)
        self.tripped = False
        self._last_warn = -float("inf")

    def check(self, rss: int, now: float | None = None) -> MemoryEvent | None:
        """Return a ``hard`` event once when ``rss`` passes the hard limit, ``soft`` events (rate-limited) above the soft one."""
        now = time.monotonic() if now is None else now
        if self.hard_limit is None or rss <= 0:
            return None
        if rss > self.hard_limit:
            if self.tripped:
                return None
            self.tripped = True
            return MemoryEvent(
                "hard", rss, self.hard_limit,
                f"resident memory {_fmt_bytes(rss)} is above the hard limit {_fmt_bytes(self.hard_limit)}: "
                f"finishing this step, checkpointing and exiting with code {EXIT_MEMORY} before the OS kills the "
                f"node. Run the same command to resume; to avoid it, {MEMORY_ADVICE}",
            )
        if self.soft_limit is not None and rss > self.soft_limit and now - self._last_warn >= self.warn_every:
            self._last_warn = now
            return MemoryEvent(
                "soft", rss, self.soft_limit,
                f"resident memory {_fmt_bytes(rss)} is above the soft limit {_fmt_bytes(self.soft_limit)} "
                f"(hard limit {_fmt_bytes(self.hard_limit)}: the node checkpoints and exits there). If it keeps "
                f"growing, {MEMORY_ADVICE}",
            )
        return None
