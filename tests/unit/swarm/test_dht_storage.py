"""The byte budget per key of our DHT storage (``KeyCappedStorage``): a flood of fresh keys stops at the budget,
an owner's re-publish still fits, a cached dictionary over it is not kept, expired entries do not count."""

from __future__ import annotations

import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.utils.timed_storage import TimedStorage, get_dht_time

from swarmnode.swarm.dht import SwarmDHT
from swarmnode.swarm.dht_process import ENTRY_OVERHEAD, KeyCappedStorage, dictionary_bytes


def _capped(budget: int) -> KeyCappedStorage:
    store = KeyCappedStorage()
    store.max_key_bytes = budget
    return store


def test_new_entries_stop_at_the_budget_and_a_held_subkey_is_replaced_within_it():
    key, other = DHTID.generate(source="swarm:manifests:1"), DHTID.generate(source="swarm:manifests:2")
    entry = 100 + 4 + ENTRY_OVERHEAD  # a 100-byte value under a 4-byte subkey
    store, now = _capped(10 * entry), get_dht_time()
    accepted = [store.store(key, b"v" * 100, now + 60, subkey=b"k%03d" % i) for i in range(25)]
    assert accepted == [True] * 10 + [False] * 15  # a fresh key's entry past the budget is refused
    assert len(store.get(key).value) == 10 and dictionary_bytes(store.get(key).value) == 10 * entry
    assert store.store(other, b"v" * 100, now + 60, subkey=b"k999")  # the budget is per key
    # an owner re-publishing its entry (later expiration) fits; growing it past the budget does not
    assert store.store(key, b"w" * 100, now + 61, subkey=b"k003")
    assert store.get(key).value.get(b"k003").value == b"w" * 100
    assert not store.store(key, b"w" * 101, now + 62, subkey=b"k004")
    # one entry bigger than the whole budget is refused even in an empty key
    assert not _capped(entry).store(DHTID.generate(source="x"), b"v" * 101, now + 60, subkey=b"k000")


def test_expired_entries_free_the_budget():
    key, now = DHTID.generate(source="swarm:heartbeats"), get_dht_time()
    store = _capped(2 * (10 + 4 + ENTRY_OVERHEAD))
    assert store.store(key, b"v" * 10, now + 0.2, subkey=b"old1") and store.store(key, b"v" * 10, now + 0.2, subkey=b"old2")
    assert not store.store(key, b"v" * 10, now + 60, subkey=b"new1")
    import time
    time.sleep(0.3)
    assert store.store(key, b"v" * 10, now + 60, subkey=b"new1")


def test_a_whole_dictionary_over_the_budget_is_not_kept_and_regular_values_are_hivemind_s():
    now = get_dht_time()
    big = DictionaryDHTValue()
    for i in range(5):
        big.store(b"k%03d" % i, b"v" * 100, now + 60)
    small = DictionaryDHTValue()
    small.store(b"k000", b"v" * 100, now + 60)
    store = _capped(3 * (100 + 4 + ENTRY_OVERHEAD))
    assert not store.store(DHTID.generate(source="a"), big, now + 60)  # a cached read or in_cache store
    assert store.store(DHTID.generate(source="b"), small, now + 60)
    assert store.store(DHTID.generate(source="c"), b"r" * 10_000, now + 60)  # not a dictionary: no budget here
    assert isinstance(store, DHTLocalStorage)


def test_swarm_dht_refuses_a_budget_past_the_reply_cap_or_below_two_records():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    assert SwarmDHT(key, start=False).max_key_bytes == 3 * 1024 * 1024
    assert SwarmDHT(key, max_key_bytes=None, start=False).max_key_bytes is None
    for bad in (4 * 1024 * 1024, 1000, True, 2.5e6):
        with pytest.raises(ValueError, match="max_key_bytes"):
            SwarmDHT(key, max_key_bytes=bad, start=False)


