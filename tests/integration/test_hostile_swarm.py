"""Trust nothing, on the network: an honest training node beside a hostile peer on a real swarm.

Real parts only: hivemind DHTs and ``p2pd`` on loopback, Ed25519 keys, the node's own verifier, tokenizer and
model (the embedded default, or ``$SWARMNODE_TEST_MODEL``), real reasoning-gym tasks. The hostile peer is
:class:`swarmnode.testing.adversary.HostilePeer`; an honest peer (a plain ``SwarmClient``) publishes good bundles
beside it, so that the node has something to accept and the hostile peer something to replay.

The fast tests pin the two attribution rules a hostile peer on the network exploits (a wrapped bundle is the
announcer's fault, our own rollouts echoed back are not new samples) and the benchmark's ``--hostile``
plumbing.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import replace

import pytest

from monitor_helpers import test_model
from swarmnode.config import SwarmConfig, load_config
from swarmnode.swarm import wire
from swarmnode.testing.adversary import (
    BYTE_TOKENIZER_ID,
    NETWORK_CASES,
    HostileFactory,
    byte_detokenize,
)
from swarmnode.swarm.identity import Identity
from swarmnode.swarm.verify import Rejection, Verifier
from swarmnode.tasks import ReasoningGymSource, TaskMix

HOSTILE = Identity.from_private_bytes(hashlib.sha256(b"test_hostile_swarm hostile").digest())
HONEST = Identity.from_private_bytes(hashlib.sha256(b"test_hostile_swarm honest").digest())
CHAIN2 = {"min_terms": 2, "max_terms": 2}


# ============================================================================ attribution rules (pure)
@pytest.fixture(scope="module")
def mix() -> TaskMix:
    return TaskMix([ReasoningGymSource("chain_sum", CHAIN2)], [1.0])


def _verifier(mix: TaskMix) -> Verifier:
    return Verifier(SwarmConfig(swarm_id="attrib", trust={"ban_after": 3}), mix, 256, BYTE_TOKENIZER_ID,
                    detokenize=byte_detokenize)


def test_wrapped_bundle_is_charged_to_its_announcer_and_stays_acceptable(mix):
    """A peer that announces another peer's genuine signed bundle in its own manifest is the liar: it is charged
    (hard), the bundle's signer is not, and the bundle is still accepted under its publisher's own manifest."""
    v = _verifier(mix)
    honest = HostileFactory(HONEST, mix, swarm_id="attrib")
    b, env = honest.bundle(honest.honest_trees(2, 4))
    m_honest = wire.manifest_for_bundle(env, b)
    m_wrap = replace(m_honest, publisher_key=HOSTILE.public_key_bytes)
    m_wrap = v.verify_manifest(wire.encode_manifest(m_wrap, HOSTILE), HOSTILE.public_key_bytes)
    for _ in range(3):  # three wrappers: enough strikes for a ban (ban_after=3) -- of the announcer
        with pytest.raises(Rejection) as ei:
            v.verify_bundle(env, m_wrap, "p2p:hostile")
        assert (ei.value.reason, ei.value.hard, ei.value.peer) == ("manifest_mismatch", True, HOSTILE.peer_id)
    assert v.peers.banned() == [HOSTILE.peer_id]
    assert HONEST.peer_id not in v.peers.snapshot()["peers"]
    m = v.verify_manifest(wire.encode_manifest(m_honest, HONEST), HONEST.public_key_bytes)  # not "seen" yet
    assert len(v.verify_bundle(env, m, "p2p:honest")) == 2


def test_our_own_rollouts_echoed_back_are_duplicates_or_replays(mix):
    """What we published comes back from a peer as the same bytes (duplicate) or re-signed (replay): never a
    new external sample attributed to that peer."""
    v = _verifier(mix)
    ours = HostileFactory(HONEST, mix, swarm_id="attrib")
    b, env = ours.bundle(ours.honest_trees(2, 4))
    v.note_published(env, b)  # what SwarmClient.publish does
    hostile = HostileFactory(HOSTILE, mix, swarm_id="attrib")
    trees = wire.trees_from_bundle(b)
    for t, wt in zip(trees, b.trees):
        for j in t.leaves():
            t.nodes[j].reward = wt.nodes[j].claimed_reward
    _, copy = hostile.bundle(trees)
    with pytest.raises(Rejection) as ei:
        v.verify_bundle(copy, None, "p2p:hostile")
    assert (ei.value.reason, ei.value.peer, ei.value.hard) == ("replay", HOSTILE.peer_id, False)
    with pytest.raises(Rejection) as ei:
        v.verify_bundle(env, None, "p2p:hostile")
    assert ei.value.reason == "duplicate"
    announce = wire.encode_manifest(replace(wire.manifest_for_bundle(env, b), publisher_key=HOSTILE.public_key_bytes),
                                    HOSTILE)
    with pytest.raises(Rejection) as ei:  # announced by someone else: dropped before any byte is fetched
        v.verify_manifest(announce, HOSTILE.public_key_bytes)
    assert ei.value.reason == "duplicate" and not ei.value.charged
    assert v.snapshot()["bundles_accepted"] == 0


def test_a_node_knows_the_rollouts_it_published(mix, tmp_path):
    """SwarmClient.publish tells its verifier what it published (no network needed to publish): the pruned trees
    re-signed by another key come back as a replay, the exact bytes as a duplicate."""
    from swarmnode.config import RunConfig
    from swarmnode.swarm.gossip import SwarmClient
    from swarmnode.swarm.prune import prune_trees

    # the factory's completions are longer than sampling.max_completion_length (the default token cap)
    cfg = RunConfig(swarm=SwarmConfig(enabled=True, swarm_id="attrib"),
                    external={"max_external_completion_length": 256})
    client = SwarmClient(cfg, HONEST, mix, 256, "m", BYTE_TOKENIZER_ID, None, None, start=False)
    try:
        trees = HostileFactory(HONEST, mix, swarm_id="attrib").honest_trees(2, 4)
        assert client.publish(trees, step=0, policy_version=3)["swarm/bundles_published"] == 1
        published, _ = prune_trees(trees, client.prune_rule)
        _, copy = HostileFactory(HOSTILE, mix, swarm_id="attrib").bundle(published)
        with pytest.raises(Rejection) as ei:
            client.verifier.verify_bundle(copy, None, "p2p:hostile")
        assert (ei.value.reason, ei.value.peer) == ("replay", HOSTILE.peer_id)
    finally:
        client.close()


def test_network_case_table_is_consistent():
    from swarmnode.swarm.verify import HARD_REASONS, REASONS, SOFT_REASONS

    stages = {"record", "manifest", "bundle", "transport", "dht"}
    for c in NETWORK_CASES.values():
        assert c.stage in stages, c
        if c.stage in ("record", "manifest", "bundle"):
            assert c.reason in REASONS, c
            assert not (c.hard and c.reason in SOFT_REASONS) and not (not c.hard and c.reason in HARD_REASONS), c
        if c.charged is None:
            assert not c.hard, c
    # the classes of the issue, all delivered over the network
    assert {"forged_signature", "reward_mismatch", "foreign_task", "oversized", "truncated", "garbage_c1",
            "deep_nesting", "huge_count", "replay", "stale", "future", "token_out_of_vocab", "wrong_swarm", "flood",
            "foreign_subkey", "silent"} <= set(NETWORK_CASES)


# ============================================================================ the benchmark's --hostile plumbing
def test_bench_plans_hostile_twins_of_swarm_arms():
    from swarmnode.bench.swarm import Arm, plan_arms

    arms = plan_arms([(4, 0), (4, 4)], ["per_source"], ["none"], hostile=True)
    assert [a.name for a in arms] == ["isolated-4", "swarm-4x4-per_source-none", "swarm-4x4-per_source-none-hostile"]
    assert arms[2].label == "swarm 4/4 per_source none +hostile" and arms[2].hostile and arms[2].swarm
    assert not any(a.hostile for a in plan_arms([(4, 4)], ["per_source"], ["none"]))
    assert Arm(4, 0, False).label == "isolated 4/0"


def test_bench_summary_reports_rejections_of_the_hostile_peer(tmp_path):
    from swarmnode.bench.swarm import Arm, hostile_report, summarize_arm, write_report

    arm = tmp_path / "swarm-hostile"
    for i, (rej, refused) in enumerate([({"reward_mismatch": 2, "bad_signature": 1}, 5), ({"vocab": 1}, 0)]):
        d = arm / f"node-{i}"
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text(
            json.dumps({"step": 0, "eval": "before", "accuracy": 0.1}) + "\n"
            + json.dumps({"step": 1, "reward": 0.5, "samples_external": 2, "external:sn1hostile/used": 0}) + "\n")
        peers = {"sn1hostile": {"accepted": 0, "rejected": rej, "hard": sum(rej.values()), "refused_banned": refused,
                                "rate_limited": 0, "bans": 1 if refused else 0, "banned": bool(refused)},
                 "p2p:12D3KooWhostile": {"accepted": 0, "rejected": {"malformed": 3}, "hard": 0, "refused_banned": 0,
                                         "rate_limited": 0, "bans": 0, "banned": False},
                 "sn1honest": {"accepted": 7, "rejected": {}, "hard": 0, "refused_banned": 0, "rate_limited": 0,
                               "bans": 0, "banned": False}}
        (d / "swarm_snapshot.json").write_text(json.dumps(
            {"counts": {"fetch/timeout": 2, "fetch/ok": 9}, "rejected": {"banned": refused + 1},
             "verifier": {"peers": {"peers": peers}}}))
    (arm / "hostile.json").write_text(json.dumps({"peer_id": "sn1hostile", "sender_id": "p2p:12D3KooWhostile",
                                                  "delivered": {"reward_mismatch": 3}}))
    s = summarize_arm(arm)
    h = s["hostile"]
    assert h["rejected_by_reason"] == [{"bad_signature": 1, "malformed": 3, "reward_mismatch": 2},
                                       {"malformed": 3, "vocab": 1}]
    assert h["accepted"] == [0, 0] and h["banned"] == [True, False] and h["refused_banned"] == [5, 0]
    assert h["refused_while_banned"] == [6, 1] and h["bans"] == [1, 0]
    assert h["fetch_failures"] == [{"timeout": 2}, {"timeout": 2}] and h["external_used"] == [0, 0]
    text = hostile_report([(Arm(4, 4, True, hostile=True), s)])
    assert "swarm 4/4 per_source none +hostile" in text and "| rejected: reward_mismatch | 2 / 0 |" in text
    assert "| banned at the end | yes / no |" in text and "| accepted trees from it | 0 / 0 |" in text
    md, _ = write_report([(Arm(4, 4, True, hostile=True), s)], tmp_path / "out", command="x", prefix="t")
    assert "Hostile peer" in md.read_text()


# ============================================================================ the network scenario
FAST_DHT = {"health_interval": 0.5, "join_backoff": (0.5, 2.0), "startup_timeout": 60.0}
FETCH_TIMEOUT = 3.0


@pytest.mark.slow
def test_honest_node_beside_a_hostile_peer(tmp_path):
    """Every class the hostile peer delivers is rejected and counted under its reason by the training node; the
    honest peer (ban_after=3) bans it; the node keeps training, every gather within the fetch timeout."""
    from swarmnode.node import Node
    from swarmnode.testing.adversary import HostilePeer
    from swarmnode.swarm.gossip import SwarmClient, build_swarm

    rd = tmp_path / "node"
    cfg = load_config(None, {
        "model.name_or_path": test_model(), "model.device": "cpu", "run_dir": str(rd), "steps": 400,
        "sampling.prompts_per_step": 2, "sampling.num_generations": 4, "train.micro_batch_size": 8,
        "train.drop_zero_variance_groups": False,  # every step trains on its local samples, whatever the rewards
        "checkpoint.save_steps": 1000, "swarm.enabled": True, "swarm.swarm_id": f"hostile-{time.time_ns() % 10**9}",
        "swarm.identity_path": str(rd / "identity.pem"), "swarm.trust.ban_after": 1000,  # count every class, never ban
        "swarm.net.fetch_timeout": FETCH_TIMEOUT, "swarm.net.dht_timeout": 5.0, "swarm.net.bucket_seconds": 10.0,
        "swarm.trust.max_bundle_bytes": 64 * 1024,
        "external.max_external_completion_length": 256,  # the factory's completions exceed max_completion_length
        # the honest peer here is synthetic (HostileFactory trees, not sampled by our policy), which the likelihood
        # screen rightly rejects; the screen is tested in test_screen.py and test_node_trust.py
        "external.screen.enabled": False,
    })
    node = Node(cfg)
    honest = hostile = None
    try:
        node.swarm = build_swarm(cfg, node.policy, node.tasks, rd, model_id=node.base_model_id,
                                 prompt_for=node.prompt_for, poll_interval=0.5, dht_kwargs=FAST_DHT)
        client = node.swarm
        tok = node.policy.tokenizer

        def tokenize(text: str) -> list[int]:
            return list(tok(text, add_special_tokens=False)["input_ids"])

        def detokenize(ids: list[int]) -> str:
            return tok.decode(list(ids), skip_special_tokens=True)

        same_tok = {"tokenize": tokenize, "tokenizer_id": node.policy.tokenizer_id, "vocab_size": client.vocab_size}
        honest_cfg = cfg.model_copy(update={"swarm": cfg.swarm.model_copy(update={
            "trust": cfg.swarm.trust.model_copy(update={"ban_after": 3}),
            "net": cfg.swarm.net.model_copy(update={"initial_peers": client.maddrs()}), "identity_path": None})})
        honest = SwarmClient(honest_cfg, HONEST, node.tasks, client.vocab_size, "honest/model",
                             node.policy.tokenizer_id, tokenize, None, detokenize=detokenize, poll_interval=0.5,
                             heartbeat_interval=2.0, dht_kwargs=FAST_DHT)
        hostile = HostilePeer(cfg.swarm, node.tasks, initial_peers=client.maddrs(), identity=HOSTILE,
                              dht_kwargs=FAST_DHT, **same_tok)
        fh = HostileFactory(HONEST, node.tasks, swarm_id=cfg.swarm.swarm_id, model_id="honest/model", **same_tok)
        ids = (hostile.peer_id, hostile.sender_id)

        def charged() -> dict[str, dict[str, int]]:
            # a replay is charged only when it copies the node's own rollouts (the harvested bundle may be the
            # node's or the honest peer's): left out here, checked in the verifier's counts below
            peers = client.peers.snapshot()["peers"]
            return {p: {r: n for r, n in peers.get(p, {}).get("rejected", {}).items() if r != "replay"} for p in ids}

        # the attack, one slot at a time (each replaces the hostile peer's record of the current bucket, so the
        # next one waits until the node judged the previous one); replay and flood wait for harvested material
        plan = [("harvest", None)] + [("wave", i) for i in range(len(hostile.waves()))] + [
            ("garbage", None), ("subkey", None), ("transport", None), ("tail", 3)]
        state = {"k": 0, "sent": False, "tail": 0}
        records: list[dict] = []
        honest_metrics: list[dict] = []
        deadline = time.monotonic() + 480  # generous: CI machines run at load 10+

        def transport_seen() -> bool:
            counts = client.snapshot()["counts"]
            stats = client.verifier.snapshot()["rejected"]
            return (all(counts.get(f"fetch/{NETWORK_CASES[n].reason}", 0) >= 1
                        for n in ("silent", "overclaim", "short_stream", "lie"))
                    and stats.get("stale", 0) >= 1 and stats.get("duplicate", 0) >= hostile.flood_copies)

        def on_step(res) -> None:
            records.append(res.metrics)
            honest.publish(fh.honest_trees(1, 4), res.step, policy_version=3)
            honest_metrics.append(honest.gather(res.step, 3)[1])
            if time.monotonic() > deadline:
                node.stop_requested = True
                return
            what, arg = plan[state["k"]]
            done = False
            if what == "harvest":
                hostile.harvest()
                # the foreign-subkey slot targets the publishers seen here: wait until the honest peer is among them
                done = hostile.stats()["harvested"] > 0 and HONEST.public_key_bytes in hostile.victims
            elif what in ("wave", "garbage"):
                if not state["sent"]:
                    sent = hostile.publish_wave(arg) if what == "wave" else hostile.publish_garbage_record()
                    state["sent"] = bool(sent)
                else:
                    # judged: every charged class counted, and every transport-stage body of the wave requested
                    # (they are judged by the fetcher, not charged; the next wave replaces this record)
                    pending = [n for n in (hostile.waves()[arg] if what == "wave" else [])
                               if NETWORK_CASES[n].stage == "transport" and hostile.requests_for(n) < 1]
                    done = charged() == hostile.expected_rejections() and not pending
            elif what == "subkey":
                done = bool(hostile.publish_foreign_subkey())
            elif what == "transport":
                done = transport_seen()
            else:
                state["tail"] += 1
                if state["tail"] >= arg:
                    node.stop_requested = True
            if done:
                state["k"] += 1
                state["sent"] = False

        node.run(on_step)
        assert plan[state["k"]][0] == "tail", f"the attack did not finish: stuck at {plan[state['k']]}, " \
            f"delivered {dict(hostile.delivered)}, charged {charged()}, expected {hostile.expected_rejections()}, " \
            f"fetch counts {dict((k, v) for k, v in client.snapshot()['counts'].items() if k.startswith('fetch/'))}, " \
            f"verifier rejected {client.verifier.snapshot()['rejected']}, requests {hostile.stats()['stream_requests']}"

        # 1. every class was delivered over the network ...
        assert set(hostile.delivered) == set(NETWORK_CASES), set(NETWORK_CASES) - set(hostile.delivered)
        # ... and counted under its reason, charged to the right id of the hostile peer, exactly once each
        exp = hostile.expected_rejections()
        assert charged() == exp
        assert exp[hostile.peer_id]["reward_mismatch"] == 2 and exp[hostile.peer_id]["manifest_mismatch"] == 2
        assert exp[hostile.sender_id] == {"bad_signature": 2, "malformed": 3, "too_large": 2}
        book = client.peers.snapshot()["peers"]
        hard = sum(n for name, n in hostile.delivered.items() if NETWORK_CASES[name].hard)
        assert sum(book[p]["hard"] for p in ids) == hard
        # uncharged and transport-stage classes are counted too
        stats = client.verifier.snapshot()["rejected"]
        assert stats["stale"] >= 1 and stats["duplicate"] >= hostile.flood_copies
        assert stats.get("replay", 0) >= hostile.delivered["replay"]
        counts = client.snapshot()["counts"]
        for n in ("silent", "overclaim", "short_stream", "lie"):
            assert counts.get(f"fetch/{NETWORK_CASES[n].reason}", 0) >= 1, (n, counts)
        # bytes rejected from their manifest were never fetched; bundle-stage bytes were
        for name, c in NETWORK_CASES.items():
            if c.stage == "manifest":
                assert hostile.requests_for(name) == 0, name
            elif c.stage in ("bundle", "transport"):
                assert hostile.requests_for(name) >= 1, name
        # the per-step metrics report the same rejections
        for reason in {r for p in ids for r in exp[p]}:
            total = sum(exp[p].get(reason, 0) for p in ids)
            assert sum(m.get(f"swarm/rejected/{reason}", 0) for m in records) == total, reason

        # 2. 100% rejected: nothing of the hostile peer was accepted, nothing trained on
        assert all(book.get(p, {}).get("accepted", 0) == 0 for p in ids)
        assert not [a for a in client.accepted if a.publisher == hostile.peer_id]
        assert not [k for m in records for k in m if k.startswith(f"external:{hostile.peer_id}")]
        assert not [a for a in honest.accepted if a.publisher == hostile.peer_id]
        # ... while the honest peer's bundles were accepted and trained on; no honest key was ever charged (not
        # the honest peer whose subkey was forged, not the key whose genuine bundle was wrapped)
        assert book[HONEST.peer_id]["accepted"] > 0 and book[HONEST.peer_id]["rejected"] == {}
        assert sum(m.get(f"external:{HONEST.peer_id}/used", 0) for m in records) > 0
        assert hostile.factory.victim.peer_id not in book
        assert hostile.foreign_store_accepted == 0  # no DHT peer stored a record under another's subkey ...
        assert set(hostile.victims) >= {HONEST.public_key_bytes}  # ... though it tried, under the honest peers' keys
        assert honest.peers.snapshot()["peers"].get(client.peer_id, {}).get("rejected", {}) == {}

        # 3. the honest peer (ban_after=3) banned it and then dropped its input unread
        hbook = honest.peers.snapshot()
        assert hostile.peer_id in hbook["banned"] and hbook["peers"][hostile.peer_id]["bans"] >= 1
        assert honest.snapshot()["rejected"].get("banned", 0) > 0
        assert max(m.get("swarm/banned", 0) for m in honest_metrics) >= 1

        # 4. the node kept training: every step it started finished, with local samples, external samples from
        #    the honest peer, and no gather phase longer than the fetch timeout (+ generous slack: loaded machine)
        assert node.step == len(records) >= len(plan) and [r["step"] for r in records] == list(range(1, node.step + 1))
        assert all(r["samples_local"] > 0 for r in records)
        slack = 10.0
        assert max(r["time"]["verify"] for r in records) <= FETCH_TIMEOUT + slack
        assert max(r["swarm/gather_s"] for r in records) <= FETCH_TIMEOUT + slack
        assert list((rd / "checkpoints").glob("step-*")), "the node checkpointed when it stopped"
    finally:
        for x in (hostile, honest):
            if x is not None:
                x.close()
        node.close()


# ============================================================================ fair to publishers
def _wait(pred, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())


HANGING_KEYS = [Identity.from_private_bytes(hashlib.sha256(f"test_hostile_swarm hanging {i}".encode()).digest())
                for i in range(3)]
SYBIL_KEYS = [Identity.from_private_bytes(hashlib.sha256(f"test_hostile_swarm sybil {i}".encode()).digest())
              for i in range(3)]


@pytest.mark.slow
def test_hanging_bodies_of_three_keys_do_not_starve_an_honest_publisher(tmp_path):
    """Outside attack over the real network: three keys keep announcing honest-looking bundles dated 25 s
    ahead (inside the 30 s skew) whose bodies hang on the stream, 16 new ones per key per step, beside an honest
    publisher. The training node still accepts and trains on every honest bundle, keeps stepping, never accepts
    anything of the hanging keys, and rate-limits their manifests (swarm.trust.rate_limit_per_minute)."""
    from swarmnode.node import Node
    from swarmnode.testing.adversary import HostilePeer
    from swarmnode.swarm.gossip import SwarmClient, build_swarm

    rd = tmp_path / "node"
    cfg = load_config(None, {
        "model.name_or_path": test_model(), "model.device": "cpu", "run_dir": str(rd), "steps": 400,
        "sampling.prompts_per_step": 2, "sampling.num_generations": 4, "train.micro_batch_size": 8,
        "train.drop_zero_variance_groups": False, "checkpoint.save_steps": 1000, "swarm.enabled": True,
        "swarm.swarm_id": f"hanging-{time.time_ns() % 10**9}", "swarm.identity_path": str(rd / "identity.pem"),
        "swarm.net.fetch_timeout": FETCH_TIMEOUT, "swarm.net.dht_timeout": 5.0, "swarm.net.bucket_seconds": 10.0,
        "swarm.trust.max_bundle_bytes": 64 * 1024, "swarm.trust.rate_limit_per_minute": 40.0,
        # the honest publisher here is synthetic (HostileFactory trees, longer than our completions and not
        # sampled by our policy): the length cap and the likelihood screen would rightly reject it
        "external.max_external_completion_length": 256, "external.screen.enabled": False,
    })
    node = Node(cfg)
    honest = None
    hanging: list = []
    try:
        node.swarm = build_swarm(cfg, node.policy, node.tasks, rd, model_id=node.base_model_id,
                                 prompt_for=node.prompt_for, poll_interval=0.5, dht_kwargs=FAST_DHT)
        client = node.swarm
        tok = node.policy.tokenizer

        def tokenize(text: str) -> list[int]:
            return list(tok(text, add_special_tokens=False)["input_ids"])

        same_tok = {"tokenize": tokenize, "tokenizer_id": node.policy.tokenizer_id, "vocab_size": client.vocab_size}
        honest_cfg = cfg.model_copy(update={"swarm": cfg.swarm.model_copy(update={
            "net": cfg.swarm.net.model_copy(update={"initial_peers": client.maddrs()}), "identity_path": None})})
        honest = SwarmClient(honest_cfg, HONEST, node.tasks, client.vocab_size, "honest/model",
                             node.policy.tokenizer_id, tokenize, None, poll_interval=3600.0, heartbeat_interval=5.0,
                             dht_kwargs=FAST_DHT)
        hanging = [HostilePeer(cfg.swarm, node.tasks, initial_peers=client.maddrs(), identity=k, cases=[],
                               dht_kwargs=FAST_DHT, seed=i, **same_tok) for i, k in enumerate(HANGING_KEYS)]
        assert _wait(lambda: honest.dht.connected and all(h.dht.connected for h in hanging), 120)
        fh = HostileFactory(HONEST, node.tasks, swarm_id=cfg.swarm.swarm_id, model_id="honest/model", **same_tok)
        n_honest = 8
        records: list[dict] = []
        published: list[str] = []
        deadline = time.monotonic() + 400

        def honest_accepted() -> set[str]:
            return {a.digest for a in client.accepted if a.publisher == HONEST.peer_id}

        def on_step(res) -> None:
            records.append(res.metrics)
            for h in hanging:  # the attack goes on every step, also after the honest peer stopped publishing
                h.publish_hanging(16)
            if len(published) < n_honest:
                m = honest.publish(fh.honest_trees(1, 4), res.step, policy_version=3)
                if m["swarm/bundles_published"]:
                    published.append(_newest_digest(honest))
            # stop once every honest bundle is in and the attack has been live (its bodies requested and timed
            # out at least 3 times): on a loaded machine the honest bundles can all arrive before that
            live = (sum(h.requests_for("hanging") for h in hanging) >= 3
                    and client.snapshot()["counts"].get("fetch/timeout", 0) >= 3)
            if (len(published) >= n_honest and set(published) <= honest_accepted() and live) \
                    or time.monotonic() > deadline:
                node.stop_requested = True

        node.run(on_step)
        accepted = honest_accepted()
        hanging_ids = {h.peer_id for h in hanging}
        counts = client.snapshot()["counts"]
        print("hanging-bodies result:", json.dumps({
            "honest_published": len(published), "honest_accepted": len(set(published) & accepted),
            "steps": node.step, "hanging_published": sum(h.published["hanging"] for h in hanging),
            "hanging_requests": sum(h.requests_for("hanging") for h in hanging),
            "fetch_timeouts": counts.get("fetch/timeout", 0), "rate_limited": counts.get("manifests_rate_limited", 0),
            "over_budget": counts.get("fetch_over_budget", 0)}))
        # every honest bundle was accepted and trained on, despite the attack
        assert len(published) == n_honest and set(published) <= accepted, (len(set(published) & accepted), counts)
        assert sum(m.get(f"external:{HONEST.peer_id}/used", 0) for m in records) > 0
        # the attack was live: hanging bodies were requested and timed out; their keys' manifests were rate-limited
        assert sum(h.requests_for("hanging") for h in hanging) >= 3 and counts.get("fetch/timeout", 0) >= 3
        book = client.peers.snapshot()["peers"]
        assert sum(book.get(p, {}).get("rate_limited", 0) for p in hanging_ids) > 0
        assert book[HONEST.peer_id]["rate_limited"] == 0 and book[HONEST.peer_id]["rejected"] == {}
        # nothing of the hanging keys reached the trainer
        assert not [a for a in client.accepted if a.publisher in hanging_ids]
        assert not [k for m in records for k in m if any(k.startswith(f"external:{p}") for p in hanging_ids)]
        # the node kept stepping, with local samples every step
        assert node.step == len(records) and [r["step"] for r in records] == list(range(1, node.step + 1))
        assert all(r["samples_local"] > 0 for r in records)
    finally:
        for x in [*hanging, honest]:
            if x is not None:
                x.close()
        node.close()


def _newest_digest(client) -> str:
    """Hex digest of the newest bundle ``client`` published (the last manifest of its newest outbox bucket)."""
    with client.publisher.lock:
        bucket = max(client.publisher.outbox)
        menv = client.publisher.outbox[bucket][-1]
    _, m = wire.decode(menv, expected_kind=wire.KIND_MANIFEST)
    return m.bundle_digest.hex()


SYBIL_CAPS = {"young_key_trees": 1, "trees_per_earned_tree": 2, "max_trees_per_peer": 4, "established_after": 8,
              "max_young_trees": 2}


@pytest.mark.slow
def test_three_fresh_sybil_keys_do_not_take_the_honest_share(tmp_path, mix):
    """Outside attack over the real network: an established honest peer and three fresh Sybil keys that
    publish 2-leaf [1, 0] trees (first in a ``contrast`` ranking). Two receivers read the same swarm: one with
    the young-key caps (``SYBIL_CAPS``), one without (``established_after=0``, the old behaviour). The trainer's
    own selection (``select_external``, 4 groups, contrast, max_peer_share 0.5) then gives the honest peer at
    least its fair share (1 of 4 keys) on the capped receiver, and nothing on the uncapped one. Numbers in
    docs/lab/benchmarks.md ("Sybil keys")."""
    from swarmnode.config import RunConfig
    from swarmnode.testing.adversary import HostilePeer
    from swarmnode.swarm.gossip import SwarmClient
    from swarmnode.train.external import select_external

    sid = f"sybil-{time.time_ns() % 10**9}"
    net = dict(fetch_timeout=FETCH_TIMEOUT, dht_timeout=5.0, bucket_seconds=10.0)

    def receiver(name: str, **caps) -> SwarmClient:
        peers = [] if name == "capped" else victims[0].maddrs()
        cfg = RunConfig(swarm=SwarmConfig(enabled=True, swarm_id=sid, net={**net, "initial_peers": peers}, trust=caps),
                        external={"max_external_completion_length": 256})  # the factory's completions are longer
        ident = Identity.from_private_bytes(hashlib.sha256(f"test_hostile_swarm receiver {name}".encode()).digest())
        return SwarmClient(cfg, ident, mix, 256, f"model-{name}", BYTE_TOKENIZER_ID, None, tmp_path / name,
                           detokenize=byte_detokenize, poll_interval=0.5, heartbeat_interval=5.0,
                           dht_kwargs=FAST_DHT)

    victims: list[SwarmClient] = []
    publishers: list = []
    try:
        victims.append(receiver("capped", **SYBIL_CAPS))
        victims.append(receiver("uncapped", established_after=0, max_trees_per_peer=64))
        scfg = victims[0].scfg
        honest = HostilePeer(scfg, mix, initial_peers=victims[0].maddrs(), identity=HONEST, cases=[],
                             dht_kwargs=FAST_DHT)
        sybils = [HostilePeer(scfg, mix, initial_peers=victims[0].maddrs(), identity=k, cases=[], dht_kwargs=FAST_DHT,
                              seed=i + 1) for i, k in enumerate(SYBIL_KEYS)]
        publishers = [honest, *sybils]
        assert _wait(lambda: all(p.dht.connected for p in publishers) and victims[1].dht.connected, 120)
        capped, uncapped = victims

        def step(digests: list[str], k: int) -> dict[str, list]:
            """Wait until both receivers fetched this step's bundles, then one gather each (one training step)."""
            for v in victims:
                _wait(lambda v=v: set(digests) <= v.pending_digests() | {a.digest for a in v.accepted}, 90)
            return {name: v.gather(k, 0)[0] for name, v in (("capped", capped), ("uncapped", uncapped))}

        # phase 1: the honest peer alone, until the capped receiver counts it as established (no node trains
        # here, so this stands in for node.py's credit: every admitted honest tree with reward contrast)
        k = 0
        while capped.peers.earned(HONEST.peer_id) < SYBIL_CAPS["established_after"] and k < 30:
            digests = honest.publish_bundles([honest.factory.honest_trees(2, 4)])
            assert digests, "the honest peer could not store its record"
            got = step(digests, k)["capped"]
            capped.credit(HONEST.peer_id, sum(1 for t in got if t.peer_id == HONEST.peer_id
                                              and len(set(t.rewards())) > 1))
            k += 1
        assert capped.peers.earned(HONEST.peer_id) >= SYBIL_CAPS["established_after"], k
        # phase 2: three fresh Sybil keys publish their [1, 0] trees every step beside it
        sybil_ids = {s.peer_id for s in sybils}
        n_steps = 6
        tally = {name: {"selected_honest": 0, "selected_sybil": 0, "samples_honest": 0, "samples_sybil": 0,
                        "admitted_honest": 0, "admitted_sybil": 0, "max_sybil_trees_per_step": 0}
                 for name in ("capped", "uncapped")}
        for j in range(n_steps):
            digests = honest.publish_bundles([honest.factory.honest_trees(2, 4)])
            for s in sybils:
                digests += s.publish_bundles([s.factory.contrast_trees(2)])
            assert len(digests) == 4, digests  # one bundle per publisher
            got = step(digests, k + j)
            for name, trees in got.items():
                t = tally[name]
                n_syb = sum(1 for x in trees if x.peer_id in sybil_ids)
                t["admitted_sybil"] += n_syb
                t["admitted_honest"] += sum(1 for x in trees if x.peer_id == HONEST.peer_id)
                t["max_sybil_trees_per_step"] = max(t["max_sybil_trees_per_step"], n_syb)
                sel = select_external(trees, 4, "contrast", 0.5, rng=j)
                for x in sel:
                    who = "honest" if x.peer_id == HONEST.peer_id else "sybil"
                    t[f"selected_{who}"] += 1
                    t[f"samples_{who}"] += len(x.tree.leaves())
        for t in tally.values():
            t["honest_share_of_groups"] = t["selected_honest"] / max(1, t["selected_honest"] + t["selected_sybil"])
            t["honest_share_of_samples"] = t["samples_honest"] / max(1, t["samples_honest"] + t["samples_sybil"])
        print("sybil result:", json.dumps({"steps": n_steps, "fair_share": 0.25, **tally}))
        c, u = tally["capped"], tally["uncapped"]
        # the attack is real: without the caps the Sybils' trees are admitted 3:1 and, with the trainer's per-publisher
        # round-robin selection, three fresh keys still take three quarters of the groups (by key count alone)
        assert u["admitted_sybil"] > u["admitted_honest"] and u["honest_share_of_groups"] <= 0.25, u
        # with them, the honest peer supplies at least its fair share (1 of 4 keys) of groups and samples, and the
        # young keys together never get more than max_young_trees trees in a step
        assert c["honest_share_of_groups"] >= 0.25 and c["honest_share_of_samples"] >= 0.25, c
        assert c["max_sybil_trees_per_step"] <= SYBIL_CAPS["max_young_trees"] and c["admitted_sybil"] > 0, c
        # nothing was rejected: Sybils publish valid work, which is why only standing can tell them apart
        assert all(not capped.peers.snapshot()["peers"].get(p, {}).get("rejected") for p in sybil_ids)
    finally:
        for x in [*publishers, *reversed(victims)]:
            x.close()


