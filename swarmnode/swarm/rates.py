"""The heartbeat side of the swarm layer: what our signed heartbeats say, and what peers' heartbeats ask of us.

:class:`HeartbeatBook` owns both halves (protocol/SPEC.md §5.3):

- ours: step, reward mean, held-out accuracy, sample counters, and -- when the curriculum or rescue is on --
  our per-task success counts (``rates``) and the questions we got all wrong (``rescue``), built into a signed
  :class:`~swarmnode.swarm.wire.Heartbeat` by :meth:`HeartbeatBook.heartbeat` (the publisher thread stores it);
- theirs: each peer's newest valid rates and rescue requests (:meth:`HeartbeatBook.note_peer_rates`), read
  every ``heartbeat_interval`` seconds. Nothing a peer says is trusted: the curriculum
  (``swarmnode/tasks/curriculum.py``) and the rescue helper (``swarmnode/train/rescue.py``) decide what to do
  with it. A flood of fresh keys evicts fresh keys, never a peer with earned standing.

Clocks are injectable (``clock``: monotonic seconds, ``wall``: seconds since the epoch) so the policies are tested
with a fake clock (tests/unit/swarm/test_swarm_policies.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Sequence

from swarmnode.swarm import wire
from swarmnode.swarm.identity import Identity, peer_id_from_public_key
from swarmnode.swarm.info import heartbeat_time_ok
from swarmnode.swarm.peers import PeerBook
from swarmnode.tasks.base import TaskRef

log = logging.getLogger(__name__)

__all__ = ["HeartbeatBook", "RescueRequest", "MAX_RATE_PEERS", "MAX_UNEARNED_RATE_PEERS", "fitting_heartbeat"]

#: Most peers whose curriculum rates are kept, and of them the most without earned standing (fresh keys).
MAX_RATE_PEERS = 1024
MAX_UNEARNED_RATE_PEERS = 64


class RescueRequest(tuple):
    """One question a peer asks to be answered (``SwarmClient.rescue_requests``): the pair ``(peer_id, ref)``,
    plus ``standing``, the asker's earned standing in our PeerBook when the list was made (int >= 0)."""

    def __new__(cls, peer_id: str, ref: TaskRef, standing: int = 0) -> "RescueRequest":
        obj = super().__new__(cls, (peer_id, ref))
        obj.standing = int(standing)
        return obj

    @property
    def peer_id(self) -> str:
        return self[0]

    @property
    def ref(self) -> TaskRef:
        return self[1]


def fitting_heartbeat(beat: wire.Heartbeat, identity: Identity) -> bytes | None:
    """``beat`` encoded and signed; when it exceeds ``wire.MAX_HEARTBEAT_BYTES``, rescue refs are dropped from the
    end (then the key) until it fits. ``None`` (logged) when even that fails."""
    while True:
        try:
            return wire.encode_heartbeat(beat, identity)
        except wire.WireError as e:
            if e.reason != "too_large" or not beat.rescue:
                log.error("cannot encode our heartbeat: %s", e)
                return None
            beat.rescue = beat.rescue[:-1] or None


