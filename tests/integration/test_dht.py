"""Ed25519 record validator (pure) and SwarmDHT over real hivemind DHTs / p2pd on loopback (no mocks)."""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import socket
import threading
import time

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hivemind.dht import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.p2p import P2P, PeerID
from hivemind.utils import MSGPackSerializer

from swarmnode.swarm.dht import SwarmDHT, parse_multiaddr
from swarmnode.swarm.validator import (
    DOMAIN,
    OWNER_MARKER_LEN,
    SIGNATURE_SUFFIX_LEN,
    Ed25519RecordValidator,
    SwarmKeySpace,
    heartbeat_key,
    manifest_key,
    owner_marker,
    parse_owner_marker,
    publisher_heartbeat_key,
    publisher_key,
    time_bucket,
)

SWARM = "test-swarm"
BUCKET_S = 30.0


def _pub(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _key_id(key: str) -> bytes:
    return DHTID.generate(source=key).to_bytes()


def _record(key: str, subkey, value: bytes, expiration: float) -> DHTRecord:
    """A record exactly as hivemind builds it (node.py store_many): hashed key, msgpack subkey and value."""
    return DHTRecord(_key_id(key), MSGPackSerializer.dumps(subkey), MSGPackSerializer.dumps(value), expiration)


@pytest.fixture()
def keys():
    return Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()


def _validator(key, **kw) -> Ed25519RecordValidator:
    return Ed25519RecordValidator(key, key_spaces=[SwarmKeySpace(SWARM, BUCKET_S)], **kw)


def _signed(v: Ed25519RecordValidator, record: DHTRecord) -> DHTRecord:
    return dataclasses.replace(record, value=v.sign_value(record))


# --------------------------------------------------------------------------- pure helpers
def test_time_bucket_and_key_names():
    assert time_bucket(0.0, 30.0) == 0
    assert time_bucket(59.9, 30.0) == 1
    assert time_bucket(60.0, 30.0) == 2
    assert time_bucket(-0.1, 30.0) == -1
    assert time_bucket(1_700_000_000.0, 60.0) == 28_333_333
    assert manifest_key("sw", 7) == "sw:manifests:7"
    assert heartbeat_key("sw") == "sw:heartbeats"
    with pytest.raises(ValueError, match="bucket_seconds"):
        time_bucket(1.0, 0)
    with pytest.raises(ValueError, match="swarm_id"):
        manifest_key("a:b", 1)
    with pytest.raises(ValueError, match="bucket must be an int"):
        manifest_key("sw", 1.5)


def test_owner_marker_format(keys):
    pub = _pub(keys[0])
    marker = owner_marker(pub)
    assert marker == b"[ed25519:" + pub.hex().encode() + b"]"
    assert len(marker) == OWNER_MARKER_LEN == 74
    assert b"[owner:" not in marker  # cannot be mistaken for hivemind's RSA marker
    assert parse_owner_marker(marker) == pub
    assert parse_owner_marker(marker + b"x") is None
    assert parse_owner_marker(marker.upper()) is None
    assert parse_owner_marker("not bytes") is None
    with pytest.raises(ValueError, match="32 raw bytes"):
        owner_marker(b"\x00" * 31)
    assert SIGNATURE_SUFFIX_LEN == 77


def test_sign_validate_strip_roundtrip_and_signature_payload(keys):
    v = _validator(keys[0])
    exp = time.time() + 100
    rec = _record(manifest_key(SWARM, time_bucket(time.time(), BUCKET_S)), v.local_owner_marker, b"manifest", exp)
    signed_value = v.sign_value(rec)
    assert len(signed_value) == len(rec.value) + 77
    signed = dataclasses.replace(rec, value=signed_value)
    assert v.validate(signed)
    assert v.strip_value(signed) == rec.value
    # the signature is Ed25519 over DOMAIN + msgpack([key_id, subkey, value, expiration]) -- check independently
    sig = signed_value[-65:-1]
    payload = DOMAIN + msgpack.packb([rec.key, rec.subkey, rec.value, exp], use_bin_type=True)
    keys[0].public_key().verify(sig, payload)  # raises if wrong
    # another node's validator (different private key) accepts it too
    assert _validator(keys[1]).validate(signed)


def test_tampering_is_refused(keys):
    v = _validator(keys[0])
    now = time.time()
    key = manifest_key(SWARM, time_bucket(now, BUCKET_S))
    signed = _signed(v, _record(key, v.local_owner_marker, b"manifest", now + 100))
    assert v.validate(signed)
    # value changed
    tampered = dataclasses.replace(signed, value=MSGPackSerializer.dumps(b"manifesT") + signed.value[-77:])
    assert not v.validate(tampered)
    # expiration extended (later expiration would win in hivemind storage)
    assert not v.validate(dataclasses.replace(signed, expiration_time=signed.expiration_time + 1))
    # replayed under another bucket's key
    other_key = _key_id(manifest_key(SWARM, time_bucket(now, BUCKET_S) + 1))
    assert not v.validate(dataclasses.replace(signed, key=other_key))
    # signature removed / duplicated
    assert not v.validate(dataclasses.replace(signed, value=signed.value[:-77]))
    assert not v.validate(dataclasses.replace(signed, value=signed.value + signed.value[-77:]))


def test_forged_owner_is_refused(keys):
    victim, attacker = keys
    v_victim, v_attacker = _validator(victim), _validator(attacker)
    now = time.time()
    rec = _record(manifest_key(SWARM, time_bucket(now, BUCKET_S)), owner_marker(_pub(victim)), b"evil", now + 60)
    # the attacker's own validator does not sign someone else's subkey ...
    assert v_attacker.sign_value(rec) == rec.value
    assert not v_victim.validate(rec)
    # ... and a signature made with the attacker's key under the victim's marker is refused
    forged = dataclasses.replace(rec, value=rec.value + b"[ed25519sig:" + attacker.sign(
        DOMAIN + msgpack.packb([rec.key, rec.subkey, rec.value, rec.expiration_time], use_bin_type=True)) + b"]")
    assert not v_victim.validate(forged)
    assert not v_attacker.validate(forged)
    # two different owner markers in one subkey
    double = _record("other-app-key", owner_marker(_pub(victim)) + owner_marker(_pub(attacker)), b"x", now + 60)
    assert not v_victim.validate(double)


def test_unmarked_records_refused_by_a_swarm_validator(keys):
    v = _validator(keys[0])
    now = time.time()
    bucket = time_bucket(now, BUCKET_S)
    plain = DHTRecord(_key_id(manifest_key(SWARM, bucket)), MSGPackSerializer.dumps(None),
                      MSGPackSerializer.dumps(b"wipe"), now + 60)  # a plain value (subkey=None) under our key
    assert not v.validate(plain)
    assert not v.validate(_record(heartbeat_key(SWARM), b"some-peer", b"hb", now + 60))
    assert not v.validate(_record(manifest_key(SWARM, bucket - 3), "str-subkey", b"x", now + 60))
    # a swarm's node stores only its swarms' records: an unmarked value under any key could be a plain value
    # wiping a publisher key (which no validator can recognise without knowing the publisher)
    assert not v.validate(_record("someone-else:key", b"sub", b"x", now + 60))
    assert not v.validate(_record(publisher_key(SWARM, _pub(keys[1])), None, b"wipe", now + 60))
    # a validator without key spaces keeps hivemind's behaviour for other applications
    assert Ed25519RecordValidator(keys[0]).validate(_record("someone-else:key", b"sub", b"x", now + 60))
    # under our keys the subkey must be exactly the marker, nothing around it
    padded = _signed(v, _record(manifest_key(SWARM, bucket), v.local_owner_marker + b"!", b"x", now + 60))
    assert not v.validate(padded)


def test_under_our_keys_a_value_must_be_bytes(keys):
    """A reader's search decodes every entry of a key when it ends, and one entry that does not decode loses the
    whole key (hivemind's ``finish_search`` raises): one free key's signed junk entry blanked a shared key for every
    reader. Under our keys a value must be exactly one msgpack bin object (a ``bytes`` value)."""
    from swarmnode.swarm.wire import is_dht_bytes_value

    v = _validator(keys[0])
    now = time.time()
    key = manifest_key(SWARM, time_bucket(now, BUCKET_S))
    marker = v.local_owner_marker
    good = _signed(v, _record(key, marker, b"record", now + 60))
    assert v.validate(good)
    for junk in (b"\xc1\xc1junk", MSGPackSerializer.dumps("a str"), MSGPackSerializer.dumps(b"x") + b"!",
                 MSGPackSerializer.dumps(b"x")[:-1], MSGPackSerializer.dumps([b"x"]), b""):
        record = DHTRecord(_key_id(key), MSGPackSerializer.dumps(marker), junk, now + 60)
        assert not v.validate(_signed(v, record)), junk
    for n in (0, 255, 256, 65_535, 65_536):  # bin 8, 16 and 32 headers
        assert is_dht_bytes_value(MSGPackSerializer.dumps(b"a" * n))
    # the same bytes under a key of no swarm of ours, for a validator without key spaces: hivemind's behaviour
    plain = Ed25519RecordValidator(keys[0])
    record = DHTRecord(_key_id("someone-else:key"), MSGPackSerializer.dumps(plain.local_owner_marker), b"\xc1", now + 60)
    assert plain.validate(_signed(plain, record))


def test_only_the_owner_writes_under_its_publisher_key(keys):
    """A flood of fresh keys can fill a shared bucket key; a publisher key takes its owner's record alone."""
    owner, other = _validator(keys[0]), _validator(keys[1])
    now = time.time()
    own_key = publisher_key(SWARM, owner.public_key)
    assert own_key == f"{SWARM}:publisher:{owner.public_key.hex()}"
    assert owner.validate(_signed(owner, _record(own_key, owner.local_owner_marker, b"m", now + 60)))
    # another key's correctly signed entry under the owner's publisher key: refused (it would grow the dictionary)
    assert not owner.validate(_signed(other, _record(own_key, other.local_owner_marker, b"flood", now + 60)))
    assert not other.validate(_signed(other, _record(own_key, other.local_owner_marker, b"flood", now + 60)))
    # a marked record under a key of no swarm of ours (e.g. a guessed variant of the publisher key): refused
    assert not owner.validate(_signed(owner, _record(own_key + "x", owner.local_owner_marker, b"m", now + 60)))
    # the strict rules of shared keys hold there too: expiration cap
    assert not owner.validate(_signed(owner, _record(own_key, owner.local_owner_marker, b"m", now + 10_000)))
    with pytest.raises(ValueError, match="32 raw bytes"):
        publisher_key(SWARM, b"short")
    # the owner's heartbeat key: the same rule
    beat_key = publisher_heartbeat_key(SWARM, owner.public_key)
    assert beat_key == f"{SWARM}:heartbeat:{owner.public_key.hex()}" != heartbeat_key(SWARM)
    assert owner.validate(_signed(owner, _record(beat_key, owner.local_owner_marker, b"hb", now + 60)))
    assert not owner.validate(_signed(other, _record(beat_key, other.local_owner_marker, b"flood", now + 60)))
    assert not other.validate(_signed(owner, _record(publisher_heartbeat_key(SWARM, other.public_key),
                                                     owner.local_owner_marker, b"hb", now + 60)))


def test_expiration_cap_and_size_cap(keys):
    v = _validator(keys[0], max_ttl=100.0, max_clock_skew=10.0, max_value_bytes=1000)
    now = time.time()
    key = manifest_key(SWARM, time_bucket(now, BUCKET_S))
    assert v.validate(_signed(v, _record(key, v.local_owner_marker, b"x", now + 105)))
    # correctly signed but expiring too far in the future: a "later expiration wins" hijack
    assert not v.validate(_signed(v, _record(key, v.local_owner_marker, b"x", now + 111)))
    assert not v.validate(_signed(v, _record("other-app", v.local_owner_marker, b"x", now + 10_000)))
    # value over the cap (msgpack adds a 3-byte bin16 header: 997 + 3 = 1000 is the largest allowed)
    assert v.validate(_signed(v, _record(key, v.local_owner_marker, b"a" * 997, now + 50)))
    assert not v.validate(_signed(v, _record(key, v.local_owner_marker, b"a" * 998, now + 50)))


def test_validate_never_raises_on_garbage(keys):
    v = _validator(keys[0])
    assert v.validate(DHTRecord(b"", b"", b"", 0.0)) is False  # unmarked: a swarm's validator refuses it
    assert Ed25519RecordValidator(keys[0]).validate(DHTRecord(b"", b"", b"", 0.0)) is True  # no key spaces
    protected_id = _key_id(heartbeat_key(SWARM))
    for rec in [
        DHTRecord(protected_id, None, None, 0.0),
        DHTRecord(protected_id, b"\xc1\xc1", b"\xff" * 10, 1.0),
        DHTRecord(b"\x00" * 20, b"[ed25519:" + b"0" * 64 + b"]", b"[ed25519sig:" + b"\x00" * 64 + b"]", 1e300),
        DHTRecord(b"\x00" * 20, MSGPackSerializer.dumps(owner_marker(b"\xff" * 32)), b"x" * 100, float("nan")),
        DHTRecord(b"\x00" * 20, MSGPackSerializer.dumps(owner_marker(b"\xff" * 32)),
                  b"x" + b"[ed25519sig:" + b"\x00" * 64 + b"]", time.time() + 10),
    ]:
        assert v.validate(rec) is False


def test_priority_merge_composite_and_pickle(keys):
    v = _validator(keys[0])
    rsa = RSASignatureValidator()
    assert v.priority > rsa.priority > 0
    other = Ed25519RecordValidator(keys[0], key_spaces=[SwarmKeySpace("second", 60.0)])
    assert v.merge_with(other) is True
    assert [ks.swarm_id for ks in v.key_spaces] == [SWARM, "second"]
    assert v.merge_with(rsa) is False
    # composite: our signature is outermost, RSA's inner; both validate and strip in order
    composite = CompositeValidator([rsa, v])
    now = time.time()
    rec = _record(manifest_key(SWARM, time_bucket(now, BUCKET_S)), v.local_owner_marker, b"m", now + 60)
    signed = dataclasses.replace(rec, value=composite.sign_value(rec))
    assert composite.validate(signed)
    assert composite.strip_value(signed) == rec.value
    # pickling (DHT.add_validators sends validators to the DHT process)
    clone = pickle.loads(pickle.dumps(v))
    assert clone.public_key == v.public_key
    assert clone.validate(_signed(clone, rec))


def test_protected_window_covers_readable_buckets(keys):
    space = SwarmKeySpace(SWARM, 30.0)
    now = 3000.0  # bucket 100
    ids = space.key_ids(now, horizon=60.0)
    for b in range(time_bucket(now - 60, 30) - 1, time_bucket(now + 60, 30) + 2):
        assert _key_id(manifest_key(SWARM, b)) in ids
    assert _key_id(heartbeat_key(SWARM)) in ids
    assert len(ids) == (103 - 97 + 1) + 1  # buckets 97..103 plus the heartbeat key


def test_swarm_dht_argument_errors():
    key = Ed25519PrivateKey.generate()
    with pytest.raises(ValueError, match="peer id"):
        SwarmDHT(key, initial_peers=["/ip4/127.0.0.1/tcp/1"], start=False)
    with pytest.raises(ValueError, match="single string"):
        SwarmDHT(key, initial_peers="/ip4/127.0.0.1/tcp/1", start=False)
    with pytest.raises(ValueError, match="explicit port"):
        SwarmDHT(key, announce_maddrs=["/ip4/1.2.3.4/tcp/0"], start=False)
    with pytest.raises(ValueError, match="manifest_ttl"):
        SwarmDHT(key, manifest_ttl=2000, max_ttl=900, start=False)
    with pytest.raises(TypeError, match="Ed25519PrivateKey"):
        SwarmDHT("not a key", start=False)
    dht = SwarmDHT(key, swarm_ids=[SWARM], max_record_bytes=100, start=False)
    with pytest.raises(ValueError, match="not one of this DHT's swarm_ids"):
        dht.publish_manifest("unknown", 1, b"x")
    with pytest.raises(ValueError, match="max_record_bytes"):
        dht.publish_manifest(SWARM, 1, b"x" * 101)
    with pytest.raises(TypeError, match="bytes"):
        dht.publish_manifest(SWARM, 1, "text")
    # not started: calls return "no data" instead of raising or hanging
    assert dht.publish_manifest(SWARM, 1, b"x") is False
    assert dht.read_manifests(SWARM, [1]) == []
    assert dht.connected is False and dht.peer_id is None
    assert parse_multiaddr("/ip4/1.2.3.4/tcp/5/p2p/12D3KooWCooF7atNVtme2MrFMimCBL8LPygLZcwXQMb9TygysCwc") == (
        "/ip4/1.2.3.4/tcp/5", "12D3KooWCooF7atNVtme2MrFMimCBL8LPygLZcwXQMb9TygysCwc")


def test_shutdown_does_not_wait_for_a_restart_under_way():
    """A node's stop must not wait for the network: ``shutdown`` waits for a restart under way (the watchdog
    starting a new DHT process: minutes on a loaded machine, held under the restart lock) at most
    ``shutdown_grace`` s, and that restart then starts nothing that outlives the shutdown."""
    dht = SwarmDHT(Ed25519PrivateKey.generate(), swarm_ids=[SWARM], shutdown_grace=0.2, health_interval=0,
                   initial_peers=["/ip4/127.0.0.1/tcp/9/p2p/QmRH5KZxdsiy48hpAtSmgsh5i1E7y437hLxR5msPzETM7P"],
                   start=False)
    starting, release = threading.Event(), threading.Event()
    attempts: list[list[str]] = []

    def make_dht(peers: list[str]):  # p2pd start-up that takes (nearly) for ever, then fails (bootstrap down)
        attempts.append(list(peers))
        starting.set()
        release.wait(120)  # only a failure guard
        raise RuntimeError("Daemon failed to start: failed to connect to bootstrap peers")

    dht._make_dht = make_dht  # type: ignore[method-assign]
    result: dict[str, bool] = {}
    restarting = threading.Thread(target=lambda: result.update(ok=dht.restart("DHT does not answer")), daemon=True)
    restarting.start()
    assert starting.wait(60)
    stopped = threading.Event()
    threading.Thread(target=lambda: (dht.shutdown(), stopped.set()), daemon=True).start()
    try:
        assert stopped.wait(60), "shutdown waited for the restart under way"
        assert not release.is_set() and restarting.is_alive()  # it returned while the restart was still starting
    finally:
        release.set()
    restarting.join(60)
    # the restart's start-up failed; with the DHT shut down it tries no solo start, and no process is left
    assert result == {"ok": False} and attempts == [dht.initial_peers] and dht._dht is None and not dht.is_alive


# --------------------------------------------------------------------------- real DHTs on loopback
def _node(**kw) -> SwarmDHT:
    kw.setdefault("swarm_ids", [SWARM])
    kw.setdefault("bucket_seconds", BUCKET_S)
    kw.setdefault("call_timeout", 5.0)
    kw.setdefault("health_interval", 0.5)
    kw.setdefault("join_backoff", (0.5, 2.0))
    kw.setdefault("startup_timeout", 60.0)
    return SwarmDHT(Ed25519PrivateKey.generate(), **kw)


def _wait(predicate, timeout: float = 30.0, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


class ForgingValidator(Ed25519RecordValidator):
    """A hostile peer's validator: signs *any* owner-marked record with its own key and accepts everything."""

    def sign_value(self, record):
        if b"[ed25519:" not in record.subkey:
            return record.value
        payload = self._payload(record.key, record.subkey, record.value, record.expiration_time)
        return record.value + b"[ed25519sig:" + self._private_key.sign(payload) + b"]"

    def validate(self, record):
        return True


@pytest.fixture(scope="module")
def swarm3():
    a = _node()
    b = _node(initial_peers=a.visible_maddrs())
    c = _node(initial_peers=b.visible_maddrs())
    yield a, b, c
    for n in (c, b, a):
        n.shutdown()


@pytest.mark.slow
def test_three_nodes_store_and_read_manifests(swarm3):
    a, b, c = swarm3
    assert b.connected and c.connected and not b.status().solo_fallback
    bucket = a.current_bucket()
    assert a.publish_manifest(SWARM, bucket, b"manifest-a")
    assert c.publish_manifest(SWARM, bucket, b"manifest-c-v1")
    assert c.publish_manifest(SWARM, bucket, b"manifest-c-v2")  # re-publish replaces ours
    assert b.publish_manifest(SWARM, bucket - 1, b"manifest-b-old")
    expected_now = sorted([(a.public_key, b"manifest-a"), (c.public_key, b"manifest-c-v2")])
    for reader in (a, b, c):
        assert reader.read_manifests(SWARM, [bucket]) == expected_now
        assert reader.read_manifests(SWARM, [bucket - 1, bucket]) == [(b.public_key, b"manifest-b-old")] + expected_now
        assert reader.read_manifests(SWARM, [bucket + 5]) == []  # missing key: None from hivemind -> empty
    assert b.publish_heartbeat(SWARM, b"hb-b") and c.publish_heartbeat(SWARM, b"hb-c")
    assert a.read_heartbeats(SWARM) == sorted([(b.public_key, b"hb-b"), (c.public_key, b"hb-c")])
    assert a.recent_buckets(3) == [bucket - 2, bucket - 1, bucket] or a.current_bucket() != bucket


@pytest.mark.slow
def test_hostile_records_are_refused_by_honest_peers(swarm3):
    a, b, c = swarm3
    bucket = a.current_bucket() - 10  # a bucket no other test uses (still inside the protected window)
    key = manifest_key(SWARM, bucket)
    assert a.publish_manifest(SWARM, bucket, b"genuine-a")
    attacker_key = Ed25519PrivateKey.generate()
    attacker = DHT(
        initial_peers=b.visible_maddrs(), start=True, ensure_bootstrap_success=False,
        record_validators=[ForgingValidator(attacker_key, key_spaces=[SwarmKeySpace(SWARM, BUCKET_S)])],
    )
    try:
        now = time.time()
        victim_marker = owner_marker(a.public_key)
        # 1. the victim's subkey, signed with the attacker's key; 2. an unmarked subkey; 3. a plain value that
        # would replace the whole dictionary; 4. the attacker's own subkey expiring far in the future
        attacker.store(key, b"forged-as-a", now + 300, subkey=victim_marker, return_future=True).result(10)
        attacker.store(key, b"unmarked", now + 300, subkey=b"free-for-all", return_future=True).result(10)
        attacker.store(key, b"wipe", now + 890, return_future=True).result(10)
        attacker.store(key, b"pinned", now + 100_000, subkey=owner_marker(_pub(attacker_key)),
                       return_future=True).result(10)
        for reader in (a, b, c):
            assert reader.read_manifests(SWARM, [bucket]) == [(a.public_key, b"genuine-a")]
        # an honestly signed attacker record within the cap is accepted like any other publisher's
        good = owner_marker(_pub(attacker_key))
        assert attacker.store(key, b"attacker-honest", now + 60, subkey=good, return_future=True).result(10)
        assert c.read_manifests(SWARM, [bucket]) == sorted(
            [(a.public_key, b"genuine-a"), (_pub(attacker_key), b"attacker-honest")])
    finally:
        attacker.shutdown()


@pytest.mark.slow
def test_unreachable_bootstrap_starts_solo_then_joins(tmp_path):
    # a peer whose identity and port we know in advance, not running yet
    identity = str(tmp_path / "p2p.id")
    P2P.generate_identity(identity)
    with open(identity, "rb") as f:
        later_peer = PeerID.from_identity(f.read()).to_base58()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"/ip4/127.0.0.1/tcp/{port}/p2p/{later_peer}"
    lonely = _node(initial_peers=[address])
    later = None
    try:
        status = lonely.status()
        assert status.alive and status.solo_fallback and not status.connected
        bucket = lonely.current_bucket()
        assert lonely.publish_manifest(SWARM, bucket, b"solo")  # trains and publishes solo
        assert lonely.read_manifests(SWARM, [bucket]) == [(lonely.public_key, b"solo")]
        later = _node(host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"], p2p_identity_path=identity)
        assert later.peer_id == later_peer
        assert _wait(lambda: lonely.connected, timeout=45), lonely.status()
        assert not lonely.status().solo_fallback and lonely.status().join_attempts >= 1
        assert lonely.publish_manifest(SWARM, bucket, b"joined")
        assert later.read_manifests(SWARM, [bucket]) == [(lonely.public_key, b"joined")]
    finally:
        lonely.shutdown()
        if later is not None:
            later.shutdown()


@pytest.mark.slow
def test_one_dead_initial_peer_among_several_is_fine(swarm3):
    a, _, _ = swarm3
    dead = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWCooF7atNVtme2MrFMimCBL8LPygLZcwXQMb9TygysCwc"
    node = _node(initial_peers=[dead, *a.visible_maddrs()])
    try:
        assert node.connected and not node.status().solo_fallback
    finally:
        node.shutdown()


@pytest.mark.slow
def test_killed_dht_leaves_others_working_and_is_restarted(swarm3):
    a, b, c = swarm3
    bucket = a.current_bucket() - 20  # a bucket no other test uses
    old_peer, old_pid, old_p2pd = c.peer_id, c.pid, c._info["p2pd_pid"]
    os.kill(old_pid, signal.SIGKILL)
    assert _wait(lambda: not c.is_alive or c.generation > 1, timeout=10)
    # the survivors keep working
    assert a.publish_manifest(SWARM, bucket, b"after-kill-a")
    assert (a.public_key, b"after-kill-a") in b.read_manifests(SWARM, [bucket])
    # the dead node's calls return "no data" instead of raising or hanging (unless the watchdog was quicker)
    assert isinstance(c.read_manifests(SWARM, [bucket], timeout=1.0), list)
    # the watchdog restarts it: new process, new libp2p identity, rejoined through its initial peer
    assert _wait(lambda: c.generation >= 2 and c.is_alive, timeout=45), c.status()
    assert c.restarts >= 1 and c.pid != old_pid and c.peer_id != old_peer
    assert _wait(lambda: c.connected, timeout=30)
    # the first lookups after a restart may time out while peers still route to the dead identity
    # (hivemind's per-RPC wait_timeout is 3 s); a node simply reads again next round
    assert _wait(lambda: (a.public_key, b"after-kill-a") in c.read_manifests(SWARM, [bucket]), timeout=30), (
        c.status())
    assert c.publish_manifest(SWARM, bucket, b"c-is-back")
    assert _wait(lambda: (c.public_key, b"c-is-back") in a.read_manifests(SWARM, [bucket]), timeout=30)
    # the old p2pd did not outlive its DHT process (gone, or a zombie waiting to be reaped)
    assert _wait(lambda: _gone_or_zombie(old_p2pd), timeout=10)


def _gone_or_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.slow
def test_hung_dht_calls_stay_bounded_and_watchdog_restarts_it():
    node = _node(call_timeout=1.0, health_interval=0, max_record_bytes=60_000)
    try:
        bucket = node.current_bucket() - 5
        assert node.publish_manifest(SWARM, bucket, b"before")
        old_pid, old_p2pd = node.pid, node._info["p2pd_pid"]
        os.kill(old_pid, signal.SIGSTOP)  # the DHT process hangs (alive, not reading its pipe)
        # 60 kB requests fill the 64 KiB request pipe after one or two writes; later ones must fail fast
        # instead of blocking forever in pipe.write
        results = [node.publish_manifest(SWARM, bucket, os.urandom(60_000), timeout=0.5) for _ in range(4)]
        assert results == [False] * 4
        assert "pipe full" in (node.status().last_error or "")
        assert node.read_manifests(SWARM, [bucket], timeout=0.5) == []
        assert node.check_health() is False  # first unanswered probe: not yet restarted
        assert node.generation == 1
        assert node.check_health() is True  # second: restart
        assert node.generation == 2 and node.pid != old_pid and node.restarts == 1
        assert _wait(lambda: _gone_or_zombie(old_pid) and _gone_or_zombie(old_p2pd), timeout=10)
        assert node.publish_manifest(SWARM, bucket, b"after")
        assert node.read_manifests(SWARM, [bucket]) == [(node.public_key, b"after")]
    finally:
        try:
            os.kill(old_pid, signal.SIGKILL)
        except (ProcessLookupError, UnboundLocalError):
            pass
        node.shutdown()


@pytest.mark.slow
def test_a_node_whose_routing_table_emptied_joins_again_at_the_next_health_check():
    """hivemind drops a peer from the routing table when its reply fails or it refuses a request. A node left
    with no neighbour used to wait for the periodic rejoin (300 s; an outside run watched a reader stay out for
    25 s and more with ``join_attempts=0``); the watchdog now joins at its next step."""
    from swarmnode.testing.adversary import forget_neighbours

    a = _node()
    b = _node(initial_peers=a.visible_maddrs(), health_interval=0)  # the watchdog stepped by hand
    try:
        assert _wait(lambda: b.connected, 60)
        assert b.check_health() is True and b.status().join_attempts == 0  # connected: no join due
        assert forget_neighbours(b) >= 1
        assert b.check_health() is True  # sees the empty table and joins through its initial peer
        assert b.status().join_attempts == 1 and b.num_peers >= 1
        assert b.check_health() is True and b.status().join_attempts == 1  # connected again: no more joins
        bucket = a.current_bucket() - 13
        assert a.publish_manifest(SWARM, bucket, b"after the rejoin")
        assert b.read_manifests(SWARM, [bucket]) == [(a.public_key, b"after the rejoin")]
    finally:
        for n in (b, a):
            n.shutdown()


def _hold_mpfuture_lock_forever() -> None:
    from hivemind.utils.mpfuture import MPFuture

    MPFuture._update_lock.acquire()
    time.sleep(3600)


@pytest.mark.slow
def test_restart_survives_a_process_that_died_holding_hiveminds_shared_lock():
    import multiprocessing as mp

    node = _node(call_timeout=2.0, health_interval=0)
    holder = mp.get_context("fork").Process(target=_hold_mpfuture_lock_forever, daemon=True)
    try:
        holder.start()
        time.sleep(0.5)
        holder.kill()  # SIGKILL while holding MPFuture._update_lock (hivemind's mp.Lock would stay taken for ever)
        holder.join(5)
        os.kill(node.pid, signal.SIGKILL)  # the DHT dies too (say, the OOM killer)
        assert _wait(lambda: not node.is_alive, timeout=10)
        # with a lock its dead holder keeps, the new DHT process would hang on its first reply, never ready
        assert node.check_health() is True
        assert node.generation == 2 and node.is_alive
        bucket = node.current_bucket() - 6
        assert node.publish_manifest(SWARM, bucket, b"alive again")
        assert node.read_manifests(SWARM, [bucket]) == [(node.public_key, b"alive again")]
    finally:
        if holder.is_alive():
            holder.kill()
        node.shutdown()


def _flood_entries(key: str, n: int, size: int, ttl: float = 300.0) -> list[tuple[bytes, bytes, float]]:
    """``n`` fresh keys' correctly signed entries of ``size`` random bytes under ``key`` (what any peer can store)."""
    kid = _key_id(key)
    expiration = time.time() + ttl
    out = []
    for _ in range(n):
        v = _validator(Ed25519PrivateKey.generate())
        marker = v.local_owner_marker
        rec = DHTRecord(kid, MSGPackSerializer.dumps(marker), MSGPackSerializer.dumps(os.urandom(size)), expiration)
        out.append((marker, v.sign_value(rec), expiration))
    return out


@pytest.mark.slow
def test_a_flood_of_the_bucket_key_stops_at_the_key_budget_and_keeps_the_readers_routing_table():
    """Outside attack (flooded bucket key), at the DHT: 400 free keys each store a 12 KB signed entry under one
    bucket key, 4.8 MB, past hivemind's 4 MiB reply cap. Before the key budget every replica's find reply failed:
    a reader that does not hold the key itself (a client-mode node here; in a large swarm, almost every reader) got
    nothing from the shared key and dropped the replicas from its routing table, after which even publisher keys
    were out of reach until it re-joined (at 1,000 keys in a running swarm: 1 of 6 honest bundles accepted). Now our
    storage refuses new entries past 3 MiB a key: the honest replica ``a`` holds the honest record and the part of
    the flood that fits, its reply succeeds, and the reader keeps it in its routing table. Only the flooding node
    ``b``, which stores without a budget (as an attacker's node would), fails its replies."""
    from swarmnode.swarm.dht_process import DEFAULT_MAX_KEY_BYTES
    from swarmnode.testing.adversary import store_signed_entries

    a = _node()
    b = _node(initial_peers=a.visible_maddrs(), max_key_bytes=None)  # the attacker's replica: no budget
    reader = _node(initial_peers=a.visible_maddrs(), client_mode=True)
    try:
        assert _wait(lambda: b.connected and reader.connected, 60)
        bucket = a.current_bucket() - 12  # a bucket no other test uses (inside the protected window)
        key = manifest_key(SWARM, bucket)
        assert a.publish_manifest(SWARM, bucket, b"honest record")
        # (no control read by the reader here: hivemind would cache its result and answer later reads from it)
        assert b.read_manifests(SWARM, [bucket]) == [(a.public_key, b"honest record")]
        flood = _flood_entries(key, 400, 12_000)
        stored, peers = store_signed_entries(b, _key_id(key), flood)
        # b (no budget) took all 400; a only what fits in 3 MiB beside the honest record (about 260)
        fits = DEFAULT_MAX_KEY_BYTES // 12_100
        assert peers >= 1 and 400 + fits // 2 <= stored <= 400 + fits, (stored, peers, fits)
        # the flood also tries the honest publisher's own key: refused there
        own = flood[:5]
        own_id = _key_id(publisher_key(SWARM, a.public_key))
        assert store_signed_entries(b, own_id, own)[0] == 0
        assert reader.read_publishers(SWARM, [a.public_key, b.public_key]) == [(a.public_key, b"honest record")]
        # the shared key is not blinded: a's reply (under the cap) carries the honest record and its part of the flood
        got = reader.read_manifests(SWARM, [bucket], timeout=20)
        assert (a.public_key, b"honest record") in got and fits // 2 <= len(got) <= fits + 1, len(got)
        # and the reader still reaches a: its routing table kept the replica whose reply succeeded
        assert _wait(lambda: reader.num_peers >= 1, 10)
        assert reader.read_publishers(SWARM, [a.public_key]) == [(a.public_key, b"honest record")]
        assert (a.public_key, b"honest record") in reader.read_manifests(SWARM, [bucket], timeout=20)
    finally:
        for n in (reader, b, a):
            n.shutdown()


@pytest.mark.slow
def test_a_flood_of_the_heartbeat_key_hides_no_known_peers_heartbeat():
    """A flood of the shared heartbeat key before an honest peer's heartbeat: 1,100 free keys' signed entries fill
    the honest replica's key to its 1,024 entries (the honest heartbeat is then refused there, first come first
    served) and the attacker's replica past what a reader accepts in a reply, so the shared key answers with the
    flood alone and the honest peer's curriculum rates and rescue requests go unread. Its heartbeat under its
    own heartbeat key, which only it can write, reaches a reader that knows it."""
    from swarmnode.testing.adversary import store_signed_entries

    a = _node()
    b = _node(initial_peers=a.visible_maddrs(), max_key_bytes=None)  # the attacker's replica: no budget
    reader = _node(initial_peers=a.visible_maddrs(), client_mode=True)
    honest = (a.public_key, b"honest heartbeat")
    try:
        assert _wait(lambda: b.connected and reader.connected, 60)
        flood = _flood_entries(heartbeat_key(SWARM), 1_100, 1_500)
        stored, peers = store_signed_entries(b, _key_id(heartbeat_key(SWARM)), flood)
        assert peers == 1 and 1_100 + 1_000 <= stored <= 1_100 + 1_024, (stored, peers)  # b all, a its 1,024
        own_key = publisher_heartbeat_key(SWARM, a.public_key)
        assert own_key == f"{SWARM}:heartbeat:{a.public_key.hex()}"
        assert store_signed_entries(b, _key_id(own_key), flood[:5])[0] == 0  # the flood cannot write there
        a.publish_heartbeat(SWARM, honest[1])  # refused by a's full shared key; stored under a's own key
        shared = reader.read_heartbeats(SWARM, timeout=30)
        assert len(shared) >= 1_000 and honest not in shared, len(shared)  # the attack, without known peers
        got = reader.read_heartbeats(SWARM, timeout=30, known=[a.public_key, b.public_key])
        assert got[0] == honest and honest not in got[1:], got[:2]
        assert len(got) == len(shared) + 1  # b published nothing under its own key
        with pytest.raises(ValueError, match="32 raw bytes"):
            reader.read_heartbeats(SWARM, known=[b"short"])
    finally:
        for n in (reader, b, a):
            n.shutdown()


def test_a_loopback_swarm_starts_p2pd_without_nat_port_mapping_or_autonat():
    """``swarm up`` runs every node on 127.0.0.1: p2pd used to start NAT port mapping and AutoNAT there anyway."""
    from swarmnode.swarm.dht import loopback_only

    assert loopback_only(["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.3/tcp/31337/p2p/QmX", "/ip6/::1/tcp/4001"])
    assert not loopback_only([])
    assert not loopback_only(["/ip4/127.0.0.1/tcp/0", "/ip4/0.0.0.0/tcp/31337"])
    assert not loopback_only(["/dns4/localhost/tcp/1"])
    assert not loopback_only(["/ip4/not-an-address/tcp/1", "garbage"])

    key = Ed25519PrivateKey.generate()
    local = SwarmDHT(key, initial_peers=["/ip4/127.0.0.1/tcp/31337/p2p/12D3KooWCooF7atNVtme2MrFMimCBL8LPygLZcwXQMb9TygysCwc"], start=False)
    kw = local.hivemind_kwargs(local.initial_peers)
    assert kw["auto_nat"] is False and kw["nat_port_map"] is False
    public = SwarmDHT(key, host_maddrs=["/ip4/0.0.0.0/tcp/0"], start=False)
    kw = public.hivemind_kwargs([])
    assert "auto_nat" not in kw and "nat_port_map" not in kw  # hivemind's defaults (on) stay for a reachable node
    remote = SwarmDHT(key, initial_peers=["/ip4/192.0.2.7/tcp/31337/p2p/12D3KooWCooF7atNVtme2MrFMimCBL8LPygLZcwXQMb9TygysCwc"], start=False)
    assert "auto_nat" not in remote.hivemind_kwargs(remote.initial_peers)
    forced = SwarmDHT(key, dht_kwargs={"auto_nat": True}, start=False)
    assert forced.hivemind_kwargs([])["auto_nat"] is True  # the constructor's dht_kwargs override