def test_reads_get_a_copy_so_a_merge_cannot_grow_the_stored_dictionary():
    """Outside attack: hivemind's DHTNode.get starts its search from the stored dictionary and merges every other
    replica's entries into that object, which took an honest node's key from 3.1 MB to 6.7 MB in one read (past
    the reply cap, without passing the budget). ``get`` now hands out a copy."""
    key, now = DHTID.generate(source="swarm:manifests:7"), get_dht_time()
    store = _capped(3 * (100 + 4 + ENTRY_OVERHEAD))
    for i in range(3):
        assert store.store(key, b"v" * 100, now + 60, subkey=b"k%03d" % i)
    got = store.get(key).value
    for i in range(3, 40):  # what a search merges into its candidate
        got.store(b"k%03d" % i, b"v" * 100, now + 60)
    assert len(store.get(key).value) == 3 and dictionary_bytes(store.get(key).value) == 3 * (100 + 4 + ENTRY_OVERHEAD)
    assert not store.store(key, b"v" * 100, now + 60, subkey=b"k999")  # the stored object is still the one judged


def test_the_cache_keeps_nothing_and_harden_dht_node_installs_every_bound():
    """Outside attack: a node answers a find with its storage's value or its cache's, whichever expires later, and
    anyone may store into its cache; one cached entry expiring later hid every honest entry of a key."""
    import asyncio
    from types import SimpleNamespace

    from hivemind.dht.protocol import DHTProtocol

    from swarmnode.swarm.dht_process import NoCache, harden_dht_node
    from swarmnode.swarm.dht_reply import BoundedSerializer

    now = get_dht_time()
    storage, cache = DHTLocalStorage(), DHTLocalStorage()
    storage.store(DHTID.generate(source="kept"), b"v", now + 60, subkey=b"k")
    cache.store(DHTID.generate(source="cached"), b"v", now + 900, subkey=b"k")
    protocol = DHTProtocol.__new__(DHTProtocol)  # the attributes harden_dht_node touches, no network
    protocol.storage, protocol.cache = storage, cache
    protocol.client_mode = True  # no request handlers to bound (tests/integration/test_dht_requests.py has them)
    node = SimpleNamespace(protocol=protocol, cache_locally=True, cache_nearest=1, cache_on_store=True)
    assert asyncio.run(harden_dht_node(None, node, 2 * 1024 * 1024)) == 2 * 1024 * 1024
    # the protocol keeps hivemind's class (its RPC handlers are registered under that name: swapping the class
    # made every shutdown fail to remove them), only its routing-table update is ours
    assert type(protocol) is DHTProtocol and protocol.update_routing_table.__func__.__name__ == "update_routing_table_chunked"
    assert protocol._validate_dictionary.__func__.__name__ == "validate_dictionary_bounded"
    assert protocol.call_find.__func__.__name__ == "call_find_off_loop" and protocol.serializer is BoundedSerializer
    # nothing is cached after a read, here or at the nearest nodes (hivemind pushed the merged dictionary of a read,
    # over 4 MiB after a flood, to a nearby honest node; the failed call dropped it from the reader's routing table)
    assert (node.cache_locally, node.cache_nearest, node.cache_on_store) == (False, 0, False)
    assert isinstance(storage, KeyCappedStorage) and storage.max_key_bytes == 2 * 1024 * 1024
    assert storage.get(DHTID.generate(source="kept")) is not None  # the storage keeps its entries
    assert isinstance(cache, NoCache) and len(cache) == 0  # the cache is emptied ...
    key = DHTID.generate(source="swarm:heartbeats")
    assert not cache.store(key, b"v", now + 900, subkey=b"k") and not cache.store(key, b"v", now + 900)
    assert cache.get(key) is None  # ... and keeps nothing


def _handover_protocol(keys: int):
    """A bare hivemind protocol with our hand-over, an empty routing table and ``keys`` publisher keys of 60 KB."""
    import types

    from hivemind.dht.protocol import DHTProtocol
    from hivemind.dht.routing import RoutingTable

    from swarmnode.swarm.dht_process import update_routing_table_chunked

    proto = DHTProtocol.__new__(DHTProtocol)
    proto.update_routing_table = types.MethodType(update_routing_table_chunked, proto)
    proto.node_id, proto.num_replicas = DHTID.generate(source="us"), 5
    proto.routing_table = RoutingTable(proto.node_id, bucket_size=20, depth_modulo=5)
    proto.storage = _capped(3 * 1024 * 1024)
    now = get_dht_time()
    for i in range(keys):  # each its own key, as the attack's publisher keys
        assert proto.storage.store(DHTID.generate(source=f"swarm:publisher:{i}"), b"x" * 60_000, now + 600,
                                   subkey=b"k")
    return proto


