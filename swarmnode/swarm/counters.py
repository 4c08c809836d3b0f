"""The swarm layer's counters: cumulative counts and rejections, reported as per-step deltas.

:class:`SwarmCounters` is shared by the publisher, the fetcher and the gather (three kinds of thread), so it has
its own lock and never calls out while holding it: any other lock may be held while counting.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Sequence

__all__ = ["SwarmCounters"]


class SwarmCounters:
    """Cumulative counters (``counts``: event name -> n; ``rejected``: rejection reason -> n), thread-safe.

    ``deltas`` and ``rejected_deltas`` return what changed since they were last asked (the metrics of a step are
    per-step deltas, as the status endpoint expects)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self._reported: Counter[str] = Counter()
        self._rejected_reported: Counter[str] = Counter()

    def add(self, key: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``key``."""
        with self.lock:
            self.counts[key] += n

    def get(self, key: str) -> int:
        """The cumulative count of ``key`` (0 when never counted)."""
        with self.lock:
            return self.counts[key]

    def reject(self, reason: str) -> None:
        """Count one rejection under ``reason``."""
        with self.lock:
            self.rejected[reason] += 1

    def deltas(self, keys: Sequence[str]) -> dict[str, int]:
        """``{"swarm/<key>": count since the last call}`` for each of ``keys``."""
        with self.lock:
            out = {}
            for k in keys:
                out[f"swarm/{k}"] = self.counts[k] - self._reported[k]
                self._reported[k] = self.counts[k]
            return out

    def rejected_deltas(self) -> dict[str, int]:
        """``{"swarm/rejected/<reason>": rejections since the last call}`` for every reason that changed."""
        with self.lock:
            out = {f"swarm/rejected/{r}": n - self._rejected_reported[r]
                   for r, n in self.rejected.items() if n - self._rejected_reported[r]}
            self._rejected_reported = Counter(self.rejected)
            return out

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        """``(counts, rejected)`` as plain dicts (cumulative)."""
        with self.lock:
            return dict(self.counts), dict(self.rejected)
