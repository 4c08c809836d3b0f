"""Property-based fuzzing of wire.decode and Verifier.verify_bundle / verify_manifest (hypothesis).

Property: on ANY input the decoder raises only ``WireError`` (with a known reason) and the verifier only
``Rejection`` (with a known reason); whatever the verifier accepts carries our own re-scored rewards.
Inputs: random bytes, and mutations of valid encodings (bit flips, truncations, splices, msgpack-level
structural mutations of the envelope or of a re-signed body, semantic field changes re-encoded validly,
hypothesis-generated msgpack values signed as bodies). About 2000 examples in all; the long run is
``scripts/fuzz.py --n 100000``.
"""

from __future__ import annotations

import hashlib
import math
import random

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.config import SwarmConfig
from swarmnode.swarm import wire
from swarmnode.testing.adversary import BYTE_TOKENIZER_ID, HostileFactory, Mutator, byte_detokenize, byte_tokenize
from swarmnode.swarm.identity import Identity
from swarmnode.swarm.peers import PeerBook
from swarmnode.swarm.verify import REASONS, Rejection, Verifier
from swarmnode.tasks import ReasoningGymSource, TaskMix

SWARM = "fuzz-test"
T0 = 1767225600.0
KEY = Identity.from_private_bytes(hashlib.sha256(b"test_fuzz key").digest())


def fuzz(n: int) -> settings:
    """Bounded, reproducible settings: ``n`` examples, no deadline, no example database."""
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def clock() -> float:
    return T0


class World:
    """Shared, read-only fuzzing material: the task mix and a corpus of valid and hostile messages."""

    def __init__(self) -> None:
        self.mix = TaskMix([ReasoningGymSource("chain_sum", {"min_terms": 2, "max_terms": 2})], [1.0])
        f = HostileFactory(KEY, self.mix, swarm_id=SWARM, clock=clock, max_bundle_bytes=64 * 1024)
        self.bundles: list[bytes] = []
        self.manifests: list[bytes] = []
        for n_trees, n_leaves in ((1, 1), (1, 3), (2, 4)):
            b, env = f.bundle(f.honest_trees(n_trees, n_leaves))
            self.bundles.append(env)
            self.manifests.append(f.manifest(env, b)[1])
        hb = wire.Heartbeat(swarm_id=SWARM, peer_id=KEY.peer_id, model_id="m", step=1, reward_mean=None,
                            accuracy=0.5, samples_published=1, samples_accepted=0, samples_rejected=0, created_at=T0)
        self.bundles.append(wire.encode(hb, KEY))
        for c in f.cases():
            (self.manifests if c.kind == "manifest" else self.bundles).append(c.data)
        self.corpus = self.bundles + self.manifests

    def verifier(self) -> Verifier:
        peers = PeerBook(ban_after=10**9, ban_seconds=1.0, rate_limit_per_minute=1e9, clock=clock)
        cfg = SwarmConfig(swarm_id=SWARM, trust={"max_bundle_bytes": 64 * 1024})
        return Verifier(cfg, self.mix, 256, BYTE_TOKENIZER_ID, retokenize=byte_tokenize, peers=peers, clock=clock,
                        detokenize=byte_detokenize)


_WORLD: World | None = None


def world() -> World:
    global _WORLD
    if _WORLD is None:
        _WORLD = World()
    return _WORLD


def check(data: bytes, *, manifest_first: bool = False) -> None:
    """The fuzz property for one input."""
    w = world()
    try:
        wire.decode(data)
    except wire.WireError as e:
        assert e.reason in wire.REASONS
    v = w.verifier()
    order = ("manifest", "bundle") if manifest_first else ("bundle", "manifest")
    for kind in order:
        try:
            if kind == "bundle":
                out = v.verify_bundle(data, None, "transport:fuzz")
                for vt in out:  # anything accepted carries our own rewards
                    task = w.mix.get(vt.tree.task)
                    for j in vt.tree.leaves():
                        r = vt.tree.nodes[j].reward
                        assert r is not None and math.isfinite(r)
                        assert r == w.mix.score(task, vt.tree.completion_text(j))
            else:
                v.verify_manifest(data, KEY.public_key_bytes)
        except Rejection as r:
            assert r.reason in REASONS, r


