"""The monitor a running node carries: status document, status server, stall and memory watchdogs.

:class:`NodeMonitor` is created by ``Node`` (``node.monitor``) and started by ``Node.run`` (or earlier by the
CLI, so that a node evaluating before training is already visible). It

* keeps the status document (:class:`~swarmnode.monitor.status.StatusTracker`) and the Prometheus metrics
  (:class:`~swarmnode.monitor.status.NodeMetrics`) up to date from each step's metrics record;
* writes ``<run_dir>/status.json`` after every step and every ``watchdog_interval`` seconds;
* serves ``/status``, ``/metrics`` and ``/healthz`` when ``status_port`` is set (on ``status_host``,
  127.0.0.1 by default; 0 picks a free port, the URL is in ``status.json``);
* runs one daemon thread, the watchdog, every ``watchdog_interval`` seconds: the stall detector (a round
  with no progress for ``stall_seconds`` is logged with its phase and the stacks of the main thread and of a
  watched swarm call, the status says ``stalled``, a swarm-layer stall raises the swarm-recovery flag, and with
  ``stall_exit_seconds`` set the node exits with code 4 for a supervisor to restart it) and the memory guard
  (above the soft limit: a warning; above the hard limit: the monitor calls ``node.request_stop``, so the node
  finishes the step, checkpoints and the CLI exits with code 3).

Monitoring reads. The watchdog observes and flags; it never drives the swarm layer. A stall in a swarm phase
sets a flag that the node's round loop takes (:meth:`NodeMonitor.take_swarm_recovery`) while it waits on a
watched swarm call (``node/stop.py``), and acts on through the swarm layer's declared ``recover``. The one action the
monitor takes on the node itself is :meth:`MonitoredNode.request_stop` (the round loop stops after its step).

Knobs come from :func:`swarmnode.monitor.watchdog.knob` (env ``SWARMNODE_<NAME>``, ``cfg.monitor.<name>``,
``cfg.<name>``, defaults); constructor arguments win over all of them.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol, runtime_checkable

from swarmnode.monitor.metrics import PhaseTimer, gpu_memory, node_memory_bytes
from swarmnode.monitor.reporters import Reporters
from swarmnode.monitor.status import NodeMetrics, StatusServer, StatusTracker, SwarmProbe, write_status_file
from swarmnode.monitor.watchdog import (
    EXIT_MEMORY,
    EXIT_STALLED,
    MEMORY_ADVICE,
    SWARM_PHASES,
    MemoryGuard,
    StallDetector,
    _fmt_bytes as fmt_bytes,
    knob,
    stall_advice,
)

if TYPE_CHECKING:
    from swarmnode.config import RunConfig

log = logging.getLogger("swarmnode.monitor")

_UNSET: Any = object()


WATCHED_CALL_THREAD = "swarmnode-swarm-call"
"""Name of the thread a node runs a watched swarm call on (``node/stop.py``); a stall log shows its stack too."""


@runtime_checkable
class MonitoredNode(Protocol):
    """What :class:`NodeMonitor` reads of a node and the one method it calls (``swarmnode.node.Node`` implements
    it). The monitor exists before the node has loaded its model (the status says ``starting`` first), so it reads
    ``policy`` (its ``tokenizer_id``), ``base_model_id``, ``resumed_from`` and ``tokens_generated`` only once they
    exist, when :meth:`NodeMonitor.start` runs; it never writes any of them.
    """

    cfg: RunConfig
    """The node's configuration: ``steps``, ``status_port``, ``checkpoint.save_steps``, ``swarm.swarm_id`` and
    the knobs :func:`~swarmnode.monitor.watchdog.knob` reads."""
    run_dir: Path
    """The run directory (``status.json`` goes there)."""
    step: int
    """Optimizer steps done."""
    timer: PhaseTimer
    """The phase timer of the round (the stall detector's progress clock)."""
    swarm: SwarmProbe | None
    """The swarm layer, or None (solo)."""
    stop_requested: bool
    """Whether the round loop stops after this step."""

    def request_stop(self, reason: str) -> None:
        """Finish the current step, checkpoint and leave the round loop."""


class _WarningCollector(logging.Handler):
    """Copies WARNING+ records (after rate limiting) into the status document for the dashboard."""

    def __init__(self, tracker: StatusTracker) -> None:
        super().__init__(logging.WARNING)
        self.tracker = tracker
        from swarmnode.monitor.logs import rate_limit_filter

        self.addFilter(rate_limit_filter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.tracker.add_warning(record.levelname, f"{record.name}: {record.getMessage()}")
        except Exception:  # noqa: BLE001 - pragma: no cover
            pass


class NodeMonitor:
    """Status, metrics endpoint and watchdogs of one node (see the module docstring).

    Args:
        node: the ``swarmnode.node.Node`` (a :class:`MonitoredNode`; attributes that do not exist yet are read later).
        status_port: TCP port of the status server (None: off; 0: a free one); default ``cfg.status_port``.
        status_host / stall_seconds / stall_exit_seconds / memory_limit_bytes / memory_soft_fraction /
            watchdog_interval: override the knobs.
        write_file: write ``status.json`` into the run directory.

    Attributes:
        exit_code: 0, or :data:`~swarmnode.monitor.watchdog.EXIT_MEMORY` after the memory guard stopped the
            node (the CLI exits with it).
        exit_reason: one sentence, or None.
    """

    def __init__(
        self,
        node: MonitoredNode,
        *,
        status_port: int | None = _UNSET,
        status_host: str | None = None,
        stall_seconds: float | None = None,
        stall_exit_seconds: float | None = None,
        memory_limit_bytes: int | None = None,
        memory_soft_fraction: float | None = None,
        watchdog_interval: float | None = None,
        write_file: bool = True,
    ) -> None:
        cfg = node.cfg
        self.node = node
        self.run_dir = node.run_dir
        self.status_port = cfg.status_port if status_port is _UNSET else status_port
        self.status_host = status_host or knob(cfg, "status_host")
        self.interval = float(watchdog_interval or knob(cfg, "watchdog_interval"))
        if not self.interval > 0:
            raise ValueError(f"watchdog_interval must be > 0 seconds, got {self.interval!r}")
        self.stall = StallDetector(
            float(stall_seconds if stall_seconds is not None else knob(cfg, "stall_seconds")),
            float(stall_exit_seconds if stall_exit_seconds is not None else knob(cfg, "stall_exit_seconds")),
        )
        self.memory = MemoryGuard(
            memory_limit_bytes if memory_limit_bytes is not None else knob(cfg, "memory_limit_bytes"),
            float(memory_soft_fraction if memory_soft_fraction is not None else knob(cfg, "memory_soft_fraction")),
        )
        self.write_file = write_file
        sinks = list(getattr(cfg, "report_to", None) or [])  # TensorBoard / W&B (monitor/reporters.py)
        self.reporters = Reporters(sinks, self.run_dir, cfg.model_dump(mode="json") if sinks else None)
        self.no_signal_steps = int(knob(cfg, "no_signal_steps"))
        self._no_signal: list[tuple[float, float]] = []  # (reward, format) of the current run of signal-less steps
        self.tracker = StatusTracker(self.run_dir, steps_total=cfg.steps,
                                     save_steps=cfg.checkpoint.save_steps)
        self.tracker.update(lambda d: d["memory"].update(
            {"soft_limit_bytes": self.memory.soft_limit, "hard_limit_bytes": self.memory.hard_limit}))
        self.metrics = NodeMetrics()
        self.server: StatusServer | None = None
        self.exit_code = 0
        self.exit_reason: str | None = None
        self.activity_name: str | None = None
        self.activity_since: float | None = None  # time.monotonic() when the activity began
        self.base_state = "starting"  # starting -> training (in Node.run's loop) -> stopping (after it)
        self.last_progress = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._collector: _WarningCollector | None = None
        self._started = False
        self._closed = False
        self._recovery: str | None = None  # the swarm-recovery flag: why, or None (set by the watchdog)
        self._flag_lock = threading.Lock()
        self._file_lock = threading.Lock()
        self._prev_excepthook: Any = None
        self._crash_hook: Any = None
        self._refresh_state()
        self.publish()

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start the status server (when a port is configured) and the watchdog thread. Idempotent.

        Raises:
            OSError: the status port cannot be bound (the message names host and port).
        """
        if self._started or self._closed:
            return
        self._started = True
        node = self.node
        pol = getattr(node, "policy", None)
        self.tracker.update(lambda d: d["node"].update(
            {"model_id": getattr(node, "base_model_id", None), "tokenizer_id": getattr(pol, "tokenizer_id", None)}))
        resumed = getattr(node, "resumed_from", None)
        self.tracker.update(lambda d: d["checkpoint"].update({"resumed_from": str(resumed) if resumed else None}))
        self.tracker.set(step=int(node.step), policy_version=int(node.step))
        self.tracker.update(lambda d: d["throughput"].update({"tokens_total": int(getattr(node, "tokens_generated", 0))}))
        self.tracker.note_checkpoint()
        if self.status_port is not None:
            self.server = StatusServer(self.status, self.metrics, host=self.status_host, port=int(self.status_port))
            if self.status_host not in ("127.0.0.1", "localhost", "::1"):
                log.warning("status endpoint %s is reachable from the network (status_host=%s); bind 127.0.0.1 "
                            "unless you mean to expose it", self.server.url, self.status_host)
            self.tracker.update(lambda d: d["node"].update({"url": self.server.url if self.server else None}))
            log.info("status endpoint: %s/status  metrics: %s/metrics", self.server.url, self.server.url)
        self._collector = _WarningCollector(self.tracker)
        logging.getLogger().addHandler(self._collector)
        self._install_crash_hook()
        if "hivemind" in sys.modules:
            from swarmnode.monitor.logs import quiet_third_party

            quiet_third_party()
        self.metrics.set_info(model_id=getattr(node, "base_model_id", None),
                              swarm_id=node.cfg.swarm.swarm_id,
                              run_dir=str(self.run_dir))
        log.info("node pid %d: run dir %s, model %s, step %d of %d; status file %s; stall after %g s; memory limit %s",
                 os.getpid(), self.run_dir, getattr(node, "base_model_id", None), int(node.step),
                 int(node.cfg.steps), os.path.join(str(self.run_dir), "status.json"),
                 self.stall.stall_seconds, self.memory.hard_limit)
        self.mark_progress()
        self._thread = threading.Thread(target=self._loop, name="swarmnode-watchdog", daemon=True)
        self._thread.start()
        self.publish()

    def close(self, reason: str | None = None) -> None:
        """Mark the node stopped (with ``reason`` or the exit reason), write the status, stop thread and server."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self.reporters.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval + 5)
        if self._started:
            try:  # a stall that ended since the last tick is logged as recovered
                self._check_stall()
            except Exception:  # noqa: BLE001 - pragma: no cover
                log.debug("final stall check failed", exc_info=True)
        why = reason or self.exit_reason or (
            "stopped by a signal after checkpointing" if self.node.stop_requested
            else "finished" if self.node.step >= self.node.cfg.steps else "closed")
        self.tracker.set(state="stopped", exit={"code": self.exit_code, "reason": why})
        self.tracker.update(lambda d: d["swarm"].update(  # a stopped node is connected to nobody
            {"connected": False, "peers": 0, "dht_alive": False,
             "reason": "stopped: the node is not running" if d["swarm"].get("enabled") else d["swarm"]["reason"]}))
        self.tracker.note_checkpoint()
        self.publish()
        if self.server is not None:
            self.server.close()
        if self._collector is not None:
            logging.getLogger().removeHandler(self._collector)
        if self._prev_excepthook is not None and sys.excepthook is self._crash_hook:
            sys.excepthook = self._prev_excepthook

    def _install_crash_hook(self) -> None:
        """Chain ``sys.excepthook``: an uncaught exception is logged (with its traceback, into node.log) and the
        status says ``stopped`` with the cause before the process dies."""
        prev = sys.excepthook

        def hook(tp, val, tb):  # noqa: ANN001 - the sys.excepthook signature
            # Only the main thread's uncaught exception is a crash of the node. Helper threads (multiprocessing's
            # resource sharer, hivemind's pipes) can raise ConnectionResetError/BrokenPipeError while the DHT child
            # goes down with the process group on SIGTERM; the round loop is unaffected, so log, do not fail the run.
            off_main = threading.current_thread() is not threading.main_thread()
            shutting_down = self.node.stop_requested and issubclass(tp, (OSError, EOFError))
            if off_main or shutting_down:
                log.warning("ignored %s in %s: %s", tp.__name__, threading.current_thread().name, val)
                return
            if not self._closed and not issubclass(tp, KeyboardInterrupt):
                try:
                    ck = self.tracker.document()["checkpoint"].get("step")
                    log.critical("node crashed at step %s: %s: %s -- run the same command to resume from checkpoint "
                                 "step %s; if it recurs, report it with node.log", self.node.step,
                                 tp.__name__, val, ck, exc_info=(tp, val, tb))
                    self.exit_code = self.exit_code or 1
                    self.tracker.set(state="stopped", exit={"code": 1, "reason": f"crashed: {tp.__name__}: {val} "
                                                                                 "(traceback in node.log)"})
                    self._closed = True  # the watchdog thread must not overwrite this
                    self._stop.set()
                    self.publish()
                except Exception:  # noqa: BLE001 - never hide the original exception
                    pass
            prev(tp, val, tb)

        self._prev_excepthook, self._crash_hook = prev, hook
        sys.excepthook = hook

    # -------------------------------------------------------------- progress and state
    def mark_progress(self) -> None:
        """Record progress now (a step ended, an evaluation started or ended)."""
        self.last_progress = time.monotonic()

    def _last_progress(self) -> float:
        return max(self.last_progress, self.node.timer.last_change)

    def current_phase(self) -> str:
        """The phase the node is in: a timed phase of the step, ``evaluating``, or ``between phases (after X)``."""
        timer = self.node.timer
        cur = timer.current
        if cur:
            return cur
        if self.activity_name:
            return self.activity_name
        last = timer.last_phase
        return f"between phases (after {last})" if last else "between phases"

    def _refresh_state(self) -> None:
        node = self.node
        if self._closed:
            return
        if self.activity_name:
            state = self.activity_name
        elif node.stop_requested:
            state = "stopping"
        else:
            state = self.base_state
        timer = node.timer
        phase = timer.current or self.activity_name
        since = timer.current_since if timer.current else (self.activity_since if self.activity_name else None)
        now_m = time.monotonic()
        self.tracker.set(state=state, phase=phase, phase_seconds=(now_m - since) if since is not None else 0.0,
                         progress_at=time.time() - max(0.0, now_m - self._last_progress()))

    @contextmanager
    def activity(self, name: str) -> Iterator[None]:
        """Mark a long activity outside the step phases (``evaluating``) for the status and the stall watchdog."""
        prev, prev_since = self.activity_name, self.activity_since
        self.activity_name, self.activity_since = name, time.monotonic()
        self.mark_progress()
        self._refresh_state()
        self.publish()
        try:
            yield
        finally:
            self.activity_name, self.activity_since = prev, prev_since
            self.tracker.update(lambda d: d.update({"evaluation": None}))
            self.mark_progress()
            self._refresh_state()

    def eval_progress(self, done: int, total: int, held_out: int | None = None) -> None:
        """An evaluation decoded ``done`` of ``total`` questions (``held_out`` of them held-out questions, the rest
        generalization probes): progress for the stall watchdog, and ``evaluation {done, total, held_out, eta_s}``
        in the status (the ETA extrapolates the time per question so far; None before the first batch)."""
        self.mark_progress()
        elapsed = time.monotonic() - (self.activity_since or time.monotonic())
        eta = elapsed / done * (total - done) if done > 0 else None
        ev = {"done": int(done), "total": int(total), "eta_s": eta}
        if held_out is not None:
            ev["held_out"] = int(held_out)
        self.tracker.update(lambda d: d.update({"evaluation": ev}))
        self._refresh_state()

    def begin_training(self) -> None:
        """Called by ``Node.run`` before its loop: starts the monitor if needed; state ``training``."""
        self.start()
        self.base_state = "training"
        self.mark_progress()
        self._refresh_state()
        self.publish()

    def end_training(self) -> None:
        """Called by ``Node.run`` after its loop (and its final checkpoint): state ``stopping`` until closed."""
        self.base_state = "stopping"
        if not self._closed:
            self.tracker.note_checkpoint()
            self._refresh_state()
            self.publish()

    # -------------------------------------------------------------- observations (main thread)
    def observe_step(self, res: Any) -> None:
        """Fold a finished step (``StepResult`` or its metrics dict) into status and metrics; check memory."""
        m = getattr(res, "metrics", res)
        self.mark_progress()
        self.tracker.observe_step(m)
        self.metrics.observe_step(m)
        self.reporters.step(m)
        self._check_signal(m)
        self.tracker.observe_swarm(self.node.swarm)
        if isinstance((m.get("time") or {}).get("checkpoint"), (int, float)):
            self.tracker.note_checkpoint()
        self._check_memory()
        self._refresh_state()
        self.publish()

    def _check_signal(self, m: dict[str, Any]) -> None:
        """Warn once per streak when ``no_signal_steps`` steps in a row had groups and none with a reward spread
        (``zero_variance_groups == groups``): such a run cannot learn (advantages are all 0)."""
        groups, flat = m.get("groups"), m.get("zero_variance_groups")
        if not isinstance(groups, int) or not isinstance(flat, int) or groups == 0:
            return
        if flat < groups:
            self._no_signal.clear()
            return
        self._no_signal.append((float(m.get("reward") or 0.0), float(m.get("format") or 0.0)))
        if self.no_signal_steps and len(self._no_signal) == self.no_signal_steps:
            n = len(self._no_signal)
            reward = sum(r for r, _ in self._no_signal) / n
            fmt = sum(f for _, f in self._no_signal) / n
            hint = ("no completion has the answer format: is sampling.max_completion_length long "
                    "enough for the model to reach its answer?" if fmt == 0.0 else
                    "the tasks may be too hard or too easy for this model (every sample scores the same)")
            log.warning("no learning signal for %d steps in a row (through step %d): every group's rewards were "
                        "equal, so every advantage is 0 and the model does not change (mean reward %.2f, format "
                        "%.2f). %s (monitor.no_signal_steps sets this warning)", n, int(self.node.step), reward,
                        fmt, hint)

    def observe_eval(self, tag: str, res: Any) -> None:
        """Record a held-out evaluation (``EvalResult``) tagged ``before``/``periodic``/``after``."""
        self.mark_progress()
        self.tracker.observe_eval(tag, int(self.node.step), float(res.accuracy),
                                  getattr(res, "per_task", None), getattr(res, "n", None))
        self.metrics.observe_eval(float(res.accuracy))
        self.reporters.evaluation(tag, int(self.node.step), float(res.accuracy), getattr(res, "per_task", None))
        self.publish()

    def request_stop(self, code: int, reason: str) -> None:
        """Ask the node to stop after this step (``node.request_stop``; it checkpoints); the CLI exits with ``code``."""
        if not self.exit_code:
            self.exit_code, self.exit_reason = int(code), reason
        self.node.request_stop(reason)

    # -------------------------------------------------------------- the status document
    def status(self) -> dict[str, Any]:
        """The current status document (JSON-ready)."""
        return self.tracker.document()

    def publish(self) -> None:
        """Write ``status.json`` (atomically) and refresh the live Prometheus gauges."""
        doc = self.status()
        try:
            self.metrics.observe_status(doc)
        except Exception:  # noqa: BLE001 - pragma: no cover
            log.debug("metrics update failed", exc_info=True)
        if not self.write_file:
            return
        try:
            with self._file_lock:
                write_status_file(self.run_dir, doc)
        except OSError as e:
            log.warning("cannot write %s/status.json: %s (check free disk space and permissions of the run "
                        "directory)", self.run_dir, e)

    # -------------------------------------------------------------- watchdog thread
    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the watchdog must survive everything
                log.exception("monitor watchdog step failed")

    def tick(self, now: float | None = None) -> None:
        """One watchdog step: memory, stall, live probes, status file (called by the thread; public for tests)."""
        self._check_memory()
        self._check_stall(now)
        self.tracker.observe_swarm(self.node.swarm)
        self.tracker.update(lambda d: d["memory"].update({"rss_bytes": node_memory_bytes(), "gpu": gpu_memory()}))
        self._refresh_state()
        self.publish()

    def _check_memory(self) -> None:
        ev = self.memory.check(node_memory_bytes())  # the node with its DHT child, p2pd and shm manager
        if ev is None:
            return
        if ev.kind == "hard":
            log.error(ev.message)
            self.request_stop(EXIT_MEMORY, f"memory watchdog: resident memory {fmt_bytes(ev.rss)} above the hard limit "
                                           f"{fmt_bytes(ev.limit)}; checkpointed and exited with code {EXIT_MEMORY}. To "
                                           f"avoid it, {MEMORY_ADVICE}")
        else:
            log.warning(ev.message)

    def _check_stall(self, now: float | None = None) -> None:
        phase = self.current_phase()
        ev = self.stall.check(self._last_progress(), phase, now)
        swarm = self.node.swarm
        if ev is not None and ev.kind == "stalled":
            recoverable = ev.phase in SWARM_PHASES and swarm is not None
            advice = stall_advice(ev.phase, recoverable)
            # one line for the terminal; the stacks go to node.log only (INFO: the terminal shows warnings)
            log.warning("round stalled: no progress for %.0f s in phase %s at step %d -- %s (stacks in node.log)",
                        ev.seconds, ev.phase, int(self.node.step), advice)
            log.info("stacks of the stalled round (phase %s):\nmain thread:\n%s%s", ev.phase, _thread_stack(),
                     _watched_call_stack())
            self.tracker.update(lambda d: d["stall"].update({"advice": advice}))
            if recoverable:
                self.flag_swarm_recovery(f"round stalled in phase {ev.phase} for {ev.seconds:.0f} s")
        elif ev is not None and ev.kind == "recovered":
            log.warning("round recovered: progress again after a stall in phase %s", ev.phase)
            self.tracker.update(lambda d: d["stall"].update({"advice": None}))
        elif ev is not None and ev.kind == "exit":
            self._exit_stalled(ev.phase, ev.seconds)
        snap = self.stall.snapshot(now)
        self.tracker.update(lambda d: d["stall"].update({k: v for k, v in snap.items()}))
        if ev is not None and ev.kind == "stalled":
            self.metrics.stalls.inc()

    # -------------------------------------------------------------- the swarm-recovery flag
    def flag_swarm_recovery(self, reason: str) -> None:
        """Raise the swarm-recovery flag with ``reason`` (one sentence); the node's loop takes it. Idempotent:
        a flag not taken yet keeps its first reason."""
        with self._flag_lock:
            if self._recovery is None:
                self._recovery = reason

    def take_swarm_recovery(self) -> str | None:
        """Take (and clear) the swarm-recovery flag: the reason of a swarm-layer stall, or None when none is
        flagged. The node's round loop calls it and restarts its swarm layer (``SwarmHook.recover``)."""
        with self._flag_lock:
            reason, self._recovery = self._recovery, None
        return reason

    def _exit_stalled(self, phase: str, seconds: float) -> None:
        ck = self.tracker.document()["checkpoint"].get("step")
        reason = (f"stalled for {seconds:.0f} s in phase {phase} (stall_exit_seconds={self.stall.stall_exit_seconds:g}); "
                  f"exiting with code {EXIT_STALLED} so that a supervisor restarts the node; it resumes from "
                  f"checkpoint step {ck}")
        log.error(reason)
        self.exit_code, self.exit_reason = EXIT_STALLED, reason
        self.tracker.set(state="stopped", exit={"code": EXIT_STALLED, "reason": reason})
        self.publish()
        swarm = self.node.swarm
        if swarm is not None:  # stop the DHT/p2pd children, bounded (SwarmHook.close)
            t = threading.Thread(target=swarm.close, daemon=True)
            t.start()
            t.join(timeout=15)
        logging.shutdown()
        os._exit(EXIT_STALLED)


def _thread_stack(ident: int | None = None, limit: int = 12) -> str:
    """The last ``limit`` frames of thread ``ident`` (default: the main thread), or ``(unavailable)``."""
    frame = sys._current_frames().get(ident if ident is not None else threading.main_thread().ident or -1)
    if frame is None:
        return "  (unavailable)"
    return "".join(traceback.format_stack(frame)[-limit:]).rstrip()


def _watched_call_stack() -> str:
    """The stacks of the running watched swarm calls (:data:`WATCHED_CALL_THREAD`), each under a header; ``""``."""
    return "".join(f"\nswarm call ({t.name}):\n{_thread_stack(t.ident)}" for t in threading.enumerate()
                   if t.name == WATCHED_CALL_THREAD and t.ident is not None)