def test_the_hand_over_to_a_newly_met_node_goes_in_stores_under_the_message_cap(monkeypatch):
    """Outside attack: 1,000 free keys of 60 KB each under their own publisher keys (each under the key budget) made
    hivemind's hand-over to a newly met node one store over 4 MiB, which failed and dropped the newcomer from the
    routing table again. The same items now go out in batches of at most 1 MiB, and the newcomer is added. A later
    outside attack: 8 fresh peer ids each got a node's whole storage (16 full keys: 8 x 48 MB queued); all peers'
    hand-overs now share 2 MiB/s (a burst of 8 MiB; a stand-in clock here)."""
    import asyncio
    import types

    from hivemind.dht.routing import RoutingTable
    from hivemind.p2p import PeerID

    from swarmnode.swarm import dht_process
    from swarmnode.swarm.dht_process import HANDOVER_BYTES, split_handover

    clock = [100.0]
    monkeypatch.setattr(dht_process, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    items = [(i, b"x" * 60_000, 1.0) for i in range(80)]  # 4.8 MB: one store would fail
    batches = split_handover(items)
    assert [it for b in batches for it in b] == items and len(batches) == 5
    assert all(sum(len(v) + ENTRY_OVERHEAD for _, v, _ in b) <= HANDOVER_BYTES for b in batches)
    assert split_handover([(0, b"y" * (2 * HANDOVER_BYTES), 1.0), (1, b"z", 1.0)]) == [
        [(0, b"y" * (2 * HANDOVER_BYTES), 1.0)], [(1, b"z", 1.0)]]  # an item over a batch goes alone

    proto = _handover_protocol(80)
    sent: list[int] = []

    async def call_store(peer, keys, values, expirations, in_cache=None):
        sent.append(sum(dictionary_bytes(v) for v in values))
        return [True] * len(keys)

    proto.call_store = call_store
    newcomer = DHTID.generate(source="newcomer")
    peer = PeerID.from_base58("12D3KooWCooF7atNVtme2MrFMimCBL8LPygLZcwXQMb9TygysCwc")

    async def meet():
        await proto.update_routing_table(newcomer, peer)
        await asyncio.sleep(0)  # let the store tasks run

    asyncio.run(meet())
    assert newcomer in proto.routing_table  # with no other neighbour it should store everything: 80 keys
    assert len(sent) == 5 and sum(sent) == 80 * (60_000 + 1 + ENTRY_OVERHEAD) and max(sent) <= HANDOVER_BYTES
    # outside attack: every request carries a node id of the sender's choosing, and each unseen one repeated the
    # hand-over (50 pings of ~100 B: 44 MB back). A peer id gets it at most once a minute, whatever node ids it
    # claims; it still enters the routing table.
    # (the table is emptied before each meeting, so by hivemind's rule the whole storage would go every time)
    for i in range(10):
        fresh = DHTID.generate(source=f"fresh {i}")
        proto.routing_table = RoutingTable(proto.node_id, bucket_size=20, depth_modulo=5)

        async def meet_again(fresh=fresh):
            await proto.update_routing_table(fresh, peer)
            await asyncio.sleep(0)

        asyncio.run(meet_again())
        assert fresh in proto.routing_table
    assert len(sent) == 5  # no second hand-over to the same peer id
    other = PeerID.from_base58("QmNTTWvfgNdHeHgpTbnbAD6LVQqvL7wWEyxYZajW9NEzqa")
    proto.routing_table = RoutingTable(proto.node_id, bucket_size=20, depth_modulo=5)

    async def meet_other():
        await proto.update_routing_table(DHTID.generate(source="other"), other)
        await asyncio.sleep(0)

    asyncio.run(meet_other())
    # another peer id gets its own, within what the 8 MiB burst has left (8.39 - 4.80 MB: 3 batches of 0.96 MB)
    assert len(sent) == 8 and sent[5:] == sent[:3]
    clock[0] += 10.0  # 20 MiB refilled, capped at the 8 MiB burst
    proto.routing_table = RoutingTable(proto.node_id, bucket_size=20, depth_modulo=5)
    third = PeerID.from_base58("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N")

    async def meet_third():
        await proto.update_routing_table(DHTID.generate(source="third"), third)
        await asyncio.sleep(0)

    asyncio.run(meet_third())
    assert len(sent) == 13  # all 5 again


def test_hand_over_stores_go_one_at_a_time_and_stop_at_a_failure():
    """Everything a node sends waits in one queue to p2pd: hand-over stores to several new peers at once queued
    ahead of its pings (an outside attack). One hand-over store of the node is in flight at a time, and a peer whose
    store fails gets no more of its batches."""
    import asyncio

    from hivemind.dht.routing import RoutingTable
    from hivemind.p2p import PeerID

    proto = _handover_protocol(40)  # 2.4 MB: 3 batches a peer, within the burst for both peers
    peers = [PeerID.from_base58("12D3KooWCooF7atNVtme2MrFMimCBL8LPygLZcwXQMb9TygysCwc"),
             PeerID.from_base58("QmNTTWvfgNdHeHgpTbnbAD6LVQqvL7wWEyxYZajW9NEzqa")]
    calls: list = []
    in_flight, most = [0], [0]

    async def call_store(peer, keys, values, expirations, in_cache=None):
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        await asyncio.sleep(0.01)
        in_flight[0] -= 1
        calls.append(peer)
        return None if peer == peers[0] else [True] * len(keys)  # the first peer's store fails

    proto.call_store = call_store

    async def meet():
        for i, peer in enumerate(peers):  # (an empty table each time: by hivemind's rule all 40 keys go)
            proto.routing_table = RoutingTable(proto.node_id, bucket_size=20, depth_modulo=5)
            await proto.update_routing_table(DHTID.generate(source=f"new {i}"), peer)
        for _ in range(200):
            if len(calls) >= 4:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)

    asyncio.run(meet())
    assert most[0] == 1  # one hand-over store of the node at a time
    assert calls == [peers[0], peers[1], peers[1], peers[1]]  # the failed peer got one store, the other all three


