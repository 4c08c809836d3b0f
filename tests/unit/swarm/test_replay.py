"""OwnerFairSet (swarm/replay.py): the young signers' part of the replay memory, evicting from the owner that holds
the most keys."""

from __future__ import annotations

import math
import random

from swarmnode.swarm.replay import OwnerFairSet


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_full_set_evicts_the_largest_owners_oldest_key():
    s = OwnerFairSet(6, math.inf, Clock())
    s.add("a1", 1, "A")
    s.add("a2", 1, "A")
    for i in range(4):
        s.add(f"f{i}", 1, "flood")
    assert len(s) == 6 and s.owned("A") == 2 and s.owned("flood") == 4
    for i in range(4, 40):  # the flood goes on: it evicts its own oldest keys only
        s.add(f"f{i}", 1, "flood")
    assert "a1" in s and "a2" in s and s.owned("flood") == 4
    assert [k for k in (f"f{i}" for i in range(40)) if k in s] == ["f36", "f37", "f38", "f39"]
    # many owners: the fair share 6 / 7 falls below A's 2 keys, and A loses its oldest first
    for i in range(6):
        s.add(f"s{i}", 1, f"sybil{i}")
    assert s.owned("A") <= 1 and "a1" not in s


def test_re_adding_keeps_the_owner_and_expiry_follows_insertion_time():
    """A remembered key keeps its owner whoever adds it again (outside attack: copies re-charged an author's keys to
    the copier, whose own flood then evicted them)."""
    clock = Clock()
    s = OwnerFairSet(10, 5.0, clock)
    s.add("k", "x", "A")
    clock.t = 3.0
    s.add("k", "y")  # no owner given: still A's, inserted again now
    assert s.get("k") == "y" and s.owned("A") == 1
    s.add("k", "z", "B")
    assert s.get("k") == "z" and s.owned("A") == 1 and s.owned("B") == 0
    clock.t = 8.0
    assert s.get("k") == "z"  # 5 s after its last insertion: still kept (not beyond the ttl)
    clock.t = 8.5
    assert "k" not in s and len(s) == 0 and s.owned("B") == 0
    s.add("m", 1, "C")
    s.discard("m")
    s.discard("absent")
    assert len(s) == 0 and s.owned("C") == 0


def test_the_owner_counts_match_a_plain_recount_under_random_operations():
    rng = random.Random(0)
    clock = Clock()
    s = OwnerFairSet(32, 40.0, clock)
    for _ in range(5000):
        clock.t += rng.random()
        op = rng.random()
        key = f"k{rng.randrange(200)}"
        if op < 0.7:
            s.add(key, 1, rng.choice(["A", "B", "C", None, *[f"o{i}" for i in range(8)]]))
        elif op < 0.85:
            s.discard(key)
        else:
            s.get(key)
        assert len(s) <= 32
        counts: dict = {}
        for _k, (_t, _v, owner) in s._d.items():
            counts[owner] = counts.get(owner, 0) + 1
        assert counts == {o: len(ks) for o, ks in s._owned.items()}
        assert {n: set(os) for n, os in s._by_count.items()} == {
            n: {o for o, c in counts.items() if c == n} for n in set(counts.values())}
        assert s._max == max(counts.values(), default=0)


def test_replay_memory_parts_never_evict_upward_and_keys_keep_their_owner():
    """Three parts: ours, established signers', young signers'. A flood in a lower part never evicts a higher one;
    an established signer's flood evicts its own keys first; keys move only up and keep their owner."""
    from swarmnode.swarm.replay import ReplayMemory

    m = ReplayMemory(8, math.inf, Clock())
    m.add("ours", "own")
    m.add("est", "peer", young=False, owner="E")
    m.add("young", "peer", young=True, owner="Y")
    for i in range(40):  # an established key floods: its own keys go first, ours and E's stay
        m.add(f"flood{i}", "peer", young=False, owner="F")
    for i in range(40):
        m.add(f"yflood{i}", "peer", young=True, owner="G")
    assert m.get("ours") == "own" and m.get("est") == "peer" and m.get("young") == "peer"
    assert m.established.owned("F") == 7 and m.young.owned("G") == 7
    m.add("young", "peer", young=False, owner="E2")  # an established signer's tree holds it: it moves up
    assert "young" in m.established and "young" not in m.young and m.established.owned("Y") == 1
    m.add("young", "peer", young=True, owner="G")  # never down
    assert "young" in m.established
    m.add("young", ("E2", 1.0), young=None)  # authorship moves: same part, same owner
    assert m.get("young") == ("E2", 1.0) and m.established.owned("Y") == 1
    m.add("est", "own")  # our own tree holds it: the own part
    assert m.own.get("est") == "own" and "est" not in m.established
