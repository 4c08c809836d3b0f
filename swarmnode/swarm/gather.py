"""The gather: verify the fetched bodies on the caller's thread, admit their trees, report the step's metrics.

Runs on the node's main thread (``SwarmClient.gather``), where the scorers' ``SIGALRM`` time limits work: drains
the scheduler's queue of fetched bodies and verifies each (``Verifier.verify_bundle``: signature, manifest,
freshness, tasks, **every leaf re-scored**) for at most ``gather_budget_s`` seconds -- waits for the verifier
(busy on the fetcher thread) included; the rest waits for the next step. An accepted body is put into our
``BundleServer`` so others can fetch it from us (re-serving is the gossip); its trees pass the per-key caps of
:class:`~swarmnode.swarm.admission.Admission`, and the verifier's authorship changes move standing
(:func:`~swarmnode.swarm.admission.move_authorship`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.swarm.admission import Admission, move_authorship
from swarmnode.swarm.counters import SwarmCounters
from swarmnode.swarm.rates import HeartbeatBook
from swarmnode.swarm.scheduler import FetchScheduler
from swarmnode.swarm.transport import BundleServer
from swarmnode.swarm.verify import Rejection, Verifier

log = logging.getLogger(__name__)

__all__ = ["AcceptedBundle", "Gatherer"]


@dataclass
class AcceptedBundle:
    """One bundle accepted by ``SwarmClient.gather`` (for benchmarks and tests).

    Attributes:
        digest: hex SHA-256 of the bundle envelope.
        publisher: the signer's peer id (``sn1…``).
        created_at: the bundle's signed creation time (s since the epoch).
        fetched_at / accepted_at: when the body arrived / was accepted here (s since the epoch).
        size: envelope bytes.
        num_trees / num_leaves: accepted trees and their leaves.
        sender: transport id the body came from (``p2p:<libp2p PeerID>``).
    """

    digest: str
    publisher: str
    created_at: float
    fetched_at: float
    accepted_at: float
    size: int
    num_trees: int
    num_leaves: int
    sender: str


class Gatherer:
    """Verifies queued bodies within a time budget and admits their trees (see the module docstring).

    Args:
        verifier / vlock: the :class:`~swarmnode.swarm.verify.Verifier` and its lock (shared with the fetcher).
        server: the :class:`~swarmnode.swarm.transport.BundleServer` (accepted bodies are re-served).
        scheduler: the :class:`~swarmnode.swarm.scheduler.FetchScheduler` (the queue; budgets reset per step).
        admission: the :class:`~swarmnode.swarm.admission.Admission` (per-key caps).
        book / counters: the heartbeat counters and the shared counters.
        reject: ``(Rejection, num_leaves) -> None``, how a refused body is counted.
        gauges: ``() -> dict`` of the DHT's gauges for the metrics.
        gather_budget_s: seconds one gather verifies at most.
        on_accept: optional ``(AcceptedBundle) -> None`` per accepted bundle (its exceptions are logged).
    """

    def __init__(self, verifier: Verifier, vlock: threading.Lock, server: BundleServer, scheduler: FetchScheduler,
                 admission: Admission, book: HeartbeatBook, counters: SwarmCounters,
                 reject: Callable[[Rejection, int], None], gauges: Callable[[], dict[str, Any]], *,
                 gather_budget_s: float, on_accept: Callable[[AcceptedBundle], None] | None = None) -> None:
        self.verifier, self.vlock, self.server, self.scheduler = verifier, vlock, server, scheduler
        self.admission, self.book, self.counters, self.reject, self.gauges = admission, book, counters, reject, gauges
        self.gather_budget_s = float(gather_budget_s)
        self.on_accept = on_accept
        self.accepted: deque[AcceptedBundle] = deque(maxlen=4096)

    def gather(self) -> tuple[list[PeerTree], dict[str, Any]]:
        """One step's gather: the admitted :class:`PeerTree` s and the metrics (``SwarmClient.gather_verified``).

        A step boundary for the swarm layer: the per-publisher fetch budgets start afresh (at most once per
        ``fetch_timeout``). Never raises on hostile input; rejected input is counted, never returned."""
        t0 = time.monotonic()
        sched = self.scheduler
        sched.new_step(force=True)
        items = sched.take_pending()
        out: list[PeerTree] = []
        received = retok = 0
        latencies: list[float] = []
        for k, item in enumerate(items):
            left = self.gather_budget_s - (time.monotonic() - t0)
            # the verifier is shared with the fetcher thread: wait for it within the budget only, never unbounded
            if left < 0 or not self.vlock.acquire(timeout=max(left, 0.0)):
                sched.put_back(items[k:])  # the rest waits for the next step
                break
            received += 1
            try:
                committed = sched.first_read(item.mdigest)
                try:
                    vts = self.verifier.verify_bundle(item.body, item.manifest, item.sender,
                                                      received_at=item.fetched_at, prepaid=True,
                                                      committed_at=committed)
                finally:
                    changes = self.verifier.take_authorship_changes()
                    self.vlock.release()
                    move_authorship(self.verifier.peers, changes, self.counters.add)
            except Rejection as r:
                self.reject(r, item.manifest.num_leaves)
                continue
            finally:
                sched.done_with(item.manifest.bundle_digest)
            try:
                self.server.put(item.body)  # re-serve what we verified: this is the gossip
            except ValueError:
                pass
            now = time.time()
            n_leaves = sum(len(v.tree.leaves()) for v in vts)
            self.counters.add("bundles_accepted")
            self.book.add(accepted=n_leaves)
            latencies.append(max(0.0, now - item.manifest.created_at))
            acc = AcceptedBundle(item.manifest.bundle_digest.hex(), vts[0].peer_id, item.manifest.created_at,
                                 item.fetched_at, now, len(item.body), len(vts), n_leaves, item.sender)
            self.accepted.append(acc)
            if self.on_accept is not None:
                try:
                    self.on_accept(acc)
                except Exception:  # noqa: BLE001
                    log.exception("on_accept callback failed")
            retok += sum(1 for v in vts if not v.same_tokenizer)
            out.extend(vts)
        out, young, capped = self.admission.admit(out, {r.key() for r in self.book.rescue_refs()})
        self.counters.add("bundles_received", received)
        pending = sched.pending_count()
        rejected = self.counters.rejected_deltas()
        m: dict[str, Any] = self.counters.deltas(["bundles_received", "bundles_accepted", "dropped_queue_full",
                                                  "fetch_gave_up", "bytes_fetched", "manifests_rate_limited"])
        m.update(rejected)
        m.update(self.gauges())
        m.update({
            "swarm/pending": pending,
            "swarm/external_trees": len(out),
            "swarm/young_trees": young,
            "swarm/trees_capped": capped,
            "swarm/trees_carried": len(self.admission.carry),
            "swarm/retokenized_trees": retok,
            "swarm/gather_s": time.monotonic() - t0,
        })
        if latencies:
            latencies.sort()
            m["swarm/latency_p50_s"] = latencies[len(latencies) // 2]
            m["swarm/latency_max_s"] = latencies[-1]
        return out, m
