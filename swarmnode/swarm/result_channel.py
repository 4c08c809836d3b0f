"""The channel DHT processes answer on: hivemind's MPFuture pipe, made safe for processes that die.

Every result a hivemind DHT process sends back to the node (``MPFuture.set_result`` in the child) goes
through *one* pipe per origin process (``MPFuture._global_sender_pipe``), written under *one* lock
shared by every forked process (``MPFuture._update_lock``, an ``mp.Lock``; hivemind 1.1.12). Messages
larger than the pipe's atomic write (4 KiB: a find reply is up to 3.5 MiB) are written in parts, so the
lock is all that keeps two processes' messages apart. Three ways this breaks, each of which stops every
DHT call of the node (and every later DHT process's start-up) for good:

1. a process killed while it holds the lock (the OOM killer, SIGKILL, a stop right after it answered)
   leaves the lock taken for ever: every later send hangs;
2. replacing the lock after such a death (what this project used to do) gives processes forked before
   and after the replacement *different* locks on the *same* pipe: two large replies at once interleave,
   and the receiver reads garbage (``UnpicklingError: invalid load key``), after which every frame is
   misread;
3. a process killed in the middle of a message leaves part of it in the pipe: the same misreading.

:func:`install` (called before the first DHT process is forked; idempotent) fixes all three:

* the update lock becomes a :class:`FlockLock`: an exclusive ``flock`` on a lock file of this node,
  which the kernel releases when its holder dies, plus a thread lock within each process. It is never
  replaced, so every process forked from the node shares it; hivemind's two per-process locks
  (``_initialization_lock``, ``SharedBytes._lock``) become fork-safe thread locks;
* the node reads its pipe with :func:`_serve` instead of hivemind's loop: a frame it cannot decode means
  the pipe may be misframed, so that pipe is only drained from then on and futures created afterwards
  use a fresh pipe (:func:`rotate`); the futures in flight on the old pipe are lost and time out, as any
  DHT call may (every call of :class:`~swarmnode.swarm.dht_host.DHTHost` is bounded); a retired pipe is
  read for :data:`RETIRED_READ_S` more, then closed;
* :func:`after_unclean_exit` (called when a DHT process did not exit cleanly) rotates the pipe at once, so
  a half-written message cannot delay later calls until enough bytes arrive to expose it.

hivemind's own ``MPFuture.reset_backend`` is not used: it replaces the locks (case 2).
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import multiprocessing as mp
import os
import struct
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

__all__ = ["FlockLock", "ForkSafeLock", "after_unclean_exit", "install", "rotate", "rotations"]

log = logging.getLogger(__name__)

_DRAIN_CHUNK = 1 << 20  # bytes read at a time from a pipe that is only drained
#: seconds a retired pipe is still read after a rotation (every call on it is bounded far below this); then its
#: reader closes it and ends. Waiting for every writer to close it is not enough: ``multiprocessing`` keeps a
#: duplicate of the write end for each future sent to a DHT process until that process fetches it, and a process
#: killed first never does (an outside run: one thread and one pipe more after every restart, for good)
RETIRED_READ_S = 300.0
_POLL_S = 5.0  # how often a reader looks whether its pipe was retired
MAX_FRAME_BYTES = 1 << 30  # a longer frame length means the pipe is misframed

_state_lock = threading.Lock()
_installed_pid: int | None = None
_rotations = 0


class ForkSafeLock:
    """A thread lock that a forked child gets back unlocked (a thread of the parent may hold it at the fork).

    Same interface as ``threading.Lock`` (``acquire``, ``release``, context manager).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class FlockLock(ForkSafeLock):
    """A lock shared by a process and every process it forks, released by the kernel when its holder dies.

    An exclusive ``flock`` on ``path``, opened (close-on-exec) by each process on its first use, so each
    process holds its own open file description; within a process a :class:`ForkSafeLock` orders threads.

    :param path: the lock file (created if missing; the creator removes it at exit)
    :raises OSError: from ``acquire`` when the lock file cannot be opened
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        super().__init__()

    def _reset(self) -> None:
        super()._reset()
        self._fd = None  # the parent's descriptor (shared lock state) must not be used by the child

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock. ``timeout`` bounds the wait for other threads only; ``blocking=False`` never waits."""
        if not self._lock.acquire(blocking, timeout):
            return False
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.release()
            return False
        except BaseException:
            self._lock.release()
            raise
        return True

    def release(self) -> None:
        try:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._lock.release()


def _remove_lock_file(path: str, pid: int) -> None:
    if os.getpid() == pid:
        try:
            os.unlink(path)
        except OSError:
            pass


def install() -> None:
    """Make hivemind's MPFuture channel of this process safe for processes that die (see the module).

    Call before forking DHT processes: a process forked earlier keeps hivemind's ``mp.Lock``. Idempotent per
    process; a process started by ``spawn`` installs its own.

    :raises OSError: when no lock file can be created in the temporary directory
    """
    global _installed_pid
    from hivemind.utils.mpfuture import MPFuture, SharedBytes

    with _state_lock:
        if _installed_pid == os.getpid():
            return
        fd, path = tempfile.mkstemp(prefix="swarmnode-mpfuture-", suffix=".lock")
        os.close(fd)
        atexit.register(_remove_lock_file, path, os.getpid())
        MPFuture._update_lock = FlockLock(path)
        MPFuture._initialization_lock = ForkSafeLock()
        SharedBytes._lock = ForkSafeLock()
        _installed_pid = os.getpid()
    rotate()


def rotations() -> int:
    """How many times this process opened a fresh result pipe (install included)."""
    return _rotations