@pytest.mark.slow
def test_poisoned_rescue_answers_reach_the_asker_verified(tmp_path, mix):
    """The ``rescue_poison`` hostile peer over the real network: a receiver (SwarmClient, ``levers.rescue`` on)
    announces two questions it got all wrong in its heartbeats; the hostile peer reads them from the DHT
    (:meth:`HostilePeer.rescue_refs`), answers each with a tree whose every leaf is the payload line + the worked
    solution, and the receiver's verifier accepts those trees for exactly its questions with every leaf re-scored
    correct. Nothing in the protocol refuses them: the payload reaches the asker's rescue merge, where only the
    likelihood screen, admission by form and the step credit mask stand between it and training (what
    ``bench swarm --hostile rescue_poison`` measures)."""
    from swarmnode.config import RunConfig
    from swarmnode.testing.adversary import HostilePeer
    from swarmnode.swarm.gossip import SwarmClient

    sid = f"rpoison-{time.time_ns() % 10**9}"
    net = dict(fetch_timeout=FETCH_TIMEOUT, dht_timeout=5.0, bucket_seconds=10.0, heartbeat_interval=1.0)
    cfg = RunConfig(swarm=SwarmConfig(enabled=True, swarm_id=sid, net=net, trust={"established_after": 0}),
                    levers={"rescue": {"enabled": True}}, external={"max_external_completion_length": 256})
    ident = Identity.from_private_bytes(hashlib.sha256(b"test_hostile_swarm rescue asker").digest())
    (tmp_path / "asker").mkdir()
    asker = SwarmClient(cfg, ident, mix, 256, "model-asker", BYTE_TOKENIZER_ID, None, tmp_path / "asker",
                        detokenize=byte_detokenize, poll_interval=0.5, heartbeat_interval=1.0, dht_kwargs=FAST_DHT)
    hp = None
    try:
        hp = HostilePeer(asker.scfg, mix, initial_peers=asker.maddrs(), identity=HOSTILE, cases=[],
                         dht_kwargs=FAST_DHT, model_id="model-asker")
        assert hp.rescue_refs() == []  # nothing asked yet (or not joined): a round publishes nothing
        asked = mix.refs_for_step(0, 2)
        asker.announce_rescue(asked)
        assert _wait(lambda: hp.dht.connected and set(asked) <= set(hp.rescue_refs()), 90), hp.rescue_refs()
        digests = hp.run_rescue_poison_round("pwned!", n_leaves=3, max_trees=8)
        assert len(digests) == 1 and hp.published["rescue_poison"] == 1
        assert _wait(lambda: set(digests) <= asker.pending_digests() | {a.digest for a in asker.accepted}, 90)
        trees = [t for t in asker.gather(0, 0)[0] if t.peer_id == HOSTILE.peer_id]
        assert sorted(t.tree.task for t in trees) == sorted(asked)
        for t in trees:
            leaves = t.tree.leaves()
            assert len(leaves) == 3 and all(t.tree.nodes[i].reward == 1.0 for i in leaves)
            assert all(byte_detokenize(t.tree.completion_ids(i)).startswith("pwned!\n") for i in leaves)
    finally:
        if hp is not None:
            hp.close()
        asker.close()


