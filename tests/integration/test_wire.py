"""The wire codec (protocol/SPEC.md): round trips, determinism, every reason code, hostile input."""

from __future__ import annotations

import copy
import hashlib
import random

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.rollout.tree import RolloutTree
from swarmnode.swarm import wire
from swarmnode.swarm.identity import Identity
from swarmnode.swarm.wire import WireError, WireNode, WireTree
from swarmnode.tasks.base import TaskRef

KEY = Identity.from_private_bytes(hashlib.sha256(b"test_wire key").digest())
OTHER = Identity.from_private_bytes(hashlib.sha256(b"test_wire other key").digest())
T0 = 1767225600.5
VOCAB = 1000


def multi_level_tree() -> RolloutTree:
    """root -> {a, b}; a -> {a1 -> {x, y}, a2 (pruned)}; b -> b1. Depth 3, four leaves."""
    t = RolloutTree(task=TaskRef("rg:chain_sum", "3f1d2a7c9b8e4d60", 7, 42), prompt_ids=[1, 2, 3, 4],
                    prompt_text="What is 17 + 25?")
    a = t.add_child(0, [10, 11, 12], "The ", [-0.5, -0.25, -2.0], 2)
    b = t.add_child(0, [13, 14, 15], "Sum ", [-1.0, -0.125, -0.75], 2)
    a1 = t.add_child(a, [20, 21], "sum ", [-0.1, -0.2], 2)
    x = t.add_child(a1, [30, 31, 2], "is 42", [-0.3, -0.4, -0.01], 3, "eos")
    y = t.add_child(a1, [32, 2], "is 41", [-0.3, -0.02], 3, "eos")
    a2 = t.add_child(a, [40], "é", [-9.0], 2, "pruned")
    b1 = t.add_child(b, [50, 51, 52, 53], "= 42 ✓", None, 3, "length")
    t.nodes[x].reward, t.nodes[y].reward, t.nodes[b1].reward = 1.0, 0.0, 0.5
    assert t.leaves() == [x, y, a2, b1]
    return t


def make_bundle(trees=None, **kw) -> wire.RolloutBundle:
    args = dict(swarm_id="swarm-x", publisher_key=KEY.public_key_bytes, vocab_size=VOCAB, model_id="m/x",
                tokenizer_id="tok/x", created_at=T0)
    args.update(kw)
    return wire.bundle_from_trees(trees or [multi_level_tree()], **args)


def reason_of(fn, *a, **kw) -> str:
    with pytest.raises(WireError) as ei:
        fn(*a, **kw)
    assert ei.value.reason in wire.REASONS
    assert type(ei.value) is WireError
    return ei.value.reason


def body_of(env: bytes) -> dict:
    return msgpack.unpackb(msgpack.unpackb(env)["body"])


def resign(raw_body, kind="bundle", ident=KEY, version=1, **pack_kw) -> bytes:
    body = raw_body if isinstance(raw_body, bytes) else msgpack.packb(raw_body, use_bin_type=True, **pack_kw)
    return wire.seal(ident, kind, body, version=version)


# ------------------------------------------------------------------------------------ round trips
def test_multi_level_tree_round_trip():
    tree = multi_level_tree()
    bundle = make_bundle([tree])
    assert bundle.policy_version == 3  # highest segment version
    env = wire.encode_bundle(bundle, KEY)
    envelope, decoded = wire.decode(env, expected_kind="bundle")
    assert envelope.kind == "bundle" and envelope.public_key == KEY.public_key_bytes
    assert envelope.peer_id == KEY.peer_id and envelope.digest == hashlib.sha256(env).digest()
    assert decoded.swarm_id == "swarm-x" and decoded.model_id == "m/x" and decoded.tokenizer_id == "tok/x"
    assert decoded.created_at == T0 and decoded.vocab_size == VOCAB and decoded.version == 1
    wt = decoded.trees[0]
    assert wt.task == tree.task and wt.prompt_ids == [1, 2, 3, 4] and wt.prompt_text == "What is 17 + 25?"
    assert [n.parent for n in wt.nodes] == [None, 0, 0, 1, 3, 3, 1, 2]
    assert wt.leaves() == [4, 5, 6, 7]
    assert wt.claimed_rewards() == {4: 1.0, 5: 0.0, 7: 0.5}  # the pruned leaf claims nothing
    assert wt.nodes[7].logprobs is None and wt.nodes[0].logprobs is None
    # log-probs travel as float32: exact for dyadic values, rounded otherwise
    assert wt.nodes[1].logprobs == [-0.5, -0.25, -2.0]
    assert wt.nodes[3].logprobs == pytest.approx([-0.1, -0.2], abs=1e-7)

    (back,) = wire.trees_from_bundle(decoded)
    assert isinstance(back, RolloutTree)
    assert back.model_id == "m/x" and back.tokenizer_id == "tok/x" and back.task == tree.task
    assert len(back.nodes) == len(tree.nodes)
    for n0, n1 in zip(tree.nodes, back.nodes):
        assert (n1.node_id, n1.parent, n1.children, n1.token_ids, n1.text, n1.policy_version, n1.finish_reason) == (
            n0.node_id, n0.parent, n0.children, n0.token_ids, n0.text, n0.policy_version, n0.finish_reason)
        assert n1.logprobs == pytest.approx(n0.logprobs, abs=1e-6)
        assert n1.reward is None  # claims are not trusted
    assert back.leaves() == tree.leaves()
    assert back.completion_ids(4) == [10, 11, 12, 20, 21, 30, 31, 2]
    assert back.completion_text(7) == "Sum = 42 ✓"


