"""TurnQueue (swarmnode/turns.py): the fair queue behind admission's young-key pool and the rescue helper's young
askers."""

from __future__ import annotations

import pytest

from swarmnode.turns import TurnQueue


def test_the_peer_that_waited_longest_goes_first_and_a_served_peer_goes_to_the_back():
    q = TurnQueue(salt=b"fixed")
    assert q.order(["a"], 1) == ["a"]
    assert sorted(q.order(["b", "a"], 2)) == ["a", "b"] and q.order(["b", "a"], 2)[0] == "a"  # a waits since 1
    q.serve("a", 2)
    assert q.order(["a", "b", "c"], 3) == ["b", "a", "c"]  # b waits since 2, a served at 2, c new at 3
    q.serve("b", 3)
    # c waited since 3 (before turn 3's serving): ahead of b served at 3; a served at 2 is ahead of both
    assert q.order(["c", "b", "a"], 4) == ["a", "c", "b"]
    assert q.order(["a", "a", "c"], 4) == ["a", "c"]  # duplicates ignored


def test_ties_follow_the_salt_not_the_order_given():
    peers = [f"key-{i}" for i in range(40)]
    one = TurnQueue(salt=b"one").order(peers, 1)
    assert TurnQueue(salt=b"one").order(list(reversed(peers)), 1) == one  # the input order plays no part
    assert TurnQueue(salt=b"two").order(peers, 1) != one  # another salt, another tie order
    assert sorted(one) == sorted(peers)


def test_keys_minted_every_turn_cannot_overtake_a_waiting_peer():
    q = TurnQueue(salt=b"s")
    first = []
    for turn in range(1, 30):
        order = q.order(["honest", f"fresh-{turn}-0", f"fresh-{turn}-1"], turn)
        first.append(order[0])
        q.serve(order[0], turn)  # one slot a turn
    # turn 1 is a tie among keys that all arrived together; from then on the honest peer waits at most one turn
    # behind each fresh key that arrived no later than it, so it gets a slot at least every third turn
    served_at = [t for t, p in enumerate(first, 1) if p == "honest"]
    assert served_at and all(b - a <= 3 for a, b in zip([0, *served_at], [*served_at, 30]))


def test_bounded_and_a_flood_that_stopped_cannot_keep_a_newcomer_unremembered():
    q = TurnQueue(max_peers=8, salt=b"s")
    q.order([f"flood-{i}" for i in range(8)], 1)  # eight one-shot keys fill the waiting map, then go away
    assert len(q) == 8
    q.order(["newcomer"], 2)  # the least recently seen waiter not competing now makes room
    assert len(q) == 8 and q.place("newcomer", 3)[0] == 2  # remembered: waiting since turn 2
    for t in range(3, 6):  # fresh keys each turn queue behind it
        order = q.order(["newcomer", f"fresh-{t}"], t)
        assert order[0] == "newcomer", order
    # every remembered waiter competing: a newcomer beyond the bound is not remembered and takes the back
    q2 = TurnQueue(max_peers=2, salt=b"s")
    q2.order(["a", "b", "c"], 1)
    assert q2.place("c", 2)[0] == 2 and q2.order(["c", "a", "b"], 2)[-1] == "c"
    assert q2.place("a", 2)[0] == 1 and q2.place("b", 2)[0] == 1  # c, arriving, evicted neither competing peer
    for t in range(20):
        q2.serve(f"s{t}", t)
    assert len(q2) == 2  # at most max_peers, served or waiting


def test_a_place_is_kept_only_while_its_peer_competes():
    """Outside attack: keys that waited once and came back later, one or two a turn, cut in ahead of an honest
    newcomer each time (its waits doubled: 8 turns in 600 beside 2 fresh keys and 1 returning key a turn, where a
    fair share is about 150). A peer absent for more than ``grace_turns`` turns waits from its return."""
    q = TurnQueue(salt=b"s", grace_turns=1)
    bank = [f"sleeper-{i}" for i in range(256)]
    q.order(bank, 0)  # they wait once, then go away
    served, n_fresh = 0, 0
    for turn in range(1, 601):
        fresh = [f"fresh-{n_fresh + i}" for i in range(2)]
        n_fresh += 2
        order = q.order(["honest", *fresh, bank[turn % len(bank)]], turn)
        q.serve(order[0], turn)
        served += order[0] == "honest"
    assert served >= 580, served  # keys that compete once each queue behind it (598 of 600); banked places: 8
    # within the grace a place is kept; past it, the peer waits from its return
    q2 = TurnQueue(salt=b"s", grace_turns=1)
    q2.order(["x"], 10)
    assert q2.place("x", 12)[0] == 10 and q2.place("x", 13)[0] == 13
    q2.serve("x", 20)
    assert q2.order(["y"], 21) == ["y"] and q2.place("x", 22) == (20, 1, q2.place("x", 22)[2])
    assert q2.order(["x", "y"], 23) == ["y", "x"]  # x missed turns 21 and 22: back of the queue with y ahead
    with pytest.raises(ValueError, match="grace_turns"):
        TurnQueue(grace_turns=-1)


def test_a_bad_bound_is_refused():
    with pytest.raises(ValueError, match="max_peers"):
        TurnQueue(0)
