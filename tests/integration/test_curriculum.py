"""Swarm curriculum: the swarm's per-task success rates reweight the task mix, within bounds that no
peer value can break; the rates travel in heartbeats as an optional key that leaves old heartbeats' bytes alone."""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from pathlib import Path

import pytest

from swarmnode.swarm import wire
from swarmnode.swarm.identity import Identity
from swarmnode.tasks import ReasoningGymSource, TaskMix
from swarmnode.tasks.curriculum import (
    MAX_RATE_COUNT,
    LocalRates,
    PeerRates,
    combine_rates,
    curriculum_factor,
    curriculum_weights,
    learnability,
    tally_votes,
    vote_rate,
)

KEYS = ["rg:a#1", "rg:b#2", "rg:c#3"]
ME = Identity.from_private_bytes(hashlib.sha256(b"test_curriculum me").digest())
VECTORS = Path(__file__).resolve().parents[2] / "protocol" / "vectors"


def peers(n, rates, *, age=1.0, standing=0, prefix="sybil"):
    return [PeerRates(f"{prefix}{i}", rates, age_s=age, standing=standing) for i in range(n)]


# ------------------------------------------------------------------ the statistic
def test_median_of_one_vote_per_peer_with_our_own():
    own = {"rg:a#1": (10, 5)}
    ps = [PeerRates("p1", {"rg:a#1": (10, 1)}, standing=16), PeerRates("p2", {"rg:a#1": (10, 9)}, standing=16)]
    assert combine_rates(KEYS, own, ps) == {"rg:a#1": 0.5, "rg:b#2": None, "rg:c#3": None}
    # one peer id repeated 100 times votes once (its freshest entry)
    dup = ([PeerRates("p1", {"rg:a#1": (10, 0)}, age_s=5.0, standing=16)] * 100
           + [PeerRates("p1", {"rg:a#1": (10, 10)}, age_s=1.0, standing=16)])
    assert combine_rates(["rg:a#1"], {"rg:a#1": (10, 2)}, dup)["rg:a#1"] == pytest.approx(0.6)  # median(0.2, 1.0)
    # our own heartbeat read back from the DHT is not a second vote of ours
    assert combine_rates(["rg:a#1"], own, [PeerRates("me", {"rg:a#1": (10, 0)})], own_peer_id="me")["rg:a#1"] == 0.5


def test_stale_small_and_hostile_entries_are_no_votes():
    own = {"rg:a#1": (10, 5)}
    hostile = [
        PeerRates("stale", {"rg:a#1": (10, 0)}, age_s=121.0),
        PeerRates("nan-age", {"rg:a#1": (10, 0)}, age_s=float("nan")),
        PeerRates("few", {"rg:a#1": (3, 0)}),
        PeerRates("nan", {"rg:a#1": (float("nan"), 0)}),
        PeerRates("inf", {"rg:a#1": (float("inf"), float("inf"))}),
        PeerRates("neg", {"rg:a#1": (10, -5)}),
        PeerRates("str", {"rg:a#1": ("10", None)}),
        PeerRates("bool", {"rg:a#1": (True, True)}),
        PeerRates("shape", {"rg:a#1": 0.0}),
        PeerRates("notmap", ["rg:a#1"]),  # type: ignore[arg-type]
        PeerRates("", {"rg:a#1": (10, 0)}),
    ]
    assert combine_rates(["rg:a#1"], own, hostile, min_samples=8, max_age_s=120.0) == {"rg:a#1": 0.5}
    # k > n and huge counts: a rate of at most 1, and the rate of the counts claimed (capping n and k each on its
    # own turned (10**30, 10**29), rate 0.1, into rate 1: an outside attack)
    assert vote_rate((10, 10**30), 8) == 1.0
    assert vote_rate((10**30, 10**29), 8) == pytest.approx(0.1)
    assert vote_rate((2**21, 2**20), 8) == 0.5
    assert vote_rate((1e308, 0), 8) == 0.0
    for rate in combine_rates(KEYS, {}, [PeerRates("x", {k: (1e300, 1e301) for k in KEYS}, standing=16)]).values():
        assert rate is not None and 0.0 <= rate <= 1.0


def test_voters_are_capped_and_ranked_by_earned_standing():
    honest = peers(3, {"rg:a#1": (16, 8)}, standing=20, prefix="honest")
    sybils = peers(1000, {"rg:a#1": (16, 0)})
    # 32 seats: the three established peers sit first; keys without standing get none with 3 trusted votes
    # (trusted - 3 seats), so 1,000 Sybils cannot move the median off the honest 0.5
    assert combine_rates(["rg:a#1"], {}, honest + sybils, max_voters=32)["rg:a#1"] == 0.5
    assert combine_rates(["rg:a#1"], {}, sybils + honest, max_voters=3)["rg:a#1"] == 0.5
    # young keys get no seat at all (an outside attack: two liars plus Sybils in trusted - 3 seats owned the median):
    # 4 trusted votes (0.5, 0.5, 1.0, 1.0) give 0.75 with or without 1,000 Sybils voting 0.0
    four = [PeerRates(f"h{i}", {"rg:a#1": (16, 8 if i < 2 else 16)}, standing=16) for i in range(4)]
    assert combine_rates(["rg:a#1"], {}, four)["rg:a#1"] == 0.75
    t = tally_votes(["rg:a#1"], {}, four + sybils)["rg:a#1"]
    assert (t.rate, t.trusted, len(t.peers)) == (0.75, 4, 4)


