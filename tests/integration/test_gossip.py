"""Pruned subtrees, the DHT manifest record, and publish/gather between real in-process SwarmClients.

The network tests run real hivemind DHTs (p2pd) on loopback, real Ed25519 keys, real reasoning-gym tasks
(re-scored by every receiver) and the byte-level tokenizer of ``swarm.adversary`` -- no mocks.
"""

from __future__ import annotations

import hashlib
import threading
import time

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from swarmnode.config import RunConfig, SwarmConfig
from swarmnode.rollout.tree import RolloutTree
from swarmnode.swarm import wire
from swarmnode.testing.adversary import BYTE_TOKENIZER_ID, HostileFactory, byte_detokenize, byte_tokenize
from swarmnode.swarm.dht import SwarmDHT
from swarmnode.swarm.gossip import SwarmClient, read_swarm_info
from swarmnode.swarm.identity import Identity, peer_id_from_public_key
from swarmnode.swarm.prune import PruneRule, PruneStats, prune_tree, prune_trees, subtree_with_leaves
from swarmnode.tasks import ReasoningGymSource, TaskMix
from swarmnode.tasks.base import TaskRef

REF = TaskRef("rg:chain_sum", "d" * 16, 0, 7)


# ============================================================================ pruning (pure)
def _group(rewards, texts, finish=None) -> RolloutTree:
    """Independent group sampling as a tree: root -> one leaf per completion (byte-level ids)."""
    t = RolloutTree(task=REF, prompt_ids=[1, 2, 3], prompt_text="Q")
    for i, (r, s) in enumerate(zip(rewards, texts)):
        lid = t.add_child(0, byte_tokenize(s), text=s, logprobs=[-0.5] * len(s.encode()), policy_version=2,
                          finish_reason=(finish[i] if finish else "eos"))
        t.nodes[lid].reward = r
    t.update_stats()
    return t


def _branchy(rewards) -> RolloutTree:
    """root -> A -> (a1, a2); root -> B -> (b1, b2); root -> c1.  Node ids 0..7 = root, A, a1, a2, B, b1, b2, c1."""
    t = RolloutTree(task=REF, prompt_ids=[9], prompt_text="Q")
    a = t.add_child(0, [65], text="A", policy_version=1)
    a1 = t.add_child(a, [49], text="1", policy_version=1, finish_reason="eos")
    a2 = t.add_child(a, [50], text="2", policy_version=1, finish_reason="answer")
    b = t.add_child(0, [66], text="B", policy_version=1)
    b1 = t.add_child(b, [51], text="3", policy_version=1, finish_reason="eos")
    b2 = t.add_child(b, [52], text="4", policy_version=1, finish_reason="length")
    c1 = t.add_child(0, [67], text="C", policy_version=1, finish_reason="eos")
    for lid, r in zip((a1, a2, b1, b2, c1), rewards):
        t.nodes[lid].reward = r
    t.update_stats()
    return t


def test_group_prune_drops_sampler_pruned_and_duplicates():
    texts = ["<answer>3</answer>", "<answer>4</answer>", "<answer>4</answer>", "<answer>3</answer> ", "x", "<ans"]
    tree = _group([1.0, 0.0, 0.0, 1.0, 0.0, 0.0], texts, finish=["eos"] * 5 + ["pruned"])
    st = PruneStats()
    out = prune_tree(tree, PruneRule(), st)
    # eligible = leaves 1..5 (6 was cut by the sampler); mean 0.4, every advantage non-zero; leaf 3 repeats leaf 2
    assert [out.completion_text(i) for i in out.leaves()] == [texts[0], texts[1], texts[3], texts[4]]
    assert out.leaf_rewards() == [1.0, 0.0, 1.0, 0.0]
    assert (st.dropped_sampler_pruned, st.dropped_duplicate, st.dropped_zero_advantage, st.dropped_cap) == (1, 1, 0, 0)
    assert (st.trees_in, st.trees_out, st.leaves_in, st.leaves_out) == (1, 1, 6, 4)
    # log-probs, policy versions and finish reasons travel with the kept leaves; the input is untouched
    assert out.nodes[1].logprobs == [-0.5] * 18 and out.nodes[1].policy_version == 2
    assert len(tree.leaves()) == 6
    # cap 3: alternate highest / lowest advantage (ties in node order): leaf 1 (+0.6), leaf 2 (-0.4), leaf 4 (+0.6)
    st3 = PruneStats()
    out3 = prune_tree(tree, PruneRule(max_leaves=3), st3)
    assert [out3.completion_text(i) for i in out3.leaves()] == [texts[0], texts[1], texts[3]]
    assert st3.dropped_cap == 1