def test_a_key_holds_at_most_1024_entries_however_small():
    """Outside attack: 11,000 one-byte entries fit under the byte budget and made one find take 7 s (every reader
    checks every entry's signature); a key now also holds at most 1,024 entries, and a held one can be replaced."""
    key, now = DHTID.generate(source="swarm:heartbeats"), get_dht_time()
    store = _capped(3 * 1024 * 1024)
    accepted = [store.store(key, b"v", now + 60, subkey=b"k%05d" % i) for i in range(1100)]
    assert accepted == [True] * 1024 + [False] * 76 and len(store.get(key).value) == 1024
    assert store.store(key, b"w", now + 61, subkey=b"k00007")


def test_a_reply_over_the_budget_is_refused_before_any_signature_is_checked():
    """Outside attack: an attacker's own replica (no budget) answered with 20,000 signed one-byte entries; every
    reader checked every signature in its DHT event loop, heartbeat reads timed out and an honest node left a
    routing table. A dictionary over 1,024 entries or 3 MiB is now refused unchecked ("not found" at that peer)."""
    import types

    from hivemind.dht.protocol import DHTProtocol
    from hivemind.utils.serializer import MSGPackSerializer

    from swarmnode.swarm.dht_process import validate_dictionary_bounded

    class Counting:
        calls = 0

        def validate(self, record):
            Counting.calls += 1
            return True

    proto = DHTProtocol.__new__(DHTProtocol)
    proto.storage, proto.record_validator, proto.serializer = _capped(3 * 1024 * 1024), Counting(), MSGPackSerializer
    proto._validate_dictionary = types.MethodType(validate_dictionary_bounded, proto)
    now = get_dht_time()

    def dictionary(n: int, size: int) -> DictionaryDHTValue:
        d = DictionaryDHTValue()
        for i in range(n):
            d.store(b"k%05d" % i, b"v" * size, now + 60)
        return d

    key = DHTID.generate(source="swarm:heartbeats").to_bytes()
    assert not proto._validate_dictionary(key, dictionary(1025, 1)) and Counting.calls == 0  # too many entries
    assert not proto._validate_dictionary(key, dictionary(60, 60_000)) and Counting.calls == 0  # 3.6 MB
    assert proto._validate_dictionary(key, dictionary(1024, 1)) and Counting.calls == 1024  # at the budget: checked