def test_ties_in_standing_are_not_broken_by_the_peer_id():
    """A key ground to sort first by peer id has no edge for the last seat: over 24 pairs of equal standing, the
    key that sorts first by id does not win every seat (it would with id order; by chance: 2^-24)."""
    wins = 0
    for i in range(24):
        pair = [PeerRates(f"zzzz{i}", {"rg:a#1": (16, 16)}, standing=16),
                PeerRates(f"0000{i}", {"rg:a#1": (16, 0)}, standing=16)]
        wins += combine_rates(["rg:a#1"], {}, pair, max_voters=1)["rg:a#1"] == 0.0
    assert 0 < wins < 24, wins


@pytest.mark.parametrize("n_sybils", [1, 2, 5, 1000])
def test_keys_without_standing_never_decide_the_median(n_sybils):
    """Outside attack: in a small swarm, fresh keys outvoted the honest ones, and with an even count one
    liar swung the averaged median (0 -> 0.5). Now the median stays between the lowest and highest trusted vote
    (our own and peers with earned standing), whatever the fresh keys claim."""
    for own, honest in [({"rg:a#1": (16, 0)}, []), ({"rg:a#1": (16, 0)}, [(16, 0)]),
                        ({"rg:a#1": (16, 16)}, [(16, 8), (16, 12)]), ({}, [(16, 4)])]:
        trusted = [k / n for n, k in ([own["rg:a#1"]] if own else []) + honest]
        hp = [PeerRates(f"h{i}", {"rg:a#1": c}, standing=16) for i, c in enumerate(honest)]
        for lie in (0, 8, 16):
            got = combine_rates(["rg:a#1"], own, hp + peers(n_sybils, {"rg:a#1": (16, lie)}))["rg:a#1"]
            assert min(trusted) <= got <= max(trusted), (own, honest, lie, got)
    # no trusted vote at all: no rate (the configured weight), however many keys vote
    assert combine_rates(["rg:a#1"], {}, peers(n_sybils, {"rg:a#1": (16, 8)}))["rg:a#1"] is None


@pytest.mark.parametrize("standing", [1, 3, 15])
def test_keys_with_a_little_standing_are_still_young(standing):
    """Outside attack (session 19): two fresh keys with one cheap mixed tree each (standing 1) counted as trusted
    and took the median from our own vote (task share 25% -> 57%). Below ``established_after`` useful trees a key
    is young: with our own vote the only trusted one, the young keys get no seat at all."""
    own = {"rg:a#1": (16, 0)}
    sybils = peers(2, {"rg:a#1": (16, 8)}, standing=standing)
    t = tally_votes(["rg:a#1"], own, sybils, established_after=16)["rg:a#1"]
    assert (t.rate, t.peers, t.trusted) == (0.0, (), 1)
    # at the threshold the same keys are established: their votes are trusted and counted
    t = tally_votes(["rg:a#1"], own, peers(2, {"rg:a#1": (16, 8)}, standing=16), established_after=16)["rg:a#1"]
    assert (t.rate, len(t.peers), t.trusted) == (0.5, 2, 3)
    # established_after 0 (every key established for the tree caps) still asks for one useful tree
    assert combine_rates(["rg:a#1"], own, peers(2, {"rg:a#1": (16, 8)}), established_after=0)["rg:a#1"] == 0.0
    assert combine_rates(["rg:a#1"], own, sybils, established_after=0)["rg:a#1"] == 0.5


def test_the_tally_names_the_votes_it_used():
    """``curriculum/voters`` counts the peers whose votes were used, not every heartbeat read."""
    own = {"rg:a#1": (16, 8), "rg:b#2": (16, 8)}
    est = peers(3, {"rg:a#1": (16, 4)}, standing=20, prefix="est")
    young = peers(50, {"rg:a#1": (16, 0), "rg:b#2": (16, 0)})
    stale = peers(10, {"rg:a#1": (16, 0)}, standing=20, age=500.0, prefix="stale")
    tallies = tally_votes(KEYS, own, est + young + stale)
    a, b = tallies["rg:a#1"], tallies["rg:b#2"]
    assert a.trusted == 4 and set(a.peers) == {"est0", "est1", "est2"}  # young keys get no seat
    assert b.trusted == 1 and b.peers == ()  # our own vote alone: no young key sits
    assert tallies["rg:c#3"].rate is None
    assert len({p for t in tallies.values() for p in t.peers}) == 3