@pytest.fixture(scope="module", autouse=True)
def _world():
    world()


def test_corpus_is_what_we_think():
    w = world()
    v = w.verifier()
    assert len(v.verify_bundle(w.bundles[2], None, None)) == 2  # an honest bundle is accepted
    with pytest.raises(Rejection):
        v.verify_bundle(w.bundles[-1], None, None)  # a hostile one is not


@fuzz(300)
@given(st.binary(max_size=4096))
def test_random_bytes(data):
    check(data)


@fuzz(150)
@given(st.sampled_from([b"\x85", b"\x85\xa4body\xc4", b"\xde\x00\x05", b"\x85\xa4body\xc5\xff\xff"]),
       st.binary(max_size=512))
def test_random_bytes_behind_a_map_header(prefix, data):
    check(prefix + data, manifest_first=True)


@fuzz(300)
@given(st.integers(min_value=0), st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 7)), min_size=1,
                                          max_size=8))
def test_bit_flips(idx, flips):
    src = bytearray(world().corpus[idx % len(world().corpus)])
    for pos, bit in flips:
        src[pos % len(src)] ^= 1 << bit
    check(bytes(src))


@fuzz(250)
@given(st.integers(min_value=0), st.integers(min_value=0), st.integers(min_value=0), st.integers(min_value=0))
def test_truncations_and_splices(i, j, cut_a, cut_b):
    c = world().corpus
    a, b = c[i % len(c)], c[j % len(c)]
    check(a[: cut_a % (len(a) + 1)])
    check(a[: cut_a % (len(a) + 1)] + b[cut_b % (len(b) + 1):])


@fuzz(400)
@given(st.integers(min_value=0, max_value=2**32))
def test_structural_mutations(seed):
    rng = random.Random(seed)
    w = world()
    src = rng.choice(w.corpus)
    m = Mutator(rng, KEY)
    data = m.structural(src)
    for _ in range(rng.randrange(3)):
        data = m.mutate(data, rng.choice(w.corpus))
    check(data, manifest_first=src in w.manifests)


@fuzz(300)
@given(st.integers(min_value=0, max_value=2**32))
def test_semantic_mutations(seed):
    rng = random.Random(seed)
    w = world()
    m = Mutator(rng, KEY)
    data = m.semantic(rng.choice(w.bundles[:3]))
    if rng.random() < 0.5:
        data = m.semantic(data)
    check(data)


_leaf = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
         | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40) | st.binary(max_size=40))
_values = st.recursive(_leaf, lambda ch: st.lists(ch, max_size=6) | st.dictionaries(st.text(max_size=8), ch,
                                                                                   max_size=6), max_leaves=40)


@fuzz(200)
@given(_values, st.sampled_from(wire.KINDS))
def test_signed_arbitrary_msgpack_bodies(value, kind):
    try:
        body = msgpack.packb(value, use_bin_type=True)
    except (ValueError, OverflowError, TypeError):
        return
    data = wire.seal(KEY, kind, body)
    check(data, manifest_first=kind == wire.KIND_MANIFEST)


@fuzz(150)
@given(st.integers(min_value=0, max_value=2**32))
def test_bundle_shaped_bodies_with_mutated_fields(seed):
    """The real bundle map with one key's value replaced by a random msgpack value, re-signed."""
    rng = random.Random(seed)
    w = world()
    body = msgpack.unpackb(msgpack.unpackb(w.bundles[2])["body"])
    m = Mutator(rng, KEY)
    for _ in range(1 + rng.randrange(3)):
        body = m.mutate_value(body)
    try:
        packed = msgpack.packb(body, use_bin_type=True)
    except (ValueError, OverflowError, TypeError):
        return
    check(wire.seal(KEY, wire.KIND_BUNDLE, packed))
