"""The swarm client's policies, each on its own object with a fake clock: no DHT, no threads, no network.

- :class:`~swarmnode.swarm.scheduler.FetchScheduler`: the fair order, one manifest per digest, per-publisher
  limits and budgets, manifest states and retries, the bounded queue, paid tokens;
- :class:`~swarmnode.swarm.admission.Admission`: young keys' caps and turns, carried trees, standing;
- :class:`~swarmnode.swarm.rates.HeartbeatBook`: peers' task rates and rescue requests.

The wiring of these objects into ``SwarmClient`` (polls, gathers, real DHTs) is tested in
tests/integration/test_gossip.py.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace as dc_replace

import pytest

from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.tree import RolloutTree
from swarmnode.swarm import scheduler as sched_mod
from swarmnode.swarm import wire
from swarmnode.swarm.admission import Admission
from swarmnode.swarm.counters import SwarmCounters
from swarmnode.swarm.identity import Identity
from swarmnode.swarm.peers import PeerBook
from swarmnode.swarm.rates import HeartbeatBook
from swarmnode.swarm.scheduler import FetchScheduler, Pending
from swarmnode.tasks.base import TaskRef
from test_peers import FakeClock  # a clock that moves only when told to (advance)

SWARM = "policies"
REF = TaskRef("rg:chain_sum", "d" * 16, 0, 7)


def _manifest(digest: bytes, created_at: float = 0.0) -> wire.Manifest:
    return wire.Manifest(swarm_id=SWARM, publisher_key=b"\x01" * 32, bundle_digest=digest, bundle_size=10,
                         tasks=[REF], created_at=created_at, policy_version=0, num_trees=1, num_leaves=2)


def _scheduler(clock: FakeClock | None = None, wall: FakeClock | None = None, peers: PeerBook | None = None,
               **kw) -> FetchScheduler:
    args = dict(max_concurrent_fetches=4, max_fetches_per_publisher=1, fetch_retries=3, publisher_budget_s=10.0,
                max_pending=32, fetch_timeout=5.0, bucket_seconds=30.0)
    args.update(kw)
    return FetchScheduler(PeerBook() if peers is None else peers, SwarmCounters(), clock=clock or FakeClock(),
                          wall=wall or FakeClock(1_000_000.0), **args)


# ============================================================================ the fetch scheduler
def test_fair_order_round_robins_publishers_and_clamps_future_times():
    wall = FakeClock(1_000_000.0)
    s = _scheduler(wall=wall)
    now = wall()
    m0 = _manifest(b"\x00" * 32, now)

    def cand(pub: str, t: float, k: int):
        return (dc_replace(m0, created_at=t, bundle_digest=bytes([k]) * 32), bytes([k]) * 32, pub)

    # "future" announces 5 bundles 25 s ahead; "honest" one made now, "old" one a minute ago
    cands = [cand("future", now + 25 + i, i) for i in range(5)] + [cand("honest", now - 1, 10),
                                                                   cand("old", now - 60, 11)]
    s.spent["future"] = 3.0  # it already used fetch time this step
    order = s.fair_order(cands)
    pubs = [x[2] for x in order]
    # one round over every publisher before anyone's second candidate; publishers that used time go last
    assert set(pubs[:3]) == {"future", "honest", "old"} and pubs[2] == "future"
    assert pubs[3:] == ["future"] * 4
    # future times are clamped to now, so within "future" the order is the announced one (all tie at now)
    assert [x[1][0] for x in order if x[2] == "future"] == [0, 1, 2, 3, 4]


def test_fair_order_puts_publishers_with_standing_first_in_each_round():
    peers = PeerBook()
    peers.record_earned("known", 3)
    s = _scheduler(peers=peers)
    m = _manifest(b"\x00" * 32, 0.0)
    cands = [(dc_replace(m, bundle_digest=bytes([k]) * 32), bytes([k]) * 32, pub)
             for k, pub in enumerate(["fresh", "fresh", "known", "known"])]
    s.spent["known"] = 9.0  # more fetch time than "fresh", but standing comes first
    assert [x[2] for x in s.fair_order(cands)] == ["known", "fresh", "known", "fresh"]


def test_a_copy_that_keeps_losing_its_digest_is_looked_at_less_and_less_often():
    """Second outside attack (2026-12-03): every look at a waiting copy verifies it again (~1 ms), and 40 keys x 16
    copies cost 10 verifications per paid token in 20 polls. A copy that loses its digest to another manifest
    again and again now waits 2, 4, 8, ... 64 s between looks."""
    peers = PeerBook()
    peers.record_earned("publisher", 5)
    clock = FakeClock()
    s = _scheduler(clock, peers=peers)
    m = _manifest(hashlib.sha256(b"a bundle and its copy").digest(), time.time())
    waits = []
    for _ in range(8):
        now = clock()
        kept = s.one_per_digest([(m, b"copy", "copier"), (m, b"original", "publisher")], now)
        assert [x[1] for x in kept] == [b"original"]
        waits.append(round(s.mstate[b"copy"].next_try - now))
        clock.advance(100.0)
    assert waits == [2, 4, 8, 16, 32, 64, 64, 64]


def test_one_per_digest_prefers_a_publisher_that_can_start_then_standing_then_first_read():
    peers = PeerBook()
    peers.record_earned("rich", 9)
    peers.record_earned("poor", 1)
    clock = FakeClock()
    s = _scheduler(clock, peers=peers)
    m = _manifest(b"\x07" * 32)
    # the manifest read first wins among keys of equal standing
    assert s.one_per_digest([(m, b"first", "a")], clock())[0][1] == b"first"
    clock.advance(5.0)
    assert [c[1] for c in s.one_per_digest([(m, b"late", "b"), (m, b"first", "a")], clock())] == [b"first"]
    # more standing wins ...
    assert [c[2] for c in s.one_per_digest([(m, b"r", "rich"), (m, b"p", "poor")], clock())] == ["rich"]
    # ... unless that publisher cannot start now (over its budget)
    s.spent["rich"] = s.publisher_budget_s
    assert [c[2] for c in s.one_per_digest([(m, b"r", "rich"), (m, b"p", "poor")], clock())] == ["poor"]


def test_try_start_limits_per_publisher_and_keys_without_standing():
    peers = PeerBook()
    peers.record_earned("known", 2)
    clock = FakeClock()
    s = _scheduler(clock, peers=peers, max_concurrent_fetches=4, max_fetches_per_publisher=1)
    ms = [_manifest(bytes([k]) * 32) for k in range(8)]
    assert s.try_start(ms[0], b"m0", "known", extra=False) == "started"
    # at its concurrency limit: its turn is over ("wait"), unless started on spare capacity
    assert s.try_start(ms[1], b"m1", "known", extra=False) == "wait"
    assert s.mstate[b"m1"].state == "retry" and s.mstate[b"m1"].next_try == 0.0
    assert s.try_start(ms[1], b"m1", "known", extra=True) == "started"
    # keys without standing share half the workers (2 of 4)
    assert s.try_start(ms[2], b"m2", "fresh1", extra=False) == "started"
    assert s.try_start(ms[3], b"m3", "fresh2", extra=False) == "started"
    assert s.try_start(ms[4], b"m4", "fresh3", extra=False) == "skip"
    assert s.mstate[b"m4"].next_try == clock() + 1.0
    # the same digest in flight under another manifest: skip, looked at again in 1 s
    assert s.try_start(ms[0], b"copy", "known", extra=True) == "skip"
    assert s.mstate[b"copy"].state == "retry" and s.mstate[b"copy"].bundle_digest == ms[0].bundle_digest
    assert s.inflight == 4 and s.spare_taken()
    # an unsubmitted fetch goes back to retry
    s.unstart(ms[3], b"m3", "fresh2")
    assert s.inflight == 3 and ms[3].bundle_digest.hex() not in s.wanted and s.mstate[b"m3"].state == "retry"


def test_a_failed_fetch_backs_off_then_gives_up_and_an_untried_one_retries_at_once():
    clock = FakeClock()
    s = _scheduler(clock, fetch_retries=3)
    m = _manifest(b"\x05" * 32)
    for tries in (1, 2):
        assert s.try_start(m, b"m", "pub", extra=False) == "started"
        s.finish(m, b"m", "pub", ok=False, attempts=2)
        st = s.mstate[b"m"]
        assert (st.state, st.tries, st.next_try) == ("retry", tries, clock() + 2.0 ** tries)
        assert m.bundle_digest.hex() not in s.wanted and s.inflight == 0 and "pub" not in s.inflight_by_pub
    # never tried (over budget, closing): not the publisher's failure, due at once
    assert s.try_start(m, b"m", "pub", extra=False) == "started"
    s.finish(m, b"m", "pub", ok=False, attempts=0)
    assert (s.mstate[b"m"].state, s.mstate[b"m"].tries, s.mstate[b"m"].next_try) == ("retry", 2, 0.0)
    assert s.try_start(m, b"m", "pub", extra=False) == "started"
    s.finish(m, b"m", "pub", ok=False, attempts=1)
    assert (s.mstate[b"m"].state, s.mstate[b"m"].tries) == ("done", 3)
    assert s.counters.counts["fetch_gave_up"] == 1


def test_due_states_and_a_retry_waiting_on_its_digest_is_not_looked_at():
    clock = FakeClock()
    s = _scheduler(clock)
    assert s.due(b"new", clock()) == (True, None)
    assert s.mark(b"rec") and not s.mark(b"rec")  # judged once
    assert s.due(b"rec", clock())[0] is False
    s.set_state(b"lim", "limited", 0, clock() + 30.0)
    assert s.due(b"lim", clock())[0] is False
    clock.advance(30.0)
    assert s.due(b"lim", clock())[0] is True
    m = _manifest(b"\x09" * 32)
    s.mstate[b"w"] = sched_mod.MState("retry", 0, 0.0, m.bundle_digest)
    s.wanted.add(m.bundle_digest.hex())
    due, st = s.due(b"w", clock())
    assert not due and st.next_try == clock() + 1.0
    s.wanted.clear()
    clock.advance(1.0)
    assert s.due(b"w", clock())[0] is True


def test_budgets_reset_at_a_gather_once_per_fetch_timeout_or_after_a_bucket_without_one():
    clock = FakeClock()
    s = _scheduler(clock, publisher_budget_s=4.0, fetch_timeout=5.0, bucket_seconds=30.0)
    s.charge("pub", 3.0)
    assert s.budget_left("pub") == 1.0
    clock.advance(4.0)
    s.new_step(force=True)  # a gather within fetch_timeout of the last reset: no reset
    assert s.budget_left("pub") == 1.0
    clock.advance(1.0)
    s.new_step(force=False)  # the fetcher resets only after bucket_seconds
    assert s.budget_left("pub") == 1.0
    s.new_step(force=True)
    assert s.budget_left("pub") == 4.0
    s.charge("pub", 5.0)
    clock.advance(29.0)
    s.new_step(force=False)
    assert s.budget_left("pub") == -1.0
    clock.advance(1.0)
    s.new_step(force=False)
    assert s.budget_left("pub") == 4.0


def test_a_flood_of_small_bundles_drops_its_own_bodies_not_an_honest_one():
    """Outside attack (2026-12-03, F2): a fetched honest body waiting for verification was pushed out of the full
    queue by eight keys' floods of small valid bundles, and its manifest stayed done (never fetched again). Now
    the publisher holding the most places loses its oldest body, and that body's manifest goes back to retry."""
    s = _scheduler(max_pending=8)

    def item(pub: str, k: int) -> Pending:
        return Pending(b"x" * 10, _manifest(bytes([k]) * 32, time.time()), f"p2p:{pub}", time.time(), bytes([k]) * 32,
                       pub)

    with s.lock:
        s.pending.append(item("honest", 1))
        for k in range(2, 40):  # the flood arrives after the honest body
            if len(s.pending) >= s.max_pending:
                s.drop_pending()
            s.pending.append(item(f"flood{k % 3}", k))
    assert any(p.publisher == "honest" for p in s.pending)
    assert s.counters.counts["dropped_queue_full"] == 31
    st = s.mstate[bytes([2]) * 32]  # a dropped flood body: fetched again later, not given up
    assert st.state == "retry" and st.next_try > 0
    # with one publisher only, its own oldest body goes
    s.pending.clear()
    with s.lock:
        for k in range(50, 60):
            if len(s.pending) >= s.max_pending:
                s.drop_pending()
            s.pending.append(item("solo", k))
    assert [p.mdigest[0] for p in s.pending] == list(range(52, 60))
    # fetched() drops for itself when full and marks the manifest done
    s.fetched(item("solo", 60))
    assert len(s.pending) == 8 and s.mstate[bytes([60]) * 32].state == "done"