@pytest.mark.parametrize("honest", range(0, 9))
def test_two_established_liars_and_their_sybils_move_no_median_the_honest_outvote(honest):
    """Outside attack: with young seats = trusted - 3, two established liars and H Sybils cast H + 2 votes
    against our own and H honest established ones, and the median became the liars' value for every H in 0..8
    (a target task's share 0.25 -> 0.571). Young keys now get no seat: the median is an honest vote whenever the
    honest side (our own vote plus H) outnumbers the two liars, i.e. H >= 2; at H = 1 it is the mean of an honest
    and a lying vote; at H = 0 the liars hold it (measured here, reported in docs/guide/swarm.md)."""
    own = {"rg:a#1": (16, 8)}
    hp = peers(honest, {"rg:a#1": (16, 8)}, standing=20, prefix="honest")
    for lie in (0, 16):
        liars = [PeerRates(f"liar{i}", {"rg:a#1": (16, lie)}, standing=40) for i in range(2)]
        sybils = peers(1000, {"rg:a#1": (16, lie)}, standing=1)
        t = tally_votes(["rg:a#1"], own, hp + liars + sybils)["rg:a#1"]
        assert not any(p.startswith("sybil") for p in t.peers) and t.trusted == honest + 3, t
        if honest >= 2:
            assert t.rate == 0.5, (honest, lie, t)
        elif honest == 1:
            assert t.rate == 0.5 * (0.5 + lie / 16), (honest, lie, t)
        else:
            assert t.rate == lie / 16, (honest, lie, t)


@pytest.mark.parametrize("honest", [0, 1, 2, 5, 15, 30])
def test_one_lying_established_peer_and_its_sybils_never_hold_the_majority(honest):
    """Outside attack (2026-12-05): one established hostile key plus young Sybils held H + 2 of the
    2H + 3 votes against our own and H honest established peers (young seats were trusted - 1), and pushed a
    task's rate to the liar's value (its share 50% -> 20%). With trusted - 3 young seats the honest votes keep a
    strict majority: the median is an honest vote whatever the liar and 1,000 Sybils claim."""
    own = {"rg:a#1": (16, 8)}
    hp = peers(honest, {"rg:a#1": (16, 8)}, standing=20, prefix="honest")
    for lie in (0, 16):
        liar = [PeerRates("liar", {"rg:a#1": (16, lie)}, standing=20)]
        t = tally_votes(["rg:a#1"], own, hp + liar + peers(1000, {"rg:a#1": (16, lie)}))["rg:a#1"]
        assert t.trusted == honest + 2 and not any(p.startswith("sybil") for p in t.peers), (honest, t)
        # with only our own vote and the liar's, the median is their mean: between the trusted votes
        assert t.rate == (0.5 if honest else 0.5 * (0.5 + lie / 16)), (honest, lie, t.rate)


# ------------------------------------------------------------------ the weights
def test_factor_is_bounded_and_peaks_at_one_half():
    assert learnability(0.5) == 1.0 and learnability(0.0) == learnability(1.0) == 0.0
    assert learnability(float("nan")) == 0.0 and learnability(7.0) == 0.0 and learnability(-3.0) == 0.0
    assert curriculum_factor(0.5) == pytest.approx(2.0)
    assert curriculum_factor(0.0) == curriculum_factor(1.0) == pytest.approx(0.5)
    assert curriculum_factor(None) == 1.0
    grid = [i / 100 for i in range(101)] + [float("nan"), float("inf"), -1e9, 1e9]
    for p in grid:
        assert 0.5 <= curriculum_factor(p, 0.5, 2.0) <= 2.0
    with pytest.raises(ValueError):
        curriculum_factor(0.5, 0.0, 2.0)
    with pytest.raises(ValueError):
        curriculum_factor(0.5, 3.0, 2.0)


@pytest.mark.parametrize("attack", [
    {"rg:a#1": (16, 8), "rg:b#2": (16, 0), "rg:c#3": (16, 16)},      # steer everything onto task a
    {"rg:a#1": (1e300, float("nan")), "rg:b#2": (float("inf"), 1), "rg:c#3": (10**40, 10**41)},
    {"rg:a#1": (16, 0), "rg:b#2": (16, 0), "rg:c#3": (16, 0)},        # kill every task
])
def test_hostile_swarm_cannot_push_a_task_past_its_floor_or_ceiling(attack):
    configured = [1.0, 2.0, 5.0]
    own = {"rg:a#1": (16, 16), "rg:b#2": (16, 8), "rg:c#3": (16, 8)}
    rates = combine_rates(KEYS, own, peers(5000, attack))
    w = curriculum_weights(configured, [rates[k] for k in KEYS], min_factor=0.5, max_factor=2.0)
    total, ctotal = sum(w), sum(configured)
    for wi, ci in zip(w, configured):
        assert 0.5 * ci - 1e-12 <= wi <= 2.0 * ci + 1e-12
        share, cshare = wi / total, ci / ctotal
        assert cshare * 0.25 - 1e-12 <= share <= min(1.0, cshare * 4.0) + 1e-12
        assert share > 0 and math.isfinite(share)


# ------------------------------------------------------------------ the draw
@pytest.fixture(scope="module")
def mix() -> TaskMix:
    return TaskMix([ReasoningGymSource("chain_sum", {"min_terms": 2, "max_terms": 2}),
                    ReasoningGymSource("leg_counting", {})], [1.0, 1.0])


def test_weighted_draw_respects_the_weights_and_stays_deterministic(mix):
    w = curriculum_weights(mix.weights, [0.5, 1.0])  # chain_sum x2, leg_counting x0.5: share 0.8 / 0.2
    refs = [r for step in range(150) for r in mix.refs_for_step(step, 8, stream=3, weights=w)]
    share = sum(r.source == "rg:chain_sum" for r in refs) / len(refs)
    assert 0.75 <= share <= 0.85
    assert mix.refs_for_step(7, 8, stream=3, weights=w) == mix.refs_for_step(7, 8, stream=3, weights=list(w))
    assert mix.refs_for_step(7, 8, stream=3, weights=[1.0, 1.0]) == mix.refs_for_step(7, 8, stream=3)
    for r in refs:  # never a held-out question, always a task every peer accepts
        assert mix.contains(r) and not mix.is_heldout(r)
    for bad in ([1.0], [1.0, float("nan")], [1.0, 0.0], [1.0, -2.0]):
        with pytest.raises(ValueError):
            mix.refs_for_step(0, 4, weights=bad)