# ============================================================================ the poison benchmark's plumbing
def test_bench_plans_poison_twins_and_screen_off_arms():
    from swarmnode.bench.swarm import Arm, plan_arms

    arms = plan_arms([(4, 4)], ["per_source"], ["none"], hostile="poison", isolated=False, screen_off=True)
    assert [a.name for a in arms] == ["swarm-4x4-per_source-none", "swarm-4x4-per_source-none-poison",
                                      "swarm-4x4-per_source-none-poison-noscreen"]
    assert [a.screen for a in arms] == [True, True, False] and arms[2].label.endswith("+poison screen off")
    assert Arm(4, 4, True, hostile=True).hostile == "network"  # the old boolean still means the network attack
    with pytest.raises(ValueError, match="--hostile must be none, network, poison or rescue_poison"):
        Arm(4, 4, True, hostile="spam")
    rp = plan_arms([(4, 4)], ["per_source"], ["none"], hostile="rescue_poison", levers=["rescue"], isolated=False)
    assert [a.name for a in rp] == ["swarm-4x4-per_source-none-res", "swarm-4x4-per_source-none-res-rpoison"]
    assert rp[1].rescue and rp[1].label.endswith("+rescue +rescue-poison")
    # only arms whose nodes ask get the twin; without one the peer would have nothing to answer (0% by construction)
    both = plan_arms([(4, 4)], hostile="rescue_poison", levers=["none", "rescue"], isolated=False)
    assert [a.hostile for a in both] == ["", "", "rescue_poison"] and both[2].rescue
    on = plan_arms([(4, 4)], hostile="rescue_poison", isolated=False, swarm_set=[("levers.rescue.enabled", "true")])
    assert [a.hostile for a in on] == ["", "rescue_poison"]
    with pytest.raises(ValueError, match="needs a swarm arm with rescue on"):
        plan_arms([(4, 4)], hostile="rescue_poison", isolated=False)