def _find_protocol(reply, validator):
    """A hivemind DHTProtocol with the attributes ``call_find`` touches and a stub peer answering ``reply``."""
    import asyncio
    import types

    from hivemind.dht.protocol import DHTProtocol
    from hivemind.dht.routing import RoutingTable
    from hivemind.proto import dht_pb2
    from hivemind.utils.serializer import MSGPackSerializer

    from swarmnode.swarm.dht_process import validate_dictionary_bounded
    from swarmnode.swarm.dht_reply import call_find_off_loop

    proto = DHTProtocol.__new__(DHTProtocol)
    proto.storage, proto.record_validator, proto.serializer = _capped(3 * 1024 * 1024), validator, MSGPackSerializer
    proto._validate_dictionary = types.MethodType(validate_dictionary_bounded, proto)
    proto.node_id = DHTID.generate(source="reader")
    proto.node_info, proto.wait_timeout = dht_pb2.NodeInfo(node_id=proto.node_id.to_bytes()), 3.0
    proto.routing_table = RoutingTable(proto.node_id, bucket_size=20, depth_modulo=5)
    proto.rpc_semaphore = asyncio.Semaphore(8)
    proto.updates = []

    async def update_routing_table(node_id, peer_id, responded=True):
        proto.updates.append(responded)

    async def rpc_find(request, timeout=None):
        return reply(request)

    proto.update_routing_table = update_routing_table
    proto.get_stub = lambda peer: types.SimpleNamespace(rpc_find=rpc_find)
    return proto, types.MethodType(call_find_off_loop, proto)


def _find_reply(request, value: DictionaryDHTValue, expiration: float):
    from hivemind.proto import dht_pb2
    from hivemind.utils.serializer import MSGPackSerializer

    neighbour = DHTID.generate(source="neighbour")
    near = dict(nearest_node_ids=[neighbour.to_bytes()],
                nearest_peer_ids=[b"\x00$\x08\x01\x12 " + b"\x07" * 32])
    results = [dht_pb2.FindResult(type=dht_pb2.NOT_FOUND, **near),
               dht_pb2.FindResult(type=dht_pb2.FOUND_REGULAR, value=b"plain", expiration_time=expiration, **near),
               dht_pb2.FindResult(type=dht_pb2.FOUND_DICTIONARY, value=MSGPackSerializer.dumps(value),
                                  expiration_time=expiration, **near)]
    return dht_pb2.FindResponse(results=results[: len(request.keys)],
                                peer=dht_pb2.NodeInfo(node_id=DHTID.generate(source="replica").to_bytes()))