def test_local_rates_window_and_bounds():
    lr = LocalRates(window_steps=2)
    lr.observe({"rg:a#1": (4, 1)})
    lr.observe({"rg:a#1": (4, 3), "x" * 200: (4, 4)})
    lr.observe({"rg:a#1": (4, 4), "rg:b#2": (8, 0)})
    assert lr.counts() == {"rg:b#2": (8, 0), "rg:a#1": (8, 7)}  # window of 2 steps; over-long keys left out
    lr2 = LocalRates(window_steps=1)
    lr2.observe({f"rg:t{i}#0": (i + 1, 0) for i in range(40)})
    assert len(lr2.counts()) == 16


# ------------------------------------------------------------------ the heartbeat
def _beat(rates=None) -> wire.Heartbeat:
    return wire.Heartbeat(swarm_id="s", peer_id=ME.peer_id, model_id="m", step=3, reward_mean=0.5, accuracy=None,
                          samples_published=1, samples_accepted=2, samples_rejected=0, created_at=1767225600.0,
                          task_rates=rates)


def test_heartbeat_rates_round_trip_and_old_bytes_unchanged():
    rates = {"rg:leg_counting#00aa": (32, 7), "rg:chain_sum#1f7d586e2d8b0c5e": (64, 40)}
    env = wire.encode_heartbeat(_beat(rates), ME)
    assert len(env) <= wire.MAX_HEARTBEAT_BYTES
    hb = wire.decode_heartbeat(env)
    assert hb.task_rates == rates
    assert wire.to_jsonable(hb)["task_rates"] == {k: list(v) for k, v in rates.items()}
    # without rates the body has no `rates` key: byte for byte the heartbeat of before (golden vector)
    assert wire.encode_body(_beat(None)) == wire.encode_body(_beat({}))
    assert b"rates" not in wire.encode_body(_beat(None))
    vec = json.loads((VECTORS / "heartbeat_valid.json").read_text())
    got = wire.decode_heartbeat(bytes.fromhex(vec["envelope_hex"]))
    assert got.task_rates is None and "task_rates" not in wire.to_jsonable(got)
    # the largest heartbeat fits
    big = {("k%03d" % i) + "x" * 124: (wire.MAX_RATE_COUNT, wire.MAX_RATE_COUNT) for i in range(wire.MAX_RATE_TASKS)}
    assert len(wire.encode_heartbeat(_beat(big), ME)) <= wire.MAX_HEARTBEAT_BYTES


def _signed_raw(raw: dict) -> bytes:
    return wire.seal(ME, wire.KIND_HEARTBEAT, wire._pack(raw))


@pytest.mark.parametrize("rates, reason", [
    ([["a", 10, 11]], "schema"),                    # k > n
    ([["a", 0, 0]], "schema"),                      # n = 0
    ([["a", 2**21, 0]], "schema"),                  # n over MAX_RATE_COUNT
    ([["a", 10.0, 1]], "schema"),                   # a float count
    ([["a", float("nan"), 1]], "schema"),
    ([["b", 10, 1], ["a", 10, 1]], "schema"),       # not ascending
    ([["a", 10, 1], ["a", 10, 1]], "schema"),       # repeated key
    ([["", 10, 1]], "schema"),
    ([["x" * 129, 10, 1]], "too_large"),
    ([[f"k{i:02d}", 10, 1] for i in range(17)], "too_large"),
    ([], "schema"),
    ([["a", 10]], "schema"),
])
def test_hostile_heartbeat_rates_are_rejected(rates, reason):
    raw = wire._heartbeat_base_raw(_beat())
    raw["rates"] = rates
    raw = {k: raw[k] for k in wire.HEARTBEAT_RATES_KEYS}
    with pytest.raises(wire.WireError) as ei:
        wire.decode_heartbeat(_signed_raw(raw))
    assert ei.value.reason == reason