def test_tree_prune_keeps_ancestors_and_drops_zero_advantage():
    # rewards a1=1, a2=0, b1=0.5, b2=1, c1=0: mean 0.5, so b1 has advantage 0 and is dropped
    tree = _branchy([1.0, 0.0, 0.5, 1.0, 0.0])
    st = PruneStats()
    out = prune_tree(tree, PruneRule(), st)
    assert [n.parent for n in out.nodes] == [None, 0, 1, 1, 0, 4, 0]
    assert [n.text for n in out.nodes] == ["", "A", "1", "2", "B", "4", "C"]
    assert [n.finish_reason for n in out.nodes] == [None, None, "eos", "answer", None, "length", "eos"]
    assert out.leaves() == [2, 3, 5, 6] and out.leaf_rewards() == [1.0, 0.0, 1.0, 0.0]
    assert st.dropped_zero_advantage == 1
    assert out.nodes[0].visit_count == 4 and out.nodes[0].reward_sum == 2.0  # update_stats ran
    # cap 2: +0.5 side a1 (node 2) then b2 (node 6); -0.5 side a2 (3) then c1 (7) -> a1, a2
    out2 = prune_tree(tree, PruneRule(max_leaves=2))
    assert [n.text for n in out2.nodes] == ["", "A", "1", "2"] and out2.leaf_rewards() == [1.0, 0.0]
    # the result is a valid wire tree: it encodes and decodes
    ident = Identity.from_private_bytes(hashlib.sha256(b"prune test").digest())
    b = wire.bundle_from_trees([out], swarm_id="s", publisher_key=ident.public_key_bytes, vocab_size=256)
    back = wire.decode_bundle(wire.encode_bundle(b, ident))
    assert [n.parent for n in back.trees[0].nodes] == [None, 0, 1, 1, 0, 4, 0]
    assert back.trees[0].claimed_rewards() == {2: 1.0, 3: 0.0, 5: 1.0, 6: 0.0}


def test_no_contrast_no_publication_and_similarity():
    assert prune_tree(_group([1.0, 1.0, 1.0], ["a", "b", "c"])) is None
    assert prune_tree(_group([0.0, 1.0], ["a", "b"], finish=["eos", "pruned"])) is None  # one eligible leaf
    unscored = _group([1.0, 0.0], ["a", "b"])
    unscored.nodes[2].reward = None
    assert prune_tree(unscored) is None
    trees = [_group([0.0, 0.0], ["a", "b"]), _group([1.0, 0.0, 0.0], ["<answer>12</answer>", "<answer>13</answer>",
                                                                      "<answer>14</answer>"])]
    out, st = prune_trees(trees)
    assert len(out) == 1 and len(out[0].leaves()) == 3 and st.zero_variance_trees == 1
    out, st = prune_trees(trees, PruneRule(similarity=0.9))  # the two wrong answers differ in one character
    assert [out[0].completion_text(i) for i in out[0].leaves()] == ["<answer>12</answer>", "<answer>13</answer>"]
    assert st.dropped_duplicate == 1
    assert st.as_metrics()["swarm/prune/trees_out"] == 1
    with pytest.raises(ValueError, match="max_leaves"):
        PruneRule(max_leaves=1)
    with pytest.raises(ValueError, match="similarity"):
        PruneRule(similarity=1.5)
    with pytest.raises(ValueError, match="not a leaf"):
        subtree_with_leaves(_branchy([1, 0, 1, 0, 1]), [1])


# ============================================================================ the manifest record (pure)
def test_manifest_record_roundtrip_and_rejections():
    rec = wire.ManifestRecord([b"m1" * 10, b"m2"], "12D3KooWPeer", ["/ip4/127.0.0.1/tcp/5/p2p/12D3KooWPeer"])
    data = wire.encode_manifest_record(rec)
    assert data == msgpack.packb({"addrs": rec.maddrs, "m": rec.manifests, "peer": "12D3KooWPeer", "v": 1},
                                 use_bin_type=True)
    assert wire.decode_manifest_record(data) == rec

    def reason(raw, **kw) -> str:
        with pytest.raises(wire.WireError) as ei:
            wire.decode_manifest_record(raw if isinstance(raw, bytes) else msgpack.packb(raw, use_bin_type=True), **kw)
        return ei.value.reason

    good = {"addrs": [], "m": [b"x"], "peer": "p", "v": 1}
    assert reason({"v": 1, "peer": "p", "m": [b"x"], "addrs": []}) == "non_canonical"  # keys out of order
    assert reason({**good, "v": 2}) == "bad_version"
    assert reason({**good, "m": []}) == "schema"
    assert reason({**good, "m": [b"x"] * 17}) == "too_large"
    assert reason({**good, "m": [b"x" * (wire.MAX_MANIFEST_BYTES + 1)]}) == "too_large"
    assert reason({**good, "addrs": ["/a"] * 9}) == "too_large"
    assert reason({**good, "peer": 5}) == "schema"
    assert reason({"addrs": [], "m": [b"x"], "pear": "p", "v": 1}) == "schema"  # unknown key
    assert reason({**good, "extra": 1}) == "too_large"  # more map entries than the decoder allows
    assert reason(b"\xc1") == "malformed"
    assert reason(data + b"\x00") == "malformed"
    assert reason(data, max_bytes=10) == "too_large"
    with pytest.raises(wire.WireError, match="too_large"):
        wire.encode_manifest_record(wire.ManifestRecord([b"x" * 16000] * 5, "p"))


def test_metrics_tail_reads_appended_lines_incrementally(tmp_path):
    from swarmnode.swarm.local import MetricsTail

    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.update().last is None  # no file yet
    path.write_text('{"step": 0, "eval": "before", "accuracy": 0.25}\n{"step": 1, "samples_external": 3}\n{"step": 2, "sam')
    tail.update()
    assert tail.last == {"step": 1, "samples_external": 3} and tail.last_eval["accuracy"] == 0.25
    with open(path, "a") as f:  # the partial line is completed later
        f.write('ples_external": 4}\nnot json\n')
    tail.update()
    assert tail.last == {"step": 2, "samples_external": 4} and (tail.steps, tail.external_total) == (2, 7)


