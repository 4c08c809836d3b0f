"""Per-step metrics: ``metrics.jsonl`` in the run directory, and a step-phase timer."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if hasattr(v, "item"):
        try:
            return _clean(v.item())
        except (TypeError, ValueError):
            return str(v)
    return v


class MetricsWriter:
    """Appends one JSON object per line to ``path`` (flushed per record, so a crash loses at most one line).

    A line that was half-written by a crash is skipped by :func:`read_metrics`.

    Args:
        path: the ``metrics.jsonl`` file.
        resume_step: the step a resumed run restarts from: rows of later steps (written by the run that died
            after that checkpoint, and about to be trained again) are removed first, so that the file holds one
            history; the removed rows go to ``metrics.discarded.jsonl`` beside it. None keeps every row.

    A record that cannot be written (disk full) is dropped with one logged error (and one more when writing
    works again); training is not interrupted by its metrics file.
    """

    def __init__(self, path: str | Path, resume_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.discarded = truncate_after_step(self.path, resume_step) if resume_step is not None else 0
        self._f = open(self.path, "a", encoding="utf-8")
        self._failing = False

    def write(self, record: dict[str, Any]) -> None:
        """Write one record (non-finite floats become null)."""
        try:
            self._f.write(json.dumps(_clean(record), separators=(",", ":")) + "\n")
            self._f.flush()
        except OSError as e:
            if not self._failing:
                logging.getLogger("swarmnode.monitor").error(
                    "cannot write %s: %s; metrics rows are lost until it can be written again", self.path, e)
            self._failing = True
            return
        if self._failing:
            logging.getLogger("swarmnode.monitor").warning("%s is written again", self.path)
            self._failing = False

    def close(self) -> None:
        try:
            self._f.close()
        except OSError:
            pass


def truncate_after_step(path: str | Path, step: int) -> int:
    """Remove the rows of ``path`` whose ``step`` is greater than ``step`` (atomic rewrite); returns how many.

    The removed lines are appended to ``<stem>.discarded.jsonl`` beside it (kept for forensics, read by nothing).
    A half-written last line is dropped too. Missing file: 0.
    """
    p = Path(path)
    try:
        lines = p.read_bytes().split(b"\n")
    except FileNotFoundError:
        return 0
    keep, drop = [], []
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            drop.append(line)
            continue
        s = rec.get("step") if isinstance(rec, dict) else None
        (drop if isinstance(s, (int, float)) and s > step else keep).append(line)
    if not drop:
        return 0
    with open(p.with_name(p.stem + ".discarded.jsonl"), "ab") as f:
        f.write(b"".join(line + b"\n" for line in drop))
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(b"".join(line + b"\n" for line in keep))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    return len(drop)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read ``metrics.jsonl``; lines that are not valid JSON objects (a torn last line) are skipped."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


class PhaseTimer:
    """Accumulates wall-clock seconds per named phase of a step (sample, score, gossip, verify, train, checkpoint).

    It also remembers which phase runs right now (:attr:`current`, since :attr:`current_since`) and when a phase
    last started or ended (:attr:`last_change`, ``time.monotonic()`` seconds): the stall watchdog
    (:mod:`swarmnode.monitor.watchdog`) reads these from another thread to name the phase a stalled round is
    stuck in. Reads from other threads see plain attribute values (no lock needed for that use).
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.current: str | None = None
        self.current_since: float = time.monotonic()
        self.last_phase: str | None = None
        self.last_change: float = time.monotonic()
        self._stack: list[str] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the ``with`` block as phase ``name`` (nested phases are allowed; the innermost is :attr:`current`)."""
        t0 = time.perf_counter()
        self._stack.append(name)
        self.current, self.current_since = name, time.monotonic()
        self.last_change = self.current_since
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
            self._stack.pop()
            self.last_phase = name
            self.current = self._stack[-1] if self._stack else None
            self.last_change = time.monotonic()

    def reset(self) -> dict[str, float]:
        """Return the per-phase seconds accumulated since the last reset and start a new accumulation."""
        out, self.seconds = self.seconds, {}
        return out


def rss_bytes() -> int:
    """Resident set size of this process in bytes (0 if unknown)."""
    try:
        import psutil

        return int(psutil.Process(os.getpid()).memory_info().rss)
    except Exception:  # pragma: no cover - psutil missing or restricted /proc
        return 0


def node_memory_bytes() -> int:
    """Memory of this process and all its descendants (the DHT child, p2pd, torch's shm manager), in bytes.

    Each process counts its proportional set size (PSS: pages shared between the node and its forked children
    count once overall), or its RSS where PSS is unavailable; 0 if unknown. What the memory watchdog and
    ``swarmnode top`` show, since the OOM killer sees the children too.
    """
    try:
        import psutil

        me = psutil.Process(os.getpid())
        procs = [me, *me.children(recursive=True)]
    except Exception:  # noqa: BLE001 - pragma: no cover
        return rss_bytes()
    total = 0
    for pr in procs:
        try:
            try:
                total += int(pr.memory_full_info().pss)
            except (AttributeError, psutil.AccessDenied):
                total += int(pr.memory_info().rss)
        except psutil.Error:  # the child ended meanwhile
            continue
    return total or rss_bytes()


def gpu_memory() -> dict[str, int]:
    """GPU memory of this process as torch's CUDA allocator sees it, in bytes, summed over visible devices.

    Returns ``{}`` when torch is not imported yet or CUDA is unavailable (this never imports torch itself, so
    light processes such as ``swarmnode status`` stay light), else ``allocated``, ``reserved`` and ``total``
    (device capacity).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        n = torch.cuda.device_count()
        return {
            "allocated": int(sum(torch.cuda.memory_allocated(i) for i in range(n))),
            "reserved": int(sum(torch.cuda.memory_reserved(i) for i in range(n))),
            "total": int(sum(torch.cuda.get_device_properties(i).total_memory for i in range(n))),
        }
    except Exception:  # pragma: no cover - a broken driver must not break monitoring
        return {}


def _cgroup_memory_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):
            return int(text)
    return None


def total_memory_bytes() -> int | None:
    """Memory available to this process in bytes: the cgroup limit when one is set, else physical RAM.

    ``None`` when neither can be read.
    """
    total = None
    try:
        import psutil

        total = int(psutil.virtual_memory().total)
    except Exception:  # pragma: no cover
        pass
    cg = _cgroup_memory_limit()
    if cg is not None:
        total = cg if total is None else min(total, cg)
    return total