# ------------------------------------------------------------------ through a real swarm (hivemind on loopback)
def test_rates_travel_in_heartbeats_between_real_clients(tmp_path):
    from cryptography.hazmat.primitives import serialization

    from swarmnode.config import RunConfig, SwarmConfig
    from swarmnode.swarm.dht import SwarmDHT
    from swarmnode.rollout.peer_tree import PeerTree
    from swarmnode.swarm.gossip import SwarmClient
    from swarmnode.testing.adversary import BYTE_TOKENIZER_ID, HostileFactory, byte_tokenize

    swarm_id = "curriculum-test"
    mix = TaskMix([ReasoningGymSource("chain_sum", {"min_terms": 2, "max_terms": 2})], [1.0])
    fast = {"health_interval": 0.5, "join_backoff": (0.5, 2.0), "startup_timeout": 60.0}

    def client(name, peers=()):
        cfg = RunConfig(swarm=SwarmConfig(enabled=True, swarm_id=swarm_id,
                                          net={"initial_peers": list(peers), "dht_timeout": 5.0}),
                        levers={"curriculum": {"enabled": True}})
        ident = Identity.from_private_bytes(hashlib.sha256(f"test_curriculum {name}".encode()).digest())
        return SwarmClient(cfg, ident, mix, 256, "m", BYTE_TOKENIZER_ID, byte_tokenize, tmp_path / name,
                           heartbeat_interval=1.0, dht_kwargs=fast)

    a = client("a")
    b = client("b", a.maddrs())
    future_ident = Identity.from_private_bytes(hashlib.sha256(b"test_curriculum future").digest())
    key = serialization.load_pem_private_key(future_ident.to_pem(), password=None)
    dht = SwarmDHT(key, swarm_ids=[swarm_id], initial_peers=a.maddrs(), call_timeout=10.0, health_interval=0,
                   startup_timeout=60.0)
    try:
        key_a = mix.source_key(0)
        a.share_task_rates({key_a: (16, 8), "": (1, 1), "bad": (0, 0), "worse": (5, 9)})  # only the valid entry
        b.share_task_rates({key_a: (16, 1)})
        beat = wire.Heartbeat(swarm_id=swarm_id, peer_id=future_ident.peer_id, model_id="m", step=1, reward_mean=None,
                              accuracy=None, samples_published=0, samples_accepted=0, samples_rejected=0,
                              created_at=time.time() + 3600, task_rates={key_a: (16, 0)})
        assert dht.publish_heartbeat(swarm_id, wire.encode_heartbeat(beat, future_ident))  # dated an hour ahead
        deadline = time.monotonic() + 90
        seen: list[PeerRates] = []
        while time.monotonic() < deadline:
            seen = b.peer_task_rates()
            if any(p.peer_id == a.peer_id for p in seen):
                break
            time.sleep(0.5)
        by_peer = {p.peer_id: p for p in seen}
        assert set(by_peer) == {a.peer_id}  # not our own heartbeat, not the future-dated one
        assert by_peer[a.peer_id].rates == {key_a: (16, 8)} and 0 <= by_peer[a.peer_id].age_s < 90
        # a has earned no standing at b yet: with b's own vote the only trusted one, a's vote takes no seat
        assert by_peer[a.peer_id].standing == 0
        est = b.scfg.trust.established_after
        assert combine_rates([key_a], {key_a: (16, 1)}, seen, own_peer_id=b.peer_id,
                             established_after=est)[key_a] == pytest.approx(1 / 16)
        # b admits one useful (mixed) tree of a and trains on it (the node's credit): standing 1, still a young
        # key whose vote takes no seat
        useful = HostileFactory(Identity.from_private_bytes(hashlib.sha256(b"test_curriculum a").digest()), mix,
                                swarm_id=swarm_id).contrast_trees(est)
        out, n_young, _ = b._admit([PeerTree(useful[0], a.peer_id)])
        assert n_young == 1 and not out[0].established
        assert {p.peer_id: p.standing for p in b.peer_task_rates()} == {a.peer_id: 0}  # admission earns nothing
        b.credit(a.peer_id, len(out))
        seen = b.peer_task_rates()
        assert {p.peer_id: p.standing for p in seen} == {a.peer_id: 1}
        assert combine_rates([key_a], {key_a: (16, 1)}, seen, own_peer_id=b.peer_id,
                             established_after=est)[key_a] == pytest.approx(1 / 16)
        # useful trees admitted and trained on step after step until a is established: now its vote is trusted
        for t in useful[1:]:
            b.credit(a.peer_id, len(b._admit([PeerTree(t, a.peer_id)])[0]))
        while b._carry:
            b.credit(a.peer_id, len(b._admit([])[0]))
        seen = b.peer_task_rates()
        assert {p.peer_id: p.standing for p in seen} == {a.peer_id: est}
        rates = combine_rates([key_a], {key_a: (16, 1)}, seen, own_peer_id=b.peer_id, established_after=est)
        assert rates[key_a] == pytest.approx((1 / 16 + 0.5) / 2)
        assert b._admit([PeerTree(useful[0], a.peer_id)])[0][0].established
    finally:
        dht.shutdown()
        b.close()
        a.close()


# ------------------------------------------------------------------ in the round loop (embedded model, CPU)
class RatesSwarm:
    """A SwarmHook with no trees whose heartbeats (``peer_task_rates``) come from a hostile Sybil crowd."""

    peer_id = "sn1curriculumtestnode"

    def __init__(self, votes):
        self.votes = votes
        self.shared: list = []

    def publish(self, trees, step, policy_version):
        return {}

    def gather(self, step, policy_version):
        return [], {}

    def charge(self, peer_id, reason, n=1):
        pass

    def credit(self, peer_id, n=1):
        pass

    def share_task_rates(self, rates):
        self.shared.append(rates)

    def peer_task_rates(self):
        return self.votes

    def close(self):
        pass


