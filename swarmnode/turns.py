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

    A place is kept only while its peer keeps competing: a peer absent for more than ``grace_turns`` turns in a
    row waits from the turn it comes back, whether it had been served or was waiting. Otherwise keys could bank
    places (outside attack: keys that waited once and came back later, one or two a step, cut in ahead of an honest
    newcomer each time it waited; its waits doubled, 8 turns in 600 where a fair share was about 150). With
    ``grace_turns`` g an attacker keeps at most g + 1 keys in the queue for each key it shows a turn.

    Bounded whatever peers send: at most ``max_peers`` peers are remembered, served or waiting. A newcomer when
    the memory is full takes the place of the peer seen least recently, unless that one competes this turn too
    (then every remembered peer does, and the newcomer is not remembered: it takes the back of the queue, its
    place the current turn). Each call costs O(peers given · log) whatever is remembered.

    Args:
        max_peers: how many peers are remembered (>= 1).
        grace_turns: turns a peer may miss in a row and keep its place (>= 0).
        salt: the tie-break salt (default: 8 random bytes; tests pass one for a fixed order).

    Raises:
        ValueError: ``max_peers < 1`` or ``grace_turns < 0``.
    """

    def __init__(self, max_peers: int = 4096, grace_turns: int = 1, salt: bytes | None = None) -> None:
        if int(max_peers) < 1 or int(grace_turns) < 0:
            raise ValueError(f"TurnQueue needs max_peers >= 1 and grace_turns >= 0; got {max_peers!r}, "
                             f"{grace_turns!r}")
        self.max_peers = int(max_peers)
        self.grace_turns = int(grace_turns)
        self._salt = os.urandom(8) if salt is None else bytes(salt)
        # peer -> [place turn, 1 if served there else 0, last turn it competed]; the least recently seen first
        self._peers: OrderedDict[str, list[int]] = OrderedDict()

    def __len__(self) -> int:
        """Peers remembered (served and waiting)."""
        return len(self._peers)

    def _kept(self, entry: list[int], turn: int) -> bool:
        return entry[2] >= turn - 1 - self.grace_turns

    def place(self, peer: str, turn: int) -> tuple[int, int, bytes]:
        """``peer``'s sort key at ``turn`` (lower goes first); a peer not remembered, or absent for more than
        ``grace_turns`` turns before ``turn``, is at the back: ``(turn, 0)``."""
        tie = hashlib.blake2b(str(peer).encode("utf-8", "replace"), key=self._salt, digest_size=16).digest()
        e = self._peers.get(peer)
        if e is None or not self._kept(e, turn):
            return (turn, 0, tie)
        return (e[0], e[1], tie)

    def order(self, peers: Iterable[str], turn: int) -> list[str]:
        """Note ``peers`` (the ones competing at ``turn``, duplicates ignored) and return them in queue order,
        first served first."""
        now = list(dict.fromkeys(peers))
        keys = {p: self.place(p, turn) for p in now}  # before anything is noted: an absent peer waits from now
        new = []
        for p in now:  # first the remembered ones: seen now, so that no newcomer below evicts one of them
            e = self._peers.get(p)
            if e is None:
                new.append(p)
                continue
            if not self._kept(e, turn):
                e[0], e[1] = turn, 0
            e[2] = turn
            self._peers.move_to_end(p)
        for p in new:
            if len(self._peers) >= self.max_peers:
                oldest = next(iter(self._peers))
                if self._peers[oldest][2] >= turn:
                    continue  # every remembered peer competes now: this one waits at the back, unremembered
                del self._peers[oldest]
            self._peers[p] = [turn, 0, turn]
        return sorted(now, key=keys.__getitem__)

    def serve(self, peer: str, turn: int) -> None:
        """``peer`` got a slot at ``turn``: it goes to the back, behind everyone waiting since before ``turn``."""
        e = self._peers.get(peer)
        if e is None:
            if len(self._peers) >= self.max_peers:
                self._peers.popitem(last=False)
            self._peers[peer] = [turn, 1, turn]
        else:
            e[0], e[1], e[2] = turn, 1, max(e[2], turn)
        self._peers.move_to_end(peer)
