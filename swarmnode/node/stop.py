"""Stop control of the node: signal handling, watched swarm calls, and the swarm-stall flag.

A first SIGINT/SIGTERM (or the memory guard, via :meth:`StopControl.request_stop`) asks the round to finish,
checkpoint and leave; a repeated signal forces the stop (:meth:`StopControl.install_signal_handlers`). Swarm
calls that may hang on the network run as watched calls (:meth:`StopControl._watched`): the round loop waits for
them, restarts a stalled swarm layer when the monitor flags it, and leaves a call behind once a stop is under
way, so a hung call cannot hold the stop past a supervisor's grace.

:class:`StopControl` is a part of :class:`~swarmnode.node.Node`: it reads the node's ``cfg``, ``monitor``,
``swarm`` and ``stop_requested``/``forced_by`` attributes, which the node sets up.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any, Callable, TypeVar

from swarmnode.monitor.runtime import WATCHED_CALL_THREAD

log = logging.getLogger("swarmnode.node")

_T = TypeVar("_T")

#: Flags on a signal number in the signal pipe (:meth:`StopControl.install_signal_handlers`): a signal while
#: stopping that was ignored, and the one that forced the stop.
_SIGNAL_REPEATED, _SIGNAL_FORCED = 0x40, 0x80


class StopControl:
    """Signals, watched calls and the stall flag of the node's round loop (module docstring)."""

    stop_requested: bool
    forced_by: int | None
    _signals_while_stopping: int
    _signal_pipe: tuple[int, int] | None
    _signal_thread: threading.Thread | None

    def request_stop(self, reason: str) -> None:
        """Finish the current step, checkpoint and leave :meth:`run` (signals and the memory watchdog call this)."""
        if not self.stop_requested:
            log.info("stop requested: %s", reason)
        self.stop_requested = True

    def recover_swarm(self, reason: str) -> bool:
        """Restart the swarm layer's DHT (``SwarmHook.recover``) after a stall; whether a swarm was there to restart.

        Logs the outcome; a failing restart is logged (with what to do) and never raises."""
        if self.swarm is None:
            return False
        try:
            self.swarm.recover(reason)
            log.warning("swarm layer restarted after a stall (%s)", reason)
        except Exception as e:  # noqa: BLE001 - a failed restart must not end the round
            log.error("restarting the swarm layer failed: %s: %s -- restart the node (it resumes from its newest "
                      "checkpoint)", type(e).__name__, e)
        return True

    def _act_on_stall_flag(self) -> None:
        """Take the monitor's swarm-recovery flag and, when it is up, restart the swarm layer (the monitor only
        observes and flags; the round loop acts). A stopping node restarts nothing: it is about to close it."""
        reason = self.monitor.take_swarm_recovery()
        if reason is not None and not self.stop_requested:
            self.recover_swarm(reason)

    def _watched(self, call: Callable[[], _T], name: str, on_stop: Callable[[], _T]) -> _T:
        """Run ``call`` on a helper thread (:data:`~swarmnode.monitor.runtime.WATCHED_CALL_THREAD`) while the
        round loop waits for it and, every ``watchdog_interval`` seconds, acts on the monitor's swarm-recovery
        flag: a stalled swarm call is what blocks the round, so the loop restarts the swarm layer while it waits.

        Once a stop is requested it waits at most ``swarm.net.stop_wait_seconds`` more (seconds, counted from when it
        sees the stop), then leaves the call behind (logged, naming ``name``) and returns ``on_stop()``, so the
        step ends and the node checkpoints and exits however long the call hangs (e.g. on a DHT restart).

        Returns ``call()``'s value; re-raises its exception. The helper is a daemon thread: a call left behind,
        or a signal that forces the stop (``KeyboardInterrupt`` here), does not keep the process alive."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["value"] = call()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting loop
                box["error"] = e
            finally:
                done.set()

        threading.Thread(target=target, name=WATCHED_CALL_THREAD, daemon=True).start()
        bound = float(self.cfg.swarm.net.stop_wait_seconds)
        give_up_at: float | None = None  # monotonic seconds; set once the stop is seen
        while True:
            wait = self.monitor.interval
            if self.stop_requested:
                now = time.monotonic()
                if give_up_at is None:
                    give_up_at = now + bound
                if now >= give_up_at:
                    log.warning("stopping: the swarm call %s did not return within swarm.net.stop_wait_seconds=%g s; "
                                "leaving it behind to checkpoint and exit", name, bound)
                    return on_stop()
                wait = min(wait, give_up_at - now)
            if done.wait(wait):
                break
            self._act_on_stall_flag()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def install_signal_handlers(self) -> None:
        """First SIGINT/SIGTERM: finish the current step, checkpoint, exit (a graceful stop).

        While the node is stopping (after a signal or the memory guard), a SIGTERM is logged and ignored:
        supervisors and users repeat SIGTERM, and the stop they asked for is already under way. A SIGINT
        (Ctrl-C again), or a third signal, forces the stop: ``KeyboardInterrupt`` is raised where the main thread
        is, :attr:`forced_by` is set to the signal number, and :meth:`run` leaves without its final checkpoint
        (the previous one is kept); :meth:`close` records it in the monitor (``exit_code`` 128 + the signal
        number, as for a process killed by it, and an ``exit_reason`` naming the last checkpoint), so that
        nothing claims a clean checkpoint.

        The handler takes no lock: CPython runs it on the main thread between two bytecodes, possibly while that
        thread holds a non-reentrant lock (the status tracker's, inside any status update). Logging from it went
        through the monitor's warning collector into that same lock and deadlocked the node for good (no step,
        no checkpoint, the monitor's watchdog stuck behind it too). So it only sets :attr:`stop_requested` (and
        :attr:`forced_by` before it raises ``KeyboardInterrupt``) and writes the signal number into a pipe; the
        ``swarmnode-signals`` thread logs the announcement. Idempotent."""
        if self._signal_pipe is not None:
            return
        r, w = os.pipe()
        os.set_blocking(w, False)  # the handler must never block on it
        self._signal_pipe = (r, w)

        def announce() -> None:  # the one reader of the pipe; 0 ends it (close)
            try:
                while True:
                    data = os.read(r, 1)
                    if not data or data[0] == 0:
                        return
                    flag = data[0] & (_SIGNAL_REPEATED | _SIGNAL_FORCED)
                    signum = data[0] ^ flag
                    if flag == _SIGNAL_FORCED:
                        log.error("signal %d received while stopping: stopping at once, without the final "
                                  "checkpoint (the previous checkpoint is kept)", signum)
                    elif flag == _SIGNAL_REPEATED:
                        log.warning("signal %d received while stopping: ignored, the node is already checkpointing "
                                    "after this step and exiting (Ctrl-C or one more signal stops it at once, "
                                    "without that checkpoint)", signum)
                    else:
                        log.warning("signal %d received: checkpointing after this step, then exiting (Ctrl-C "
                                    "again, or a third signal, stops at once without that checkpoint)", signum)
            except OSError:
                return
            finally:
                os.close(r)

        self._signal_thread = threading.Thread(target=announce, name="swarmnode-signals", daemon=True)
        self._signal_thread.start()

        def announce_from_handler(code: int) -> None:
            pipe = self._signal_pipe  # None after close(): nothing to announce to
            if pipe is not None:
                try:
                    os.write(pipe[1], bytes([code]))
                except OSError:  # pipe full: the stop itself is requested all the same
                    pass

        def handler(signum, frame):  # noqa: ARG001 - no lock, no logging, no allocation-heavy work here
            if self.stop_requested:  # already stopping (a signal before, or the memory guard)
                self._signals_while_stopping += 1
                if signum == signal.SIGINT or self._signals_while_stopping >= 2:
                    self.forced_by = signum
                    announce_from_handler(_SIGNAL_FORCED | signum)
                    raise KeyboardInterrupt
                announce_from_handler(_SIGNAL_REPEATED | signum)
                return
            self.stop_requested = True
            announce_from_handler(signum)

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def _close_signal_pipe(self) -> None:
        """End the ``swarmnode-signals`` thread after it logged what is pending (bounded), and close the pipe."""
        pipe, self._signal_pipe = self._signal_pipe, None
        if pipe is None:
            return
        w = pipe[1]
        try:
            os.write(w, b"\0")
        except OSError:
            pass
        if self._signal_thread is not None:
            self._signal_thread.join(timeout=5.0)
        os.close(w)