def test_round_loop_draws_with_bounded_curriculum_weights(tmp_path):
    from swarmnode.config import RunConfig
    from swarmnode.node import Node

    cfg = RunConfig.model_validate({
        "steps": 2, "run_dir": str(tmp_path / "run"), "seed": 0,
        "model": {"name_or_path": "embedded", "device": "cpu", "dtype": "float32"},
        "sampling": {"prompts_per_step": 2, "num_generations": 4, "max_completion_length": 24},
        "train": {"micro_batch_size": 8},
        "levers": {"curriculum": {"enabled": True, "min_samples": 4}}, "external": {"screen": {"enabled": False}},
        "checkpoint": {"save_steps": 1000},
    })
    node = Node(cfg)
    keys = [node.tasks.source_key(i) for i in range(len(node.tasks.sources))]
    crowd = {k: (16, 0) for k in keys} | {keys[-1]: (16, 8)}  # starve every task but the last one
    # peers with earned standing (keys without it never outvote our own rates): still bounded whatever they claim
    node.swarm = sw = RatesSwarm(peers(3000, crowd, standing=cfg.swarm.trust.established_after))
    try:
        ms = [node.run_step().metrics for _ in range(2)]
        weights, _ = node.task_weights()
    finally:
        node.close()
    ctotal = sum(node.tasks.weights)
    for m in ms:
        assert m["curriculum/voters"] == cfg.levers.curriculum.max_voters  # the votes used, not the 3,000 read
        shares = [m[f"curriculum/share/{node._task_label(i)}"] for i in range(len(keys))]
        assert sum(shares) == pytest.approx(1.0)
        for share, w in zip(shares, node.tasks.weights):
            assert 0.25 * w / ctotal <= share + 1e-12 and share <= 4.0 * w / ctotal + 1e-12
    for w, c in zip(weights, node.tasks.weights):
        assert 0.5 * c - 1e-12 <= w <= 2.0 * c + 1e-12
    assert weights[-1] == pytest.approx(2.0 * node.tasks.weights[-1])  # the crowd's median is 0.5 there
    # our own counts went to the swarm layer for our heartbeats: 2 prompts x 4 leaves per step
    assert len(sw.shared) == 2 and sum(n for n, _ in sw.shared[-1].values()) == 16
    assert all(0 <= k <= n for n, k in sw.shared[-1].values())


@pytest.mark.parametrize("honest", [2, 5, 8])
def test_two_liars_cannot_set_a_rare_tasks_rate_while_honest_peers_abstain(honest):
    """Outside attack: on a task with fewer than ``min_samples`` leaves in our window and the honest peers'
    windows, two established liars claiming 16 leaves were the only votes and owned its rate (factor 0.5 instead of
    2.0) for any number of honest established peers. Abstaining seats now repeat our own vote, or, without one,
    leave the task without a swarm rate."""
    rare = "rg:a#1"
    hp = [PeerRates(f"h{i}", {rare: (6, 3)}, standing=16) for i in range(honest)]  # too few leaves: abstain
    liars = [PeerRates(f"liar{i}", {rare: (16, 16)}, standing=16) for i in range(2)]
    t = tally_votes([rare], {rare: (8, 4)}, hp + liars, min_samples=8, established_after=16)[rare]
    assert t.rate == 0.5, t  # our own 0.5 holds against the liars' 1.0
    assert t.trusted == 3 and set(t.peers) == {"liar0", "liar1"}
    t = tally_votes([rare], {rare: (4, 2)}, hp + liars, min_samples=8, established_after=16)[rare]
    assert t.rate is None, t  # no vote of ours, 2 of honest + 2 seats voted: not a majority
    # control: when the honest peers have their samples, they outvote the liars as before
    hv = [PeerRates(f"h{i}", {rare: (16, 8)}, standing=16) for i in range(honest)]
    t = tally_votes([rare], {rare: (16, 8)}, hv + liars, min_samples=8, established_after=16)[rare]
    assert t.rate == 0.5 and t.trusted == honest + 3, t


# ------------------------------------------------------------------ liars with top standing
def _binomial_votes(rng, n_peers, probs, prefix, standing):
    """``n_peers`` honest peers at ``standing``, each with its own sampled counts of every task (n in 8..64)."""
    out = []
    for i in range(n_peers):
        rates = {}
        for key, p in zip(KEYS, probs):
            n = rng.randint(8, 64)
            rates[key] = (n, sum(rng.random() < p for _ in range(n)))
        out.append(PeerRates(f"{prefix}{i}", rates, standing=standing))
    return out