def test_group_tree_round_trip_and_options():
    t = RolloutTree.from_group(TaskRef("rg:x", "", 0, 1), [5], [[1, 2], [3], [4, 5, 6]], texts=["a", "b", "c"],
                               logprobs=[[-1.0, -2.0], [-0.5], [-1.0, -1.0, -1.0]], policy_version=9)
    for leaf in t.leaves():
        t.nodes[leaf].reward = 1.0
    b = make_bundle([t], include_logprobs=False, include_rewards=False)
    d = wire.decode_bundle(wire.encode_bundle(b, KEY))
    assert [n.logprobs for n in d.trees[0].nodes] == [None] * 4
    assert d.trees[0].claimed_rewards() == {}
    assert d.policy_version == 9 and [n.policy_version for n in d.trees[0].nodes] == [0, 9, 9, 9]


def test_encoding_is_deterministic_and_canonical():
    b1, b2 = make_bundle(), make_bundle()
    e1, e2 = wire.encode_bundle(b1, KEY), wire.encode_bundle(b2, KEY)
    assert e1 == e2
    # re-encoding the decoded message reproduces the exact bytes (float32 log-probs are stable)
    assert wire.encode_bundle(wire.decode_bundle(e1), KEY) == e1
    # the envelope is a 5-key map in byte order: body, kind, pk, sig, v
    raw = msgpack.unpackb(e1)
    assert list(raw) == ["body", "kind", "pk", "sig", "v"] and raw["v"] == 1
    assert list(body_of(e1)) == list(wire.BUNDLE_KEYS)
    assert KEY.sign(wire.domain_prefix("bundle") + raw["body"]) == raw["sig"]
    assert wire.domain_prefix("bundle") == b"swarmnode/v1/bundle\x00"


def test_manifest_round_trip_and_check():
    env = wire.encode_bundle(make_bundle(), KEY)
    bundle = wire.decode_bundle(env)
    man = wire.manifest_for_bundle(env, bundle)
    assert man.bundle_size == len(env) and man.bundle_digest == hashlib.sha256(env).digest()
    assert man.num_trees == 1 and man.num_leaves == 4 and man.tasks == [bundle.trees[0].task]
    menv = wire.encode_manifest(man, KEY)
    assert len(menv) < 400
    got = wire.decode_manifest(menv)
    assert got == man
    wire.check_manifest(got, env)
    wire.check_manifest(got, env, bundle)
    assert reason_of(wire.check_manifest, got, env + b"x") == "manifest_mismatch"
    assert reason_of(wire.check_manifest, got, env[:-1] + bytes([env[-1] ^ 1])) == "manifest_mismatch"
    other = copy.deepcopy(bundle)
    other.trees[0].task = TaskRef("rg:chain_sum", "3f1d2a7c9b8e4d60", 7, 43)
    assert reason_of(wire.check_manifest, got, env, other) == "manifest_mismatch"


def test_heartbeat_round_trip():
    hb = wire.Heartbeat("swarm-x", KEY.peer_id, "m/x", 12, 0.75, 0.5, 100, 40, 3, T0)
    env = wire.encode_heartbeat(hb, KEY)
    assert wire.decode_heartbeat(env) == hb
    hb.peer_id = OTHER.peer_id
    assert reason_of(wire.encode_heartbeat, hb, KEY) == "key_mismatch"
    raw = body_of(env)
    raw["peer"] = OTHER.peer_id
    assert reason_of(wire.decode_heartbeat, resign(raw, "heartbeat")) == "key_mismatch"


