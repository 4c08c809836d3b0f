"""The fetcher thread: read manifest records from the DHT, verify new manifests, fetch announced bodies.

Every ``poll_interval`` seconds :meth:`Fetcher.poll` reads the records of the current and the previous bucket
(all of the last ``swarm.net.read_buckets`` buckets every ``bucket_seconds / 2`` seconds: each DHT read costs
traffic in every replica), known publishers first from their own keys (no flood of the shared keys can hide
them), at most :data:`NEW_OWNERS_PER_POLL` other owners per poll; skips our own; decodes each record (a
malformed record is charged to its owner, whose DHT signature covers it); verifies every new manifest with the
record owner as the expected signer -- at most ``swarm.trust.rate_limit_per_minute`` new manifests per publisher (the
token bucket its bundles use too) -- and hands the candidates to the fair scheduler
(``swarmnode/swarm/scheduler.py``), which decides what starts.

A fetch asks the publisher, then up to ``swarm.net.fetch_relays`` other live peers that may have cached it
(re-serving is the gossip), each try bounded by ``swarm.net.fetch_timeout`` and the publisher's budget, capped at
the announced size. Record addresses are never dialled: fetches go by libp2p PeerID. Bodies are **not** cached
for re-serving before they are verified (the gather does that, ``swarmnode/swarm/gossip.py``).
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from cachetools import Cache, LRUCache

from swarmnode.swarm import wire
from swarmnode.swarm.counters import SwarmCounters
from swarmnode.swarm.dht import SwarmDHT, parse_multiaddr
from swarmnode.swarm.identity import peer_id_from_public_key
from swarmnode.swarm.scheduler import Candidate, FetchScheduler, Pending
from swarmnode.swarm.transport import BundleServer
from swarmnode.swarm.verify import Rejection, Verifier

log = logging.getLogger(__name__)

__all__ = ["Fetcher", "KNOWN_PUBLISHERS_READ", "NEW_OWNERS_PER_POLL", "SHARED_READ_SOFT_BYTES", "MAX_OWNER_KEYS"]

# reads a flood cannot blind: the publishers with earned standing are read from their own publisher keys (at most
# this many, most standing first); of the owners without standing in the shared bucket keys, at most
# NEW_OWNERS_PER_POLL (at random) have their records decoded and manifests verified per poll; a shared read over
# SHARED_READ_SOFT_BYTES makes the next shared reads wait for the full-read cadence (bytes per poll bounded)
KNOWN_PUBLISHERS_READ = 32
NEW_OWNERS_PER_POLL = 16
SHARED_READ_SOFT_BYTES = 256 * 1024
MAX_OWNER_KEYS = 4096
MAX_CONTACTS = 1024


def _peek(cache: LRUCache) -> dict:
    """The entries of ``cache`` without refreshing them (``LRUCache.__getitem__`` would: a read of every entry
    would reorder the cache by insertion and let a flood of new entries evict the ones written last)."""
    return {k: Cache.__getitem__(cache, k) for k in cache}


class Fetcher:
    """Polls the DHT and runs the fetch workers (see the module docstring).

    Args:
        dht / server: the node's :class:`~swarmnode.swarm.dht.SwarmDHT` and
            :class:`~swarmnode.swarm.transport.BundleServer`.
        verifier / vlock: the :class:`~swarmnode.swarm.verify.Verifier` and the lock that serializes it (it is not
            thread-safe; the gather uses it too).
        scheduler: the :class:`~swarmnode.swarm.scheduler.FetchScheduler` (order, limits, states, queue).
        counters: the shared :class:`~swarmnode.swarm.counters.SwarmCounters`.
        reject: ``Rejection -> None``, how a rejected manifest is counted.
        swarm_id / public_key: this swarm and our own key (our records are skipped).
        scfg: ``cfg.swarm`` (its ``net`` section: ``read_buckets``, ``bucket_seconds``, ``dht_timeout``, ``fetch_timeout``).
        poll_interval: seconds between polls; fetch_relays: ``swarm.net.fetch_relays``; max_bundle_bytes: the body cap.
        max_concurrent_fetches: fetch worker threads.
    """

    def __init__(self, dht: SwarmDHT, server: BundleServer, verifier: Verifier, vlock: threading.Lock,
                 scheduler: FetchScheduler, counters: SwarmCounters, reject: Callable[[Rejection], None], *,
                 swarm_id: str, public_key: bytes, scfg: Any, poll_interval: float, fetch_relays: int,
                 max_bundle_bytes: int, max_concurrent_fetches: int) -> None:
        self.dht, self.server, self.verifier, self.vlock = dht, server, verifier, vlock
        self.peers = verifier.peers
        self.scheduler, self.counters, self.reject = scheduler, counters, reject
        self.swarm_id, self.public_key, self.scfg = swarm_id, public_key, scfg
        self.poll_interval = float(poll_interval)
        self.fetch_relays = int(fetch_relays)
        self.max_bundle_bytes = int(max_bundle_bytes)
        self.full_read_every = max(1, round(scfg.net.bucket_seconds / (2 * self.poll_interval)))
        self.lock = threading.Lock()  # contacts, owner keys, the last shared read's size
        # owner -> (libp2p PeerID, seen (monotonic)); the newest record refreshes an owner, reads do not (_peek)
        self.contacts: LRUCache = LRUCache(maxsize=MAX_CONTACTS)
        # record owner's peer id -> its public key, least recently seen first. Not an LRUCache: the known-publisher
        # ranking reads every entry each poll, and its ties follow this order, which only writes may change
        self.owner_keys: OrderedDict[str, bytes] = OrderedDict()
        self.last_shared_bytes = 0  # bytes the last read of the shared bucket keys returned
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=max_concurrent_fetches, thread_name_prefix="swarm-fetch")
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the fetcher thread (a poll every ``poll_interval`` seconds)."""
        self.thread = threading.Thread(target=self._loop, name="swarm-fetcher", daemon=True)
        self.thread.start()

    def close(self, timeout: float) -> None:
        """Stop the thread (joined for at most ``timeout`` s) and cancel queued fetches."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=timeout)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self.stop.wait(self.poll_interval):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - the thread must survive everything
                log.exception("swarm poll failed")

    # ------------------------------------------------------------------ polling
    def poll(self) -> int:
        """One fetcher step: read recent manifest records, verify new manifests, start fetches.

        Returns:
            The number of fetches started.
        """
        if not self.dht.is_alive:
            return 0
        # new manifests land in the current bucket (or the previous one, stored late): those two are read every
        # poll; all ``read_buckets`` only every ``full_read_every`` polls (a DHT read costs N^2 traffic)
        buckets = self.dht.recent_buckets(self.scfg.net.read_buckets)
        with self.lock:
            full = self.counters.get("polls") % self.full_read_every == 0
            shared = full or self.last_shared_bytes <= SHARED_READ_SOFT_BYTES
        if not full:
            buckets = buckets[-2:]
        known = self.known_publishers()
        entries = self.dht.read_publishers(self.swarm_id, known, timeout=self.scfg.net.dht_timeout) if known else []
        shared_entries = (self.dht.read_manifests(self.swarm_id, buckets, timeout=self.scfg.net.dht_timeout)
                          if shared else [])
        now = self.scheduler.clock()
        self.counters.add("polls")
        self.counters.add("known_publisher_records", len(entries))
        if shared:
            with self.lock:
                self.last_shared_bytes = sum(len(v) for _, v in shared_entries)
        else:
            self.counters.add("shared_reads_skipped")
        self.counters.add("dht_read_bytes", sum(len(v) for _, v in entries) + sum(len(v) for _, v in shared_entries))
        entries = self.poll_entries(entries, shared_entries, set(known))
        candidates: list[Candidate] = []
        for owner, value in entries:
            if owner == self.public_key:
                continue
            owner_id = peer_id_from_public_key(owner)
            with self.lock:
                self.owner_keys[owner_id] = owner
                self.owner_keys.move_to_end(owner_id)
                while len(self.owner_keys) > MAX_OWNER_KEYS:
                    self.owner_keys.popitem(last=False)
            if self.peers.is_banned(owner_id):  # no work and no state for a banned key's records
                continue
            try:
                rec = wire.decode_manifest_record(value)
            except wire.WireError as e:
                if self.scheduler.mark(hashlib.sha256(value).digest()):
                    self.peers.record_reject(owner_id, e.reason, True, f"manifest record: {e.detail}")
                    self.counters.reject(e.reason)
                continue
            self.note_contact(owner_id, rec)
            for menv in rec.manifests:
                c = self._candidate(menv, owner, owner_id, now)
                if c is not None:
                    candidates.append(c)
        sched = self.scheduler
        candidates = sched.one_per_digest(candidates, now)
        sched.new_step(force=False)
        started = 0
        waiting: list[Candidate] = []
        for c in sched.fair_order(candidates):
            res = self.start_fetch(*c, extra=False)
            if res is None:
                break  # closing
            if res == "wait":
                waiting.append(c)
            started += res == "started"
        # work-conserving: spare workers go to publishers over their turn (concurrency or budget), but never the
        # last worker, so a publisher within its turn that shows up next finds one free at once
        for c in waiting:
            if sched.spare_taken():
                break
            res = self.start_fetch(*c, extra=True)
            if res is None:
                break
            started += res == "started"
        return started

    def _candidate(self, menv: bytes, owner: bytes, owner_id: str, now: float) -> Candidate | None:
        """One announced manifest of a record: None when not due, over its publisher's rate limit (looked at again
        once a token is back, never verified before that; the token taken here pays for the bundle too) or
        rejected; else the verified candidate."""
        sched = self.scheduler
        mdigest = hashlib.sha256(menv).digest()
        due, st = sched.due(mdigest, now)
        if not due:
            return None
        paid = sched.paid_for(owner_id, mdigest)
        if ((st is None or st.state == "limited") and not paid and not self.peers.is_banned(owner_id)
                and not self.peers.allow(owner_id)):
            self.counters.add("manifests_rate_limited")
            sched.set_state(mdigest, "limited", 0, now + 60.0 / max(float(self.peers.rate_limit_per_minute), 1e-3))
            return None
        if not paid:
            sched.note_paid(owner_id, mdigest)
        try:
            with self.vlock:
                manifest = self.verifier.verify_manifest(menv, owner)
        except Rejection as r:
            self.reject(r)
            sched.set_state(mdigest, "done")
            return None
        return manifest, mdigest, owner_id

    def known_publishers(self) -> list[bytes]:
        """Public keys of the publishers with earned standing whose keys we saw, most standing first (at most
        :data:`KNOWN_PUBLISHERS_READ`): read from their own publisher keys every poll."""
        with self.lock:
            owners = list(self.owner_keys.items())
        ranked = [(self.peers.earned(pid), pub) for pid, pub in owners]
        ranked = [(e, pub) for e, pub in ranked if e > 0 and not self.peers.is_banned(peer_id_from_public_key(pub))]
        ranked.sort(key=lambda x: -x[0])
        return [pub for _, pub in ranked[:KNOWN_PUBLISHERS_READ]]

    def poll_entries(self, own: list[tuple[bytes, bytes]], shared: list[tuple[bytes, bytes]],
                     known: set[bytes]) -> list[tuple[bytes, bytes]]:
        """The records one poll looks at: every record of a known publisher (its own key, then the shared keys),
        then those of at most :data:`NEW_OWNERS_PER_POLL` other owners chosen at random (the rest are looked at in
        later polls), so a flood of fresh keys costs the reader a bounded number of decodes and verifications
        per poll and never comes before a publisher with standing. Duplicate (owner, record) pairs are dropped."""
        seen: set[tuple[bytes, bytes]] = set()
        first: list[tuple[bytes, bytes]] = []
        others: dict[bytes, list[tuple[bytes, bytes]]] = {}
        for owner, value in [*own, *shared]:
            if (owner, value) in seen:
                continue
            seen.add((owner, value))
            if owner in known:
                first.append((owner, value))
            else:
                others.setdefault(owner, []).append((owner, value))
        chosen = list(others)
        if len(chosen) > NEW_OWNERS_PER_POLL:
            chosen = random.sample(chosen, NEW_OWNERS_PER_POLL)
            self.counters.add("new_owners_deferred", len(others) - NEW_OWNERS_PER_POLL)
        return first + [e for owner in chosen for e in others[owner]]

    def note_contact(self, owner_id: str, rec: wire.ManifestRecord) -> None:
        """Remember the record owner's libp2p PeerID. The record's ``addrs`` are **never** used for dialling
        (an address in a peer's record can point anywhere): fetches go by PeerID and libp2p routes them to
        addresses it observed itself."""
        try:
            parse_multiaddr(f"/ip4/127.0.0.1/tcp/1/p2p/{rec.libp2p_peer_id}")
        except ValueError:
            return  # not a libp2p PeerID: nothing to fetch from
        with self.lock:
            self.contacts[owner_id] = (rec.libp2p_peer_id, time.monotonic())

    def sources(self, publisher: str) -> list[str]:
        """libp2p PeerIDs to ask: the publisher's first, then up to ``fetch_relays`` other peers seen within the
        read window (who may have cached it)."""
        with self.lock:
            contacts = _peek(self.contacts)
        out = []
        if publisher in contacts:
            out.append(contacts[publisher][0])
        horizon = time.monotonic() - (self.scfg.net.read_buckets + 1) * self.scfg.net.bucket_seconds
        others = [c[0] for p, c in contacts.items() if p != publisher and c[1] >= horizon]
        random.shuffle(others)
        out.extend(others[:self.fetch_relays])
        return out

    # ------------------------------------------------------------------ fetching
    def start_fetch(self, manifest: wire.Manifest, mdigest: bytes, owner_id: str, extra: bool) -> str | None:
        """Start one fetch: ``"started"``, ``"skip"``, ``"wait"`` (see :meth:`FetchScheduler.try_start`) or None
        (the pool is shut down)."""
        res = self.scheduler.try_start(manifest, mdigest, owner_id, extra)
        if res != "started":
            return res
        try:
            self.pool.submit(self.fetch_one, manifest, mdigest, owner_id, extra)
        except RuntimeError:  # the pool is shut down (closing)
            self.scheduler.unstart(manifest, mdigest, owner_id)
            return None
        return "started"

    def fetch_one(self, manifest: wire.Manifest, mdigest: bytes, publisher: str, extra: bool = False) -> None:
        """Fetch one announced body (fetch worker thread); ``extra``: started on spare capacity, so the
        publisher's budget does not stop it (its time is still charged)."""
        sched = self.scheduler
        bdigest = manifest.bundle_digest.hex()
        ok = False
        attempts = 0
        try:
            for libp2p_id in self.sources(publisher):
                if self.stop.is_set():
                    break
                left = float(self.scfg.net.fetch_timeout) if extra else sched.budget_left(publisher)
                if left <= 0:  # this publisher spent its budget for the step: the rest waits for the next one
                    self.counters.add("fetch_over_budget")
                    break
                attempts += 1
                t0 = time.monotonic()
                try:
                    res = self.server.fetch_result(libp2p_id, bdigest, timeout=min(float(self.scfg.net.fetch_timeout),
                                                                                  max(1.0, left)),
                                                   max_bytes=min(manifest.bundle_size, self.max_bundle_bytes),
                                                   cache=False)
                finally:
                    sched.charge(publisher, time.monotonic() - t0)
                self.counters.add(f"fetch/{res.reason}")
                if res.ok and res.body is not None:
                    sched.fetched(Pending(res.body, manifest, f"p2p:{libp2p_id}", time.time(), mdigest, publisher))
                    ok = True
                    break
        except Exception:  # noqa: BLE001
            log.exception("bundle fetch failed")
        finally:
            sched.finish(manifest, mdigest, publisher, ok, attempts)
