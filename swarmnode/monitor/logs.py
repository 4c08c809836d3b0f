"""Logging of a node: a structured, rotating log in the run directory, rate-limited third-party noise, hints.

:func:`setup_logging` configures the root logger of a ``swarmnode`` process:

* ``<run_dir>/node.log`` -- one JSON object per line (``time`` unix seconds, ``ts`` ISO 8601, ``level``,
  ``logger``, ``pid``, ``thread``, ``msg``, and ``exc`` with the traceback when there is one); rotated at
  ``max_bytes`` with ``backups`` old files (``node.log.1`` ...), so a node running for weeks never fills the
  disk. ``jq`` reads it: ``jq -r 'select(.level=="WARNING") | .msg' node.log``.
* the terminal gets WARNING and above, one line each in one format (``WARNING name: message``, never wrapped,
  whatever the width; through rich when a console is given, so it does not break the progress bar).
* :class:`RateLimitFilter` on every handler: noise -- records of third-party loggers (hivemind, asyncio,
  p2p...) and disconnect errors (``BrokenPipeError``, ``ConnectionResetError``, stream resets) -- passes at
  most ``burst`` times per ``window`` seconds per message template; the next one that passes says how many
  were suppressed. Disconnect tracebacks are cut to one line. Known third-party errors get a hint that says
  what to do (:data:`HINTS`).

hivemind installs its own stderr handler on the ``hivemind`` logger and stops propagation;
:func:`quiet_third_party` (called by :func:`setup_logging` with ``swarm=True``, before the DHT process is
forked) routes its records through our handlers instead.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
import traceback
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

NOISY_LOGGERS = ("hivemind", "transformers", "httpx", "urllib3", "matplotlib", "asyncio", "multiaddr", "filelock",
                 "datasets", "PIL")
"""Third-party loggers set to WARNING and rate-limited."""

NOISE_EXCEPTIONS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, EOFError)
"""Exceptions whose tracebacks are cut to one line (peers disconnecting is normal in a swarm)."""

_NOISE_TEXT = re.compile(
    r"broken pipe|connection reset|connection aborted|stream reset|disconnect|connection refused|"
    r"P2PDaemonError|P2PHandlerError|CancelledError|failed to (connect|dial)|timed? ?out",
    re.IGNORECASE,
)

HINTS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"address already in use", re.I),
     "another process uses that port: pick another --host-maddrs port or --status-port (0 picks a free one)"),
    (re.compile(r"too many open files", re.I), "raise the open-files limit, e.g. `ulimit -n 65536`, and restart"),
    (re.compile(r"bootstrap|initial.?peers?|failed to (connect|dial)|connection refused", re.I),
     "check the --initial-peers multiaddr (/ip4/<ip>/tcp/<port>/p2p/<PeerID> of a running node) and that its "
     "port is reachable; the node trains solo meanwhile"),
    (re.compile(r"p2pd|P2PDaemonError|daemon", re.I),
     "the libp2p daemon failed; the DHT watchdog restarts it. If it keeps failing, check that the listen port "
     "is free and see docs/guide/operations.md"),
    (re.compile(r"out of memory|CUDA error: out of memory|OutOfMemoryError", re.I),
     "lower sampling.num_generations, sampling.max_completion_length or train.micro_batch_size"),
]
"""(pattern, what to do) for third-party warnings and errors; the first match is appended to the message."""

_KEY_NUM = re.compile(r"0x[0-9a-f]+|[0-9a-f]{12,}|[1-9A-HJ-NP-Za-km-z]{30,}|\d+(\.\d+)?", re.I)


def _is_third_party(record: logging.LogRecord) -> bool:
    return not (record.name == "swarmnode" or record.name.startswith("swarmnode.") or record.name == "root")


def _noise_exc(record: logging.LogRecord) -> BaseException | None:
    if record.exc_info and isinstance(record.exc_info[1], NOISE_EXCEPTIONS):
        return record.exc_info[1]
    return None


class RateLimitFilter(logging.Filter):
    """Rate-limits noisy records per message template; cuts disconnect tracebacks; appends hints.

    A record is *noise* when it comes from a third-party logger, carries a :data:`NOISE_EXCEPTIONS`
    exception, or its text matches disconnect/timeout patterns. Noise with the same key (logger, level,
    message with numbers and ids blanked) passes ``burst`` times per ``window`` seconds; suppressed records
    are counted and reported on the next record of that key that passes. Own (``swarmnode.*``) records that
    are not noise always pass. The decision is memoized on the record, so one filter instance can sit on
    several handlers and counts each record once.

    Args:
        burst: records per key per window (>= 1).
        window: seconds (> 0).
        clock: monotonic clock in seconds (tests pass their own).
    """

    def __init__(self, burst: int = 3, window: float = 60.0, clock: Any = time.monotonic) -> None:
        super().__init__()
        if burst < 1 or not window > 0:
            raise ValueError(f"need burst >= 1 and window > 0 seconds, got burst={burst!r}, window={window!r}")
        self.burst, self.window = int(burst), float(window)
        self.clock = clock
        self._lock = threading.Lock()
        self._state: dict[tuple, list[float]] = {}  # key -> [window_start, passed, suppressed]
        self.suppressed_total = 0

    @staticmethod
    def key(record: logging.LogRecord) -> tuple:
        """The rate-limit key of a record: (logger, level, template with numbers/ids blanked, exception type)."""
        text = record.msg if isinstance(record.msg, str) else str(record.msg)
        exc = type(record.exc_info[1]).__name__ if record.exc_info and record.exc_info[1] is not None else ""
        return record.name, record.levelno, _KEY_NUM.sub("#", text)[:160], exc

    def is_noise(self, record: logging.LogRecord) -> bool:
        """Whether a record is subject to rate limiting (see the class docstring)."""
        if _is_third_party(record) or _noise_exc(record) is not None:
            return True
        try:
            return bool(_NOISE_TEXT.search(record.getMessage()))
        except Exception:  # noqa: BLE001 - a malformed record is noise
            return True

    def filter(self, record: logging.LogRecord) -> bool:
        memo = getattr(record, "_swarmnode_pass", None)
        if memo is not None:
            return memo
        decision = self._decide(record)
        record._swarmnode_pass = decision  # type: ignore[attr-defined]
        return decision

    def _decide(self, record: logging.LogRecord) -> bool:
        if not self.is_noise(record):
            return True
        now = self.clock()
        k = self.key(record)
        with self._lock:
            st = self._state.get(k)
            if st is None or now - st[0] >= self.window:
                suppressed = int(st[2]) if st is not None else 0
                st = [now, 0, 0]
                self._state[k] = st
                if len(self._state) > 2048:  # forget the oldest keys
                    for old in sorted(self._state, key=lambda x: self._state[x][0])[:512]:
                        del self._state[old]
            else:
                suppressed = 0
            if st[1] >= self.burst:
                st[2] += 1
                self.suppressed_total += 1
                return False
            st[1] += 1
            suppressed += int(st[2])
            st[2] = 0
        self._rewrite(record, suppressed)
        return True

    @staticmethod
    def _rewrite(record: logging.LogRecord, suppressed: int) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001
            msg = str(record.msg)
        exc = _noise_exc(record)
        if exc is not None:  # a peer hung up: one line, no traceback
            msg = f"{msg} ({type(exc).__name__}: {exc})"
            record.exc_info, record.exc_text = None, None
        if record.levelno >= logging.WARNING and _is_third_party(record):
            for pat, hint in HINTS:
                if pat.search(msg):
                    msg = f"{msg} -- what to do: {hint}"
                    break
        if suppressed:
            msg = f"{msg} [{suppressed} similar message(s) suppressed]"
        record.msg, record.args = msg, None


LEVEL_NAMES = {logging.CRITICAL: "CRITICAL", logging.ERROR: "ERROR", logging.WARNING: "WARNING",
               logging.INFO: "INFO", logging.DEBUG: "DEBUG"}
"""The one name of each level in every output (hivemind renames WARNING to ``WARN`` process-wide)."""

TERMINAL_FORMAT = "%(levelname)s %(name)s: %(message)s"
"""The one format of log lines on the terminal (``node.log`` holds JSON with the time)."""


def canonical_level(record: logging.LogRecord) -> bool:
    """Handler filter: set ``record.levelname`` from :data:`LEVEL_NAMES` (always passes the record)."""
    record.levelname = LEVEL_NAMES.get(record.levelno, record.levelname)
    return True


class ConsoleHandler(logging.Handler):
    """Log lines through a ``rich`` console (so they print above a live progress bar), never wrapped: a line
    longer than the terminal stays one line (``soft_wrap``), and rich markup in a message is printed as text."""

    _STYLES = {logging.WARNING: "yellow", logging.ERROR: "bold red", logging.CRITICAL: "bold red"}

    def __init__(self, console: Any, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.print(self.format(record), markup=False, highlight=False, soft_wrap=True,
                               style=self._STYLES.get(record.levelno))
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time``, ``ts``, ``level``, ``logger``, ``pid``, ``thread``, ``msg``, ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": round(record.created, 3),
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "thread": record.threadName,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()[-8000:]
        elif record.exc_text:
            out["exc"] = record.exc_text[-8000:]
        return json.dumps(out, ensure_ascii=False, default=str)


_FILTER: RateLimitFilter | None = None


def rate_limit_filter() -> RateLimitFilter:
    """The process-wide :class:`RateLimitFilter` (one instance, shared by every handler)."""
    global _FILTER
    if _FILTER is None:
        _FILTER = RateLimitFilter()
    return _FILTER


def quiet_third_party() -> None:
    """Set noisy third-party loggers to WARNING and make hivemind's records go through our handlers.

    Imports ``hivemind.utils.logging`` only if hivemind is importable; cheap to call again.
    """
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        from hivemind.utils import logging as hm_logging

        hm_logging.use_hivemind_log_handler("nowhere")
    except Exception:  # noqa: BLE001 - hivemind missing or changed: its own handler stays
        pass
    logging.getLogger("hivemind").setLevel(logging.WARNING)
    try:  # weight-loading progress bars are noise in a node's output
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:  # noqa: BLE001
        pass


def setup_logging(run_dir: str | Path | None = None, verbose: bool = False, *, console: Any = None,
                  swarm: bool = False, max_bytes: int = 5_000_000, backups: int = 3) -> None:
    """Configure logging for a swarmnode process (replaces earlier root handlers).

    Args:
        run_dir: where ``node.log`` goes (created); ``None``: terminal only (INFO, or DEBUG when verbose).
        verbose: DEBUG level for the file (and the terminal without a run dir).
        console: a ``rich.console.Console`` for the terminal handler (:class:`ConsoleHandler`: works under rich
            progress bars, never wraps a line); ``None`` writes plain lines to stderr. Both use
            :data:`TERMINAL_FORMAT` and the level names of :data:`LEVEL_NAMES`.
        swarm: route hivemind's records through our handlers now (call before the DHT starts).
        max_bytes / backups: rotation of ``node.log``.
    """
    level = logging.DEBUG if verbose else logging.INFO
    flt = rate_limit_filter()
    handlers: list[logging.Handler] = []
    if run_dir is not None:
        rd = Path(run_dir)
        rd.mkdir(parents=True, exist_ok=True)
        fh = RotatingFileHandler(rd / "node.log", maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        fh.setFormatter(JsonFormatter())
        fh.setLevel(level)
        handlers.append(fh)
    term_level = logging.WARNING if run_dir is not None else level
    th: logging.Handler = ConsoleHandler(console) if console is not None else logging.StreamHandler(sys.stderr)
    th.setFormatter(logging.Formatter(TERMINAL_FORMAT))  # one format, never wrapped
    th.setLevel(term_level)
    handlers.append(th)
    for h in handlers:
        h.addFilter(flt)
        h.addFilter(canonical_level)
    logging.basicConfig(level=level, handlers=handlers, force=True)
    logging.captureWarnings(True)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    if swarm or "hivemind" in sys.modules:
        quiet_third_party()
    else:
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except Exception:  # noqa: BLE001
            pass
