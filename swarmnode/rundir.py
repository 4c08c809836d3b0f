"""Exclusive use of a run directory (and of an identity file) by one process at a time.

Two processes sharing a run directory write every metrics row twice and overwrite each other's checkpoints;
two nodes with one identity are one peer twice. :class:`ExclusiveLock` takes an ``fcntl.flock``
on a lock file (``<run_dir>/.lock``, ``<identity>.lock``) for as long as the process uses it and writes its
PID into the file, so that a second process is refused with a message naming the holder. The kernel drops
a flock when its holder dies (``kill -9`` included), so a stale lock never blocks a restart; the lock's
file descriptor is closed in processes forked from the holder (the DHT child), so that a surviving child
cannot keep it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no locking
    fcntl = None  # type: ignore[assignment]

__all__ = ["CHILDREN_FILE", "ExclusiveLock", "LockedError", "RUN_DIR_LOCK", "end_stale_children", "lock_identity",
           "lock_run_dir", "write_children_file"]

_log = logging.getLogger("swarmnode.rundir")

RUN_DIR_LOCK = ".lock"
CHILDREN_FILE = "children.json"  # the DHT child and p2pd of a swarm node (pid + start time)

_HELD: dict[int, "ExclusiveLock"] = {}  # fd -> lock held by this process (closed in forked children)


def _close_held_in_child() -> None:
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held_in_child)


class LockedError(RuntimeError):
    """The resource is locked by another process; the message names it and the holder's PID.

    Attributes:
        pid: the PID written by the holder (None when it could not be read).
    """

    def __init__(self, msg: str, pid: int | None) -> None:
        super().__init__(msg)
        self.pid = pid


class ExclusiveLock:
    """An exclusive, non-blocking ``flock`` on ``path`` (created if missing), holding this process's PID.

    Args:
        path: the lock file.
        what: what the lock protects, for messages (e.g. ``"run directory runs/x"``).
        advice: what to do when it is held, for the message.

    Raises (from :meth:`acquire`):
        LockedError: another process holds it.
        OSError: the lock file cannot be created (e.g. a read-only directory).
    """

    def __init__(self, path: str | os.PathLike, what: str,
                 advice: str = "stop that process first, or use another directory") -> None:
        self.path = Path(path)
        self.what = what
        self.advice = advice
        self.fd: int | None = None

    def acquire(self) -> "ExclusiveLock":
        """Take the lock (idempotent); returns ``self``."""
        if self.fd is not None or fcntl is None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_pid(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            who = f"process {holder}" if holder is not None else "another process"
            raise LockedError(
                f"{self.what} is in use by {who} (lock file {self.path}); {self.advice}", holder) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n{' '.join(sys.argv)[:500]}\n".encode())
        self.fd = fd
        _HELD[fd] = self
        return self

    def release(self) -> None:
        """Drop the lock (idempotent). The file stays (removing it would race with a new holder)."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        _HELD.pop(fd, None)
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        os.close(fd)

    @property
    def held(self) -> bool:
        return self.fd is not None

    def __enter__(self) -> "ExclusiveLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        first = os.pread(fd, 64, 0).split(b"\n", 1)[0].strip()
        return int(first) if first else None
    except (OSError, ValueError):
        return None


def lock_run_dir(run_dir: str | os.PathLike) -> ExclusiveLock:
    """Lock ``run_dir`` for this process (``<run_dir>/.lock``); the directory must exist.

    Raises:
        LockedError: another process uses the directory (the message names its PID).
    """
    return ExclusiveLock(Path(run_dir) / RUN_DIR_LOCK, f"run directory {run_dir}").acquire()


def lock_identity(path: str | os.PathLike) -> ExclusiveLock:
    """Lock the identity key file ``path`` for this process (``<path>.lock`` beside it).

    Raises:
        LockedError: another node uses this identity (the message names its PID).
    """
    p = Path(path)
    return ExclusiveLock(p.with_name(p.name + ".lock"), f"identity {p}",
                         "one identity is one peer, so two nodes cannot share it: stop that node first, or give this "
                         "node its own identity (--identity NEW.pem --create-identity)").acquire()


# ------------------------------------------------------------------ child processes left by a killed node
def _proc_start(pid: int) -> float | None:
    """Start time of process ``pid`` (psutil's ``create_time``), or None when it does not run."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def write_children_file(path: str | os.PathLike, children: Sequence[int | None], sockets: Sequence[str] = ()) -> None:
    """Record this process's child processes (pid + start time) and socket files in ``path`` (JSON, atomic)."""
    rec = {"parent": {"pid": os.getpid(), "start": _proc_start(os.getpid())},
           "children": [{"pid": int(c), "start": _proc_start(int(c))} for c in children if c],
           "sockets": [s for s in sockets if s]}
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(rec, f)
    os.replace(tmp, path)


