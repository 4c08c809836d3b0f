"""Bounded memories of what the verifier has seen: exact bytes (:class:`TTLSet`), tree contents (:class:`ReplayMemory`,
its peers' parts :class:`OwnerFairSet` s).

The ``duplicate`` and ``replay`` checks of the trust table (:mod:`swarmnode.swarm.verify`, step 1c and step 6) read
them. Both are bounded by a capacity and a time to live (:class:`TTLSet` evicts its oldest insertion first,
:class:`OwnerFairSet` the oldest insertion of the owner holding the most keys).

Why not ``cachetools.TTLCache``: it evicts the least recently *read* key when full, and a read moves a key to the
back; here the eviction order must depend only on what we inserted (accepted), never on what peers make us look
up (a peer that re-sends a copy would otherwise keep its entry alive and choose which entries are evicted first).
It also drops a key at exactly ``ttl`` seconds, where this set keeps it until ``ttl`` has passed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

__all__ = ["OwnerFairSet", "ReplayMemory", "TTLSet"]


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


class OwnerFairSet(TTLSet):
    """A bounded set with expiry whose keys each belong to an owner, where a full set evicts from the owner holding
    the most keys (its oldest insertion first), so that many keys of one owner evict that owner's keys, and an
    owner below the fair share ``capacity / owners`` keeps all of its keys.

    Args:
        capacity: most keys kept (int, at least 1).
        ttl: seconds a key lives after its (last) insertion; ``math.inf``: until the capacity evicts it.
        clock: seconds (the clock ``ttl`` is measured on).

    Reads (:meth:`TTLSet.get`) never change any order; re-adding a key counts as inserted now and keeps its owner
    (``owner`` is used for a new key only). Each operation costs O(1) amortized (owners are kept in buckets
    by key count).
    """

    def __init__(self, capacity: int, ttl: float, clock: Callable[[], float]) -> None:
        super().__init__(capacity, ttl, clock)
        self._d: OrderedDict[Any, tuple[float, Any, Any]] = OrderedDict()  # key -> (time, value, owner); by time
        self._owned: dict[Any, OrderedDict[Any, None]] = {}  # owner -> its keys, oldest first
        self._by_count: dict[int, dict[Any, None]] = {}  # key count -> owners holding that many
        self._max = 0

    def _move(self, owner: Any, old: int, new: int) -> None:
        if old:
            bucket = self._by_count[old]
            del bucket[owner]
            if not bucket:
                del self._by_count[old]
        if new:
            self._by_count.setdefault(new, {})[owner] = None
        if new > self._max:
            self._max = new
        while self._max and self._max not in self._by_count:
            self._max -= 1

    def _remove(self, key: Any) -> None:
        _, _, owner = self._d.pop(key)
        keys = self._owned[owner]
        n = len(keys)
        del keys[key]
        if not keys:
            del self._owned[owner]
        self._move(owner, n, n - 1)

    def _expire(self, now: float) -> None:
        while self._d:
            k, (t, _, _) = next(iter(self._d.items()))
            if now - t <= self.ttl:
                break
            self._remove(k)
        while len(self._d) > self.capacity:
            owner = next(iter(self._by_count[self._max]))
            self._remove(next(iter(self._owned[owner])))

    def add(self, key: Any, value: Any = True, owner: Any = None) -> None:
        now = self.clock()
        if key in self._d:
            owner = self._d[key][2]  # a remembered key keeps its owner, whoever adds it again
            self._remove(key)
        keys = self._owned.setdefault(owner, OrderedDict())
        keys[key] = None
        self._move(owner, len(keys) - 1, len(keys))
        self._d[key] = (now, value, owner)
        self._expire(now)

    def owner_of(self, key: Any) -> Any:
        """The owner ``key`` is charged to (None when not remembered)."""
        item = self._d.get(key)
        return None if item is None else item[2]

    def owned(self, owner: Any) -> int:
        """How many keys ``owner`` holds now."""
        return len(self._owned.get(owner, ()))

    def discard(self, key: Any) -> None:
        if key in self._d:
            self._remove(key)

    def clear(self) -> None:
        self._d.clear()
        self._owned.clear()
        self._by_count.clear()
        self._max = 0


class ReplayMemory:
    """The content keys of trees seen (ours, and accepted peers'), in three bounded parts of ``capacity`` keys each.

    Keys of our own trees live in the *own* part (a :class:`TTLSet`: only we add to it); keys of trees from
    established signers in the *established* part and keys of trees from young signers (free keys) in the *young*
    part, each an :class:`OwnerFairSet` where a key is charged to the signer whose tree brought it and a full part
    evicts from the signer holding the most. So a flood of bundles from fresh keys evicts only young keys' memory,
    and in it the flood's own keys first (outside attack: 64 free keys with one 1,024-leaf bundle each emptied the
    one shared memory, after which an honest tree re-signed by another key was fresh again); an established signer
    flooding evicts its own keys, never ours (outside attack: one established key's 129 bundles evicted every own
    and established key of the older two-part memory). A remembered key keeps its owner (outside attack: copies
    re-charged an author's keys to the copier, whose own flood then evicted them) and moves only up, young ->
    established -> own, when such a tree also holds it.

    Three parts rather than one cache: a single LRU or TTL cache (``cachetools``) has one eviction order for all
    keys, and the protection is exactly that lower parts never evict the higher ones.
    """

    def __init__(self, capacity: int, ttl: float, clock: Callable[[], float]) -> None:
        self.own = TTLSet(capacity, ttl, clock)
        self.established = OwnerFairSet(capacity, ttl, clock)
        self.young = OwnerFairSet(capacity, ttl, clock)

    def _part(self, key: Any) -> TTLSet | None:
        for part in (self.own, self.established, self.young):
            if key in part:
                return part
        return None

    def get(self, key: Any, default: Any = None) -> Any:
        for part in (self.own, self.established, self.young):
            v = part.get(key, _MISSING)
            if v is not _MISSING:
                return v
        return default

    def add(self, key: Any, value: Any, young: bool | None = False, owner: Any = None) -> None:
        """Remember ``key`` with ``value``: ``owner`` None and ``young`` False for our own trees; otherwise
        ``owner`` is the signer and ``young`` says whether it is a young signer; ``young`` None keeps the part and
        owner the key is already in (a new key then goes to the established part). A key never moves down a part,
        and a remembered key keeps its owner."""
        parts = (self.young, self.established, self.own)  # lowest first: a key only moves up
        now = self._part(key)
        if young is None:
            wanted = now or self.established
        else:
            wanted = self.own if owner is None and young is False else self.young if young else self.established
        target = max(wanted, now, key=lambda q: -1 if q is None else parts.index(q))
        if now is not None and now is not target:
            first = now.owner_of(key) if isinstance(now, OwnerFairSet) else None
            owner = owner if first is None else first  # a remembered key keeps its first owner
            now.discard(key)
        if isinstance(target, OwnerFairSet):
            target.add(key, value, owner)
        else:
            target.add(key, value)

    def __len__(self) -> int:
        return len(self.own) + len(self.established) + len(self.young)

    def clear(self) -> None:
        for part in (self.own, self.established, self.young):
            part.clear()
