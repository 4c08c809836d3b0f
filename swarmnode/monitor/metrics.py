"""Per-step metrics: ``metrics.jsonl`` in the run directory, and a step-phase timer."""

from __future__ import annotations

import json
import math
import os
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
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        """Write one record (non-finite floats become null)."""
        self._f.write(json.dumps(_clean(record), separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


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
    """Accumulates wall-clock seconds per named phase of a step (sample, score, gossip, verify, train, checkpoint)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def reset(self) -> dict[str, float]:
        out, self.seconds = self.seconds, {}
        return out


def rss_bytes() -> int:
    """Resident set size of this process in bytes (0 if unknown)."""
    try:
        import psutil

        return int(psutil.Process(os.getpid()).memory_info().rss)
    except Exception:  # pragma: no cover - psutil missing or restricted /proc
        return 0