def test_version_negotiation():
    b = make_bundle()
    b.version = 2
    env2 = wire.encode_bundle(b, KEY)
    assert reason_of(wire.decode_bundle, env2) == "bad_version"
    assert wire.decode_bundle(env2, supported_versions={1, 2}).version == 2
    env1 = wire.encode_bundle(make_bundle(), KEY)
    assert reason_of(wire.decode_bundle, env1, supported_versions={2}) == "bad_version"
    # relabelling a v1 envelope as v2 breaks the signature (the version is in the domain prefix)
    raw = msgpack.unpackb(env1)
    raw["v"] = 2
    assert reason_of(wire.decode_bundle, msgpack.packb(raw), supported_versions={1, 2}) == "bad_signature"


# ------------------------------------------------------------------------------------ every reason code
def _cases():
    env = wire.encode_bundle(make_bundle(), KEY)
    body = body_of(env)

    def mut(fn):
        raw = copy.deepcopy(body)
        fn(raw)
        return resign(raw)

    node = lambda r, i: r["trees"][0]["nodes"][i]  # noqa: E731
    hb = wire.encode_heartbeat(wire.Heartbeat("s", KEY.peer_id, "m", 1, None, None, 0, 0, 0, T0), KEY)
    return [
        ("too_large", lambda: wire.decode_bundle(env, max_bytes=100)),
        ("too_large", lambda: wire.decode_bundle(mut(lambda r: r.__setitem__("swarm", "s" * 300)))),
        ("malformed", lambda: wire.decode_bundle(env[:-1])),
        ("malformed", lambda: wire.decode_bundle("not bytes")),  # type: ignore[arg-type]
        ("non_canonical", lambda: wire.decode_bundle(resign(msgpack.packb(body, use_single_float=True)))),
        ("schema", lambda: wire.decode_bundle(mut(lambda r: r.__setitem__("extra", 1)))),
        ("schema", lambda: wire.decode_bundle(mut(lambda r: node(r, 1).__setitem__("fin", "stopped")))),
        ("bad_version", lambda: wire.decode_bundle(mut(lambda r: r.__setitem__("v", 3)))),
        ("bad_kind", lambda: wire.decode_bundle(hb)),
        ("bad_signature", lambda: wire.decode_bundle(env[:-5] + bytes([env[-5] ^ 0x10]) + env[-4:])),
        ("key_mismatch", lambda: wire.decode_bundle(mut(lambda r: r.__setitem__("pub", OTHER.public_key_bytes)))),
        ("vocab", lambda: wire.decode_bundle(mut(lambda r: r.__setitem__("vocab", 12)))),
        ("tree_shape", lambda: wire.decode_bundle(mut(lambda r: node(r, 2).__setitem__("p", 5)))),
        ("numeric", lambda: wire.decode_bundle(mut(lambda r: r.__setitem__("t", float("inf"))))),
        ("manifest_mismatch", lambda: wire.check_manifest(wire.manifest_for_bundle(env, wire.decode_bundle(env)),
                                                          env + b"\x00")),
    ]


def test_every_reason_code_is_reachable():
    seen = set()
    for expected, fn in _cases():
        got = reason_of(fn)
        assert got == expected, (expected, got)
        seen.add(got)
    assert seen == set(wire.REASONS)


# ------------------------------------------------------------------------------------ encoder refuses bad input
def _chain(depth: int) -> RolloutTree:
    t = RolloutTree(task=TaskRef("rg:x", "", 0, 0), prompt_ids=[1])
    nid = 0
    for d in range(depth):
        nid = t.add_child(nid, [3], "x", finish_reason="eos" if d == depth - 1 else None)
    return t


@pytest.mark.parametrize("mutate, reason", [
    (lambda t: t.nodes[1].token_ids.__setitem__(0, VOCAB), "vocab"),
    (lambda t: t.nodes[1].token_ids.__setitem__(0, -1), "vocab"),
    (lambda t: t.nodes[1].logprobs.append(-1.0), "schema"),
    (lambda t: t.nodes[1].logprobs.__setitem__(0, 0.5), "numeric"),
    (lambda t: t.nodes[1].logprobs.__setitem__(0, float("nan")), "numeric"),
    (lambda t: setattr(t.nodes[4], "reward", 2.5), "numeric"),
    (lambda t: setattr(t.nodes[4], "finish_reason", None), "tree_shape"),
    (lambda t: setattr(t.nodes[1], "finish_reason", "eos"), "tree_shape"),
    (lambda t: setattr(t.nodes[1], "text", "\ud800"), "schema"),
    (lambda t: setattr(t, "prompt_ids", []), "schema"),
    (lambda t: t.nodes[7].token_ids.extend([5] * wire.MAX_SEGMENT_TOKENS), "too_large"),
    (lambda t: setattr(t.nodes[1], "text", "x" * (wire.MAX_TEXT_BYTES + 1)), "too_large"),
])
def test_encoder_validates(mutate, reason):
    t = multi_level_tree()
    mutate(t)
    b = make_bundle([t], policy_version=5)
    assert reason_of(wire.encode_bundle, b, KEY) == reason


