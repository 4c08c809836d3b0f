"""Per-peer accounting: accepted / rejected counters, reputation, bans and rate limits (docs/reference/design.md §6 step 7).

Every item a peer sends ends in exactly one verdict, recorded here by the verification pipeline
(:mod:`swarmnode.swarm.verify`): :meth:`PeerBook.record_accept` or :meth:`PeerBook.record_reject` with a
reason code and a ``hard`` flag. ``swarmnode peers``, the status endpoint and Prometheus read
:meth:`PeerBook.snapshot` (RL Swarm #253 #312 #267: peers could not see why they were "not on the
leaderboard"; here every rejection is counted by reason, per peer).

Peer ids
--------
Plain strings. After a signature verifies, the verifier uses the signer's printable peer id
(``identity.peer_id_from_public_key``, ``"sn1…"``); bytes that cannot be attributed to a key (no valid
signature yet) are charged to the transport-level sender id when the caller knows it, else to
:data:`UNATTRIBUTED`, a shared bucket that is rate limited but never banned (banning it would block every
unattributed input, including honest ones).

Hard and soft rejections
------------------------
*Hard* rejections are provable misbehaviour of the charged peer (a forged signature, a signed body that
violates the schema, a claimed reward that our re-score contradicts, a task outside the swarm's set, …);
*soft* ones can happen to an honest peer (a stale or duplicate bundle, clock skew, an unsupported protocol
version, an oversize bundle under our lower byte cap). Which reason is which is decided by the caller;
:data:`HARD_REASONS` / :data:`SOFT_REASONS` in :mod:`swarmnode.swarm.verify` document the verifier's choice.

Reputation
----------
``reputation = (a + 1) / (a + 2 + 5·h + s)`` in (0, 1), where ``a``, ``h`` and ``s`` are the peer's
accepted items, hard rejections and soft rejections, each **exponentially decayed** with half-life
``decay_half_life`` seconds (``x ← x · 2^(-Δt / half_life)`` applied lazily on every update and read).
The ``+1`` / ``+2`` are a Beta(1, 1) (Laplace) prior: an unknown peer scores 0.5, a peer with only accepted
items tends to 1, one hard rejection weighs as much as five soft ones. The reputation is for ranking and
display; bans are decided by the strike count below, not by the reputation.

Bans
----
Each hard rejection is a *strike*. At ``ban_after`` strikes the peer is banned for ``ban_seconds``
(``clock()`` seconds); the strikes reset, so after the ban expires it takes another ``ban_after`` hard
rejections to ban it again. While banned, :meth:`allow` returns False and the verifier drops the peer's
input before decoding it. :data:`UNATTRIBUTED` is never banned.

Rate limit
----------
A token bucket per peer (capacity ``burst``, default one minute's worth, refilled at
``rate_limit_per_minute / 60`` tokens per second). :meth:`allow` takes one token and is meant to be called
before any decoding work; a refusal is counted under ``rate_limited`` but does not touch the reputation.

Earned standing (Sybil resistance)
----------------------------------
Keys are free to mint, so a fresh key must not get the share of an established one (an outside attack:
four fresh keys took all four external slots). :meth:`PeerBook.record_earned` counts the *useful* trees of
a peer: trees the node trained on (accepted by the verifier, admitted, selected within the token budget,
kept by the likelihood screen and the share cap), with reward variance under our own re-score
(``SwarmClient.credit`` in ``swarmnode/swarm/gossip.py``, called by ``swarmnode/node/loop.py`` after the update).
:meth:`PeerBook.tree_cap` turns that record into a per-step cap, ``min(ceiling, base + earned // per)``, and
:meth:`PeerBook.is_young` tells keys with fewer than ``established_after`` earned trees apart (the swarm layer caps the trees of all young keys together
per step). Since only trained trees earn, and admission is itself capped per step, standing grows with
time and kept work, not with the number of keys. A hard rejection resets the earned record to 0; a tree the
trainer rejects (the likelihood screen) takes one earned tree back (:meth:`PeerBook.record_unearned`), so a key
whose junk is screened every step keeps no standing.

Bounded memory
--------------
Peer ids are free to mint (Sybils), so at most ``max_peers`` peers are tracked; beyond that the peer
seen least recently that is neither banned nor holding earned standing is forgotten (a flood of fresh
keys cannot erase the standing of established peers). Logging of rejections and bans goes through
:class:`LogLimiter` so a flood cannot flood the logs (hivemind #439: log floods on disconnect).

Thread safety: every public method takes one internal lock.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger(__name__)

__all__ = ["UNATTRIBUTED", "PeerBook", "PeerRecord", "LogLimiter", "HARD_WEIGHT"]

UNATTRIBUTED = "-"
"""Peer id charged for input that cannot be attributed to any peer (no sender, no valid signature)."""

HARD_WEIGHT = 5.0
"""Weight of a hard rejection relative to a soft one in the reputation formula."""


class LogLimiter:
    """A token bucket for log lines: at most ``per_minute`` lines per minute (bursts up to that many).

    Suppressed lines are counted; the next line that gets through says how many were suppressed.

    Args:
        per_minute: lines allowed per minute (> 0).
        clock: time source in seconds (``time.monotonic`` by default).
    """

    def __init__(self, per_minute: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not per_minute > 0:
            raise ValueError(f"per_minute must be > 0, got {per_minute!r}")
        self.capacity = float(per_minute)
        self.rate = float(per_minute) / 60.0
        self.clock = clock
        self.tokens = float(per_minute)
        self.last = clock()
        self.suppressed = 0

    def log(self, logger: logging.Logger, level: int, msg: str, *args: object) -> bool:
        """Emit ``msg % args`` at ``level`` if the bucket has a token; returns whether it was emitted."""
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + max(0.0, now - self.last) * self.rate)
        self.last = now
        if self.tokens < 1.0:
            self.suppressed += 1
            return False
        self.tokens -= 1.0
        if self.suppressed:
            msg = msg + " (%d similar log lines suppressed)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        logger.log(level, msg, *args)
        return True


#: Units one peer may owe for moved authorship (:meth:`PeerBook.record_moved`); older debts are forgotten.
MAX_OWED = 256


@dataclass
class PeerRecord:
    """Everything the book keeps about one peer.

    Attributes:
        accepted: items accepted in total (never decays).
        rejected: rejections by reason in total (never decays), e.g. ``{"stale": 2, "reward_mismatch": 1}``.
        hard / soft: hard and soft rejections in total.
        rate_limited: inputs refused by the rate limit.
        refused_banned: inputs refused because the peer was banned.
        strikes: hard rejections since the last ban.
        bans: number of bans so far.
        banned_until: ``clock()`` time the current ban ends (0.0: not banned).
        dec_accepted / dec_hard / dec_soft: the decayed counters of the reputation formula.
        decay_time: ``clock()`` time the decayed counters were last brought up to date.
        tokens / token_time: the rate-limit bucket and when it was last refilled.
        first_seen / last_seen: ``clock()`` times.
        earned: useful trees trained on (:meth:`PeerBook.record_earned`); reset by a hard rejection.
        owed: units this peer owes for trees whose authorship moved while it had no standing to give
            (:meth:`PeerBook.record_moved`): the winner of each (None: a dispute, the unit is dropped), oldest
            first, at most :data:`MAX_OWED`; its next earned units pay them.
    """

    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    hard: int = 0
    soft: int = 0
    rate_limited: int = 0
    refused_banned: int = 0
    strikes: int = 0
    bans: int = 0
    banned_until: float = 0.0
    dec_accepted: float = 0.0
    dec_hard: float = 0.0
    dec_soft: float = 0.0
    decay_time: float = 0.0
    tokens: float = 0.0
    token_time: float = 0.0
    first_seen: float = 0.0
    last_seen: float = 0.0
    earned: int = 0
    owed: list = field(default_factory=list)


class PeerBook:
    """Per-peer counters, reputation, bans and rate limits (see the module docstring for the formulas).

    Args:
        ban_after: hard rejections (strikes) that ban a peer (int >= 1; ``swarm.trust.ban_after``).
        ban_seconds: length of a ban in ``clock()`` seconds (> 0; ``swarm.trust.ban_seconds``).
        rate_limit_per_minute: bundles a peer may send per minute on average (> 0).
        clock: time source in seconds (``time.time`` by default; tests pass a fake clock).
        burst: capacity of the rate-limit bucket; default ``rate_limit_per_minute`` (one minute's worth).
        decay_half_life: half-life in seconds of the reputation counters (> 0).
        max_peers: most peers tracked at once (>= 1); the least recently seen non-banned peer is forgotten.
        log_per_minute: most rejection/ban log lines per minute (each kind has its own budget).

    Raises:
        ValueError: an argument out of range.
    """

    def __init__(
        self,
        ban_after: int = 3,
        ban_seconds: float = 600.0,
        rate_limit_per_minute: float = 120.0,
        clock: Callable[[], float] = time.time,
        *,
        burst: float | None = None,
        decay_half_life: float = 3600.0,
        max_peers: int = 10_000,
        log_per_minute: float = 30.0,
    ) -> None:
        if isinstance(ban_after, bool) or not isinstance(ban_after, int) or ban_after < 1:
            raise ValueError(f"ban_after must be an int >= 1, got {ban_after!r}")
        for name, v in (("ban_seconds", ban_seconds), ("rate_limit_per_minute", rate_limit_per_minute),
                        ("decay_half_life", decay_half_life)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        if burst is not None and not (math.isfinite(burst) and burst >= 1):
            raise ValueError(f"burst must be >= 1, got {burst!r}")
        if isinstance(max_peers, bool) or not isinstance(max_peers, int) or max_peers < 1:
            raise ValueError(f"max_peers must be an int >= 1, got {max_peers!r}")
        self.ban_after = ban_after
        self.ban_seconds = float(ban_seconds)
        self.rate_limit_per_minute = float(rate_limit_per_minute)
        self.burst = float(burst) if burst is not None else max(1.0, float(rate_limit_per_minute))
        self.decay_half_life = float(decay_half_life)
        self.max_peers = max_peers
        self.clock = clock
        self._peers: OrderedDict[str, PeerRecord] = OrderedDict()
        self._lock = threading.Lock()
        self._reject_log = LogLimiter(log_per_minute)
        self._ban_log = LogLimiter(log_per_minute)
        self.forgotten = 0
        self.totals: dict[str, int] = {"accepted": 0, "hard": 0, "soft": 0, "rate_limited": 0, "refused_banned": 0,
                                       "bans": 0}
        self.rejected_by_reason: dict[str, int] = {}

    # ------------------------------------------------------------------ internals
    def _get(self, peer: str, now: float) -> PeerRecord:
        if not isinstance(peer, str):
            peer = str(peer)
        rec = self._peers.get(peer)
        if rec is None:
            rec = PeerRecord(tokens=self.burst, token_time=now, decay_time=now, first_seen=now, last_seen=now)
            self._peers[peer] = rec
            if len(self._peers) > self.max_peers:
                self._evict(keep=peer, now=now)
        else:
            self._peers.move_to_end(peer)
            rec.last_seen = now
        return rec

    def _evict(self, keep: str, now: float) -> None:
        # oldest first; banned peers are kept so a Sybil flood cannot unban them, and peers with earned
        # standing are kept so that a flood of fresh keys cannot erase it (they go only when nothing else can)
        for spare_earned in (True, False):
            for pid in list(self._peers):
                if len(self._peers) <= self.max_peers:
                    break
                if pid == keep:
                    continue
                rec = self._peers[pid]
                if rec.banned_until > now or (spare_earned and rec.earned > 0):
                    continue
                del self._peers[pid]
                self.forgotten += 1
        while len(self._peers) > self.max_peers:  # everyone is banned: forget the oldest ban
            pid = next(p for p in self._peers if p != keep)
            del self._peers[pid]
            self.forgotten += 1

    def _decay(self, rec: PeerRecord, now: float) -> None:
        dt = now - rec.decay_time
        if dt > 0:
            f = 0.5 ** (dt / self.decay_half_life)
            rec.dec_accepted *= f
            rec.dec_hard *= f
            rec.dec_soft *= f
            rec.decay_time = now

    def _reputation(self, rec: PeerRecord) -> float:
        return (rec.dec_accepted + 1.0) / (rec.dec_accepted + 2.0 + HARD_WEIGHT * rec.dec_hard + rec.dec_soft)

    @staticmethod
    def _is_banned(peer: str, rec: PeerRecord, now: float) -> bool:
        return peer != UNATTRIBUTED and rec.banned_until > now

    # ------------------------------------------------------------------ queries
    def allow(self, peer: str) -> bool:
        """May ``peer`` send one more item now? Call before any decoding work.

        Returns False (and counts it) when the peer is banned or its rate-limit bucket is empty; otherwise
        takes one token and returns True. A banned peer's input costs no token.
        """
        with self._lock:
            now = self.clock()
            rec = self._get(peer, now)
            if self._is_banned(peer, rec, now):
                rec.refused_banned += 1
                self.totals["refused_banned"] += 1
                return False
            rec.tokens = min(self.burst, rec.tokens + max(0.0, now - rec.token_time) * self.rate_limit_per_minute / 60.0)
            rec.token_time = now
            if rec.tokens < 1.0:
                rec.rate_limited += 1
                self.totals["rate_limited"] += 1
                self._reject_log.log(log, logging.WARNING, "rate limit: dropped input from peer %s (%.0f/min)",
                                     peer, self.rate_limit_per_minute)
                return False
            rec.tokens -= 1.0
            return True

    def is_banned(self, peer: str) -> bool:
        """True while ``peer`` is banned (no token is taken, nothing is counted)."""
        with self._lock:
            rec = self._peers.get(peer)
            return rec is not None and self._is_banned(peer, rec, self.clock())

    def banned(self) -> list[str]:
        """Peer ids banned right now, sorted."""
        with self._lock:
            now = self.clock()
            return sorted(p for p, r in self._peers.items() if self._is_banned(p, r, now))

    def reputation(self, peer: str) -> float:
        """``(a + 1) / (a + 2 + 5·h + s)`` with decayed counters; 0.5 for an unknown peer."""
        with self._lock:
            rec = self._peers.get(peer)
            if rec is None:
                return 0.5
            self._decay(rec, self.clock())
            return self._reputation(rec)

    def __contains__(self, peer: object) -> bool:
        with self._lock:
            return peer in self._peers

    def __len__(self) -> int:
        with self._lock:
            return len(self._peers)

    # ------------------------------------------------------------------ verdicts
    def record_accept(self, peer: str, n: int = 1) -> None:
        """Count ``n`` accepted items (e.g. trees) from ``peer``."""
        if n <= 0:
            return
        with self._lock:
            now = self.clock()
            rec = self._get(peer, now)
            self._decay(rec, now)
            rec.accepted += n
            rec.dec_accepted += n
            self.totals["accepted"] += n

    def record_reject(self, peer: str, reason: str, hard: bool, detail: str = "") -> bool:
        """Count one rejection of ``peer``'s input under ``reason``; ban the peer on its ``ban_after``-th strike.

        Args:
            peer: the charged peer id.
            reason: reason code (e.g. ``"reward_mismatch"``; see ``verify.REASONS``).
            hard: True for provable misbehaviour (a strike), False otherwise.
            detail: human-readable detail for the log line.

        Returns:
            True when this rejection banned the peer.
        """
        reason = str(reason)
        with self._lock:
            now = self.clock()
            rec = self._get(peer, now)
            self._decay(rec, now)
            rec.rejected[reason] = rec.rejected.get(reason, 0) + 1
            self.rejected_by_reason[reason] = self.rejected_by_reason.get(reason, 0) + 1
            if hard and peer != UNATTRIBUTED:
                rec.earned = 0  # provable misbehaviour costs the standing a key has earned
            if hard:
                rec.hard += 1
                rec.dec_hard += 1.0
                self.totals["hard"] += 1
            else:
                rec.soft += 1
                rec.dec_soft += 1.0
                self.totals["soft"] += 1
            self._reject_log.log(log, logging.WARNING if hard else logging.INFO,
                                 "rejected input from peer %s: %s (%s)%s", peer, reason, "hard" if hard else "soft",
                                 f": {detail[:200]}" if detail else "")
            if not hard or peer == UNATTRIBUTED:
                return False
            rec.strikes += 1
            if rec.strikes < self.ban_after:
                return False
            rec.strikes = 0
            rec.bans += 1
            rec.banned_until = now + self.ban_seconds
            self.totals["bans"] += 1
            self._ban_log.log(log, logging.WARNING, "banned peer %s for %.0f s after %d hard rejections (last: %s)",
                              peer, self.ban_seconds, self.ban_after, reason)
            return True

    def record_earned(self, peer: str, n: int = 1) -> None:
        """Count ``n`` useful trees of ``peer`` trained on (its earned standing, see the module
        docstring). Non-positive ``n`` is ignored."""
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            return
        with self._lock:
            rec = self._get(peer, self.clock())
            while n and rec.owed:  # pay what it owes first: those units were its trees' authors'
                winner = rec.owed.pop(0)
                n -= 1
                if winner is not None:
                    self._get(winner, self.clock()).earned += 1
            rec.earned += n

    def record_moved(self, loser: str, winner: str | None) -> None:
        """One tree's authorship moved from ``loser`` to ``winner`` (None: disputed, no one keeps it): one unit
        of ``loser``'s earned standing goes to ``winner``. A unit is never made: when ``loser`` has none (the
        copy's credit is still to come, or it never earned), the unit is owed and its next earned unit pays it
        (:attr:`PeerRecord.owed`), so claiming a key at 0 gives the claimant nothing until that key earns."""
        with self._lock:
            rec = self._get(loser, self.clock())
            if rec.earned >= 1:
                rec.earned -= 1
                if winner is not None:
                    self._get(winner, self.clock()).earned += 1
            else:
                rec.owed.append(winner)
                del rec.owed[:-MAX_OWED]

    def record_unearned(self, peer: str, n: int = 1) -> int:
        """Take back ``n`` earned trees of ``peer`` (never below 0): the trainer rejected ``n`` of its samples
        (e.g. the likelihood screen), or another key took a tree's authorship. Non-positive ``n`` is ignored.

        Returns:
            the units actually taken (0 to ``n``: fewer when ``peer`` had fewer)."""
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            return 0
        with self._lock:
            rec = self._peers.get(peer)
            if rec is None:
                return 0
            taken = min(n, rec.earned)
            rec.earned -= taken
            return taken

    def earned(self, peer: str) -> int:
        """Useful trees of ``peer`` trained on so far (0 for an unknown peer); reset by a hard rejection."""
        with self._lock:
            rec = self._peers.get(peer)
            return 0 if rec is None else rec.earned

    def is_young(self, peer: str, established_after: int) -> bool:
        """True while ``peer`` has earned fewer than ``established_after`` useful trees (an unknown peer is young;
        ``established_after <= 0`` makes every peer established)."""
        return self.earned(peer) < established_after

    def tree_cap(self, peer: str, *, base: int, per: int, ceiling: int) -> int:
        """Trees of ``peer`` the swarm layer may admit in one step: ``min(ceiling, base + earned // per)``.

        Args:
            base: a fresh key's cap (int >= 0).
            per: earned trees per extra tree of cap (int >= 1).
            ceiling: the most any key gets (int >= base).

        Raises:
            ValueError: ``per < 1``, ``base < 0`` or ``ceiling < base``.
        """
        if per < 1 or base < 0 or ceiling < base:
            raise ValueError(f"need per >= 1, base >= 0 and ceiling >= base; got per={per!r}, base={base!r}, "
                             f"ceiling={ceiling!r}")
        return min(int(ceiling), int(base) + self.earned(peer) // int(per))

    def unban(self, peer: str) -> None:
        """Lift ``peer``'s ban now (operator action); strikes are reset."""
        with self._lock:
            rec = self._peers.get(peer)
            if rec is not None:
                rec.banned_until = 0.0
                rec.strikes = 0

    # ------------------------------------------------------------------ reporting
    def snapshot(self) -> dict:
        """A JSON-ready view for metrics and ``swarmnode peers``.

        Returns:
            ``{"peers": {peer_id: {"accepted", "rejected": {reason: n}, "hard", "soft", "rate_limited",
            "refused_banned", "strikes", "bans", "banned", "ban_remaining_s", "reputation", "first_seen",
            "last_seen", "earned"}}, "banned": [peer ids], "totals": {"accepted", "hard", "soft", "rate_limited",
            "refused_banned", "bans"}, "rejected_by_reason": {reason: n}, "tracked": int, "forgotten": int}``.
            Times are ``clock()`` seconds.
        """
        with self._lock:
            now = self.clock()
            peers = {}
            for pid, rec in self._peers.items():
                self._decay(rec, now)
                banned = self._is_banned(pid, rec, now)
                peers[pid] = {
                    "accepted": rec.accepted,
                    "rejected": dict(sorted(rec.rejected.items())),
                    "hard": rec.hard,
                    "soft": rec.soft,
                    "rate_limited": rec.rate_limited,
                    "refused_banned": rec.refused_banned,
                    "strikes": rec.strikes,
                    "bans": rec.bans,
                    "banned": banned,
                    "ban_remaining_s": max(0.0, rec.banned_until - now) if banned else 0.0,
                    "reputation": self._reputation(rec),
                    "first_seen": rec.first_seen,
                    "last_seen": rec.last_seen,
                    "earned": rec.earned,
                }
            return {
                "peers": peers,
                "banned": sorted(p for p, v in peers.items() if v["banned"]),
                "totals": dict(self.totals),
                "rejected_by_reason": dict(sorted(self.rejected_by_reason.items())),
                "tracked": len(self._peers),
                "forgotten": self.forgotten,
            }