def test_a_manifest_is_paid_for_once_whatever_evicts_its_state():
    """Outside attack (2026-12-03, F3): junk keys' records pushed an honest publisher's handled manifests out of
    the bounded manifest-state table; read again, each looked new and took another of its rate-limit tokens,
    until its new bundles waited as rate-limited. Payments are remembered per owner, apart from that table,
    owners without earned standing forgotten first."""
    peers = PeerBook()
    s = _scheduler(peers=peers)
    peers.record_earned("honest", 3)
    s.note_paid("honest", b"m1")
    assert s.paid_for("honest", b"m1") and not s.paid_for("honest", b"m2")
    assert not s.paid_for("junk0", b"m1")
    for i in range(sched_mod.MAX_PAID_OWNERS + 50):  # a flood of fresh keys, each paying for manifests
        s.note_paid(f"junk{i}", b"m")
    assert len(s.paid) == sched_mod.MAX_PAID_OWNERS
    assert s.paid_for("honest", b"m1")  # the key with standing is kept
    for i in range(sched_mod.PAID_PER_OWNER + 5):
        s.note_paid("honest", i.to_bytes(4, "big"))
    assert len(s.paid["honest"]) == sched_mod.PAID_PER_OWNER and not s.paid_for("honest", b"m1")


# ============================================================================ admission of young keys
def _tree(contrast: bool = True, k: int = 0, rewards: tuple[float, float] | None = None) -> RolloutTree:
    t = RolloutTree(task=TaskRef("rg:chain_sum", "d" * 16, 0, k), prompt_ids=[1, 2], prompt_text="Q")
    for i, r in enumerate(rewards or ((1.0, 0.0) if contrast else (0.0, 0.0))):
        lid = t.add_child(0, [65 + i], text=chr(65 + i), finish_reason="eos")
        t.nodes[lid].reward = r
    t.update_stats()
    return t