# ============================================================================ real clients on loopback
SWARM = "gossip-test"
CHAIN2 = {"min_terms": 2, "max_terms": 2}
FAST_DHT = {"health_interval": 0.5, "join_backoff": (0.5, 2.0), "startup_timeout": 60.0}


def _client(tmp_path, name, mix, *, peers=(), tokenizer_id=BYTE_TOKENIZER_ID, swarm_kw=None, **kw) -> SwarmClient:
    # established_after=0: no young-key caps here (they have their own test in test_hostile_swarm.py)
    cfg = RunConfig(swarm=SwarmConfig(enabled=True, swarm_id=SWARM,
                                      net={"initial_peers": list(peers), "dht_timeout": 5.0, "fetch_timeout": 5.0},
                                      trust={"established_after": 0}, **(swarm_kw or {})),
                    external={"max_external_completion_length": 256})
    ident = Identity.from_private_bytes(hashlib.sha256(f"test_gossip {name}".encode()).digest())
    kw.setdefault("detokenize", byte_detokenize if tokenizer_id == BYTE_TOKENIZER_ID else None)
    return SwarmClient(cfg, ident, mix, 256, f"model-{name}", tokenizer_id, byte_tokenize, tmp_path / name,
                       heartbeat_interval=1.0, dht_kwargs=FAST_DHT, **kw)


def _gather_until(client: SwarmClient, pred, timeout: float = 60.0, poll: bool = False):
    """Call gather (and, for a manually polled client, poll) until ``pred(trees)``; returns (trees, metrics list)."""
    deadline = time.monotonic() + timeout
    got, metrics = [], []
    while time.monotonic() < deadline:
        if poll:
            client.poll()
        trees, m = client.gather(0, 0)
        got.extend(trees)
        metrics.append(m)
        if pred(got):
            break
        time.sleep(0.3)
    return got, metrics


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gossip")
    mix = TaskMix([ReasoningGymSource("chain_sum", CHAIN2)], [1.0])
    a = _client(tmp, "a", mix)
    b = _client(tmp, "b", mix, peers=a.maddrs())
    # c has another tokenizer (re-tokenizes) and is polled by hand (poll_interval 1 h)
    c = _client(tmp, "c", mix, peers=a.maddrs(), tokenizer_id="bytes-other", poll_interval=3600.0,
                prompt_for=lambda task: f"<ours>{task.question}</ours>")
    yield {"a": a, "b": b, "c": c, "mix": mix, "tmp": tmp}
    for x in (c, b, a):
        x.close()


@pytest.mark.slow
def test_publish_gather_retokenize_and_relay(swarm):
    a, b, c, mix = swarm["a"], swarm["b"], swarm["c"], swarm["mix"]
    assert b.dht.connected and c.dht.connected
    info = read_swarm_info(swarm["tmp"] / "a")
    assert info["peer_id"] == a.peer_id and info["maddrs"] == a.maddrs() and info["libp2p_peer_id"] == a.dht.peer_id
    fa = HostileFactory(a.identity, mix, swarm_id=SWARM)
    trees = fa.honest_trees(n_trees=2, n_leaves=4)  # 2 of 4 leaves correct in each tree
    zero = fa.honest_trees(n_trees=1, n_leaves=3)
    for lid in zero[0].leaves():  # no contrast: nothing is published
        zero[0].nodes[lid].reward = 0.0
    assert a.publish(zero, step=0, policy_version=3)["swarm/bundles_published"] == 0
    m = a.publish(trees, step=0, policy_version=3)
    assert (m["swarm/bundles_published"], m["swarm/published_trees"], m["swarm/published_leaves"]) == (1, 2, 8)
    assert m["swarm/prune/zero_variance_trees"] == 0

    # b: same tokenizer -- ids kept, rewards are b's own re-scores (equal to the honest claims)
    got, ms = _gather_until(b, lambda g: len(g) >= 2)
    assert len(got) == 2 and sum(x.get("swarm/bundles_accepted", 0) for x in ms) == 1
    assert {t.peer_id for t in got} == {a.peer_id} and all(t.same_tokenizer for t in got)
    assert [t.rewards() for t in got] == [tr.leaf_rewards() for tr in trees]
    first_leaf = [t.tree.completion_ids(t.tree.leaves()[0]) for t in got]
    assert first_leaf == [tr.completion_ids(tr.leaves()[0]) for tr in trees]
    assert got[0].model_id == "model-a" and got[0].policy_version == 3
    digest = b.accepted[-1].digest
    assert digest in b.server.store  # re-served from now on
    assert ms[-1]["swarm/peers"] >= 1 and ms[-1]["swarm/connected"] is True

    # c: another tokenizer id -- trees re-tokenized, our own prompt for the task
    got_c, _ = _gather_until(c, lambda g: len(g) >= 2, poll=True)
    assert len(got_c) == 2 and not any(t.same_tokenizer for t in got_c)
    for t in got_c:
        q = mix.get(t.tree.task).question
        assert t.tree.prompt_text == f"<ours>{q}</ours>" and t.tree.prompt_ids == byte_tokenize(t.tree.prompt_text)
        assert all(t.tree.nodes[i].logprobs == [] for i in t.tree.leaves())

    # relay: b publishes (so c knows b's contact); a publishes again and goes away after b verified it;
    # c then fetches a's bundle from b's cache
    fb = HostileFactory(b.identity, mix, swarm_id=SWARM)
    # (its own task stream: HostileFactory's honest trees of step 0 on the default stream are a's, and a subset of
    # a's leaves is a copy)
    assert b.publish(fb.contrast_trees(1), step=1, policy_version=3)["swarm/bundles_published"] == 1
    a.publish(fa.honest_trees(1, 4), step=1, policy_version=4)
    got_b2, _ = _gather_until(b, lambda g: any(t.policy_version == 4 for t in g))
    assert any(t.policy_version == 4 for t in got_b2)
    a_libp2p, b_libp2p = a.dht.peer_id, b.dht.peer_id
    a.close()
    got_c2, _ = _gather_until(c, lambda g: any(t.policy_version == 4 for t in g), timeout=90, poll=True)
    assert any(t.policy_version == 4 and t.peer_id == a.peer_id for t in got_c2)
    relayed = [x for x in c.accepted if x.publisher == a.peer_id][-1]
    assert relayed.sender == f"p2p:{b_libp2p}" != f"p2p:{a_libp2p}"
    assert any(x.publisher == b.peer_id for x in c.accepted)  # and b's own bundle