class HeartbeatBook:
    """Our heartbeat's fields and the peers' newest valid rates and rescue requests (thread-safe).

    Args:
        swarm_id / peer_id: this swarm and our own peer id (our own heartbeats are skipped).
        peers: the :class:`~swarmnode.swarm.peers.PeerBook` (earned standing orders eviction; banned peers are
            left out of what we return).
        allowed: ``public key bytes -> bool``, the swarm's allowlist (a private swarm counts only its members).
        max_clock_skew / freshness_seconds: the swarm's time checks (s), as for manifests.
        curriculum / rescue: ``levers.curriculum.enabled`` / ``levers.rescue.enabled``.
        max_rescue_requests: ``levers.rescue.max_requests`` (refs we announce at most).
        clock / wall: monotonic seconds and seconds since the epoch.
    """

    def __init__(self, swarm_id: str, peer_id: str, peers: PeerBook, allowed: Callable[[bytes], bool], *,
                 max_clock_skew: float, freshness_seconds: float, curriculum: bool = False, rescue: bool = False,
                 max_rescue_requests: int = wire.MAX_RESCUE_REFS, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.swarm_id, self.peer_id, self.peers, self.allowed = swarm_id, peer_id, peers, allowed
        self.max_clock_skew, self.freshness_seconds = float(max_clock_skew), float(freshness_seconds)
        self.curriculum_enabled, self.rescue_enabled = bool(curriculum), bool(rescue)
        self.max_rescue_requests = int(max_rescue_requests)
        self.clock, self.wall = clock, wall
        self._lock = threading.Lock()
        self._hb: dict[str, Any] = {"step": 0, "reward_mean": None, "accuracy": None, "npub": 0, "nacc": 0, "nrej": 0,
                                    "rates": None, "rescue": None}
        # peer -> (signed time, first seen (monotonic), rates); evicts unearned keys first, so not a plain LRU map
        self.peer_rates: OrderedDict[str, tuple[float, float, dict]] = OrderedDict()
        # peer -> (signed time, first seen (monotonic), TaskRefs it asks for); bounded like peer_rates
        self.peer_rescue: OrderedDict[str, tuple[float, float, list[TaskRef]]] = OrderedDict()

    # ------------------------------------------------------------------ ours
    def note_step(self, step: int, rewards: Sequence[float]) -> None:
        """The step we just published (heartbeats say ``step + 1``) and its leaf rewards (their mean, clamped to
        ``[0, wire.MAX_REWARD]``, or None without rewards)."""
        with self._lock:
            self._hb["step"] = int(step) + 1
            self._hb["reward_mean"] = (min(max(sum(rewards) / len(rewards), 0.0), wire.MAX_REWARD)
                                       if rewards else None)

    def add(self, published: int = 0, accepted: int = 0, rejected: int = 0) -> None:
        """Add leaves to the heartbeat's ``samples_published`` / ``_accepted`` / ``_rejected`` counters."""
        with self._lock:
            self._hb["npub"] += published
            self._hb["nacc"] += accepted
            self._hb["nrej"] += rejected

    def note_accuracy(self, accuracy: float | None) -> None:
        """Record the last held-out accuracy in [0, 1] for the next heartbeats (anything else is ignored)."""
        if accuracy is None or (isinstance(accuracy, (int, float)) and 0.0 <= accuracy <= 1.0):
            with self._lock:
                self._hb["accuracy"] = None if accuracy is None else float(accuracy)

    def share_task_rates(self, rates: dict[str, tuple[int, int]] | None) -> None:
        """Our per-task success counts (task key -> ``(n, k)``) for the next heartbeats; entries the codec would
        refuse are left out (see ``SwarmClient.share_task_rates``). Never raises."""
        clean: dict[str, tuple[int, int]] = {}
        for key, v in (rates or {}).items():
            try:
                n, k = int(v[0]), int(v[1])
            except (TypeError, ValueError, IndexError, OverflowError):
                continue
            if (isinstance(key, str) and 0 < len(key.encode("utf-8")) <= wire.MAX_TASK_KEY_BYTES
                    and 1 <= n <= wire.MAX_RATE_COUNT and 0 <= k <= n):
                clean[key] = (n, k)
            if len(clean) >= wire.MAX_RATE_TASKS:
                break
        with self._lock:
            self._hb["rates"] = clean or None

    def announce_rescue(self, refs: Sequence[TaskRef] | None) -> None:
        """The questions we got all wrong, for our next heartbeats (see ``SwarmClient.announce_rescue``): at most
        ``max_rescue_requests`` distinct TaskRefs the receiver's codec accepts, the first ones given. Never
        raises."""
        limit = min(wire.MAX_RESCUE_REFS, self.max_rescue_requests)
        clean: list[TaskRef] = []
        for r in refs or []:
            if not isinstance(r, TaskRef) or r in clean:
                continue
            try:
                wire._task_ref(wire._enc_task(r, "rescue"), "rescue")  # the receiver's bounds
            except wire.WireError:
                continue
            clean.append(r)
            if len(clean) >= limit:
                break
        with self._lock:
            self._hb["rescue"] = clean or None

    def rescue_refs(self) -> list[TaskRef]:
        """The TaskRefs our heartbeats announce now (empty with rescue off)."""
        with self._lock:
            return list(self._hb["rescue"] or []) if self.rescue_enabled else []

    def heartbeat(self, model_id: str) -> wire.Heartbeat:
        """Our heartbeat as of now (unsigned; :func:`fitting_heartbeat` signs it within the size cap)."""
        with self._lock:
            hb = dict(self._hb)
        return wire.Heartbeat(swarm_id=self.swarm_id, peer_id=self.peer_id, model_id=model_id[:256],
                              step=hb["step"], reward_mean=hb["reward_mean"], accuracy=hb["accuracy"],
                              samples_published=hb["npub"], samples_accepted=hb["nacc"],
                              samples_rejected=hb["nrej"], created_at=self.wall(),
                              task_rates=hb["rates"] if self.curriculum_enabled else None,
                              rescue=list(hb["rescue"] or []) or None if self.rescue_enabled else None)

    # ------------------------------------------------------------------ theirs
    def peer_task_rates(self) -> list[Any]:
        """The peers' newest valid per-task success counts as ``swarmnode.tasks.curriculum.PeerRates`` (one per
        peer; ``age_s`` from when WE first read the heartbeat, never younger than its signed age less the skew;
        banned peers left out). Never raises."""
        from swarmnode.tasks.curriculum import PeerRates

        now, now_wall = self.clock(), self.wall()
        with self._lock:
            items = list(self.peer_rates.items())
        out = []
        for pid, (t, seen, rates) in items:
            if self.peers.is_banned(pid):
                continue
            # our clock decides; the signed time can only make a rate older (a heartbeat read again after an
            # eviction is no fresher than it is), never younger
            age = max(now - seen, now_wall - t - self.max_clock_skew)
            out.append(PeerRates(peer_id=pid, rates=dict(rates), age_s=age, standing=self.peers.earned(pid)))
        return out

    def rescue_requests(self) -> list[RescueRequest]:
        """The questions peers ask us to answer (rescue on only): one :class:`RescueRequest` per ref, with the
        asker's earned standing; banned askers and heartbeats older than ``freshness_seconds`` (from when WE
        first read them, or their signed time less the skew) are left out. Never raises."""
        if not self.rescue_enabled:
            return []
        now, now_wall = self.clock(), self.wall()
        with self._lock:
            items = list(self.peer_rescue.items())
        out: list[RescueRequest] = []
        for pid, (t, seen, refs) in items:
            if (self.peers.is_banned(pid)
                    or max(now - seen, now_wall - t - self.max_clock_skew) > self.freshness_seconds):
                continue
            standing = self.peers.earned(pid)
            out.extend(RescueRequest(pid, r, standing) for r in refs)
        return out

    def note_peer_rates(self, entries: Sequence[tuple[bytes, bytes]]) -> None:
        """Keep each peer's newest valid curriculum rates and rescue requests from heartbeat records (untrusted).

        Args:
            entries: ``[(publisher public key, heartbeat envelope bytes)]`` as
                :meth:`swarmnode.swarm.dht.SwarmDHT.read_heartbeats` returns them; anything that does not decode,
                verify, match its owner key and this swarm, or pass the time checks is skipped.

        Peers with earned standing are read first and kept first: at most :data:`MAX_RATE_PEERS` peers are
        kept, of which at most :data:`MAX_UNEARNED_RATE_PEERS` without standing (the least recently updated
        go first), so a flood of fresh keys evicts fresh keys, never a peer with standing. Never raises."""
        now_wall, now = self.wall(), self.clock()
        salt = os.urandom(8)

        def read_order(entry: tuple[bytes, bytes]) -> tuple[bool, bytes]:
            try:
                pid = peer_id_from_public_key(bytes(entry[0]))
            except Exception:  # noqa: BLE001 - a malformed owner key sorts last
                return (True, b"")
            return (self.peers.earned(pid) <= 0, hashlib.blake2b(pid.encode(), key=salt).digest())

        entries = sorted((e for e in entries if isinstance(e, tuple) and len(e) == 2), key=read_order)[:4096]
        for owner, value in entries:
            try:
                env, hb = wire.decode(value, expected_kind=wire.KIND_HEARTBEAT)
            except wire.WireError:
                continue
            if (env.public_key != owner or not isinstance(hb, wire.Heartbeat) or hb.swarm_id != self.swarm_id
                    or hb.peer_id == self.peer_id):
                continue
            if not (hb.task_rates or (self.rescue_enabled and (hb.rescue or hb.peer_id in self.peer_rescue))):
                continue
            if not heartbeat_time_ok(hb.created_at, now_wall, self.max_clock_skew, self.freshness_seconds):
                continue
            if not self.allowed(env.public_key):  # a private swarm counts only its members
                continue
            with self._lock:
                prev = self.peer_rates.get(hb.peer_id)
                if hb.task_rates and (prev is None or prev[0] < hb.created_at):
                    self.peer_rates[hb.peer_id] = (hb.created_at, now, dict(hb.task_rates))
                    self.peer_rates.move_to_end(hb.peer_id)
                prev_r = self.peer_rescue.get(hb.peer_id)
                if self.rescue_enabled and (prev_r is None or prev_r[0] < hb.created_at):
                    if hb.rescue:
                        self.peer_rescue[hb.peer_id] = (hb.created_at, now, list(hb.rescue))
                        self.peer_rescue.move_to_end(hb.peer_id)
                    else:  # a newer heartbeat without the key: the peer asks for nothing now
                        self.peer_rescue.pop(hb.peer_id, None)
        for book in (self.peer_rates, self.peer_rescue):
            with self._lock:
                held = list(book)
            unearned = [p for p in held if self.peers.earned(p) <= 0]  # least recently updated first
            with self._lock:
                for p in unearned[: max(0, len(unearned) - MAX_UNEARNED_RATE_PEERS)]:
                    book.pop(p, None)
                while len(book) > MAX_RATE_PEERS:
                    book.popitem(last=False)