def _peer_trees(key: str, n: int, contrast: bool = True) -> tuple[str, list[PeerTree]]:
    return key, [PeerTree(_tree(contrast, k), key) for k in range(n)]


def _admission(clock: FakeClock | None = None, *, num_external: int = 4, young_key_trees: int = 1,
               trees_per_earned_tree: int = 4, max_trees_per_peer: int = 8, established_after: int = 16,
               max_young_trees: int | None = None, window_s: float = 90.0) -> Admission:
    """Defaults of ``SwarmConfig``; ``max_young_trees`` None resolved as the client does (num_external // 2)."""
    return Admission(PeerBook(), young_key_trees=young_key_trees, trees_per_earned_tree=trees_per_earned_tree,
                     max_trees_per_peer=max_trees_per_peer, established_after=established_after,
                     max_young_trees=max(1, num_external // 2) if max_young_trees is None else max_young_trees,
                     window_s=window_s, clock=clock or FakeClock())


def test_young_keys_share_a_pool_earn_standing_and_wait_for_later_steps():
    a = _admission(young_key_trees=1, trees_per_earned_tree=2, established_after=4, max_trees_per_peer=3)
    assert a.max_young_trees == 2  # None -> num_external // 2
    keys = [_peer_trees(f"young {i}", 3) for i in range(3)]
    trees = [t for _, ts in keys for t in ts]
    out, young, dropped = a.admit(trees)
    # 3 young keys, 3 trees each: the pool admits 2 trees (one per key per turn), the rest waits
    assert (len(out), young, dropped) == (2, 2, 0) and len({t.peer_id for t in out}) == 2
    assert not any(t.established for t in out)  # young keys' trees: cross-node expansion skips them
    assert len(a.carry) == 7
    assert sum(a.peers.earned(p) for p, _ in keys) == 0  # admission earns nothing: the node credits trees
    # next step, nothing new arrives: the carried trees are admitted two at a time, older first
    out2, _, _ = a.admit([])
    assert len(out2) == 2 and not set(map(id, out2)) & set(map(id, out))
    # an established key is not limited by the pool, only by max_trees_per_peer
    est, est_trees = _peer_trees("established", 5)
    a.peers.record_earned(est, 4)
    out3, young3, _ = a.admit(est_trees)
    assert sum(1 for t in out3 if t.peer_id == est) == 3 and young3 == 2
    assert all(t.established == (t.peer_id == est) for t in out3)
    # standing comes from the node's credit after its update, at most max_trees_per_peer at a time
    lazy, _ = _peer_trees("lazy", 1, contrast=False)
    a.credit(lazy, 2)
    a.credit(lazy, 100)
    a.credit(lazy, -4)
    assert a.peers.earned(lazy) == 5
    # a young key's cap grows with what it earned: 1 + earned // 2
    grown, _ = _peer_trees("grown", 3)
    a.peers.record_earned(grown, 2)
    assert a.peers.tree_cap(grown, base=1, per=2, ceiling=3) == 2


def test_carried_trees_wait_at_most_the_read_window():
    clock = FakeClock()
    a = _admission(clock, young_key_trees=1, max_young_trees=1, window_s=90.0)
    key, trees = _peer_trees("waiting", 3)
    out, _, dropped = a.admit(trees)
    assert (len(out), dropped, len(a.carry)) == (1, 0, 2)
    clock.advance(90.0)  # exactly the window: still carried, one more admitted
    out, _, dropped = a.admit([])
    assert (len(out), dropped, len(a.carry)) == (1, 0, 1)
    clock.advance(0.5)  # beyond the window: dropped and counted
    out, _, dropped = a.admit([])
    assert (out, dropped, a.carry) == ([], 1, [])


@pytest.mark.parametrize("n_sybils,sybil_standing", [(2, 1), (8, 1), (8, 0), (32, 1)])
def test_young_keys_take_turns_and_no_standing_locks_out_a_newcomer(n_sybils, sybil_standing):
    """Outside attack: two Sybil keys with one earned tree each (one copied tree) took both young-pool slots
    every step, because young keys were served by earned standing, and the screen's rejections of their junk never
    lowered it: an honest newcomer was admitted 0 of 20 steps. Young keys now take turns (the one served longest
    ago first), and each trainer rejection takes an earned tree back. The newcomer beside any number of Sybils,
    with or without standing, is admitted at least once per ceil(keys / pool) steps and becomes established."""
    est_after = 2
    a = _admission(young_key_trees=1, established_after=est_after)
    pool = a.max_young_trees
    assert pool == 2
    period = -(-(n_sybils + 1) // pool)
    steps = period * (est_after + 1)
    sybils = [_peer_trees(f"sybil {n_sybils} {i}", steps) for i in range(n_sybils)]
    for p, _ in sybils:
        a.credit(p, sybil_standing)
    newcomer, trees = _peer_trees(f"newcomer {n_sybils}", steps)
    admitted = []
    for step in range(steps):
        out, young, _ = a.admit([ts[step] for _, ts in sybils] + [trees[step]])
        assert young == pool, step
        got = [t for t in out if t.peer_id == newcomer]
        admitted.append(len(got))
        if got:
            a.credit(newcomer, 1)  # the node trains on the honest tree
        for t in out:
            if t.peer_id != newcomer:
                a.charge(t.peer_id, "screen")  # the Sybils' junk is screen-rejected
        a.carry = []  # what waits over the cap is the next steps' business, not this measurement's
    # a turn at least once per period, from the first period on, whatever the Sybils' standing
    for k in range(0, steps, period):
        assert sum(admitted[k:k + period]) >= 1, (k, admitted)
    assert not a.peers.is_young(newcomer, est_after), admitted
    # a screen rejection costs standing: the Sybils' bought tree is gone
    assert all(a.peers.earned(p) == 0 for p, _ in sybils)


@pytest.mark.parametrize("fresh_per_step", [2, 3, 8])
def test_fresh_keys_minted_every_step_queue_behind_a_waiting_newcomer(fresh_per_step):
    """Outside attack on the turns: "never served goes first" let two brand-new keys a step, each with one valid
    tree with contrast, take both young-pool slots, and the honest newcomer was admitted 1 step in 12. A key's place
    is now the turn it last got a slot, or the turn it first waited: fresh keys queue behind it."""
    a = _admission(young_key_trees=1, established_after=16)
    steps = 12
    newcomer, trees = _peer_trees(f"newcomer fresh {fresh_per_step}", steps)
    admitted = []
    for step in range(steps):
        fresh = [_peer_trees(f"fresh {fresh_per_step} {step} {i}", 1) for i in range(fresh_per_step)]
        out, _, _ = a.admit([ts[0] for _, ts in fresh] + [trees[step]])
        admitted.append(sum(1 for t in out if t.peer_id == newcomer))
        a.carry = []
    # the first step is a random draw among keys that all arrived together; from then on the newcomer waits
    # longest (it was served, or queued, before any key minted later)
    assert all(admitted[1:]), admitted


def test_a_flood_of_flat_trees_takes_no_young_pool_slot():
    # Sybils sending trees without reward contrast (nothing to train) take no pool slot at all
    a = _admission(young_key_trees=1, established_after=16)
    late, late_trees = _peer_trees("late newcomer", 1)
    flat = [_peer_trees(f"flat {i}", 1, contrast=False) for i in range(32)]
    out, young, dropped = a.admit([ts[0] for _, ts in flat] + late_trees)
    assert [t.peer_id for t in out] == [late] and young == 1 and dropped == 32 and a.carry == []
    # an answer to a question we asked carries no contrast of its own (all correct): it is admitted; an
    # all-wrong one has nothing to merge and is dropped
    asker = _admission(young_key_trees=1, established_after=16)
    answer = PeerTree(_tree(k=5, rewards=(1.0, 1.0)), "rescuer")
    assert asker.admit([answer], {answer.task_key})[0] == [answer]
    wrong = PeerTree(_tree(False, 6), "rescuer")
    assert asker.admit([wrong], {wrong.task_key})[:3:2] == ([], 1)


def test_a_tree_carried_while_its_key_was_young_is_not_marked_established():
    """Outside attack (2026-12-05), open item: a tree sent while its key was young waited over the cap and was
    marked established (expandable) when the key became established before the tree was admitted. The mark now
    follows the key's standing when the tree first arrived."""
    a = _admission(young_key_trees=1, trees_per_earned_tree=100, established_after=4, max_trees_per_peer=3)
    key, trees = _peer_trees("carried", 6)
    out, _, _ = a.admit(trees[:3])  # young: one tree admitted, two carried
    assert len(out) == 1 and not out[0].established and len(a.carry) == 2
    a.peers.record_earned(key, 10)  # the key becomes established before the carried trees are admitted
    out2, _, _ = a.admit(trees[3:])  # carried (young at arrival) + new (established at arrival)
    # max_trees_per_peer = 3, older first: the two carried trees and the first new one
    assert [id(t) for t in out2] == [id(t) for t in trees[1:4]]
    assert [t.established for t in out2] == [False, False, True]


def test_admitted_trees_earn_no_standing_until_the_node_trains_on_them():
    """Outside attacks (2026-12-05): standing was earned at admission. A fresh key whose mixed junk trees the
    screen rejected every step was established after 11 steps, and one junk tree a step over the per-step token
    budget -- admitted, never selected, never screened -- after 16 steps. Admission now earns nothing; the node
    credits what it trained on (``SwarmClient.credit``, tests/unit/node/test_node_trust.py) and a trainer rejection is a
    soft reject only."""
    from swarmnode.train.screen import SCREEN_REASON

    a = _admission(established_after=16)
    junk, junk_trees = _peer_trees("junk", 8 * 30)
    for step in range(30):
        out, _, _ = a.admit(junk_trees[8 * step: 8 * step + 8])
        assert any(t.peer_id == junk for t in out)
        rejected = sum(len(t.tree.leaves()) for t in out if t.peer_id == junk)
        if step % 2:
            a.charge(junk, SCREEN_REASON, rejected)  # what the node does when its screen rejects them
        assert a.peers.earned(junk) == 0, step
    assert a.peers.is_young(junk, 16)
    assert a.peers.snapshot()["peers"][junk]["rejected"][SCREEN_REASON] > 0
    honest, honest_trees = _peer_trees("honest", 2)
    a.admit(honest_trees)
    a.credit(honest, 2)  # the node trained on both
    assert a.peers.earned(honest) == 2
    a.charge(honest, SCREEN_REASON, 3)  # a soft reject (no strike), but it costs one earned tree
    assert a.peers.earned(honest) == 1 and not a.peers.is_banned(honest)


# ============================================================================ peers' heartbeats
def _ident(name: str) -> Identity:
    return Identity.from_private_bytes(hashlib.sha256(f"test_swarm_policies {name}".encode()).digest())


def _heartbeat_entry(ident: Identity, rates: dict | None, created_at: float,
                     rescue: list | None = None) -> tuple[bytes, bytes]:
    beat = wire.Heartbeat(swarm_id=SWARM, peer_id=ident.peer_id, model_id="m", step=1, reward_mean=None,
                          accuracy=None, samples_published=0, samples_accepted=0, samples_rejected=0,
                          created_at=created_at, task_rates=rates, rescue=rescue)
    return ident.public_key_bytes, wire.encode_heartbeat(beat, ident)


def _book(clock: FakeClock, wall: FakeClock, **kw) -> HeartbeatBook:
    return HeartbeatBook(SWARM, _ident("me").peer_id, PeerBook(), lambda key: True, max_clock_skew=30.0,
                         freshness_seconds=600.0, clock=clock, wall=wall, **kw)


def test_a_heartbeat_flood_of_fresh_keys_does_not_evict_a_peer_with_standing():
    """Outside attack finding: ~1,100 fresh keys' heartbeats (real Ed25519 signatures) pushed an honest peer
    with earned standing out of the 1,024 curriculum rates the node keeps (oldest first), and a heartbeat read
    again after its eviction counted as fresh (age from our new first read). Now fresh keys evict fresh keys
    (at most 64 kept) and a rate's age is never below its signed age less max_clock_skew."""
    clock, wall = FakeClock(), FakeClock(1_000_000.0)
    book = _book(clock, wall, curriculum=True)
    key = "rg:chain_sum"
    honest, old = _ident("rates honest"), _ident("rates old")
    flood = [_ident(f"flood {i}") for i in range(1100)]
    book.peers.record_earned(honest.peer_id, 5)
    book.peers.record_earned(old.peer_id, 5)
    now = wall()
    book.note_peer_rates([_heartbeat_entry(honest, {key: (16, 8)}, now - 1),
                          _heartbeat_entry(old, {key: (16, 8)}, now - 100)])
    for r in range(3):  # the flood goes on: newer heartbeats every read
        book.note_peer_rates([_heartbeat_entry(k, {key: (16, 0)}, now + r) for k in flood])
    got = {p.peer_id: p for p in book.peer_task_rates()}
    assert honest.peer_id in got and old.peer_id in got
    assert sum(1 for p in got.values() if p.standing == 0) <= 64 and len(got) <= 66
    # the signed time can only age a rate: 100 s old, skew 30 s -> 70 s, though we read it just now; the honest
    # one is as old as our first read of it (the fake clock did not move)
    assert got[old.peer_id].age_s == 100 - book.max_clock_skew
    assert got[honest.peer_id].age_s == 0.0
    clock.advance(50.0)
    wall.advance(50.0)
    got = {p.peer_id: p for p in book.peer_task_rates()}
    assert got[honest.peer_id].age_s == 50.0 and got[old.peer_id].age_s == 120.0
    # malformed entries are skipped, never raised on
    book.note_peer_rates([(b"x", b"y"), ("not", "bytes"), (honest.public_key_bytes, b"\x00" * 10)])
    book.note_peer_rates([None, 3, (1, 2, 3)])  # type: ignore[list-item]
    assert honest.peer_id in {p.peer_id for p in book.peer_task_rates()}


def test_rescue_requests_age_out_and_a_newer_heartbeat_without_them_withdraws_them():
    clock, wall = FakeClock(), FakeClock(1_000_000.0)
    book = _book(clock, wall, rescue=True)
    asker = _ident("asker")
    ref = TaskRef("rg:chain_sum", "d" * 16, 0, 3)
    book.peers.record_earned(asker.peer_id, 2)
    book.note_peer_rates([_heartbeat_entry(asker, None, wall(), rescue=[ref])])
    reqs = book.rescue_requests()
    assert [(r.peer_id, r.ref, r.standing) for r in reqs] == [(asker.peer_id, ref, 2)]
    clock.advance(600.0)  # freshness_seconds from our first read: still asked
    assert len(book.rescue_requests()) == 1
    clock.advance(1.0)
    assert book.rescue_requests() == []
    # a newer heartbeat without the key: the peer asks for nothing now
    book.note_peer_rates([_heartbeat_entry(asker, None, wall(), rescue=[ref])])
    book.note_peer_rates([_heartbeat_entry(asker, None, wall() + 1)])
    assert book.rescue_requests() == [] and asker.peer_id not in book.peer_rescue
    # our own announcements: TaskRefs only, no duplicates, at most max_rescue_requests
    mine = _book(clock, wall, rescue=True, max_rescue_requests=2)
    more = [TaskRef("rg:chain_sum", "d" * 16, 0, 4), TaskRef("rg:chain_sum", "d" * 16, 0, 5)]
    mine.announce_rescue([ref, ref, "x", *more])
    assert mine.rescue_refs() == [ref, more[0]]
    assert mine.heartbeat("m").rescue == mine.rescue_refs() and mine.heartbeat("m").created_at == wall()


def test_answers_to_our_questions_take_no_young_pool_slot_one_per_question_a_step():
    """A weaker node's rescue answers come from a stronger peer that is young at it (the weaker node's screen
    rejects many of that peer's leaves, so it earns standing slowly): in a live pair the helper
    answered 27-35 questions in 25 steps and the asker merged none, every answer waiting behind the helper's
    ordinary trees for the one young slot until its question expired. An answer to a question we asked is now
    admitted beside the pool, the first tree of each asked question a step (so at most len(asked) more)."""
    a = _admission(young_key_trees=1, max_young_trees=1, established_after=16)
    helper, ordinary = _peer_trees("stronger helper", 3)
    asked = [PeerTree(_tree(k=10 + k, rewards=(1.0, 1.0)), helper) for k in range(2)]  # all correct: no contrast
    sybils = [PeerTree(_tree(True, 10), f"sybil answer {i}") for i in range(20)]  # 20 keys answer question 10
    out, young, dropped = a.admit(ordinary + asked + sybils, {t.task_key for t in asked})
    ids = {id(t) for t in out}
    answers = [t for t in out if t.task_key in {x.task_key for x in asked}]
    # both questions answered once each (by whichever answerer waited longest), plus the one pool slot
    assert len(answers) == 2 and len({t.task_key for t in answers}) == 2
    assert len(out) == 3 and young == 3
    assert sum(1 for t in ordinary if id(t) in ids) + sum(1 for t in sybils if id(t) in ids) <= 2
    # keys answering with wrong leaves only take no question's turn from a correct answer: they are dropped
    c = _admission(young_key_trees=1, max_young_trees=1, established_after=16)
    wrong = [PeerTree(_tree(False, 10), f"wrong answer {i}") for i in range(20)]
    out, young, dropped = c.admit(wrong + asked, {t.task_key for t in asked})
    assert sorted(t.task_key for t in out) == sorted(t.task_key for t in asked) and dropped == 20
    assert all(t.peer_id == helper for t in out)
    # without the question asked, the helper's flat answer trees are dropped as before and nothing else changes
    b = _admission(young_key_trees=1, max_young_trees=1, established_after=16)
    out, young, dropped = b.admit(ordinary + asked)
    assert len(out) == 1 and young == 1 and dropped == 2


def test_a_flood_of_one_shot_young_keys_cannot_keep_a_later_newcomer_out_of_the_queue():
    """Outside-attack shape, open item: keys that waited once and went away filled the waiting map for good (it was
    never trimmed), and a newcomer arriving later was not remembered: until its first slot its place was the
    current turn every step, a lottery against the keys minted that step. Now the waiter seen least recently that
    is not competing makes room (``TurnQueue``): the newcomer ties only with the keys minted on its first step and
    gets a slot on the next one at the latest. Eight trials: without the room made, each would pass with
    probability about 0.4."""
    from swarmnode.turns import TurnQueue

    for trial in range(8):
        a = _admission(young_key_trees=1, established_after=16)  # a pool of 2 young trees a step
        a.turns = TurnQueue(max_peers=16)
        # twenty one-shot keys in one step, each with a tree with contrast: two get slots, the others wait, then
        # all go away (their trees dropped)
        a.admit([_peer_trees(f"one-shot {trial} {i}", 1)[1][0] for i in range(20)])
        a.carry = []
        newcomer, trees = _peer_trees(f"later newcomer {trial}", 2)
        got = 0
        for step in range(2):  # eight fresh keys minted every step
            fresh = [_peer_trees(f"minted {trial} {step} {i}", 1)[1][0] for i in range(8)]
            out, _, _ = a.admit(fresh + [trees[step]])
            got += sum(1 for t in out if t.peer_id == newcomer)
            a.carry = []
        assert got >= 1, f"trial {trial}: the newcomer got no slot in 2 steps"
