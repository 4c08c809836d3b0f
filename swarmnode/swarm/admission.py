"""Admission of verified peer trees per step: the caps on young keys, their turns, and authorship moves.

Keys are free to mint (docs/reference/design.md §7; docs/guide/swarm.md, the trust table), so
:class:`Admission` admits per step at most ``PeerBook.tree_cap`` trees of a young key and at most
``swarm.trust.max_young_trees`` trees of all young keys together, handed out one per key per turn, the key that has
waited longest first; an established key (``swarm.trust.established_after`` useful trees) gets
``swarm.trust.max_trees_per_peer``. Trees over a cap wait for later steps (bounded, ``swarm/trees_carried``); what
no longer fits, or waited longer than the read window, is dropped and counted (``swarm/trees_capped``).

Admission earns nothing: standing comes from :meth:`Admission.credit` (``SwarmClient.credit``) once the node
trained on a tree -- a tree is *useful* when some of its samples passed selection, the token budget, the
likelihood screen and the share cap, and our re-scored rewards of its leaves differ -- so standing grows with
time and verified, kept work, not with the number of keys; :func:`move_authorship` hands a copied tree's
standing to the key whose manifest we read first.

State is this object's own (the gather runs on one thread, the node's main thread); the clock is injectable
(``clock``: monotonic seconds) so the policy is tested with a fake clock (tests/unit/swarm/test_swarm_policies.py).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Callable, Collection, Iterable

from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.swarm.peers import PeerBook
from swarmnode.turns import TurnQueue

__all__ = ["Admission", "MAX_CARRY_TREES", "MAX_YOUNG_KEYS", "has_contrast", "move_authorship"]

MAX_CARRY_TREES = 64
"""Verified trees over a per-step cap carried to the next steps, at most."""
MAX_YOUNG_KEYS = 4096
"""Young keys remembered for their turn (served or waiting), at most."""


def has_contrast(vt: PeerTree) -> bool:
    """Our re-scored rewards of the tree's leaves differ (it can carry an advantage)."""
    try:
        r = vt.rewards()
    except ValueError:
        return False
    return len(r) >= 2 and max(r) - min(r) > 1e-9


def _has_correct_leaf(vt: PeerTree) -> bool:
    """A leaf of the tree has our re-scored reward >= 1 (exactly correct; the format reward, when on, is a
    fraction below 1 added to the exact score)."""
    try:
        return max(vt.rewards(), default=0.0) >= 1.0
    except ValueError:
        return False


def move_authorship(peers: PeerBook, changes: Iterable[tuple[str, str | None]],
                    count: Callable[[str], None]) -> None:
    """Apply the verifier's authorship changes (``Verifier.take_authorship_changes``): per tree, the key that
    held its content loses one earned tree, and the key whose manifest we read first (None: a tie, no one)
    gains the unit the loser gives (``PeerBook.record_moved``: owed until the loser has one, so claiming a key at
    0 mints nothing, an outside attack); ``count`` is told ``"authorship_moved"`` or ``"authorship_disputed"`` per change. A copier
    verified before the author thus earns nothing once the author's bundle arrives, and the author earns what
    its trees were worth (outside attack: a copier verified first took 32 trained samples and +1 standing a
    step, the author 0)."""
    for loser, winner in changes:
        peers.record_moved(loser, winner)  # a unit moves, it is never made (owed while the loser has none)
        count("authorship_moved" if winner is not None else "authorship_disputed")