@pytest.mark.slow
def test_hostile_records_are_charged_to_their_owner(swarm):
    b, c = swarm["b"], swarm["c"]
    key = Ed25519PrivateKey.generate()
    hostile = SwarmDHT(key, swarm_ids=[SWARM], initial_peers=b.maddrs(), call_timeout=5.0, health_interval=0,
                       startup_timeout=60.0)
    try:
        hostile_id = peer_id_from_public_key(hostile.public_key)
        bucket = hostile.current_bucket()
        # 1. garbage under its own subkey; 2. a record relaying c's honestly signed manifest (owner mismatch)
        assert hostile.publish_manifest(SWARM, bucket, b"\xc1 not msgpack")
        fc = HostileFactory(c.identity, swarm["mix"], swarm_id=SWARM)
        bundle, env = fc.bundle(fc.honest_trees(1, 2))
        _, menv = fc.manifest(env, bundle)
        rec = wire.encode_manifest_record(wire.ManifestRecord([menv], hostile.peer_id, hostile.visible_maddrs()))
        assert hostile.publish_manifest(SWARM, bucket - 1, rec)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            snap = b.snapshot()
            if {"malformed", "owner_mismatch"} <= set(snap["rejected"]):
                break
            time.sleep(0.5)
        assert {"malformed", "owner_mismatch"} <= set(snap["rejected"]), snap["rejected"]
        rec_h = b.peers.snapshot()["peers"][hostile_id]
        assert rec_h["hard"] >= 2 and rec_h["rejected"].get("owner_mismatch") == 1
        _, m = b.gather(0, 0)  # rejections found by the fetcher thread are reported by the next gather
        assert m["swarm/rejected/malformed"] == 1 and m["swarm/rejected/owner_mismatch"] == 1
    finally:
        hostile.shutdown()


