"""The fair fetch scheduler: which announced bundle is fetched next, and what happens to it after.

Pure policy and state, no network (the fetcher, ``swarmnode/swarm/fetcher.py``, does the reads and the fetches).
An outside attack motivated each rule (docs/guide/swarm.md, the trust table): future-dated manifests won a
newest-first order, hanging bodies held every fetch worker, and three such keys cut a victim's accepted honest
bundles from 28/28 to 0/27. So :class:`FetchScheduler`

- orders candidates **round-robin across publishers** (:meth:`~FetchScheduler.fair_order`: publishers with
  earned standing first, then the least fetch time this step, then more standing, ties at random; each
  publisher's own newest first, future times clamped to our clock);
- keeps **one manifest per bundle digest** (:meth:`~FetchScheduler.one_per_digest`; copies wait with a growing
  back-off);
- lets at most ``max_fetches_per_publisher`` fetches of one publisher run or wait, of ``max_concurrent_fetches``
  in all, keys without standing together at most half (:meth:`~FetchScheduler.try_start`);
- charges each publisher the seconds its fetches take against a **time budget per step**
  (:meth:`~FetchScheduler.charge`, reset by :meth:`~FetchScheduler.new_step`);
- remembers every manifest's state (``inflight``, ``done``, ``retry``, ``limited``) and each owner's paid
  rate-limit tokens, and bounds the queue of fetched bodies (:meth:`~FetchScheduler.drop_pending`).

Thread-safe (``lock``); the clocks are injectable (``clock``: monotonic seconds, ``wall``: seconds since the
epoch) so the policies are tested with a fake clock (tests/unit/swarm/test_swarm_policies.py).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from typing import Callable

from cachetools import FIFOCache

from swarmnode.swarm import wire
from swarmnode.swarm.counters import SwarmCounters
from swarmnode.swarm.peers import PeerBook

__all__ = ["Candidate", "FetchScheduler", "MState", "Pending", "MSTATE_CAPACITY", "PAID_PER_OWNER", "MAX_PAID_OWNERS"]

MSTATE_CAPACITY = 8192
"""Manifest states (and first-read times) remembered, at most."""
#: Manifests remembered as paid (one rate-limit token each) per owner: more than one owner's records can hold
#: (``read_buckets`` x ``wire.MAX_RECORD_MANIFESTS``); and owners remembered (keys with earned standing kept first).
PAID_PER_OWNER = 256
MAX_PAID_OWNERS = 1024

Candidate = tuple[wire.Manifest, bytes, str]
"""A verified manifest ready to fetch: ``(manifest, manifest digest, owner's peer id)``."""


@dataclass
class Pending:
    """A fetched body waiting for verification by the next gather."""

    body: bytes
    manifest: wire.Manifest
    sender: str
    fetched_at: float
    mdigest: bytes = b""  # the manifest it was fetched for (its state goes back to retry if the body is dropped)
    publisher: str = ""  # the manifest's owner (peer id)


@dataclass
class MState:
    """What we did with one manifest (or record) digest."""

    state: str  # "inflight" | "done" | "retry" (admitted: its token is paid) | "limited" (over the rate limit)
    tries: int = 0
    next_try: float = 0.0
    bundle_digest: bytes = b""  # of a verified manifest in retry: while that digest is in flight under another
    # manifest, poll lets it wait without verifying it again (outside attack F4: thousands of copies waiting on
    # one held digest cost ~1 ms of signature and task checks each, every poll)
    deferrals: int = 0  # polls in a row in which another manifest of the same digest was preferred to this one


class FetchScheduler:
    """Fetch order, per-publisher limits and budgets, manifest states and the queue of fetched bodies.

    Args:
        peers: the :class:`~swarmnode.swarm.peers.PeerBook` (earned standing).
        counters: the shared :class:`~swarmnode.swarm.counters.SwarmCounters` (``dropped_queue_full``,
            ``fetch_gave_up``, ``bytes_fetched``).
        max_concurrent_fetches / max_fetches_per_publisher / fetch_retries: ``swarm.*`` of the same names.
        publisher_budget_s: fetch seconds per publisher per step (``swarm.net.publisher_fetch_budget_seconds``,
            None resolved to ``2 x fetch_timeout`` by the caller).
        max_pending: fetched bodies waiting for verification (``swarm.net.max_pending_bundles``).
        fetch_timeout / bucket_seconds: ``swarm.*`` (s): the budgets reset at most once per ``fetch_timeout`` at
            a gather, or after ``bucket_seconds`` without one.
        clock / wall: monotonic seconds and seconds since the epoch.
    """

    def __init__(self, peers: PeerBook, counters: SwarmCounters, *, max_concurrent_fetches: int,
                 max_fetches_per_publisher: int, fetch_retries: int, publisher_budget_s: float, max_pending: int,
                 fetch_timeout: float, bucket_seconds: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.peers, self.counters = peers, counters
        self.max_concurrent_fetches = int(max_concurrent_fetches)
        self.max_fetches_per_publisher = int(max_fetches_per_publisher)
        self.fetch_retries = int(fetch_retries)
        self.publisher_budget_s = float(publisher_budget_s)
        self.max_pending = int(max_pending)
        self.fetch_timeout, self.bucket_seconds = float(fetch_timeout), float(bucket_seconds)
        self.clock, self.wall = clock, wall
        self.lock = threading.Lock()
        self.pending: deque[Pending] = deque()
        # Not an LRU/TTL cache: some updates move a state to the end and others keep its place (a retry set
        # while a fetch starts or ends keeps it), and eviction is by that order
        self.mstate: OrderedDict[bytes, MState] = OrderedDict()
        # when we first read each manifest (monotonic s): a copy of a bundle can only be announced after its
        # publisher's manifest, so among keys of equal standing the earlier one is fetched. Insert-once, oldest
        # first out: a FIFOCache (reads do not reorder it)
        self.first_seen: FIFOCache = FIFOCache(maxsize=MSTATE_CAPACITY)
        # owner -> manifests it paid for. Not an LRUCache: owners without earned standing are evicted first
        self.paid: OrderedDict[str, OrderedDict[bytes, None]] = OrderedDict()
        self.inflight = 0
        self.inflight_by_pub: Counter[str] = Counter()  # fetches running or queued, per publisher
        self.unearned_inflight: set[str] = set()  # publishers without standing when their fetch started
        self.unearned_slots = max(1, self.max_concurrent_fetches // 2)
        self.spent: Counter[str] = Counter()  # fetch seconds per publisher this step
        self.budget_reset_at = clock()
        self.wanted: set[str] = set()  # bundle digests (hex) in flight or queued

    # ------------------------------------------------------------------ manifest states
    def due(self, mdigest: bytes, now: float) -> tuple[bool, MState | None]:
        """``(look at it now, its state)``: not when done, in flight or not due yet; a ``retry`` whose bundle
        digest is in flight under another manifest waits one more second without being verified again."""
        with self.lock:
            st = self.mstate.get(mdigest)
            if st is not None and (st.state in ("done", "inflight") or now < st.next_try):
                return False, st
            if st is not None and st.state == "retry" and st.bundle_digest.hex() in self.wanted:
                st.next_try = now + 1.0  # its digest is still on its way under another manifest
                return False, st
            return True, st

    def mark(self, digest: bytes) -> bool:
        """Mark a record/manifest digest as judged; True the first time."""
        with self.lock:
            if digest in self.mstate:
                return False
            self.mstate[digest] = MState("done")
            self._trim()
            return True

    def set_state(self, mdigest: bytes, state: str, tries: int = 0, next_try: float = 0.0) -> None:
        """Set a manifest's state (moved to the newest end of the table)."""
        with self.lock:
            self.mstate[mdigest] = MState(state, tries, next_try)
            self.mstate.move_to_end(mdigest)
            self._trim()

    def _trim(self) -> None:
        while len(self.mstate) > MSTATE_CAPACITY:
            self.mstate.popitem(last=False)

    def paid_for(self, owner_id: str, mdigest: bytes) -> bool:
        """True when ``owner_id`` already paid a rate-limit token for this manifest. Kept apart from the manifest
        states, which other keys' floods can push out: a publisher is never charged twice for one manifest."""
        with self.lock:
            return mdigest in self.paid.get(owner_id, ())

    def note_paid(self, owner_id: str, mdigest: bytes) -> None:
        """Remember a paid manifest: at most :data:`PAID_PER_OWNER` per owner (more than it can have live) and
        :data:`MAX_PAID_OWNERS` owners, those without earned standing forgotten first, least recent first."""
        with self.lock:
            mine = self.paid.setdefault(owner_id, OrderedDict())
            mine[mdigest] = None
            while len(mine) > PAID_PER_OWNER:
                mine.popitem(last=False)
            self.paid.move_to_end(owner_id)
            if len(self.paid) <= MAX_PAID_OWNERS:
                return
            owners = list(self.paid)
        unearned = [p for p in owners if self.peers.earned(p) <= 0]
        with self.lock:
            for p in (unearned + owners)[: max(0, len(self.paid) - MAX_PAID_OWNERS)]:
                self.paid.pop(p, None)

    # ------------------------------------------------------------------ order
    def one_per_digest(self, candidates: list[Candidate], now: float) -> list[Candidate]:
        """Keep one manifest per bundle digest, ranked by: its publisher can start a fetch now (under its
        concurrency limit and fetch budget), then the most earned standing, then the manifest we read first (a copy
        can only be announced after the manifest it copies), then at random. The others (copies of a bundle
        re-announced under other keys, their tokens paid) wait in ``retry`` and are looked at again after 2 s,
        twice as long each time they lose again (at most 64 s), so copies cost few verifications while their
        digest waits.

        Without this, fresh copier keys, first in the fair order because they had used no fetch time this step,
        took an established publisher's digest first and held it for a fetch timeout each (outside attack F5: its
        bundles a step late). Standing alone is not enough: a key with more standing that keeps itself over its
        own fetch budget would win every digest it copies and never start the fetch, so the publisher's manifest
        was deferred until it went stale (second attack, HIGH); hence a publisher that can start goes first."""
        best: dict[bytes, tuple[tuple[bool, int, float, float], Candidate]] = {}
        deferred: list[Candidate] = []
        with self.lock:
            busy = {pub for pub, n in self.inflight_by_pub.items() if n >= self.max_fetches_per_publisher}
            busy |= {pub for pub, t in self.spent.items() if t >= self.publisher_budget_s}
            for _, mdigest, _ in candidates:
                if mdigest not in self.first_seen:
                    self.first_seen[mdigest] = now
            seen = {md: self.first_seen[md] for _, md, _ in candidates}
        for c in candidates:
            rank = (c[2] not in busy, self.peers.earned(c[2]), -seen[c[1]], random.random())
            held = best.get(c[0].bundle_digest)
            if held is None or rank > held[0]:
                if held is not None:
                    deferred.append(held[1])
                best[c[0].bundle_digest] = (rank, c)
            else:
                deferred.append(c)
        with self.lock:
            for m, mdigest, _ in deferred:
                # looked at again after 2, 4, 8, ... 64 s: each look verifies it again, and keys may announce
                # thousands of copies of one digest
                prev = self.mstate.get(mdigest)
                n = (prev.deferrals if prev else 0) + 1
                self.mstate[mdigest] = MState("retry", prev.tries if prev else 0, now + 2.0 ** min(n, 6),
                                              m.bundle_digest, n)
                self.mstate.move_to_end(mdigest)
            self._trim()
        return [c for _, c in best.values()]

    def fair_order(self, candidates: list[Candidate]) -> list[Candidate]:
        """Round-robin across publishers: in each round the publishers with earned standing before those without,
        then those that used the least fetch time this step, then more earned standing, ties at random; each
        publisher's own candidates newest first, with times in the future clamped to our clock (a future-dated
        manifest is no newer than one made now)."""
        wall = self.wall()
        by_pub: dict[str, list[Candidate]] = {}
        for c in candidates:
            by_pub.setdefault(c[2], []).append(c)
        for lst in by_pub.values():
            lst.sort(key=lambda c: min(float(c[0].created_at), wall), reverse=True)
        pubs = list(by_pub)
        random.shuffle(pubs)
        with self.lock:
            spent = dict(self.spent)
        # publishers with standing before fresh keys within each round, then the least fetch time this step
        pubs.sort(key=lambda p: (self.peers.earned(p) <= 0, spent.get(p, 0.0), -self.peers.earned(p)))
        out: list[Candidate] = []
        depth = max((len(v) for v in by_pub.values()), default=0)
        for i in range(depth):
            out.extend(by_pub[p][i] for p in pubs if i < len(by_pub[p]))
        return out

    # ------------------------------------------------------------------ starting and ending fetches
    def try_start(self, manifest: wire.Manifest, mdigest: bytes, owner_id: str, extra: bool) -> str:
        """Book one fetch: ``"started"`` (the caller submits it, or calls :meth:`unstart`), ``"skip"`` (already
        wanted, or too many in flight) or ``"wait"`` (the publisher's turn is over: at its concurrency limit or
        over its budget; ``extra`` books it anyway, on spare capacity). Publishers without earned standing
        together hold at most half the fetch workers (at least one)."""
        unearned = self.peers.earned(owner_id) <= 0
        with self.lock:
            prev = self.mstate.get(mdigest)
            tries = prev.tries if prev else 0
            bdigest = manifest.bundle_digest.hex()
            if bdigest in self.wanted:
                # the same digest is on its way under another manifest (maybe a copy by a key whose body hangs or
                # lies): this one (its token is paid) is looked at again once that fetch is over, never given up
                self.mstate[mdigest] = MState("retry", tries, self.clock() + 1.0, manifest.bundle_digest)
                return "skip"
            if self.inflight >= 2 * self.max_concurrent_fetches:  # the rest waits for the next poll
                self.mstate[mdigest] = MState("retry", tries, 0.0, manifest.bundle_digest)
                return "skip"
            if not extra and (self.inflight_by_pub[owner_id] >= self.max_fetches_per_publisher
                              or self.spent[owner_id] >= self.publisher_budget_s):
                self.mstate[mdigest] = MState("retry", tries, 0.0, manifest.bundle_digest)
                return "wait"
            if unearned and sum(n for p, n in self.inflight_by_pub.items()
                                if p in self.unearned_inflight) >= self.unearned_slots:
                # keys without standing share half the fetch workers: the rest is always free for known publishers
                self.mstate[mdigest] = MState("retry", tries, self.clock() + 1.0, manifest.bundle_digest)
                return "skip"
            if unearned:
                self.unearned_inflight.add(owner_id)
            self.wanted.add(bdigest)
            self.mstate[mdigest] = MState("inflight", tries)
            self.mstate.move_to_end(mdigest)
            self._trim()
            self.inflight += 1
            self.inflight_by_pub[owner_id] += 1
        return "started"

    def unstart(self, manifest: wire.Manifest, mdigest: bytes, owner_id: str) -> None:
        """Undo :meth:`try_start` for a fetch that could not be submitted (closing): back to ``retry``."""
        with self.lock:
            prev = self.mstate.get(mdigest)
            self.inflight -= 1
            self.inflight_by_pub[owner_id] -= 1
            self.wanted.discard(manifest.bundle_digest.hex())
            self.mstate[mdigest] = MState("retry", prev.tries if prev else 0, 0.0, manifest.bundle_digest)

    def spare_taken(self) -> bool:
        """Whether all workers but one are busy: the spare capacity over publishers' turns is used up (the last
        worker stays free, so a publisher within its turn that shows up next finds one at once)."""
        with self.lock:
            return self.inflight >= max(1, self.max_concurrent_fetches - 1)

    def fetched(self, item: Pending) -> None:
        """A fetched body arrives: queued for the next gather (the full queue drops one first), manifest done."""
        with self.lock:
            if len(self.pending) >= self.max_pending:
                self.drop_pending()
            self.pending.append(item)
            self.counters.add("bytes_fetched", len(item.body))
            prev = self.mstate.get(item.mdigest)
            self.mstate[item.mdigest] = MState("done", (prev.tries if prev else 0) + 1)

    def finish(self, manifest: wire.Manifest, mdigest: bytes, publisher: str, ok: bool, attempts: int) -> None:
        """A fetch is over (``ok``: its body was queued by :meth:`fetched`; ``attempts``: sources asked). Failed:
        never tried (over budget, closing) -> ``retry`` at once; tried ``fetch_retries`` times -> ``done``
        (``fetch_gave_up``); else ``retry`` after ``2 ** tries`` s."""
        bdigest = manifest.bundle_digest.hex()
        with self.lock:
            self.inflight -= 1
            self.inflight_by_pub[publisher] -= 1
            if self.inflight_by_pub[publisher] <= 0:
                del self.inflight_by_pub[publisher]
                self.unearned_inflight.discard(publisher)
            # on success "done" was set with the queued body (and "retry" again if it has been dropped since)
            if not ok:
                self.wanted.discard(bdigest)
                prev = self.mstate.get(mdigest)
                tries = (prev.tries if prev else 0) + (1 if attempts else 0)
                if not attempts:  # never tried (over budget / closing): not the publisher's failure
                    self.mstate[mdigest] = MState("retry", tries, 0.0, manifest.bundle_digest)
                elif tries >= self.fetch_retries:
                    self.mstate[mdigest] = MState("done", tries)
                    self.counters.add("fetch_gave_up")
                else:
                    self.mstate[mdigest] = MState("retry", tries, self.clock() + 2.0 ** tries,
                                                  manifest.bundle_digest)

    def drop_pending(self) -> None:
        """Make room in the full queue of fetched bodies (caller holds ``lock``): the oldest body of the publisher
        holding the most places goes (ties: the least earned standing), so a flood of many small bundles drops its
        own bodies, not an honest publisher's one; its manifest goes back to ``retry`` (its rate-limit token is
        paid), never given up."""
        held = Counter(p.publisher for p in self.pending)
        worst = max(held, key=lambda pub: (held[pub], -self.peers.earned(pub)))  # ties: the least standing
        victim = next(p for p in self.pending if p.publisher == worst)
        self.pending.remove(victim)
        self.wanted.discard(victim.manifest.bundle_digest.hex())
        self.counters.add("dropped_queue_full")
        if victim.mdigest:
            prev = self.mstate.get(victim.mdigest)
            self.mstate[victim.mdigest] = MState("retry", prev.tries if prev else 0, self.clock() + 2.0,
                                                 victim.manifest.bundle_digest)

    # ------------------------------------------------------------------ budgets and the queue
    def new_step(self, force: bool = False) -> None:
        """Reset the per-publisher fetch budgets: at a gather (``force``) at most once per ``fetch_timeout``, or
        from the fetcher when no gather came for ``bucket_seconds``."""
        now = self.clock()
        with self.lock:
            gap = now - self.budget_reset_at
            if (force and gap >= self.fetch_timeout) or gap >= self.bucket_seconds:
                self.spent.clear()
                self.budget_reset_at = now

    def budget_left(self, publisher: str) -> float:
        """Fetch seconds ``publisher`` has left this step (<= 0: over budget)."""
        with self.lock:
            return self.publisher_budget_s - self.spent[publisher]

    def charge(self, publisher: str, seconds: float) -> None:
        """Charge ``seconds`` of fetching to ``publisher``'s budget of this step."""
        with self.lock:
            self.spent[publisher] += seconds

    def take_pending(self) -> list[Pending]:
        """Empty the queue of fetched bodies; returns them, oldest first."""
        with self.lock:
            items = list(self.pending)
            self.pending.clear()
            return items

    def put_back(self, items: list[Pending]) -> None:
        """Return unverified bodies to the front of the queue (in order)."""
        with self.lock:
            self.pending.extendleft(reversed(items))

    def done_with(self, bundle_digest: bytes) -> None:
        """A queued body was verified (or refused): its digest is no longer wanted."""
        with self.lock:
            self.wanted.discard(bundle_digest.hex())

    def first_read(self, mdigest: bytes) -> float | None:
        """When we first read this manifest (monotonic s), or None."""
        with self.lock:
            return self.first_seen.get(mdigest) if mdigest else None

    def pending_count(self) -> int:
        """Fetched bodies waiting for the next gather."""
        with self.lock:
            return len(self.pending)