def end_stale_children(path: str | os.PathLike, timeout: float = 10.0) -> list[int]:
    """End the child processes a dead node recorded in ``path`` (see :func:`write_children_file`).

    A recorded process is ended only if it still runs with the recorded start time (a reused pid is left
    alone), and only when the recorded parent is gone (a live node's children are never touched). SIGTERM,
    then SIGKILL after ``timeout`` seconds; recorded socket files are removed; the file is removed.

    :returns: the pids that were ended
    :raises OSError: never for a missing or unreadable file (it is treated as empty)
    """
    import psutil

    p = Path(os.fspath(path))
    try:
        rec = json.loads(p.read_text(encoding="utf-8"))
        parent = rec.get("parent") or {}
        children = [c for c in rec.get("children") or [] if isinstance(c, dict)]
        sockets = [s for s in rec.get("sockets") or [] if isinstance(s, str)]
    except (OSError, ValueError, AttributeError):
        return []
    ppid = parent.get("pid")
    if isinstance(ppid, int) and _same_process(ppid, parent.get("start")):
        _log.warning("%s belongs to the running process %d; its children are left alone", p, ppid)
        return []
    procs = []
    for c in children:
        pid = c.get("pid")
        if isinstance(pid, int) and pid != os.getpid() and _same_process(pid, c.get("start")):
            try:
                procs.append(psutil.Process(pid))
            except psutil.Error:
                pass
    for pr in procs:
        try:
            pr.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for pr in alive:
        try:
            pr.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=timeout)
    if procs:
        _log.warning("ended %d process(es) a previous run of this node left behind: %s", len(procs),
                    ", ".join(str(pr.pid) for pr in procs))
    for sock in sockets:
        path_ = sock[len("/unix"):] if sock.startswith("/unix/") else sock
        if os.path.basename(path_).startswith("hivemind-p2pd-"):
            try:
                os.remove(path_)
            except OSError:
                pass
    try:
        p.unlink()
    except OSError:
        pass
    return [pr.pid for pr in procs]


def _same_process(pid: int, start: Any) -> bool:
    now = _proc_start(pid)
    return now is not None and isinstance(start, (int, float)) and abs(now - float(start)) < 1.0


# ------------------------------------------------------------------ full disks and read-only run directories
EXIT_DISK = 5
"""Exit code of a node that stopped because its run directory could not be written (disk full, read-only)."""

_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}
_DISK_TEXT = ("no space left", "file write failed", "storagefull", "read-only file system", "disk quota",
              "permission denied")


class DiskError(OSError):
    """The run directory cannot take a write: one line naming the path, the cause and the space needed."""


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes (for an unprivileged user) on the filesystem of ``path`` or its nearest existing parent."""
    import shutil

    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return int(shutil.disk_usage(p).free)
    except OSError:
        return None


def is_disk_error(exc: BaseException) -> bool:
    """Whether ``exc`` means "this path cannot be written" (disk full, quota, read-only, no permission).

    Recognizes OSErrors by errno and the RuntimeErrors torch and safetensors raise for a failed write
    (``PytorchStreamWriter failed writing file ...: file write failed``), by their text."""
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS:
        return True
    text = str(exc).lower()
    return any(t in text for t in _DISK_TEXT)


def disk_error(path: str | os.PathLike, exc: BaseException | None, need: int | None = None) -> DiskError:
    """A one-line :class:`DiskError` for a failed write under ``path``: the cause, free space and space needed."""
    free = free_bytes(path)
    if isinstance(exc, OSError) and exc.errno == errno.EROFS or "read-only" in str(exc).lower():
        cause = "the file system is read-only"
    elif isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM):
        cause = "permission denied"
    elif exc is None:
        cause = "not enough free space"
    elif (need is not None and free is not None and free < need) or is_disk_error(exc):
        cause = "no space left on the device"
    else:  # pragma: no cover - callers only pass disk errors
        cause = f"{type(exc).__name__}: {exc}"
    space = "" if free is None else f"; {_mib(free)} free"
    if need is not None:
        space += f", about {_mib(need)} needed"
    err = DiskError(f"cannot write to {path}: {cause}{space}")
    err.errno = getattr(exc, "errno", None) or errno.ENOSPC
    return err


def check_writable(run_dir: str | os.PathLike, need: int = 0) -> None:
    """Start-up check: create ``run_dir`` if needed, write and remove a probe file, and compare free space with
    ``need`` bytes.

    Raises:
        DiskError: the directory cannot be created or written, or has less than ``need`` bytes free.
    """
    rd = Path(run_dir)
    probe = rd / f".write-test-{os.getpid()}"
    try:
        rd.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise disk_error(rd, e, need or None) from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    free = free_bytes(rd)
    if need and free is not None and free < need:
        raise disk_error(rd, None, need)


def checkpoint_bytes(model: Any, optimizer_slots: int = 2) -> int:
    """Rough size of one checkpoint of ``model`` in bytes: the weights, plus ``optimizer_slots`` fp32 copies of
    the trainable parameters (AdamW's two moments), plus 1 MiB of tokenizer and metadata files."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    moments = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad) * optimizer_slots
    return int(weights + moments + 2**20)