def test_find_replies_are_decoded_and_checked_off_the_event_loop_with_hivemind_s_result():
    """Outside attack: two attacker replicas answering just under the key budget (1,024 entries, ~3 MiB) under the
    keys a poll reads held a loaded reader's DHT event loop past hivemind's 3 s RPC timeout while it decoded and
    checked their replies one after another; honest replies and pings counted as failed and the reader's routing
    table was empty after every read. Replies are now decoded and checked in a worker thread, the loop stays free
    (here: the validator waits for a task that only a free loop can run), and the result is hivemind's."""
    import asyncio
    import threading

    from hivemind.dht.protocol import DHTProtocol
    from hivemind.p2p import PeerID

    now = get_dht_time()
    value = DictionaryDHTValue()
    for i in range(5):
        value.store(b"k%d" % i, b"v" * 100, now + 60)
    loop_free, seen_threads = threading.Event(), set()

    class WaitsForTheLoop:
        def validate(self, record):
            seen_threads.add(threading.get_ident())
            return loop_free.wait(60)  # set by a task on the loop: never, if this ran on the loop

    keys = [DHTID.generate(source=f"swarm:key{i}") for i in range(3)]
    peer = PeerID.from_base58("12D3KooWCooF7atNVtme2MrFMimCBL8LPygLZcwXQMb9TygysCwc")
    proto, call_find = _find_protocol(lambda request: _find_reply(request, value, now + 60), WaitsForTheLoop())

    async def read():
        async def free_loop():
            await asyncio.sleep(0)
            loop_free.set()

        task = asyncio.create_task(free_loop())
        out = await call_find(peer, keys)
        await task
        return out, threading.get_ident()

    ours, loop_thread = asyncio.run(read())
    assert seen_threads and loop_thread not in seen_threads  # checked in the worker thread
    assert proto.updates == [True]  # the replica counts as responded
    # the same reply through hivemind's own call_find gives the same result
    loop_free.set()
    proto.updates.clear()
    theirs = asyncio.run(DHTProtocol.call_find(proto, peer, keys))
    assert ours.keys() == theirs.keys() == set(keys)
    for key in keys:
        (a, near_a), (b, near_b) = ours[key], theirs[key]
        assert near_a == near_b and len(near_a) == 1
        if b is None:
            assert a is None
        elif isinstance(b.value, DictionaryDHTValue):
            assert dict(a.value.items()) == dict(b.value.items()) and a.expiration_time == b.expiration_time
        else:
            assert a == b
    assert ours[keys[0]][0] is None and ours[keys[1]][0].value == b"plain" and len(ours[keys[2]][0].value) == 5


def test_a_find_reply_that_fails_its_checks_or_does_not_decode_counts_as_not_found_or_failed():
    """A value refused by a validator is "not found" at that replica (as in hivemind); a reply that does not decode,
    or has a result count other than the keys asked, makes the call return None and marks the replica failed."""
    import asyncio

    from hivemind.p2p import PeerID

    class Refuses:
        def validate(self, record):
            return False

    now = get_dht_time()
    value = DictionaryDHTValue()
    value.store(b"k", b"v", now + 60)
    keys = [DHTID.generate(source=f"swarm:key{i}") for i in range(3)]
    peer = PeerID.from_base58("12D3KooWCooF7atNVtme2MrFMimCBL8LPygLZcwXQMb9TygysCwc")
    proto, call_find = _find_protocol(lambda request: _find_reply(request, value, now + 60), Refuses())
    out = asyncio.run(call_find(peer, keys))
    assert [out[k][0] for k in keys] == [None, None, None] and proto.updates == [True]

    def garbled(request):
        reply = _find_reply(request, value, now + 60)
        reply.results[2].value = b"\xc1 not msgpack"
        return reply

    proto, call_find = _find_protocol(garbled, Refuses())
    assert asyncio.run(call_find(peer, keys)) is None and proto.updates == [True, False]
    proto, call_find = _find_protocol(lambda request: _find_reply(request, value, now + 60), Refuses())
    assert asyncio.run(call_find(peer, keys + [DHTID.generate(source="a fourth key")])) is None
    assert proto.updates == [True, False]


def _nested_tuples(depth: int) -> bytes:
    """hivemind's encoding of ``depth`` tuples nested in one another, built bottom-up (no recursion here)."""
    import msgpack

    data = msgpack.packb([])
    for _ in range(depth - 1):
        data = msgpack.packb([msgpack.ExtType(0x40, data)])
    return msgpack.packb(msgpack.ExtType(0x40, data))


