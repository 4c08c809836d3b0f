"""Fair turns among peers without standing: the peer that has waited longest goes first.

Two places hand out scarce slots to peers that have earned nothing yet, and both use :class:`TurnQueue`:

- admission (``swarm/admission.py``): the young-key pool, ``swarm.trust.max_young_trees`` trees a step;
- the rescue helper (``train/rescue.py``): the answers to askers below ``levers.rescue.min_standing``,
  ``levers.rescue.young_answers`` a step.

Why a queue and not "never served first" or a random pick: outside attacks minted fresh keys every step. With
"never served first" two fresh keys a step took both young slots and an honest newcomer was admitted 1 step in 12
(an honest young asker answered once in 24 steps); with standing as the order, keys with one copied earned tree
each took the slots every step. Here a peer's place is the turn it was last served or, never served, the turn it
first waited, so a key minted this turn queues behind everyone already waiting, and nothing a peer sends moves it
ahead.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from typing import Iterable

__all__ = ["TurnQueue"]


class TurnQueue:
    """Whose turn it is among peers competing for a few slots a turn (young keys, young askers).

    A peer's place is ``(turn it was last served, 1)`` or, never served, ``(turn it first waited, 0)``: lower goes
    first, so a peer that has waited since turn ``t`` goes ahead of one served at ``t``; ties in a salted order
    (blake2b keyed by a per-queue random salt) a peer id cannot be ground for. Turns are the caller's counter
    (admission rounds, training steps): ints that do not decrease.

    Bounded whatever peers send: at most ``max_peers`` served peers remembered (the least recently served are
    forgotten first; one that comes back waits again from then) and at most ``max_peers`` waiting peers. When the
    waiting map is full, the waiter seen least recently that is not competing this turn is forgotten to make room,
    so keys that waited once and went away (a flood that stopped) cannot keep a later newcomer from being
    remembered; when every remembered waiter is competing this turn, the newcomer is not remembered and takes the
    back of the queue (its place is the current turn).

    Args:
        max_peers: how many served and how many waiting peers are remembered (>= 1).
        salt: the tie-break salt (default: 8 random bytes; tests pass one for a fixed order).

    Raises:
        ValueError: ``max_peers < 1``.
    """

    def __init__(self, max_peers: int = 4096, salt: bytes | None = None) -> None:
        if int(max_peers) < 1:
            raise ValueError(f"TurnQueue needs max_peers >= 1; got {max_peers!r}")
        self.max_peers = int(max_peers)
        self._salt = os.urandom(8) if salt is None else bytes(salt)
        self._served: OrderedDict[str, int] = OrderedDict()   # peer -> turn last served, least recent first
        self._waiting: OrderedDict[str, int] = OrderedDict()  # never served -> turn it first waited, least seen first

    def __len__(self) -> int:
        """Peers remembered (served and waiting)."""
        return len(self._served) + len(self._waiting)

    def place(self, peer: str, turn: int) -> tuple[int, int, bytes]:
        """``peer``'s sort key at ``turn`` (lower goes first); a peer not remembered is at the back: ``(turn, 0)``."""
        tie = hashlib.blake2b(str(peer).encode("utf-8", "replace"), key=self._salt, digest_size=16).digest()
        if peer in self._served:
            return (self._served[peer], 1, tie)
        return (self._waiting.get(peer, turn), 0, tie)

    def order(self, peers: Iterable[str], turn: int) -> list[str]:
        """Note ``peers`` (the ones competing at ``turn``, duplicates ignored) as waiting and return them in queue
        order, first served first."""
        now = list(dict.fromkeys(peers))
        competing = set(now)
        for p in now:
            if p in self._served:
                continue
            if p in self._waiting:
                self._waiting.move_to_end(p)  # seen again: the last to be forgotten
                continue
            if len(self._waiting) >= self.max_peers:
                gone = next((q for q in self._waiting if q not in competing), None)
                if gone is None:
                    continue  # every remembered waiter competes now: this one waits at the back, unremembered
                del self._waiting[gone]
            self._waiting[p] = turn
        return sorted(now, key=lambda p: self.place(p, turn))

    def serve(self, peer: str, turn: int) -> None:
        """``peer`` got a slot at ``turn``: it goes to the back, behind everyone waiting since before ``turn``."""
        self._waiting.pop(peer, None)
        self._served[peer] = turn
        self._served.move_to_end(peer)
        while len(self._served) > self.max_peers:
            self._served.popitem(last=False)