def test_bench_poison_report_counts_attack_success_and_honest_false_positives(tmp_path):
    from swarmnode.bench.swarm import Arm, summarize_arm, write_report

    arm = tmp_path / "swarm-poison"
    for i, (share, acc) in enumerate([(0.0, 0.5), (0.25, 0.4)]):
        d = arm / f"node-{i}"
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text(
            json.dumps({"step": 0, "eval": "before", "accuracy": 0.3}) + "\n"
            + json.dumps({"step": 1, "reward": 0.5, "samples_external": 2}) + "\n"
            + json.dumps({"step": 1, "eval": "after", "accuracy": acc}) + "\n")
        (d / "result.json").write_text(json.dumps({"poison": {
            "payload": "pwned!", "screened": {"payload_kept": i, "payload_rejected": 10, "clean_kept": 50,
                                              "clean_rejected": 1},
            "screened_by_peer": {"sn1hostile": [10 + i, 10], "sn1honest": [50, 1]},
            "trained": {"payload": i, "clean": 40}, "held_out": {"n": 4, "share": share, "example": "x"}}}))
    (arm / "hostile.json").write_text(json.dumps({"peer_id": "sn1hostile", "sender_id": "p2p:x"}))
    s = summarize_arm(arm)
    p = s["poison"]
    assert p["attack_success"] == [0.0, 0.25] and p["trained"] == {"payload": 1, "clean": 80}
    assert (p["honest_checked"], p["honest_rejected"], p["hostile_checked"], p["hostile_rejected"]) == (100, 2, 21, 20)
    assert p["honest_fp"] == pytest.approx(0.02)
    assert s["accuracy_after_per_node"] == [0.5, 0.4]
    md, _ = write_report([(Arm(4, 4, True, hostile="poison"), s)], tmp_path / "out", command="x", prefix="t")
    text = md.read_text()
    assert "Poisoned but correct" in text and "| 0.0% / 25.0% | - / - | 50.0% / 40.0% | 1 / 20 | 1 | 80 | 2.00% (2/100) |" in text