@pytest.mark.slow
def test_future_dated_heartbeats_are_left_out_of_the_peer_list(swarm):
    """Heartbeat times are checked like manifests: a validly signed heartbeat dated an hour ahead is in the DHT
    but ``list_peers`` leaves it out; the same key's heartbeat dated now is listed."""
    from cryptography.hazmat.primitives import serialization

    from swarmnode.swarm.gossip import list_peers

    b = swarm["b"]
    ident = Identity.from_private_bytes(hashlib.sha256(b"test_gossip future heartbeat").digest())
    key = serialization.load_pem_private_key(ident.to_pem(), password=None)
    dht = SwarmDHT(key, swarm_ids=[SWARM], initial_peers=b.maddrs(), call_timeout=10.0, health_interval=0,
                   startup_timeout=60.0)

    def beat(t: float) -> bytes:
        return wire.encode_heartbeat(wire.Heartbeat(swarm_id=SWARM, peer_id=ident.peer_id, model_id="m", step=1,
                                                    reward_mean=None, accuracy=None, samples_published=0,
                                                    samples_accepted=0, samples_rejected=0, created_at=t), ident)

    def listed() -> set[str]:
        return {r["peer_id"] for r in list_peers(SWARM, b.maddrs(), timeout=20.0)}

    try:
        future = beat(time.time() + 3600)
        assert dht.publish_heartbeat(SWARM, future)
        deadline = time.monotonic() + 60  # until b's DHT returns it (then list_peers reads it too)
        while time.monotonic() < deadline and (ident.public_key_bytes, future) not in b.dht.read_heartbeats(SWARM):
            time.sleep(0.5)
        assert (ident.public_key_bytes, future) in b.dht.read_heartbeats(SWARM)
        rows = listed()
        assert ident.peer_id not in rows and b.peer_id in rows
        assert dht.publish_heartbeat(SWARM, beat(time.time()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and ident.peer_id not in rows:
            rows = listed()
        assert ident.peer_id in rows
    finally:
        dht.shutdown()


# ============================================================================ wiring of the policy objects (no network)
# the policies themselves (fair order, budgets, retry states, young-key turns, peers' rates) are unit-tested with a
# fake clock in tests/unit/swarm/test_swarm_policies.py
def _offline_client(mix, *, external=None, levers=None, **swarm) -> SwarmClient:
    cfg = RunConfig(swarm=SwarmConfig(enabled=True, swarm_id=SWARM, **swarm), external=external or {},
                    levers=levers or {})
    ident = Identity.from_private_bytes(hashlib.sha256(b"test_gossip offline").digest())
    return SwarmClient(cfg, ident, mix, 256, "m", BYTE_TOKENIZER_ID, byte_tokenize, None, start=False)


def test_gather_waits_for_a_busy_verifier_within_its_budget_only():
    """gather runs on the node's main thread (a stop waits for it): while the fetcher thread holds the verifier,
    gather waits for it at most its budget, and the fetched body waits for the next step instead."""
    from swarmnode.swarm.scheduler import Pending as _Pending

    mix = TaskMix([ReasoningGymSource("chain_sum", CHAIN2)], [1.0])
    c = _offline_client(mix, net={"gather_budget_seconds": 0.2})
    f = HostileFactory(Identity.from_private_bytes(hashlib.sha256(b"busy verifier").digest()), mix, swarm_id=SWARM)
    h = f.honest()
    c.scheduler.pending.append(_Pending(h.data, h.manifest, h.sender, time.time()))
    held, release = threading.Event(), threading.Event()

    def fetcher_verifying() -> None:  # the fetcher thread inside a verify_manifest that does not end
        with c.fetcher.vlock:
            held.set()
            release.wait(60)  # only a failure guard

    busy = threading.Thread(target=fetcher_verifying, daemon=True)
    busy.start()
    try:
        assert held.wait(30)
        trees, m = c.gather(0, 0)
        assert not release.is_set() and busy.is_alive()  # gather returned while the verifier was still busy
        assert trees == [] and m["swarm/pending"] == 1 and m["swarm/bundles_received"] == 0
        release.set()
        busy.join(30)
        trees, m = c.gather(1, 0)  # the next step verifies it
        assert m["swarm/bundles_received"] == 1 and m["swarm/bundles_accepted"] == 1 and m["swarm/pending"] == 0
    finally:
        release.set()
        c.close()


def _heartbeat_entry(ident: Identity, rates: dict, created_at: float) -> tuple[bytes, bytes]:
    beat = wire.Heartbeat(swarm_id=SWARM, peer_id=ident.peer_id, model_id="m", step=1, reward_mean=None,
                          accuracy=None, samples_published=0, samples_accepted=0, samples_rejected=0,
                          created_at=created_at, task_rates=rates)
    return ident.public_key_bytes, wire.encode_heartbeat(beat, ident)


def test_the_client_wires_standing_admission_and_heartbeats_to_its_policy_objects():
    """``credit``/``charge``/``_admit`` reach :class:`Admission` with the client's knobs and PeerBook;
    ``note_peer_rates``/``peer_task_rates`` reach the :class:`HeartbeatBook` with the curriculum switch."""
    from swarmnode.rollout.peer_tree import PeerTree

    mix = TaskMix([ReasoningGymSource("chain_sum", CHAIN2)], [1.0])
    c = _offline_client(mix, external={"num_external": 4}, levers={"curriculum": {"enabled": True}},
                        trust={"young_key_trees": 1, "max_trees_per_peer": 3, "established_after": 4})
    try:
        assert c.admission.peers is c.peers and c.book.peers is c.peers and c.scheduler.peers is c.peers
        assert (c.admission.max_trees_per_peer, c.admission.established_after, c.admission.max_young_trees) == (3, 4, 2)
        c.credit("lazy", 100)  # clamped to max_trees_per_peer
        assert c.peers.earned("lazy") == 3
        c.charge("lazy", "screen", 2)
        assert c.peers.earned("lazy") == 2 and c.peers.snapshot()["peers"]["lazy"]["rejected"]["screen"] == 2
        f = HostileFactory(_key("wired young"), mix, swarm_id=SWARM)
        trees = [PeerTree(t, f.identity.peer_id) for t in f.contrast_trees(3)]
        out, young, dropped = c._admit(trees)  # the old entry point, kept for other suites
        assert (len(out), young, dropped) == (1, 1, 0) and len(c._carry) == 2 and c._carry is c.admission.carry
        assert c.book.curriculum_enabled and not c.book.rescue_enabled
        honest = _key("wired rates")
        c.note_peer_rates([_heartbeat_entry(honest, {mix.source_key(0): (16, 8)}, time.time())])
        assert [p.peer_id for p in c.peer_task_rates()] == [honest.peer_id]
        # heartbeats of the publishers with standing are also read from their own keys (a flood of the shared
        # heartbeat key cannot hide them): the publisher thread asks the fetcher which those are
        assert c.publisher.known_peers() == []
        c.fetcher.owner_keys[honest.peer_id] = honest.public_key_bytes
        assert c.publisher.known_peers() == []  # seen, no standing yet
        c.credit(honest.peer_id, 1)
        assert c.publisher.known_peers() == [honest.public_key_bytes] == c.fetcher.known_publishers()
    finally:
        c.close()


def test_heartbeat_time_checks():
    from swarmnode.swarm.gossip import heartbeat_time_ok

    now = 1_000_000.0
    assert heartbeat_time_ok(now, now, 30, 600) and heartbeat_time_ok(now + 30, now, 30, 600)
    assert not heartbeat_time_ok(now + 31, now, 30, 600)  # from the future beyond the skew
    assert heartbeat_time_ok(now - 630, now, 30, 600) and not heartbeat_time_ok(now - 631, now, 30, 600)
    assert not heartbeat_time_ok(float("nan"), now, 30, 600) and not heartbeat_time_ok(float("inf"), now, 30, 600)
    assert not heartbeat_time_ok("soon", now, 30, 600)


def test_every_client_knob_comes_from_the_swarm_config():
    mix = TaskMix([ReasoningGymSource("chain_sum", CHAIN2)], [1.0])
    c = _offline_client(mix, net={"poll_interval": 1.5, "heartbeat_interval": 7.0, "gather_budget_seconds": 2.5,
                                  "max_pending_bundles": 5, "max_concurrent_fetches": 3,
                                  "store_bytes": 8 * 1024 * 1024, "fetch_retries": 2, "fetch_relays": 1,
                                  "max_fetches_per_publisher": 2, "publisher_fetch_budget_seconds": 4.0,
                                  "max_concurrent_serves": 9, "max_serves_per_peer": 2,
                                  "serve_first_byte_timeout": 0.5}, trust={"max_young_trees": 3})
    try:
        assert (c.poll_interval, c.heartbeat_interval, c.gather_budget_s, c.max_pending) == (1.5, 7.0, 2.5, 5)
        assert (c.max_concurrent_fetches, c.server.store.max_total_bytes) == (3, 8 * 1024 * 1024)
        assert (c.fetch_retries, c.fetch_relays, c.max_fetches_per_publisher, c.publisher_budget_s) == (2, 1, 2, 4.0)
        assert (c.server.max_concurrent_serves, c.server.max_serves_per_peer, c.server.first_byte_timeout) == (9, 2, 0.5)
        assert c.max_young_trees == 3 and c.server.max_concurrent_fetches == 3
        # the policy objects get the same knobs
        sch = c.scheduler
        assert (sch.max_pending, sch.max_concurrent_fetches, sch.fetch_retries, sch.max_fetches_per_publisher,
                sch.publisher_budget_s) == (5, 3, 2, 2, 4.0)
        assert (c.fetcher.poll_interval, c.fetcher.fetch_relays, c.publisher.heartbeat_interval) == (1.5, 1, 7.0)
        assert c.admission.max_young_trees == 3 and c.gatherer.gather_budget_s == 2.5
    finally:
        c.close()
    d = SwarmClient(RunConfig(swarm=SwarmConfig(enabled=True, swarm_id=SWARM, net={"max_pending_bundles": 5})),
                    Identity.from_private_bytes(hashlib.sha256(b"x").digest()), mix, 256, "m", BYTE_TOKENIZER_ID,
                    byte_tokenize, None, max_pending=9, poll_interval=0.25, start=False)
    try:  # constructor arguments win over the config (tests and benchmarks use them)
        assert (d.max_pending, d.poll_interval, d.publisher_budget_s) == (9, 0.25, 2 * d.scfg.net.fetch_timeout)
        assert (d.scheduler.max_pending, d.fetcher.poll_interval) == (9, 0.25)
        # None -> max(1, num_external // 2)
        assert d.max_young_trees == d.admission.max_young_trees == max(1, d.cfg.external.num_external // 2)
    finally:
        d.close()


def test_a_copy_in_flight_does_not_make_the_node_give_up_the_original():
    """A key that re-announces an honest bundle's digest under its own manifest (its body hangs, or lies) gets
    that digest in flight first. The honest publisher's manifest for the same digest used to be marked done for
    good while that fetch ran, so the honest bundle was never fetched. Now it waits and is started once the
    copy's fetch is over (one rate-limit token already paid for it)."""
    from dataclasses import replace as dc_replace

    mix = TaskMix([ReasoningGymSource("chain_sum", CHAIN2)], [1.0])
    c = _offline_client(mix)
    try:
        digest = hashlib.sha256(b"the honest bundle").digest()
        honest = wire.Manifest(swarm_id=SWARM, publisher_key=b"\x01" * 32, bundle_digest=digest, bundle_size=10,
                               tasks=[REF], created_at=time.time(), policy_version=0, num_trees=1, num_leaves=2)
        copy = dc_replace(honest, publisher_key=b"\x02" * 32)
        m_honest = b"m-honest" * 4
        with c.scheduler.lock:  # the copy's fetch is in flight (what FetchScheduler.try_start records for it)
            c.scheduler.wanted.add(copy.bundle_digest.hex())
        # the honest manifest, read while the copy is in flight: waits, never given up
        assert c.fetcher.start_fetch(honest, m_honest, "honest", extra=False) == "skip"
        st = c.scheduler.mstate[m_honest]
        assert st.state == "retry" and st.next_try <= time.monotonic() + 1.0
        # the copy's fetch is over (it hung until its timeout, or its body was refused): the original starts
        with c.scheduler.lock:
            c.scheduler.wanted.discard(copy.bundle_digest.hex())
        assert c.fetcher.start_fetch(honest, m_honest, "honest", extra=False) == "started"
    finally:
        c.close()


def _key(name: str) -> Identity:
    return Identity.from_private_bytes(hashlib.sha256(f"test_gossip {name}".encode()).digest())


def _announce(mix, digest: bytes, key: Identity, i: int, copies: int = 1) -> tuple[bytes, bytes]:
    """A DHT manifest record of ``key``: ``copies`` signed manifests announcing ``digest`` (2 tasks each)."""
    envs = [wire.encode(wire.Manifest(swarm_id=SWARM, publisher_key=key.public_key_bytes, bundle_digest=digest,
                                      bundle_size=100, tasks=mix.refs_for_step(0, 2), created_at=time.time() - j,
                                      policy_version=0, num_trees=2, num_leaves=4), key) for j in range(copies)]
    return key.public_key_bytes, wire.encode_manifest_record(wire.ManifestRecord(envs, f"p{i}"))


def _reading(c: SwarmClient, records: list) -> list:
    """Make every DHT read of ``c`` return ``records`` (the DHT itself is tested on loopback elsewhere) and record
    the publishers whose manifests ``Fetcher.start_fetch`` is asked to fetch; returns that list."""
    from types import SimpleNamespace

    c.fetcher.dht = SimpleNamespace(is_alive=True, recent_buckets=lambda k: [0],
                                    read_manifests=lambda *a, **kw: records)
    started: list = []
    start = c.fetcher.start_fetch
    c.fetcher.start_fetch = lambda m, md, pub, extra: started.append(pub) or start(m, md, pub, extra)
    return started


def test_copies_waiting_on_a_digest_in_flight_are_not_verified_again_every_poll():
    """Outside attack (2026-12-03, F4): manifests that wait because their bundle digest is in flight under another
    manifest were verified again (signature, decoding, every task ref) on every poll, about 1-2 ms each; 2,720
    copies cost seconds of CPU per poll. Now a waiting manifest keeps its bundle digest and is verified again only
    once that digest is no longer in flight."""
    mix = TaskMix([ReasoningGymSource("chain_sum", CHAIN2)], [1.0])
    c = _offline_client(mix)
    held = hashlib.sha256(b"a digest held in flight").digest()
    _reading(c, [_announce(mix, held, _key(f"waiter {i}"), i, copies=3) for i in range(6)])
    calls = []
    verify = c.verifier.verify_manifest
    c.verifier.verify_manifest = lambda data, owner=None: calls.append(owner) or verify(data, owner)
    try:
        with c.scheduler.lock:
            c.scheduler.wanted.add(held.hex())  # another manifest's fetch of this digest is in flight (it may hang)
        assert c.poll() == 0 and len(calls) == 18  # each verified once, each waits
        waiting = [st for st in c.scheduler.mstate.values() if st.state == "retry"]
        assert len(waiting) == 18
        for st in waiting:  # their next look is due (no wall-clock wait in tests)
            st.next_try = 0.0
        calls.clear()
        assert c.poll() == 0 and calls == []  # still in flight: they wait without any verification
        assert all(st.state == "retry" and st.next_try > 0 for st in waiting)
        for st in waiting:
            st.next_try = 0.0
        with c.scheduler.lock:
            c.scheduler.wanted.discard(held.hex())  # that fetch is over (it failed): the waiters are looked at again
        assert c.poll() == 1 and len(calls) == 18  # verified again; one fetch of the digest starts, not 18
    finally:
        c.close()


def test_a_copy_by_a_fresh_key_does_not_take_a_digest_from_its_established_publisher():
    """Outside attack (2026-12-03, F5): fresh keys re-announced an established publisher's bundle digest. Having
    used no fetch time this step, they came first in the fair order, took the digest and held it for a fetch
    timeout each, so the publisher's own manifest waited: its bundles arrived a step late. Now one manifest per
    digest goes forward in a poll, the one whose publisher has the most earned standing; the copies wait."""
    mix = TaskMix([ReasoningGymSource("chain_sum", CHAIN2)], [1.0])
    c = _offline_client(mix)
    digest = hashlib.sha256(b"the publisher's second bundle of the step").digest()
    owner, copiers = _key("established"), [_key(f"copier {i}") for i in range(5)]
    records = [_announce(mix, digest, k, i) for i, k in enumerate([*copiers, owner])]
    copy_digests = [hashlib.sha256(wire.decode_manifest_record(v).manifests[0]).digest() for _, v in records[:-1]]
    started = _reading(c, records)
    c.peers.record_earned(owner.peer_id, 20)
    try:
        with c.scheduler.lock:  # the publisher's first fetch of this step took 3 s (the copiers' keys used none)
            c.scheduler.spent[owner.peer_id] = 3.0
        assert c.poll() == 1
        assert started == [owner.peer_id]  # the copies were not even tried: no copier holds the digest
        copies = [c.scheduler.mstate[md] for md in copy_digests]  # they wait (tokens paid), never given up
        assert all(st.state == "retry" and st.bundle_digest == digest and st.next_try > 0 for st in copies)
    finally:
        c.close()


def test_a_copier_with_more_standing_that_cannot_start_does_not_veto_the_publisher():
    """Second outside attack (2026-12-03, HIGH): a key with more earned standing than the publisher copied its
    digests while keeping itself over its own fetch budget. Its copy won every digest and was never started, and
    the publisher's manifest was deferred until stale: 0 of 8 bundles accepted. Now a publisher that can start a
    fetch goes before one that cannot, whatever their standing."""
    mix = TaskMix([ReasoningGymSource("chain_sum", CHAIN2)], [1.0])
    c = _offline_client(mix)
    digest = hashlib.sha256(b"the publisher's bundle").digest()
    owner, rival = _key("veto owner"), _key("veto rival")
    started = _reading(c, [_announce(mix, digest, k, i) for i, k in enumerate([rival, owner])])
    c.peers.record_earned(owner.peer_id, 20)
    c.peers.record_earned(rival.peer_id, 21)
    try:
        with c.scheduler.lock:  # the rival spent its whole fetch budget this step (on hanging fetches of its own)
            c.scheduler.spent[rival.peer_id] = c.scheduler.publisher_budget_s
        assert c.poll() == 1 and started == [owner.peer_id]
    finally:
        c.close()


def test_among_new_keys_the_manifest_read_first_is_fetched_not_a_later_copy():
    """Second outside attack (2026-12-03, MEDIUM): among keys without standing the choice of a digest's manifest was
    a lottery, so 160 free copier keys delayed a new publisher's first bundle by up to 8 steps. A copy can only be
    announced after the manifest it copies, so the manifest read first now goes first."""
    mix = TaskMix([ReasoningGymSource("chain_sum", CHAIN2)], [1.0])
    c = _offline_client(mix)
    digest = hashlib.sha256(b"a new publisher's first bundle").digest()
    owner = _key("first owner")
    records = [_announce(mix, digest, owner, 0)]
    started = _reading(c, records)
    try:
        with c.scheduler.lock:  # the first read finds every fetch slot busy: the publisher's manifest waits
            c.scheduler.inflight = 2 * c.scheduler.max_concurrent_fetches
        assert c.poll() == 0
        with c.scheduler.lock:
            c.scheduler.inflight = 0
        records.extend(_announce(mix, digest, _key(f"late copier {i}"), i + 1) for i in range(8))  # at the next read
        started.clear()
        assert c.poll() == 1 and started == [owner.peer_id]
    finally:
        c.close()


@pytest.mark.parametrize("add_leaf", [False, True], ids=["whole copy", "copy with a leaf added"])
def test_a_copier_verified_first_earns_nothing_and_the_author_gets_the_standing(add_leaf):
    """Outside attack (copier), through ``gather``: a copier re-signs an honest author's fresh trees and is verified
    first (its body arrives first) for five steps; the node trains on the copies and credits the copier. Each
    author bundle then arrives (a ``replay``, nothing trains twice), and because the receiver read the author's
    manifest before the copier's, the standing moves: the copier ends with none, the author with one per tree
    and established. With a leaf of the copier's own added to each copy (a new content key), the author's
    original comes in as a regrouping of seen leaves and takes the tree back per leaf."""
    import copy as _copy

    from swarmnode.swarm.scheduler import Pending as _Pending

    mix = TaskMix([ReasoningGymSource("chain_sum", CHAIN2)], [1.0])
    c = _offline_client(mix, trust={"established_after": 4}, external={"max_external_completion_length": 256})
    author = Identity.from_private_bytes(hashlib.sha256(b"test_gossip author").digest())
    copier = Identity.from_private_bytes(hashlib.sha256(b"test_gossip copier").digest())
    fa = HostileFactory(author, mix, swarm_id=SWARM)
    try:
        def pending(ident: Identity, trees: list, first_read: float) -> _Pending:
            b, env = fa.bundle(trees, identity=ident)
            m, menv = fa.manifest(env, b, ident)
            mdigest = hashlib.sha256(menv).digest()
            c.scheduler.first_seen[mdigest] = first_read
            return _Pending(env, m, f"p2p:{ident.peer_id}", time.time(), mdigest, ident.peer_id)

        def copied(tree: RolloutTree) -> RolloutTree:
            if not add_leaf:
                return tree
            out = _copy.deepcopy(tree)
            text = "<answer>my own guess</answer>"
            leaf = out.add_child(1, byte_tokenize(text), text=text, policy_version=3, finish_reason="eos")
            out.nodes[leaf].reward = float(mix.score_detail(mix.get(out.task), out.completion_text(leaf))["reward"])
            return out

        for step in range(5):
            trees = fa.contrast_trees(1)
            read_author, read_copier = 10.0 * step, 10.0 * step + 1.0  # the copy is announced after the original
            c.scheduler.pending.append(pending(copier, [copied(trees[0])], read_copier))  # its body arrives first
            got, _ = c.gather(2 * step, 0)
            assert [t.peer_id for t in got] == [copier.peer_id]
            assert len(got[0].tree.leaves()) == 2 + add_leaf
            c.credit(copier.peer_id, 1)  # the node trained on the copy (its leaves were all new then)
            c.scheduler.pending.append(pending(author, trees, read_author))
            got, m = c.gather(2 * step + 1, 0)
            assert got == [] and m.get("swarm/rejected/replay") == 1  # nothing trains twice
            assert c.peers.earned(copier.peer_id) == 0, step
            assert c.peers.earned(author.peer_id) == step + 1, step
        assert not c.peers.is_young(author.peer_id, 4)
        assert c.snapshot()["counts"]["authorship_moved"] == 5
    finally:
        c.close()