def test_encoder_limits_and_key():
    assert reason_of(wire.encode_bundle, make_bundle([_chain(wire.MAX_DEPTH + 1)]), KEY) == "tree_shape"
    wire.encode_bundle(make_bundle([_chain(wire.MAX_DEPTH)]), KEY)
    root_only = RolloutTree(task=TaskRef("rg:x", "", 0, 0), prompt_ids=[1])
    assert reason_of(wire.encode_bundle, make_bundle([root_only]), KEY) == "tree_shape"
    wide = RolloutTree.from_group(TaskRef("rg:x", "", 0, 0), [1], [[2]] * (wire.MAX_LEAVES_PER_TREE + 1))
    assert reason_of(wire.encode_bundle, make_bundle([wide]), KEY) == "tree_shape"
    long_path = RolloutTree(task=TaskRef("rg:x", "", 0, 0), prompt_ids=[1])
    n1 = long_path.add_child(0, [3] * wire.MAX_SEGMENT_TOKENS)
    long_path.add_child(n1, [3], finish_reason="eos")
    assert reason_of(wire.encode_bundle, make_bundle([long_path]), KEY) == "too_large"
    assert reason_of(wire.encode_bundle, make_bundle([_chain(1)] * (wire.MAX_TREES_PER_BUNDLE + 1)), KEY) == "too_large"
    assert reason_of(wire.encode_bundle, make_bundle(policy_version=1), KEY) == "schema"  # segment newer than bundle
    assert reason_of(wire.encode_bundle, make_bundle(), OTHER) == "key_mismatch"
    assert reason_of(wire.encode_bundle, make_bundle(created_at=float("nan")), KEY) == "numeric"
    assert reason_of(wire.encode_bundle, make_bundle(swarm_id=""), KEY) == "schema"


# ------------------------------------------------------------------------------------ hostile input
def test_hostile_structures():
    hdr = msgpack.packb({"model": "m", "pub": KEY.public_key_bytes, "pv": 0, "swarm": "s", "t": T0, "tok": "t"})
    cases = {
        "deep nesting": (b"\x91" * 100_000 + b"\xc0", "too_large"),
        "huge array header": (b"\x89" + hdr[1:] + msgpack.packb("trees") + b"\xdd\xff\xff\xff\xff", "too_large"),
        "huge map header": (b"\xdf\xff\xff\xff\xff", "too_large"),
        # a str/bin header longer than the data is a truncation: nothing is allocated for it
        "huge str header": (b"\xdb\xff\xff\xff\xff", "malformed"),
        "huge bin header": (b"\xc6\x7f\xff\xff\xff", "malformed"),
        "long str": (msgpack.packb("x" * (wire.MAX_TEXT_BYTES + 1)), "too_large"),
        "long bin": (msgpack.packb(b"x" * (4 * wire.MAX_SEGMENT_TOKENS + 1)), "too_large"),
        "container bomb": (msgpack.packb({"trees": [[[]] * 1000] * 64}), "too_large"),
        "reserved byte": (b"\xc1", "malformed"),
        "ext": (b"\xd4\x01\x00", "malformed"),
        "empty": (b"", "malformed"),
        "int key": (b"\x81\x01\x01", "malformed"),
        "not a map": (msgpack.packb([1, 2, 3]), "schema"),
        "nil": (b"\xc0", "schema"),
    }
    for name, (body, reason) in cases.items():
        assert reason_of(wire.decode_bundle, resign(body)) == reason, name
        assert reason_of(wire.decode_body, "bundle", body) == reason, name
    # the same at envelope level (no signature needed to be rejected)
    env = wire.encode_bundle(make_bundle([_chain(1)]), KEY)
    assert env[0] == 0x85
    dup_key = b"\x86" + env[1:] + b"\xa1v\x01"  # a sixth entry repeating "v": same dict, other bytes
    for data, reason in [(b"\x91" * 100_000, "too_large"), (b"\xdd\xff\xff\xff\xff", "too_large"),
                         (dup_key, "non_canonical"), (b"\x85" + b"\xa1v\x01" * 5, "schema"), (b"\x80", "schema"),
                         (msgpack.packb({"v": "1"}), "schema"), (b"\xc0" * 10, "malformed")]:
        assert reason_of(wire.decode_bundle, data) == reason, data[:8]