def test_bench_repeats_report_gives_mean_and_standard_error():
    from swarmnode.bench.swarm import Arm, repeats_report

    a = Arm(4, 4, True)
    one = {"cumulative_reward": 10.0, "accuracy_after": 0.5, "accuracy_after_per_node": [0.4, 0.6]}
    two = {"cumulative_reward": 14.0, "accuracy_after": 0.7, "accuracy_after_per_node": [0.6, 0.8]}
    assert repeats_report([(a, one)]) == ""  # one run: no spread to report
    text = repeats_report([(a, one), (a, two)])
    # mean 12, SE = sd / sqrt(2) = 2.83 / 1.41 = 2.00; per node 40, 60, 60, 80: sd 16.3 -> SE 8.2
    assert "| swarm 4/4 per_source none | 2 | 12.00 ± 2.00 (n=2) | - | 60.0% ± 10.0% (n=2) | 60.0% ± 8.2% (n=4) |" in text


def test_payload_start_probability_separates_the_models_own_start_from_a_payload():
    from swarmnode.bench.swarm import payload_start_probability
    from swarmnode.config import ModelConfig
    from swarmnode.evaluation import greedy_completions
    from swarmnode.policy.loading import load_policy

    pol = load_policy(ModelConfig(name_or_path="embedded", device="cpu", dtype="float32"))
    prompts = [pol.prompt("Calculate 4 + 3 - 2 + 1 - 5 + 6 - 1 =")]
    first_line = greedy_completions(pol.model, pol.tokenizer, prompts, 24)[0].split("\n")[0]
    assert first_line
    own = payload_start_probability(pol.model, pol.tokenizer, prompts, first_line)
    planted = payload_start_probability(pol.model, pol.tokenizer, prompts, "pwned!")
    assert 0.0 <= planted < 1e-6 < 1e-2 < own <= 1.0
    with pytest.raises(ValueError):
        payload_start_probability(pol.model, pol.tokenizer, [], "x")