def _factor_range(lo, hi):
    """The smallest and largest :func:`curriculum_factor` over rates in ``[lo, hi]`` (it peaks at 0.5)."""
    ends = (curriculum_factor(lo), curriculum_factor(hi))
    return min(ends), (curriculum_factor(0.5) if lo <= 0.5 <= hi else max(ends))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_liars_with_top_standing_cannot_move_a_rate_the_honest_majority_gives(k):
    """Outside attack: seats went by standing, so k liars with top standing took the seats even while honest
    established voters outnumbered them. Every established voter now counts once: against H = k+1 .. 8 honest
    voters at the lowest established standing, k liars at standing 10**6 (and 1,000 Sybils) give the honest rate
    exactly when the honest votes agree, and otherwise a rate between the honest votes of ranks
    ceil((m-k)/2) and floor((m+k)/2)+1 (m honest trusted votes): no farther from the honest median than that."""
    probs = (0.15, 0.5, 0.85)
    lies = {"zero": lambda h: 0.0, "one": lambda h: 1.0, "half": lambda h: 0.5,
            "below": lambda h: max(0.0, min(h) - 0.01), "above": lambda h: min(1.0, max(h) + 0.01)}
    for seed in range(6):
        rng = random.Random(f"{seed}/{k}")
        for honest in range(k + 1, 9):
            sybils = peers(1000, {key: (16, 16 * (seed % 2)) for key in KEYS}, standing=1)
            # agreeing honest votes: the liars move nothing, rate and factor are the honest ones
            agree = {key: (32, round(32 * p)) for key, p in zip(KEYS, probs)}
            hp = peers(honest, agree, standing=16, prefix="honest")
            for own in (agree, {}):
                base = tally_votes(KEYS, own, hp)
                for name, lie in lies.items():
                    liars = [PeerRates(f"liar{i}", {key: (64, round(64 * lie([a[1] / 32]))) for key, a in agree.items()},
                                       standing=10**6) for i in range(k)]
                    got = tally_votes(KEYS, own, hp + liars + sybils)
                    for key in KEYS:
                        assert got[key].rate == base[key].rate == agree[key][1] / 32, (seed, honest, name, key)
                        assert curriculum_factor(got[key].rate) == curriculum_factor(base[key].rate)
                        assert got[key].trusted == honest + k + bool(own)
            # noisy honest votes (each peer's own sample of each task): within the rank band of the honest votes
            hp = _binomial_votes(rng, honest, probs, "honest", 16)
            for own in (_binomial_votes(rng, 1, probs, "me", 0)[0].rates, {}):
                base = tally_votes(KEYS, own, hp)
                for name, lie in lies.items():
                    for key in KEYS:
                        h = sorted(([vote_rate(own[key], 8)] if own else []) + [vote_rate(p.rates[key], 8) for p in hp])
                        m = len(h)
                        lo, hi = h[math.ceil((m - k) / 2) - 1], h[(m + k) // 2]
                        liars = [PeerRates(f"liar{i}", {key: (10**6, round(10**6 * lie(h)))}, standing=10**6)
                                 for i in range(k)]
                        rate = tally_votes([key], own, hp + liars + sybils)[key].rate
                        assert lo <= rate <= hi and lo <= base[key].rate <= hi, (seed, honest, name, key, h, rate)
                        fmin, fmax = _factor_range(lo, hi)
                        assert fmin - 1e-12 <= curriculum_factor(rate) <= fmax + 1e-12
                        assert abs(rate - base[key].rate) <= hi - lo
    # fewer seats than voters (max_voters = H): ranked seats went to the k liars first; drawn seats hold them at the
    # draw's rate, k H / (H + k) of the H seats on average
    for honest in range(k + 1, 9):
        voters = peers(honest, {KEYS[0]: (16, 8)}, standing=16, prefix="honest") + peers(
            k, {KEYS[0]: (16, 0)}, standing=10**6, prefix="liar")
        seated = [sum(p.startswith("liar") for p in tally_votes(KEYS[:1], {}, voters, max_voters=honest,
                                                                 seed=bytes([d]))[KEYS[0]].peers)
                  for d in range(200)]
        assert abs(sum(seated) / 200 - k * honest / (honest + k)) < 0.25 * k, (k, honest, sum(seated) / 200)


def test_seats_are_a_uniform_draw_whatever_the_standing():
    """Beyond ``max_voters`` established peers the seats are a random subset drawn per call from a secret seed,
    never the highest standing: 20 liars at standing 10**6 among 100 established peers get 20% of 10 seats on
    average, and own the median (with our own vote: 6 of 10 seats) about as often as the hypergeometric draw
    says (1.2%), where ranked seats gave it to them on every step."""
    honest = peers(80, {"rg:a#1": (16, 8)}, standing=16, prefix="honest")
    liars = peers(20, {"rg:a#1": (16, 16)}, standing=10**6, prefix="liar")
    own = {"rg:a#1": (16, 8)}
    seated_liars = owned = 0
    draws = 1000
    for s in range(draws):
        t = tally_votes(["rg:a#1"], own, liars + honest, max_voters=10, seed=s.to_bytes(4, "big"))["rg:a#1"]
        assert len(t.peers) == 10 and t.trusted == 11
        seated_liars += sum(p.startswith("liar") for p in t.peers)
        owned += t.rate == 1.0
        assert t.rate in (0.5, 1.0)
    assert 0.17 <= seated_liars / (10 * draws) <= 0.23, seated_liars
    p_own = sum(math.comb(20, n) * math.comb(80, 10 - n) for n in range(6, 11)) / math.comb(100, 10)
    assert p_own < 0.02 and owned <= 3 * p_own * draws + 5, (owned, p_own)
    # the same seed repeats a draw; without one every call draws afresh; no key is seated by its id
    ids = lambda seed: tally_votes(["rg:a#1"], own, liars + honest, max_voters=10, seed=seed)["rg:a#1"].peers
    assert ids(b"x") == ids(b"x") and len({ids(None) for _ in range(20)}) > 1
    with pytest.raises(TypeError):
        tally_votes(["rg:a#1"], own, liars + honest, max_voters=10, seed=7)  # type: ignore[arg-type]


def test_the_outside_attack_on_ranked_seats_is_held():
    """The outside test against ranked seats: 17 liars at standing 100 beside 40 honest at 16 (32 seats) owned the
    median. With the default seats all 57 count (the honest 0.5); with 32 seats drawn at random the liars need 17
    of them (chance 4e-6 a step): over 300 draws the rate stays 0.5."""
    honest = peers(40, {"rg:a#1": (16, 8)}, standing=16, prefix="honest")
    liars = peers(17, {"rg:a#1": (16, 0)}, standing=100, prefix="liar")
    own = {"rg:a#1": (16, 8)}
    t = tally_votes(["rg:a#1"], own, liars + honest)["rg:a#1"]
    assert (t.rate, t.trusted) == (0.5, 58)
    assert all(tally_votes(["rg:a#1"], own, liars + honest, max_voters=32)["rg:a#1"].rate == 0.5 for _ in range(300))


# ------------------------------------------------------------------ the factor is a median over seats' factors
def _seat(i, n, k, standing=16):
    return PeerRates(f"p{i}", {"rg:a#1": (n, k)}, standing=standing)


@pytest.mark.parametrize("honest_voting,honest_abstaining,liars", [(2, 2, 3), (1, 2, 2), (2, 3, 2), (2, 1, 2),
                                                                   (1, 1, 1)])
def test_liars_cannot_set_the_factor_while_honest_peers_abstain_and_we_have_no_vote(
        honest_voting, honest_abstaining, liars):
    """Outside attack: without a vote of ours, a task got a rate once most seats voted, and the liars' own votes
    counted toward that majority, so fewer liars than honest established peers (some abstaining) set the factor
    (H = 4 with 2 abstaining, 3 liars: factor 0.5, the liars' value). Every seat now holds its factor or, abstaining,
    the neutral 1: the factor stays within the honest seats' values (here 1 and 2)."""
    key = "rg:a#1"
    hp = [_seat(i, 20, 10) for i in range(honest_voting)] + [_seat(10 + i, 4, 2) for i in range(honest_abstaining)]
    for lie in ((20, 20), (20, 0), (20, 10)):
        lp = [PeerRates(f"liar{j}", {key: lie}, standing=10**6) for j in range(liars)]
        t = tally_votes([key], {}, hp + lp, min_samples=8, established_after=16)[key]
        assert 1.0 - 1e-12 <= t.factor <= 2.0 + 1e-12, (lie, t)
    # control: the honest seats alone
    t = tally_votes([key], {}, hp, min_samples=8, established_after=16)[key]
    assert 1.0 - 1e-12 <= t.factor <= 2.0 + 1e-12


def test_one_liar_cannot_flip_the_factor_of_bimodal_honest_votes():
    """Outside attack: the factor is not monotone in the rate; with our vote at 0.0 and two honest peers at 1.0
    (every honest seat: factor 0.5), one liar at 0.0 made the median rate 0.5 and the factor 2.0. The median of the
    seats' factors gives 0.5 whatever the liar says."""
    key = "rg:a#1"
    honest = [_seat(0, 20, 20), _seat(1, 20, 20)]
    for lie in ((20, 0), (20, 10), (20, 20), (4, 2)):
        t = tally_votes([key], {key: (20, 0)}, honest + [PeerRates("liar", {key: lie}, standing=10**6)],
                        min_samples=8, established_after=16)[key]
        assert t.factor == pytest.approx(0.5), (lie, t)
    # and honest seats at 0.1 / 0.9 (each factor 0.824...): one liar cannot raise it to 2.0
    honest = [_seat(0, 20, 18), _seat(1, 20, 18)]
    t = tally_votes([key], {key: (20, 2)}, honest + [PeerRates("liar", {key: (20, 10)}, standing=10**6)],
                    min_samples=8, established_after=16)[key]
    assert t.factor == pytest.approx(curriculum_factor(0.1))


def test_abstaining_liars_do_not_repeat_our_outlying_vote_into_the_factor():
    """Outside attack: each abstention repeated our own vote, so k abstaining liars dragged the rate toward our
    outlier (our 0.0 against H honest peers at 0.5: with k = H the rate was 0.0, factor 0.5). An abstention is now
    the neutral factor 1: the factor stays within the honest seats' values (ours 0.5, theirs 2.0)."""
    key = "rg:a#1"
    for h in (2, 3, 5):
        hp = [_seat(i, 64, 32) for i in range(h)]
        for k in range(0, h + 1):
            lp = [PeerRates(f"liar{j}", {key: (4, 0)}, standing=16) for j in range(k)]
            t = tally_votes([key], {key: (64, 0)}, hp + lp, min_samples=8, established_after=16)[key]
            assert 0.5 - 1e-12 <= t.factor <= 2.0 + 1e-12
            if k < h:  # more than half the seats are honest peers at factor 2.0 (plus neutral liars)
                assert t.factor >= 1.0 - 1e-12, (h, k, t)


def test_local_rates_scale_huge_counts_together():
    """A window with more than MAX_RATE_COUNT leaves publishes its rate, not 1 (each count capped alone gave
    (2**20, 2**20) for 2**30 leaves at 0.5)."""
    lr = LocalRates(window_steps=2)
    lr.observe({"rg:a#1": (2**30, 2**29)})
    n, k = lr.counts()["rg:a#1"]
    assert n == MAX_RATE_COUNT and k == MAX_RATE_COUNT // 2
