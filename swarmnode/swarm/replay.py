"""Bounded memories of what the verifier has seen: exact bytes (:class:`TTLSet`), tree contents (:class:`ReplayMemory`).

The ``duplicate`` and ``replay`` checks of the trust table (:mod:`swarmnode.swarm.verify`, step 1c and step 6) read
them. Both are bounded by a capacity (oldest insertion evicted first) and a time to live.

Why not ``cachetools.TTLCache``: it evicts the least recently *read* key when full, and a read moves a key to the
back; here the eviction order must depend only on what we inserted (accepted), never on what peers make us look
up (a peer that re-sends a copy would otherwise keep its entry alive and choose which entries are evicted first).
It also drops a key at exactly ``ttl`` seconds, where this set keeps it until ``ttl`` has passed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

__all__ = ["ReplayMemory", "TTLSet"]


class TTLSet:
    """A bounded set with expiry: at most ``capacity`` keys, each forgotten ``ttl`` seconds after insertion.

    Args:
        capacity: most keys kept (int, at least 1); inserting past it evicts the oldest insertion first (a re-added
            key counts as inserted now). Reads never change the order.
        ttl: seconds a key lives after its (last) insertion; ``math.inf``: until the capacity evicts it.
        clock: seconds (any clock, the one ``ttl`` is measured on; the verifier passes its wall clock).
    """

    def __init__(self, capacity: int, ttl: float, clock: Callable[[], float]) -> None:
        self.capacity = max(1, int(capacity))
        self.ttl = float(ttl)
        self.clock = clock
        self._d: OrderedDict[Any, tuple[float, Any]] = OrderedDict()

    def _expire(self, now: float) -> None:
        while self._d:
            k, (t, _) = next(iter(self._d.items()))
            if now - t <= self.ttl and len(self._d) <= self.capacity:
                break
            del self._d[k]

    def get(self, key: Any, default: Any = None) -> Any:
        now = self.clock()
        self._expire(now)
        item = self._d.get(key)
        if item is None or now - item[0] > self.ttl:
            return default
        return item[1]

    def __contains__(self, key: Any) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def add(self, key: Any, value: Any = True) -> None:
        now = self.clock()
        self._d.pop(key, None)
        self._d[key] = (now, value)
        self._expire(now)

    def __len__(self) -> int:
        return len(self._d)

    def discard(self, key: Any) -> None:
        self._d.pop(key, None)

    def clear(self) -> None:
        self._d.clear()


_MISSING = object()


class ReplayMemory:
    """The content keys of trees seen (ours, and accepted peers'), in two bounded parts of ``capacity`` keys each.

    Keys of our own trees and of trees from established signers live in the *protected* part; keys of trees from
    young signers (free keys) live in the *young* part, so that a flood of bundles from fresh keys evicts only other
    young keys' memory, never ours or an established peer's (outside attack: 64 free keys with one 1,024-leaf bundle
    each emptied the one shared memory, after which an honest tree re-signed by another key was fresh again). A key
    already remembered keeps its part when its value changes (authorship moves); a young key's entry that an
    established signer's tree also holds moves to the protected part.

    The two parts are this class rather than one cache: a single LRU or TTL cache (``cachetools``) has one
    eviction order for all keys, and the protection is exactly that young keys never evict the others.
    """

    def __init__(self, capacity: int, ttl: float, clock: Callable[[], float]) -> None:
        self.protected = TTLSet(capacity, ttl, clock)
        self.young = TTLSet(capacity, ttl, clock)

    def get(self, key: Any, default: Any = None) -> Any:
        v = self.protected.get(key, _MISSING)
        return v if v is not _MISSING else self.young.get(key, default)

    def add(self, key: Any, value: Any, young: bool | None = False) -> None:
        """Remember ``key``; ``young``: True for a young signer's tree, False for ours or an established
        signer's, None to keep the part the key is already in (the protected one for a new key)."""
        if young is None:
            young = key not in self.protected and key in self.young
        if young and key not in self.protected:
            self.young.add(key, value)
        else:
            self.young.discard(key)  # the key now lives in the protected part
            self.protected.add(key, value)

    def __len__(self) -> int:
        return len(self.protected) + len(self.young)

    def clear(self) -> None:
        self.protected.clear()
        self.young.clear()