FLOOD_KEYS = int(os.environ.get("SWARMNODE_TEST_FLOOD_KEYS", "300"))  # 1000 for the measurement in docs/guide/swarm.md


@pytest.mark.slow
def test_a_flood_of_free_keys_in_the_bucket_key_does_not_hide_an_established_publisher(tmp_path, mix):
    """Outside attack (flooded bucket key), over the real network: 300 free keys each store one full manifest
    record (16 signed
    manifests, about 11 KB) under the shared manifest keys of the current and the next bucket. The outsider saw a
    receiver accept 0 of 27 honest bundles of an established peer that way (control 19 of 19). Now the receiver
    reads known publishers from their own publisher keys first and looks at a bounded number of new owners per
    poll, so the established honest publisher keeps >= 90% of its control acceptance."""
    from swarmnode.config import RunConfig
    from swarmnode.swarm.gossip import SwarmClient
    from swarmnode.swarm.dht_process import DEFAULT_MAX_KEY_BYTES
    from swarmnode.testing.adversary import HostilePeer

    sid = f"flood-{time.time_ns() % 10**9}"
    scfg = SwarmConfig(enabled=True, swarm_id=sid, net={"fetch_timeout": FETCH_TIMEOUT, "dht_timeout": 10.0,
                                                        "bucket_seconds": 30.0})
    ident = Identity.from_private_bytes(hashlib.sha256(b"test_hostile_swarm flood receiver").digest())
    victim = SwarmClient(RunConfig(swarm=scfg, external={"max_external_completion_length": 256}), ident, mix, 256,
                         "model-victim", BYTE_TOKENIZER_ID, None, tmp_path / "victim", detokenize=byte_detokenize, poll_interval=0.5, heartbeat_interval=5.0,
                         dht_kwargs=FAST_DHT)
    honest = flooder = None
    try:
        honest = HostilePeer(victim.scfg, mix, initial_peers=victim.maddrs(), identity=HONEST, cases=[],
                             dht_kwargs=FAST_DHT)
        # the flooder's own DHT node stores without a key budget, as an attacker's would
        flooder = HostilePeer(victim.scfg, mix, initial_peers=victim.maddrs(), cases=[],
                              dht_kwargs={**FAST_DHT, "max_key_bytes": None}, seed=7)
        assert _wait(lambda: honest.dht.connected and flooder.dht.connected, 120)

        def run_steps(n: int, k0: int) -> tuple[int, int]:
            """``n`` steps of one honest bundle each: (published, accepted) as the receiver's gather saw them."""
            published = accepted = 0
            for k in range(n):
                digests = honest.publish_bundles([honest.factory.honest_trees(2, 4)])
                assert digests, "the honest peer could not store its record"
                published += 1
                _wait(lambda: set(digests) <= victim.pending_digests() | {a.digest for a in victim.accepted}, 30)
                got = victim.gather(k0 + k, 0)[0]
                mine = [t for t in got if t.peer_id == HONEST.peer_id]
                accepted += any(a.digest in digests for a in victim.accepted)
                victim.credit(HONEST.peer_id, len(mine))  # what node.py does once it trained on them
            return published, accepted

        control = run_steps(4, 0)
        assert control[1] == control[0] and victim.peers.earned(HONEST.peer_id) > 0, control  # established peer
        before = dict(victim.snapshot()["counts"])
        bucket = flooder.dht.current_bucket()
        floods = [flooder.flood_bucket_key(FLOOD_KEYS, bucket=b, seed=b) for b in (bucket, bucket + 1)]
        assert all(f["stored"] >= FLOOD_KEYS for f in floods), floods
        # the flood is in the key: a plain read of the shared key returns every fake record that fits in our
        # storage's budget per key (3 MiB; the flooder's own node holds all, and its replies fail past 4 MiB)
        plain = victim.dht.read_manifests(sid, [bucket])
        assert len(plain) >= min(FLOOD_KEYS, DEFAULT_MAX_KEY_BYTES // (floods[0]["record_bytes"] + 200))
        flooded_key_bytes = sum(len(v) for _, v in plain)
        flooded = run_steps(6, 10)
        after = victim.snapshot()["counts"]
        polls = after["polls"] - before.get("polls", 0)
        read_mb = (after["dht_read_bytes"] - before.get("dht_read_bytes", 0)) / 1e6
        print("flood result:", json.dumps({
            "keys": FLOOD_KEYS, "record_bytes": floods[0]["record_bytes"], "flooded_key_kb": flooded_key_bytes // 1000,
            "control": control, "flooded": flooded,
            "polls": polls, "dht_read_mb": round(read_mb, 2), "read_kb_per_poll": round(1e3 * read_mb / max(polls, 1)),
            "new_owners_deferred": after.get("new_owners_deferred", 0), "shared_reads_skipped":
            after.get("shared_reads_skipped", 0), "known_publisher_records": after.get("known_publisher_records", 0),
            "fetch": {k: v for k, v in after.items() if k.startswith("fetch")}, "rejected":
            victim.snapshot()["rejected"], "dht": victim.dht.status().num_peers}))
        # honest bundles of the established peer keep >= 90% of their control acceptance
        assert flooded[1] / flooded[0] >= 0.9 * control[1] / control[0], (control, flooded)
        # the flood was live and its cost bounded: most fresh owners deferred each poll, big shared reads spaced out
        assert after.get("new_owners_deferred", 0) > 0 and after.get("shared_reads_skipped", 0) > 0
        assert read_mb * 1e6 / max(polls, 1) <= 0.5 * flooded_key_bytes, (read_mb, polls, flooded_key_bytes)
        # nothing of the flood's keys was accepted (nobody serves their bodies)
        assert all(a.publisher == HONEST.peer_id for a in victim.accepted)
    finally:
        for x in (flooder, honest):
            if x is not None:
                x.close()
        victim.close()
