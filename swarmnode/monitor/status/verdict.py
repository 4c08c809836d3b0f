"""What ``swarmnode status`` concludes about a node from its status document (:func:`assess_status` ->
:class:`Verdict`): live, stalled, stopped, dead (its process is gone) or unreachable, with the exit code.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmnode.monitor.status.document import _num

__all__ = ["EXIT_OK", "EXIT_STALLED", "EXIT_UNREACHABLE", "Verdict", "assess_status", "is_stalled", "process_alive"]

EXIT_OK, EXIT_STALLED, EXIT_UNREACHABLE = 0, 1, 2
"""Exit codes of ``swarmnode status``: live; stalled; unreachable / not running (stopped, dead, no status)."""


@dataclass
class Verdict:
    """What ``swarmnode status`` concludes about a node.

    Attributes:
        kind: ``live``, ``stalled``, ``stopped``, ``dead`` (the process is gone without stopping) or
            ``unreachable`` (no answer / no status document).
        reason: one sentence with the cause and what to do.
        exit_code: :data:`EXIT_OK`, :data:`EXIT_STALLED` or :data:`EXIT_UNREACHABLE`.
    """

    kind: str
    reason: str
    exit_code: int

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK


def process_alive(pid: Any, started_at: Any = None) -> bool | None:
    """Whether process ``pid`` runs (and, when ``started_at`` is given, is the same process: its start time
    matches within 1 s). ``None`` when it cannot be told (no psutil, bad pid)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    try:
        import psutil

        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        if _num(started_at) is not None and abs(p.create_time() - float(started_at)) > 1.0:
            return False  # the pid was reused by another process
        return True
    except ImportError:  # pragma: no cover
        return None
    except Exception:  # noqa: BLE001 - NoSuchProcess, AccessDenied...
        return False


def _log_of(node: dict) -> str:
    """The log a dead node left: ``node.log`` in its run dir, else ``stdout.log`` there (a ``swarmnode bench swarm``
    node writes only that one), else a generic hint when neither exists or the run dir is unknown."""
    rd = node.get("run_dir")
    if isinstance(rd, str) and rd:
        for name in ("node.log", "stdout.log"):
            if (Path(rd) / name).is_file():
                return str(Path(rd) / name)
    return "node.log in the run directory"


def assess_status(status: dict[str, Any], stall_seconds: float | None = None, now: float | None = None,
                  check_pid: bool = True) -> Verdict:
    """Tell a live node from a stalled, stopped or dead one, from its status document.

    Args:
        status: the document (from ``status.json`` or ``/status``).
        stall_seconds: a document not updated for longer than this is stalled (default: the node's own
            ``stall.threshold_s``, else 600 s).
        now: unix time (default ``time.time()``).
        check_pid: when the document comes from this host, check that its process still runs (a node killed
            with ``kill -9`` leaves a ``status.json`` that claims it is training).
    """
    now = time.time() if now is None else now
    state = status.get("state")
    step = status.get("step")
    ck = (status.get("checkpoint") or {}).get("step")
    resume = (f"run the same command to resume from checkpoint step {ck}" if ck is not None
              else "run the same command to start again (no checkpoint yet)")
    if state == "stopped":
        ex = status.get("exit") or {}
        why = ex.get("reason") or "stopped"
        code = ex.get("code")
        if why == "finished":
            resume = f"to train further, run the same command with a larger --steps (it resumes from step {ck})"
        return Verdict("stopped", f"stopped at step {step}: {why}" + (f" (exit code {code})" if code else "")
                       + f"; {resume}", EXIT_UNREACHABLE)
    node = status.get("node") or {}
    if check_pid and node.get("hostname") == socket.gethostname():
        alive = process_alive(node.get("pid"), node.get("pid_started_at"))
        if alive is False:
            return Verdict("dead", f"not running: process {node.get('pid')} is gone (killed or crashed) while "
                                   f"{state} at step {step}; see {_log_of(node)}; {resume}",
                           EXIT_UNREACHABLE)
    stall = status.get("stall") or {}
    threshold = stall_seconds if stall_seconds is not None else (_num(stall.get("threshold_s")) or 600.0)
    if stall.get("stalled"):
        return Verdict("stalled", f"stalled: {stall.get('last_cause') or 'no progress'}"
                                  + (f" -- {stall['advice']}" if stall.get("advice") else ""), EXIT_STALLED)
    updated = _num(status.get("updated_at"))
    if updated is None:
        return Verdict("stalled", "the status document has no updated_at time", EXIT_STALLED)
    if now - updated > threshold:
        return Verdict("stalled", f"stalled: the status was last updated {now - updated:.0f} s ago (> {threshold:g} s); "
                                  "the process may be frozen (suspended, swapping, or stuck in native code)",
                       EXIT_STALLED)
    progress = _num(status.get("progress_at"))
    if progress is not None and state == "training" and now - progress > threshold:
        return Verdict("stalled", f"stalled: no progress for {now - progress:.0f} s (> {threshold:g} s) in phase "
                                  f"{status.get('phase') or '?'}", EXIT_STALLED)
    return Verdict("live", f"{state} at step {step}", EXIT_OK)


def is_stalled(status: dict[str, Any], stall_seconds: float, now: float | None = None) -> bool:
    """True when the node's document says it is stalled or was not updated for ``stall_seconds`` seconds."""
    return assess_status(status, stall_seconds, now=now, check_pid=False).kind == "stalled"