class Admission:
    """The per-step caps on trees per key (Sybil resistance), with the young keys' turns and the carried trees.

    Args:
        peers: the :class:`~swarmnode.swarm.peers.PeerBook` (earned standing, ``is_young``, ``tree_cap``).
        young_key_trees / trees_per_earned_tree / max_trees_per_peer / established_after: ``swarm.*`` of the same
            names (pydantic checks their bounds).
        max_young_trees: trees of all young keys together per step (``swarm.trust.max_young_trees``, its None resolved
            to ``max(1, num_external // 2)`` by the caller).
        window_s: seconds a carried tree may wait, ``(read_buckets + 1) * bucket_seconds``.
        clock: monotonic seconds.
    """

    def __init__(self, peers: PeerBook, *, young_key_trees: int, trees_per_earned_tree: int, max_trees_per_peer: int,
                 established_after: int, max_young_trees: int, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.peers = peers
        self.young_key_trees = int(young_key_trees)
        self.trees_per_earned_tree = int(trees_per_earned_tree)
        self.max_trees_per_peer = int(max_trees_per_peer)
        self.established_after = int(established_after)
        self.max_young_trees = int(max_young_trees)
        self.window_s = float(window_s)
        self.clock = clock
        # trees over a per-step cap: (first seen, tree, key was young then)
        self.carry: list[tuple[float, PeerTree, bool]] = []
        # young keys' turns for the young-key pool: the key that has waited longest first
        self.turns = TurnQueue(MAX_YOUNG_KEYS)
        self.turn = 0

    def credit(self, peer_id: str, n: int = 1) -> None:
        """The node trained on ``n`` useful trees of ``peer_id``: ``n`` trees of earned standing
        (``PeerBook.record_earned``; ``n`` clamped to [0, max_trees_per_peer]). Standing is earned here, after
        the update, never at admission (see ``SwarmClient.credit``)."""
        n = max(0, min(int(n), self.max_trees_per_peer))
        if n:
            self.peers.record_earned(str(peer_id), n)

    def charge(self, peer_id: str, reason: str, n: int = 1) -> None:
        """The trainer rejected ``n`` (clamped to [0, 1024]) of ``peer_id``'s samples under ``reason``: ``n`` soft
        rejections (no strike, no ban) and one earned tree taken back (see ``SwarmClient.charge``)."""
        n = max(0, min(int(n), 1024))
        peer_id = str(peer_id)
        for _ in range(n):
            self.peers.record_reject(peer_id, str(reason), False, "rejected by the trainer")
        if n:
            self.peers.record_unearned(peer_id, 1)

    def admit(self, trees: list[PeerTree], asked: Collection[str] = ()) -> tuple[list[PeerTree], int, int]:
        """Admit this step's verified trees (and the carried ones) under the per-key caps.

        An established key (``PeerBook.earned >= established_after``) gets up to ``max_trees_per_peer``
        trees; a young key up to ``PeerBook.tree_cap`` (``young_key_trees + earned // trees_per_earned_tree``),
        and all young keys together up to ``max_young_trees``, handed out one tree per key per turn (a young
        key's trees whose rewards do not differ are dropped first -- unless they answer a question we asked,
        ``asked`` holds those task keys -- they have nothing to train and must not take a slot; and a young key's
        tree that answers a question we asked with an exactly correct leaf takes no slot of the pool either: the
        first such tree of each asked question a step (queue order) is admitted beside the pool, so at most
        ``len(asked)`` trees more, and keys answering with wrong leaves only cannot take the question's turn from
        a correct answer (an answer without a correct leaf has nothing to merge: it is an ordinary tree, dropped
        when flat) -- a weaker node asks
        exactly where a stronger, young-at-us peer helps, and its answers must not wait behind that peer's
        ordinary trees for the one young slot), the key that has
        waited longest first (:class:`~swarmnode.turns.TurnQueue`): a key's place is the turn it last got a slot,
        or, never served, the turn it first waited; ties in a salted order. Every young key with something to train gets a turn at least once per
        ``ceil(young keys / max_young_trees)`` steps; no standing a copied tree buys moves it ahead (outside
        attack: two keys with one earned tree each took both slots every step and locked an honest newcomer
        out), and fresh keys minted every step queue behind a key that has been waiting (outside attack: with
        "never served goes first", two fresh keys a step took both slots and an honest newcomer was admitted 1
        step in 12). Admission earns nothing. The trees of an established key are marked
        ``PeerTree.established`` (what cross-node expansion requires), but only when the key was already
        established when the tree first arrived.

        Trees over a cap are carried to the next steps (older first), at most ``max_trees_per_peer`` per key and
        :data:`MAX_CARRY_TREES` in all, for at most ``window_s``; beyond that they are dropped.

        Returns:
            ``(admitted trees, admitted trees of young keys, trees dropped this step)``: dropped by a cap, by
            age, or as a young key's tree without reward contrast.
        """
        now = self.clock()
        horizon = now - self.window_s
        dropped = sum(1 for t0, _, _ in self.carry if t0 < horizon)
        arrived_young = {vt.peer_id: self.peers.is_young(vt.peer_id, self.established_after) for vt in trees}
        items = ([(t0, vt, y) for t0, vt, y in self.carry if t0 >= horizon]
                 + [(now, vt, arrived_young[vt.peer_id]) for vt in trees])
        self.carry = []
        if not items:
            return [], 0, dropped
        by_peer: dict[str, list[int]] = {}
        for i, (_, vt, _) in enumerate(items):
            by_peer.setdefault(vt.peer_id, []).append(i)
        keep: set[int] = set()
        gone: set[int] = set()  # young keys' trees without reward contrast
        young: dict[str, list[int]] = {}
        answers: dict[str, list[int]] = {}  # young key -> its trees answering a question we asked
        for peer, idx in by_peer.items():
            if self.peers.is_young(peer, self.established_after):
                # answers to our questions with an exactly correct leaf: admitted apart from the pool, one per
                # question a step (their contrast is our wrong leaves)
                ans = [i for i in idx if items[i][1].task_key in asked and _has_correct_leaf(items[i][1])]
                if ans:
                    answers[peer] = ans
                # no contrast and no answer to merge (all-wrong answers included): nothing to train, no slot
                flat = {i for i in idx if i not in ans and not has_contrast(items[i][1])}
                gone |= flat
                idx = [i for i in idx if i not in flat and i not in ans]
                cap = self.peers.tree_cap(peer, base=self.young_key_trees, per=self.trees_per_earned_tree,
                                          ceiling=max(self.young_key_trees, self.max_trees_per_peer))
                young[peer] = idx[:cap]
            else:
                keep.update(idx[:self.max_trees_per_peer])
                for i in idx:
                    items[i][1].established = not items[i][2]
        pool = self.max_young_trees
        self.turn += 1
        order = self.turns.order([p for p in young if young[p] or p in answers], self.turn)
        n_young = 0
        answered: set[str] = set()
        for p in order:  # each question we asked: the first young key in the queue that answers it, one tree
            for i in answers.get(p, ()):
                if items[i][1].task_key not in answered:
                    answered.add(items[i][1].task_key)
                    keep.add(i)
                    n_young += 1
        while pool > 0 and any(young[p] for p in order):
            for p in order:
                if pool > 0 and young[p]:
                    keep.add(young[p].pop(0))
                    pool -= 1
                    n_young += 1
                    self.turns.serve(p, self.turn)
        out = [vt for i, (_, vt, _) in enumerate(items) if i in keep]
        carry: list[tuple[float, PeerTree, bool]] = []
        per_peer: Counter[str] = Counter()
        dropped += len(gone)
        for i, (t0, vt, arrived) in enumerate(items):
            if i in keep or i in gone:
                continue
            if per_peer[vt.peer_id] < self.max_trees_per_peer:
                per_peer[vt.peer_id] += 1
                carry.append((t0, vt, arrived))
            else:
                dropped += 1
        if len(carry) > MAX_CARRY_TREES:  # the oldest go first
            dropped += len(carry) - MAX_CARRY_TREES
            carry = carry[-MAX_CARRY_TREES:]
        self.carry = carry
        return out, n_young, dropped
