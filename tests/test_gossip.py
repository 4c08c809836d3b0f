"""Pruned subtrees, the DHT manifest record, and publish/gather between real in-process SwarmClients.

The network tests run real hivemind DHTs (p2pd) on loopback, real Ed25519 keys, real reasoning-gym tasks
(re-scored by every receiver) and the byte-level tokenizer of ``swarm.adversary`` -- no mocks.
"""

from __future__ import annotations

import hashlib
import time

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from swarmnode.config import RunConfig, SwarmConfig
from swarmnode.rollout.tree import RolloutTree
from swarmnode.swarm import wire
from swarmnode.swarm.adversary import BYTE_TOKENIZER_ID, HostileFactory, byte_detokenize, byte_tokenize
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


def _client(tmp_path, name, mix, *, peers=(), tokenizer_id=BYTE_TOKENIZER_ID, **kw) -> SwarmClient:
    # established_after=0: no young-key caps here (they have their own test in test_hostile_swarm.py)
    cfg = RunConfig(swarm=SwarmConfig(enabled=True, swarm_id=SWARM, initial_peers=list(peers), dht_timeout=5.0,
                                      fetch_timeout=5.0, established_after=0))
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
    assert b.publish(fb.honest_trees(1, 2), step=1, policy_version=3)["swarm/bundles_published"] == 1
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