def test_the_bounded_serializer_decodes_what_hivemind_s_does():
    from hivemind.utils.serializer import MSGPackSerializer

    from swarmnode.swarm.dht_reply import BoundedSerializer

    now = get_dht_time()
    value = DictionaryDHTValue()
    for i in range(1024):  # a full key
        value.store(b"[ed25519:%04d]" % i, b"record %d" % i, now + 60 + i)
    for obj in [b"signed record", None, 7, 1.5, "text", [1, [2, b"x"]], ((1, (2, (b"x",))), "y")]:
        assert BoundedSerializer.loads(MSGPackSerializer.dumps(obj)) == obj
    assert BoundedSerializer.loads(_nested_tuples(8)) == MSGPackSerializer.loads(_nested_tuples(8))
    ours = BoundedSerializer.loads(MSGPackSerializer.dumps(value))
    theirs = MSGPackSerializer.loads(MSGPackSerializer.dumps(value))
    assert isinstance(ours, DictionaryDHTValue) and dict(ours.items()) == dict(theirs.items()) and len(ours) == 1024
    assert ours.latest_expiration_time == theirs.latest_expiration_time == now + 60 + 1023
    assert BoundedSerializer.dumps(value) == MSGPackSerializer.dumps(value)


def test_the_bounded_serializer_refuses_deep_nesting_long_arrays_and_other_extension_types():
    """Outside attack: 200 tuple extension types nested in one another (714 bytes) overflowed the C stack in
    hivemind's decoder and killed the DHT process of the node that decoded them, as a find reply or as a store
    sent straight to it (no signature needed); a reply of 300,000 one-byte entries took 5.5 s to decode before
    any bound looked at it. Both are refused now, the long one at its array header. The deep one is decoded in a
    child process: were the bound gone, the crash would take the child, not the test run."""
    import subprocess
    import sys

    import msgpack
    from hivemind.utils.serializer import MSGPackSerializer

    from swarmnode.swarm.dht_reply import MAX_DICTIONARY_ENTRIES, BoundedSerializer

    code = ("import sys; from swarmnode.swarm.dht_reply import BoundedSerializer\n"
            "try:\n    BoundedSerializer.loads(sys.stdin.buffer.read())\nexcept ValueError as e:\n    print('refused:', e)")
    out = subprocess.run([sys.executable, "-c", code], input=_nested_tuples(2000), capture_output=True, timeout=120)
    assert out.returncode == 0 and b"refused: msgpack extension types nested deeper than 8" in out.stdout, out
    with pytest.raises(ValueError, match="nested deeper"):
        BoundedSerializer.loads(_nested_tuples(9))
    now = get_dht_time()
    value = DictionaryDHTValue()
    for i in range(MAX_DICTIONARY_ENTRIES + 1):
        value.store(b"k%05d" % i, b"v", now + 60)
    with pytest.raises(ValueError):
        BoundedSerializer.loads(MSGPackSerializer.dumps(value))
    with pytest.raises(ValueError):
        BoundedSerializer.loads(msgpack.packb([0] * (MAX_DICTIONARY_ENTRIES + 1)))
    # every container under the per-array bound, ~3 million empty maps in all (4 MB): 6-8 s and ~320 MB to decode
    # a reply or a store before (an outside attack); refused once the count passes a full dictionary's
    many = msgpack.packb(msgpack.ExtType(0x50, msgpack.packb([None, 1.0, [[{}, {}, {}]] * 1024] * 8)))
    with pytest.raises(ValueError, match="msgpack objects"):
        BoundedSerializer.loads(many)
    with pytest.raises(ValueError, match="msgpack objects"):
        BoundedSerializer.loads(msgpack.packb([[[]] * 1024] * 6))
    for payload in [b"\x00" * 100_000, "é" * 50_000, 7, None]:  # tuple(payload) was 100,000 objects, or a TypeError
        with pytest.raises(ValueError, match="tuple's payload"):
            BoundedSerializer.loads(msgpack.packb(msgpack.ExtType(0x40, msgpack.packb(payload))))
    with pytest.raises(ValueError, match="extension type 0x51"):  # hivemind's tensor descriptor, or any other
        BoundedSerializer.loads(msgpack.packb(msgpack.ExtType(0x51, msgpack.packb([1, 2]))))
    for payload in [[1, 2], [None, 1.0, [[b"k", b"v"]]], [None, "x", []], [None, 1.0, [[[b"list"], b"v", 1.0]]]]:
        with pytest.raises(ValueError, match="DHT dictionary"):
            BoundedSerializer.loads(msgpack.packb(msgpack.ExtType(0x50, msgpack.packb(payload))))