def test_every_truncation_and_bit_flip_is_a_wire_error():
    env = wire.encode_bundle(make_bundle([_chain(2)]), KEY)
    for n in range(len(env)):
        reason_of(wire.decode_bundle, env[:n])
    rng = random.Random(0)
    for _ in range(300):
        i = rng.randrange(len(env))
        bad = env[:i] + bytes([env[i] ^ (1 << rng.randrange(8))]) + env[i + 1:]
        reason_of(wire.decode_bundle, bad)


def test_max_bytes_is_clamped_to_the_protocol_limit():
    hb = wire.encode_heartbeat(wire.Heartbeat("s", KEY.peer_id, "m", 1, None, None, 0, 0, 0, T0), KEY)
    padded = msgpack.unpackb(hb)
    padded["body"] = msgpack.packb({**msgpack.unpackb(padded["body"]), "model": "m" * 200})
    big = resign(padded["body"], "heartbeat")
    assert len(big) < wire.MAX_HEARTBEAT_BYTES
    assert wire.decode_heartbeat(big, max_bytes=10**9).model_id == "m" * 200
    assert reason_of(wire.decode_heartbeat, big, max_bytes=100) == "too_large"


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=4), kids, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_wire_error(data):
    for kind in wire.KINDS:
        reason_of(wire.decode, data, expected_kind=kind)
        try:
            wire.decode_body(kind, data)
        except WireError as e:
            assert "unexpected" not in e.detail


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(wire.BUNDLE_KEYS)), msgpack_values)
def test_signed_garbage_fields_only_raise_wire_error(key, value):
    raw = body_of(wire.encode_bundle(make_bundle([_chain(2)]), KEY))
    raw[key] = value
    try:
        wire.decode_bundle(resign(msgpack.packb(raw, use_bin_type=True)))
    except WireError as e:
        assert "unexpected" not in e.detail  # a validator path, not the catch-all


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(wire.NODE_KEYS)), msgpack_values, st.integers(0, 2))
def test_signed_garbage_nodes_only_raise_wire_error(key, value, idx):
    raw = body_of(wire.encode_bundle(make_bundle([_chain(2)]), KEY))
    raw["trees"][0]["nodes"][idx][key] = value
    try:
        wire.decode_bundle(resign(msgpack.packb(raw, use_bin_type=True)))
    except WireError as e:
        assert "unexpected" not in e.detail  # a validator path, not the catch-all


def test_wire_error_fields():
    e = WireError("schema", "bundle.v: expected an integer")
    assert (e.reason, e.detail) == ("schema", "bundle.v: expected an integer")
    assert str(e) == "schema: bundle.v: expected an integer" and isinstance(e, ValueError)


def test_near_limit_bundle_decodes():
    """64 trees of 8 leaves x 900 tokens with log-probs: about 3.7 MB, under the 4 MiB cap."""
    rng = random.Random(1)
    trees = []
    for k in range(wire.MAX_TREES_PER_BUNDLE):
        comps = [[rng.randrange(VOCAB) for _ in range(900)] for _ in range(8)]
        t = RolloutTree.from_group(TaskRef("rg:x", "", 0, k), [1, 2], comps, texts=["y" * 900] * 8,
                                   logprobs=[[-0.5] * 900] * 8)
        trees.append(t)
    env = wire.encode_bundle(make_bundle(trees), KEY)
    assert 3_500_000 < len(env) <= wire.MAX_ENVELOPE_BYTES
    d = wire.decode_bundle(env)
    assert d.num_leaves() == 512 and d.trees[63].nodes[8].token_ids == trees[63].nodes[8].token_ids
    assert reason_of(wire.decode_bundle, env, max_bytes=len(env) - 1) == "too_large"


def test_swarm_codec_does_not_import_train_or_policy():
    import subprocess
    import sys

    code = ("import sys, swarmnode.swarm.wire, swarmnode.swarm.identity; "
            "bad = [m for m in sys.modules if m.startswith(('swarmnode.train', 'swarmnode.policy'))]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
