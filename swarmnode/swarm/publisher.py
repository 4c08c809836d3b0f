"""Publishing: pruned subtrees into signed bundles, manifest records, heartbeats, and the publisher thread.

Publish (main thread, :meth:`Publisher.publish`, CPU only)
    prune every tree (:func:`~swarmnode.swarm.prune.prune_trees`; trees without reward variance are not
    published) -> ``wire.bundle_from_trees`` -> sign and encode (split into several bundles when one would
    exceed ``swarm.trust.max_bundle_bytes``) -> ``BundleServer.put`` (peers fetch the body from us) ->
    ``wire.manifest_for_bundle`` -> signed manifest appended to this time bucket's **manifest record**
    (protocol/SPEC.md §11: our newest manifests of the bucket plus our libp2p contact).

Publisher thread (:meth:`Publisher.step`)
    stores the record of every changed bucket under ``{swarm}:manifests:{bucket}`` in our own subkey
    (``SwarmDHT.publish_manifest``, bounded by ``swarm.net.dht_timeout``), retries failed stores every second,
    re-stores after a DHT restart or after joining a swarm, and publishes a signed heartbeat every
    ``heartbeat_interval`` seconds (:class:`~swarmnode.swarm.rates.HeartbeatBook` builds it); with the
    curriculum or rescue on it also reads the swarm's heartbeats on that cadence (the shared key, and the own
    heartbeat keys of the peers with earned standing).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from swarmnode.rollout.tree import RolloutTree
from swarmnode.swarm import wire
from swarmnode.swarm.counters import SwarmCounters
from swarmnode.swarm.dht import SwarmDHT
from swarmnode.swarm.identity import Identity
from swarmnode.swarm.prune import PruneRule, prune_tree, prune_trees
from swarmnode.swarm.rates import HeartbeatBook, fitting_heartbeat
from swarmnode.swarm.transport import BundleServer
from swarmnode.swarm.verify import Verifier

log = logging.getLogger(__name__)

__all__ = ["Publisher", "flat_subtree"]


def flat_subtree(tree: RolloutTree, max_leaves: int) -> RolloutTree | None:
    """The subtree of ``tree``'s first ``max_leaves`` scored leaves of distinct completion text (node order), for a
    rescue answer without reward contrast; ``None`` when no leaf is scored."""
    kept: list[int] = []
    seen: set[str] = set()
    for lid in tree.leaves():
        n = tree.nodes[lid]
        if n.reward is None or not math.isfinite(float(n.reward)) or n.finish_reason in (None, "pruned"):
            continue
        text = tree.completion_text(lid)
        if text in seen:
            continue
        seen.add(text)
        kept.append(lid)
        if len(kept) >= max_leaves:
            break
    return tree.subtree(kept) if kept else None


class Publisher:
    """Our bundles, our manifest records (one per time bucket) and our heartbeats (see the module docstring).

    Args:
        dht / server: the node's :class:`~swarmnode.swarm.dht.SwarmDHT` and
            :class:`~swarmnode.swarm.transport.BundleServer`.
        verifier / vlock: the :class:`~swarmnode.swarm.verify.Verifier` (told what we published, so an echo of
            our own rollouts is a replay) and its lock.
        identity: our signing :class:`~swarmnode.swarm.identity.Identity`.
        book: the :class:`~swarmnode.swarm.rates.HeartbeatBook` (our heartbeat's fields; peers' rates).
        counters: the shared :class:`~swarmnode.swarm.counters.SwarmCounters`.
        write_info: called after joining a swarm (our contact changed): rewrites ``swarm.json``.
        swarm_id / vocab_size / model_id / tokenizer_id: the bundle header.
        prune: the :class:`~swarmnode.swarm.prune.PruneRule`.
        scfg: ``cfg.swarm`` (its ``net`` section: ``read_buckets``, ``dht_timeout``).
        heartbeat_interval: seconds between heartbeats; max_bundle_bytes: the envelope cap.
        known_peers: the public keys whose heartbeats are also read from their own heartbeat keys (the
            fetcher's publishers with earned standing), so a flood of the shared key cannot hide their
            curriculum rates and rescue requests.
    """

    def __init__(self, dht: SwarmDHT, server: BundleServer, verifier: Verifier, vlock: threading.Lock,
                 identity: Identity, book: HeartbeatBook, counters: SwarmCounters, write_info: Callable[[], None], *,
                 swarm_id: str, vocab_size: int, model_id: str, tokenizer_id: str, prune: PruneRule, scfg: Any,
                 heartbeat_interval: float, max_bundle_bytes: int,
                 known_peers: Callable[[], Sequence[bytes]] = tuple) -> None:
        self.dht, self.server, self.verifier, self.vlock = dht, server, verifier, vlock
        self.identity, self.book, self.counters, self.write_info = identity, book, counters, write_info
        self.swarm_id, self.vocab_size, self.model_id, self.tokenizer_id = swarm_id, vocab_size, model_id, tokenizer_id
        self.prune_rule, self.scfg = prune, scfg
        self.heartbeat_interval = float(heartbeat_interval)
        self.max_bundle_bytes = int(max_bundle_bytes)
        self.known_peers = known_peers
        self.lock = threading.Lock()  # outbox and dirty buckets
        self.outbox: dict[int, list[bytes]] = {}  # bucket -> our signed manifests (newest last)
        self.dirty: set[int] = set()  # buckets whose record must be stored (again)
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.last_hb = -math.inf
        self.last_rates_read = -math.inf
        self.was_connected = False
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------------ main thread
    def publish(self, trees: list[RolloutTree], step: int, policy_version: int) -> dict[str, Any]:
        """Prune, sign and announce ``trees`` (see ``SwarmClient.publish``); returns metrics."""
        t0 = time.perf_counter()
        rewards = [float(t.nodes[i].reward) for t in trees for i in t.leaves() if t.nodes[i].reward is not None]
        self.book.note_step(step, rewards)
        pruned, pst = prune_trees(trees, self.prune_rule)
        m: dict[str, Any] = pst.as_metrics()
        n_trees, n_leaves, n_bytes, n_manifest_bytes = self.publish_pruned(pruned, int(policy_version))
        m.update(self.counters.deltas(["bundles_published", "publish_errors"]))
        m.update({"swarm/published_trees": n_trees, "swarm/published_leaves": n_leaves,
                  "swarm/published_bytes": n_bytes, "swarm/manifest_bytes": n_manifest_bytes,
                  "swarm/publish_s": time.perf_counter() - t0})
        return m

    def publish_rescue(self, trees: list[RolloutTree], policy_version: int) -> dict[str, Any]:
        """Publish answers to rescue requests (see ``SwarmClient.publish_rescue``): a tree without reward contrast
        keeps its first ``max_leaves`` leaves of distinct text instead of being dropped."""
        pruned: list[RolloutTree] = []
        for t in trees:
            p = prune_tree(t, self.prune_rule)
            if p is None:
                p = flat_subtree(t, self.prune_rule.max_leaves)
            if p is not None:
                pruned.append(p)
        n_trees, n_leaves, n_bytes, _ = self.publish_pruned(pruned, int(policy_version))
        return {"rescue/published_trees": n_trees, "rescue/published_leaves": n_leaves,
                "rescue/published_bytes": n_bytes}

    def publish_pruned(self, pruned: list[RolloutTree], policy_version: int) -> tuple[int, int, int, int]:
        """Sign, serve and announce already pruned trees; returns (trees, leaves, bundle bytes, manifest bytes)."""
        n_bytes = n_manifest_bytes = n_leaves = n_trees = 0
        now = time.time()
        for envelope, bundle in self.bundles(pruned, int(policy_version), now):
            self.server.put(envelope)
            with self.vlock:  # an echo of our own rollouts is a duplicate / replay, never an external sample
                self.verifier.note_published(envelope, bundle)
            manifest = wire.manifest_for_bundle(envelope, bundle)
            menv = wire.encode_manifest(manifest, self.identity)
            bucket = self.dht.current_bucket(bundle.created_at)
            with self.lock:
                box = self.outbox.setdefault(bucket, [])
                box.append(menv)
                del box[:-wire.MAX_RECORD_MANIFESTS]
                self.dirty.add(bucket)
                for old in [b for b in self.outbox if b <= bucket - self.scfg.net.read_buckets - 1]:
                    del self.outbox[old]
                    self.dirty.discard(old)
            self.counters.add("bundles_published")
            self.book.add(published=bundle.num_leaves())
            n_bytes += len(envelope)
            n_manifest_bytes += len(menv)
            n_leaves += bundle.num_leaves()
            n_trees += len(bundle.trees)
        if n_trees:
            self.wake.set()
        return n_trees, n_leaves, n_bytes, n_manifest_bytes

    def bundles(self, trees: list[RolloutTree], policy_version: int,
                now: float) -> list[tuple[bytes, wire.RolloutBundle]]:
        """Encode ``trees`` into signed bundles, each within the byte and tree caps (split in halves as needed); a
        tree the codec refuses is dropped and counted (``publish_errors``)."""
        out: list[tuple[bytes, wire.RolloutBundle]] = []
        todo = [trees[i:i + wire.MAX_TREES_PER_BUNDLE] for i in range(0, len(trees), wire.MAX_TREES_PER_BUNDLE)]
        while todo:
            chunk = todo.pop(0)
            if not chunk:
                continue
            bundle = wire.bundle_from_trees(chunk, swarm_id=self.swarm_id, publisher_key=self.identity.public_key_bytes,
                                            vocab_size=self.vocab_size, model_id=self.model_id,
                                            tokenizer_id=self.tokenizer_id, policy_version=policy_version,
                                            created_at=now)
            try:
                envelope = wire.encode_bundle(bundle, self.identity)
            except wire.WireError as e:
                if e.reason == "too_large" and len(chunk) > 1:
                    half = len(chunk) // 2
                    todo[:0] = [chunk[:half], chunk[half:]]
                    continue
                if len(chunk) > 1:  # find the offending tree(s): encode one by one
                    todo[:0] = [[t] for t in chunk]
                    continue
                self.counters.add("publish_errors")
                log.warning("not publishing a tree of task %s: %s", chunk[0].task.key(), e)
                continue
            if len(envelope) > self.max_bundle_bytes:
                if len(chunk) > 1:
                    half = len(chunk) // 2
                    todo[:0] = [chunk[:half], chunk[half:]]
                else:
                    self.counters.add("publish_errors")
                    log.warning("not publishing a tree of task %s: %d bytes exceed swarm.trust.max_bundle_bytes=%d",
                                chunk[0].task.key(), len(envelope), self.max_bundle_bytes)
                continue
            out.append((envelope, bundle))
        return out

    # ------------------------------------------------------------------ publisher thread
    def start(self) -> None:
        """Start the publisher thread (a step at each wake-up, at least every second)."""
        self.thread = threading.Thread(target=self._loop, name="swarm-publisher", daemon=True)
        self.thread.start()

    def close(self, timeout: float) -> None:
        """Stop the thread (joined for at most ``timeout`` s)."""
        self.stop.set()
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout=timeout)

    def after_restart(self) -> None:
        """The DHT restarted: every record is stored again, ``swarm.json`` rewritten, a heartbeat sent at once."""
        with self.lock:
            self.dirty.update(self.outbox)
        self.last_hb = -math.inf
        self.write_info()
        self.wake.set()

    def record_bytes(self, bucket: int) -> bytes | None:
        """Our encoded manifest record of ``bucket`` (the oldest manifests dropped until it fits), or None."""
        contact = self.dht.contact()
        if contact is None:
            return None
        with self.lock:
            manifests = list(self.outbox.get(bucket, []))
        maddrs = [m for m in contact.maddrs if len(m.encode()) <= wire.MAX_ID_BYTES][: wire.MAX_RECORD_ADDRS]
        while manifests:
            try:
                return wire.encode_manifest_record(wire.ManifestRecord(manifests, contact.peer_id, maddrs))
            except wire.WireError as e:
                if e.reason != "too_large":
                    log.error("cannot encode our manifest record: %s", e)
                    return None
                manifests = manifests[1:]  # drop the oldest until it fits
        return None

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.wake.wait(1.0)
            self.wake.clear()
            if self.stop.is_set():
                break
            try:
                self.step()
            except Exception:  # noqa: BLE001 - the thread must survive everything
                log.exception("swarm publisher step failed")

    def step(self) -> None:
        """One publisher step: store changed records, a heartbeat when due, read peers' heartbeats when due."""
        connected = self.dht.connected
        if connected and not self.was_connected:  # just joined: our solo-stored records live only with us
            with self.lock:
                self.dirty.update(self.outbox)
            self.write_info()
        self.was_connected = connected
        with self.lock:
            dirty = sorted(self.dirty)
            newest = max(self.outbox, default=None)
        for bucket in dirty:
            data = self.record_bytes(bucket)
            if data is None:
                continue
            ok = self.dht.publish_manifest(self.swarm_id, bucket, data, timeout=self.scfg.net.dht_timeout,
                                           own_key=bucket == newest)
            if ok:
                with self.lock:
                    self.dirty.discard(bucket)
                self.counters.add("records_stored")
                self.counters.add("record_bytes", len(data))
            else:
                self.counters.add("record_store_failures")
        if time.monotonic() - self.last_hb >= self.heartbeat_interval:
            data = fitting_heartbeat(self.book.heartbeat(self.model_id), self.identity)
            if data is not None and self.dht.publish_heartbeat(self.swarm_id, data, timeout=self.scfg.net.dht_timeout):
                self.last_hb = time.monotonic()
        if ((self.book.curriculum_enabled or self.book.rescue_enabled)
                and time.monotonic() - self.last_rates_read >= self.heartbeat_interval):
            self.last_rates_read = time.monotonic()
            self.book.note_peer_rates(self.dht.read_heartbeats(self.swarm_id, timeout=self.scfg.net.dht_timeout,
                                                               known=self.known_peers()))