def test_store_entries_keeps_store_subkey_s_rules_with_the_total_computed_once():
    """``KeyCappedStorage.store_entries`` stores several entries of one key as ``store_subkey`` would one by one
    (budget in bytes and entries, replacing a held subkey within it, a later expiration only), without recomputing
    the key's byte total per entry (an outside attack: a store of 1,024 entries cost the loop 0.43 s that way)."""
    now = get_dht_time()
    entries = [(f"s{i % 40}".encode(), bytes(100 + (i * 37) % 500), now + 60 + (i % 7)) for i in range(120)]
    entries += [(b"s1", b"y" * 3000, now + 90), (b"big", b"z" * 20_000, now + 60), (b"s2", b"w", now + 1)]
    key = DHTID.generate(source="swarm:heartbeats")
    one_by_one, batched = _capped(12_000), _capped(12_000)
    one_by_one.max_key_entries = batched.max_key_entries = 30
    expected = [one_by_one.store_subkey(key, *e) for e in entries]
    assert batched.store_entries(key, entries) == expected
    assert True in expected and False in expected  # the budget refused some, as the test means it to
    a, b = one_by_one.get(key).value, batched.get(key).value
    assert {k: tuple(v) for k, v in a.items()} == {k: tuple(v) for k, v in b.items()}
    assert dictionary_bytes(b) <= 12_000 and len(b) <= 30


def test_re_storing_a_subkey_later_and_later_keeps_the_heaps_small():
    """Outside attack: 1,024 owners re-storing one key 1 ms later each time left a key of 1,033 entries with
    409,395 entries in hivemind's expiration heap (+127 MB in 75 s): one heap entry per store, dropped only at its
    expiration. The heaps are compacted once stale entries outnumber live ones; what is stored and when it expires
    stay hivemind's."""
    now = get_dht_time()
    key = DHTID.generate(source="swarm:heartbeats")
    store = _capped(3 * 1024 * 1024)
    for i in range(2000):
        assert store.store_subkey(key, f"k{i % 10}".encode(), b"v%d" % i, now + 60 + i * 0.001)
    batched = _capped(3 * 1024 * 1024)
    for i in range(200):
        assert batched.store_entries(key, [(f"k{j}".encode(), b"w%d" % i, now + 60 + i * 0.001) for j in range(10)])
    for storage in (store, batched):
        held = TimedStorage.get(storage, key).value
        assert len(held) == 10 and len(held.expiration_heap) <= 2 * 10 + 64 + 1
        assert len(storage.expiration_heap) <= 2 * 1 + 64 + 1
        top_key, top = held.top()  # the heap still orders the live entries by expiration
        assert top.expiration_time == min(v.expiration_time for _, v in held.items())
    assert store.get(key).value.get(b"k9").value == b"v1999"
    assert batched.get(key).value.get(b"k0").value == b"w199"


def test_a_keys_reply_size_is_kept_until_the_key_changes():
    """Outside attack: walking 16 full keys of 1,024 entries for every answered find was 91% of a victim's CPU under
    finds from 8 peer ids. A key's size estimate is kept on its stored dictionary and follows every change."""
    from swarmnode.swarm.dht_reply import SIZE_ATTRIBUTE, _value_size

    storage, key, now = _capped(3 * 1024 * 1024), DHTID.generate(source="swarm:manifests:9"), get_dht_time()
    for i in range(3):
        assert storage.store(key, b"x" * 100, now + 600, subkey=f"s{i}".encode())
    held = TimedStorage.get(storage, key).value
    first = _value_size(held)
    assert first == 3 * (100 + 64) + 16 and held.__dict__[SIZE_ATTRIBUTE][2] == first  # kept
    assert storage.store(key, b"y" * 1000, now + 700, subkey=b"s0")  # same entries, a larger value
    assert _value_size(held) == first + 900
    assert storage.store_entries(key, [(b"s3", b"z" * 10, now + 600)]) == [True]
    assert _value_size(held) == first + 900 + 10 + 64
    held.store(b"s4", b"w", now + 600)  # a change behind the storage's back: the entry count tells
    assert _value_size(held) == first + 900 + 10 + 64 + 1 + 64