def rotate() -> None:
    """Send the results of futures created from now on through a fresh pipe, read by a fresh thread.

    The old pipe's thread keeps serving the futures already in flight on it until it reads a frame it cannot
    decode, every writer has closed it, or it has been retired for :data:`RETIRED_READ_S`. Futures created by other
    threads while this runs may use either pipe.
    """
    global _rotations
    from hivemind.utils.mpfuture import MPFuture

    receiver, sender = mp.Pipe(duplex=False)
    with MPFuture._initialization_lock:
        if MPFuture._active_futures is None or MPFuture._active_pid != os.getpid():
            MPFuture._active_futures = {}
        old = MPFuture._global_sender_pipe if MPFuture._active_pid == os.getpid() else None
        thread = threading.Thread(target=_serve, args=(receiver, sender), daemon=True,
                                  name=f"swarmnode.mpfuture.results.{_rotations + 1}")
        MPFuture._global_sender_pipe, MPFuture._active_pid = sender, os.getpid()
        MPFuture._pipe_waiter_thread = thread  # hivemind's own loop, if it ran, ends at its next message
        thread.start()
        _rotations += 1
    if old is not None:
        try:
            old.close()  # our copy only: children's copies stay open until their futures are done
        except OSError:
            pass


def after_unclean_exit() -> None:
    """A DHT process died, was killed or hung: it may have left half a message in the pipe, so rotate now."""
    if _installed_pid == os.getpid():
        rotate()


def _deliver(uid: int, update_type: Any, payload: Any) -> None:
    """Hand one update to its future (what hivemind's loop does)."""
    from hivemind.utils.mpfuture import MPFuture, UpdateType

    ref = (MPFuture._active_futures or {}).pop(uid, None)
    future = ref() if ref is not None else None
    if future is None:  # nobody waits for it any more
        return
    if update_type == UpdateType.RESULT:
        future.set_result(payload)
    elif update_type == UpdateType.EXCEPTION:
        future.set_exception(payload)
    elif update_type == UpdateType.CANCEL:
        future.cancel()
    else:
        raise RuntimeError(f"unexpected MPFuture update type {update_type!r}")


class _Stop(Exception):
    """The reader of a retired pipe has waited long enough."""


def _read_exact(receiver: Connection, n: int, sender: Connection, retired: list) -> bytes:
    """``n`` bytes of ``receiver``, waiting in steps of :data:`_POLL_S` (a blocking read could wait for ever on half a
    frame a killed writer left). ``retired`` holds when the pipe was first seen retired (``[None]`` before).

    :raises EOFError: every writer closed the pipe
    :raises _Stop: the pipe has been retired for :data:`RETIRED_READ_S` with nothing to read
    """
    from hivemind.utils.mpfuture import MPFuture

    chunks, fd, got = [], receiver.fileno(), 0
    while got < n:
        if not receiver.poll(_POLL_S):
            if MPFuture._global_sender_pipe is not sender:
                retired[0] = time.monotonic() if retired[0] is None else retired[0]
                if time.monotonic() - retired[0] >= RETIRED_READ_S:
                    raise _Stop
            continue
        chunk = os.read(fd, min(n - got, _DRAIN_CHUNK))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv_frame(receiver: Connection, sender: Connection, retired: list) -> bytes:
    """One frame in ``multiprocessing``'s framing (a 4-byte big-endian length; -1, then an 8-byte length).

    :raises EOFError, _Stop: as :func:`_read_exact`
    :raises ValueError: a length no frame of ours has (the pipe is misframed)
    """
    (size,) = struct.unpack("!i", _read_exact(receiver, 4, sender, retired))
    if size == -1:
        (size,) = struct.unpack("!Q", _read_exact(receiver, 8, sender, retired))
    if not 0 <= size <= MAX_FRAME_BYTES:
        raise ValueError(f"a frame of {size} bytes")
    return _read_exact(receiver, size, sender, retired)


def _serve(receiver: Connection, sender: Connection) -> None:
    """Read ``receiver`` until every writer closed it or it has been retired for :data:`RETIRED_READ_S`; on a frame
    that does not decode, drain it and rotate.

    :param sender: the write end this thread's pipe was created with (to tell whether it is still current)
    """
    from hivemind.utils.mpfuture import MPFuture

    retired: list = [None]
    while True:
        try:
            frame = _recv_frame(receiver, sender, retired)
            uid, update_type, payload = ForkingPickler.loads(frame)
        except (_Stop, EOFError):  # retired long enough, or every writer closed it
            if MPFuture._global_sender_pipe is sender:
                log.warning("the DHT result pipe was closed by every writer; opening a fresh one")
                rotate()
            break
        except Exception as e:  # noqa: BLE001 - a writer died mid-message, or two wrote at once
            log.warning("a DHT result could not be decoded (%s: %s); the pipe may be misframed: draining it and "
                        "opening a fresh one (calls in flight on it will time out)", type(e).__name__, e)
            if MPFuture._global_sender_pipe is sender:
                rotate()
            _drain(receiver)
            break
        try:
            _deliver(uid, update_type, payload)
        except Exception:  # noqa: BLE001 - one bad update must not end the loop
            log.exception("could not deliver a DHT result")
    try:
        receiver.close()
    except OSError:
        pass


def _drain(receiver: Connection) -> None:
    """Read and discard everything (writers must never block on it) until every writer has closed the pipe or
    nothing came for :data:`RETIRED_READ_S`."""
    fd, idle_since = receiver.fileno(), time.monotonic()
    while True:
        try:
            if not receiver.poll(_POLL_S):
                if time.monotonic() - idle_since >= RETIRED_READ_S:
                    return
                continue
            if not os.read(fd, _DRAIN_CHUNK):
                return
            idle_since = time.monotonic()
        except InterruptedError:
            continue
        except OSError:
            return
