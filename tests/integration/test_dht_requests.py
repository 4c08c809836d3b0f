"""What one find or store request may ask of a node: real hivemind DHT nodes and p2pd on loopback."""

from __future__ import annotations

import asyncio
import threading
import time
import types

import pytest
from hivemind.dht.node import DHTNode
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.dht.validation import RecordValidatorBase
from hivemind.p2p import P2PHandlerError
from hivemind.proto import dht_pb2
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.swarm.dht_process import harden_dht_node
from swarmnode.swarm.dht_reply import (MAX_FIND_KEYS, MAX_PENDING_STORES, MAX_STORE_ENTRIES, MAX_STORE_KEYS,
                                      REPLY_VALUE_BYTES)

BUDGET = 3 * 1024 * 1024


def _full_dictionary(tag: str, now: float) -> DictionaryDHTValue:
    """A dictionary at the key budget: 1,000 entries of 3,000 bytes (3.06 MB)."""
    value = DictionaryDHTValue()
    for i in range(1000):
        value.store(f"{tag}{i}".encode(), bytes([i % 251]) * 3000, now + 600)
    return value


async def _pair(harden: bool, record_validator=None):
    server = await DHTNode.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], cache_locally=False,
                                  record_validator=record_validator)
    if harden:
        await harden_dht_node(None, server, BUDGET)
    maddrs = await server.get_visible_maddrs()
    asker = await DHTNode.create(initial_peers=maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"], client_mode=True)
    return server, asker


def _find_request(asker: DHTNode, keys: list[DHTID]) -> dht_pb2.FindRequest:
    return dht_pb2.FindRequest(keys=[k.to_bytes() for k in keys], peer=asker.protocol.node_info)


def test_find_and_store_requests_are_bounded_and_the_node_keeps_answering():
    """Outside attack: one find request of 150,000 keys (3.3 MB) held a node's DHT event loop past 60 s (+120 MB);
    hivemind answers any number of keys, and stores any number too (each record a signature check). A hardened
    node refuses more than 64 keys a find and 256 a store before looking at one, answers what an honest reader asks
    (16 keys at most) as hivemind does, and keeps answering pings."""

    async def main():
        server, asker = await _pair(harden=True)
        try:
            stub = asker.protocol.get_stub(server.peer_id)
            now = get_dht_time()
            held = DHTID.generate(source="swarm:heartbeats")
            assert server.protocol.storage.store(held, b"v", now + 600, subkey=b"k")
            many = [DHTID.generate(source=f"k{i}") for i in range(MAX_FIND_KEYS + 1)]
            with pytest.raises(P2PHandlerError, match=f"asks for {MAX_FIND_KEYS + 1} keys"):
                await stub.rpc_find(_find_request(asker, many), timeout=30)
            many = [DHTID.generate(source=f"k{i}") for i in range(20_000)]
            with pytest.raises(P2PHandlerError, match="asks for 20000 keys"):
                await stub.rpc_find(_find_request(asker, many), timeout=30)
            # what a reader asks: up to 16 keys, answered with the held value and neighbours, as hivemind does
            ok = await stub.rpc_find(_find_request(asker, [held] + many[:15]), timeout=30)
            assert len(ok.results) == 16 and ok.results[0].type == dht_pb2.FOUND_DICTIONARY
            assert all(r.type == dht_pb2.NOT_FOUND for r in ok.results[1:])
            assert server.protocol.serializer.loads(ok.results[0].value).get(b"k").value == b"v"
            twice = await stub.rpc_find(_find_request(asker, [held, held, held]), timeout=30)  # a key asked thrice
            assert [r.type for r in twice.results] == [dht_pb2.FOUND_DICTIONARY] + [dht_pb2.NOT_FOUND] * 2
            answer = await asker.protocol.call_find(server.peer_id, [held])
            assert answer is not None and answer[held][0].value.get(b"k").value == b"v"
            # stores: more than 256 keys refused before any is decoded; a few keys stored as before
            keys = [DHTID.generate(source=f"s{i}") for i in range(MAX_STORE_KEYS + 1)]
            with pytest.raises(P2PHandlerError, match=f"carries {MAX_STORE_KEYS + 1} keys"):
                await stub.rpc_store(dht_pb2.StoreRequest(
                    keys=[k.to_bytes() for k in keys], subkeys=[b""] * len(keys), values=[b"x"] * len(keys),
                    expiration_time=[now + 60] * len(keys), in_cache=[False] * len(keys),
                    peer=asker.protocol.node_info), timeout=30)
            assert all(server.protocol.storage.get(k) is None for k in keys)
            stored = await asker.protocol.call_store(server.peer_id, keys[:3], [b"x"] * 3, now + 60)
            assert stored == [True, True, True] and server.protocol.storage.get(keys[0]).value == b"x"
            assert await asker.protocol.call_ping(server.peer_id) is not None  # the node still answers
        finally:
            await asker.shutdown()
            await server.shutdown()

    asyncio.run(main())


@pytest.mark.parametrize("harden", [False, True])
def test_a_reply_of_several_full_keys_keeps_the_small_ones(harden):
    """hivemind answers a find with every asked key's whole value in one message; two keys near the 3 MiB budget
    pass its 4 MiB cap and the whole reply fails, so the small owner-only key asked beside them is lost too and the
    asker drops the node from its routing table. A hardened node answers the smallest values first within 3.5 MiB
    and the rest as not found."""

    async def main():
        server, asker = await _pair(harden)
        try:
            now = get_dht_time()
            big = [DHTID.generate(source=f"swarm:manifests:{i}") for i in range(2)]
            small = DHTID.generate(source="swarm:publisher:ab")
            for i, key in enumerate(big):
                assert server.protocol.storage.store(key, _full_dictionary(str(i), now), now + 600)
            assert server.protocol.storage.store(small, b"record", now + 600, subkey=b"owner")
            answer = await asker.protocol.call_find(server.peer_id, big + [small])
            if not harden:  # the test fails where the bound is missing
                assert answer is None
                return
            assert answer is not None
            found = [answer[k][0] is not None for k in big]
            assert sorted(found) == [False, True]  # one full key fits the reply, the second does not
            assert answer[small][0].value.get(b"owner").value == b"record"
            assert all(answer[k][1] is not None for k in big + [small])  # neighbours for every key
            assert REPLY_VALUE_BYTES < 4 * 1024 * 1024
        finally:
            await asker.shutdown()
            await server.shutdown()

    asyncio.run(main())


def test_a_client_mode_node_is_left_as_it_is():
    """A client-mode node registers no request handlers, so there is nothing to bound."""

    async def main():
        node = await DHTNode.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], client_mode=True)
        try:
            await harden_dht_node(None, node, BUDGET)
            assert isinstance(node.protocol, DHTProtocol) and "rpc_find" not in vars(node.protocol)
        finally:
            await node.shutdown()

    asyncio.run(main())


class _GatedValidator(RecordValidatorBase):
    """Accepts every record but those of value ``b"forged"``, counts the checks, and (while ``gate`` is clear) holds the checking thread, so a test
    can tell whether checks run on the event loop without measuring time."""

    def __init__(self):
        self.checks = 0
        self.gate = threading.Event()

    def validate(self, record) -> bool:
        self.checks += 1
        self.gate.wait(60)
        return record.value != b"forged"

    def sign_value(self, record) -> bytes:
        return record.value

    def strip_value(self, record) -> bytes:
        return record.value


def _store_request(asker: DHTNode, keys: list[DHTID], dictionaries: list[DictionaryDHTValue]) -> dht_pb2.StoreRequest:
    return dht_pb2.StoreRequest(
        keys=[key.to_bytes() for key in keys], subkeys=[DHTProtocol.IS_DICTIONARY] * len(dictionaries),
        values=[MSGPackSerializer.dumps(d) for d in dictionaries],
        expiration_time=[d.latest_expiration_time for d in dictionaries], in_cache=[False] * len(dictionaries),
        peer=asker.protocol.node_info)


def _entries(tag: str, n: int, now: float) -> DictionaryDHTValue:
    value = DictionaryDHTValue()
    for i in range(n):
        value.store(f"{tag}{i}".encode(), b"v", now + 600)
    return value


def test_stores_are_checked_off_the_loop_bounded_in_entries_and_pending_and_replays_cost_no_check(monkeypatch):
    """Outside attacks: one store of 24 whole dictionaries of 1,000 fresh signed entries (4 MB, under every per-key
    bound), replayed, took a loaded node 3.3 s of signature checks in its event loop each (pings 1 of 20, its DHT
    restarted); on the first bounded version, valid entries replayed with an older expiration were checked on every
    replay and stored at O(entries^2) in the loop (pings 6 of 20), and one sender held every waiting slot. Now a
    key's whole dictionary comes once a request, at most 1,024 entries are checked a request, in a worker thread
    (pings are answered while a check is held), one store waits per sender, and entries held with the same or a
    later expiration, or checked a moment ago, are not checked again."""
    from swarmnode.swarm import dht_reply

    monkeypatch.setattr(dht_reply, "MAX_PENDING_STORES", 2)

    async def main():
        validator = _GatedValidator()
        server, asker = await _pair(harden=True, record_validator=validator)
        maddrs = await server.get_visible_maddrs()
        pinger = await DHTNode.create(initial_peers=maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"], client_mode=True)
        third = await DHTNode.create(initial_peers=maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"], client_mode=True)
        try:
            stub = asker.protocol.get_stub(server.peer_id)
            now = get_dht_time()
            key, other = DHTID.generate(source="swarm:manifests:7"), DHTID.generate(source="swarm:manifests:8")
            # the attack's shape: 24 whole dictionaries under one key: refused before anything is decoded
            with pytest.raises(P2PHandlerError, match="whole dictionary twice"):
                await stub.rpc_store(_store_request(asker, [key] * 24, [_entries(f"{j}.", 1000, now) for j in range(24)]),
                                     timeout=60)
            # two keys of 600 fresh entries: more than 1,024 to check, refused before any check
            with pytest.raises(P2PHandlerError, match=f"more than {MAX_STORE_ENTRIES} entries to check"):
                await stub.rpc_store(_store_request(asker, [key, other], [_entries("x", 600, now),
                                                                          _entries("y", 600, now)]), timeout=60)
            assert validator.checks == 0 and server.protocol.storage.get(key) is None
            # a store within the bound is checked in the worker: while its checks are held, the node answers pings
            store = asyncio.create_task(stub.rpc_store(_store_request(asker, [key], [_entries("a", 900, now)]),
                                                       timeout=120))
            while validator.checks == 0:
                await asyncio.sleep(0.05)
            assert await pinger.protocol.call_ping(server.peer_id) is not None
            assert not store.done()  # the ping was answered while the store's first check was still held
            # one waiting store a sender; and at most MAX_PENDING_STORES (2 here) in all
            with pytest.raises(P2PHandlerError, match="one of them its own"):
                await stub.rpc_store(_store_request(asker, [other], [_entries("b", 10, now)]), timeout=60)
            second = asyncio.create_task(pinger.protocol.get_stub(server.peer_id).rpc_store(
                _store_request(pinger, [other], [_entries("p", 10, now)]), timeout=120))
            await asyncio.sleep(1.0)
            with pytest.raises(P2PHandlerError, match="2 stores are being checked"):
                await third.protocol.get_stub(server.peer_id).rpc_store(
                    _store_request(third, [other], [_entries("t", 10, now)]), timeout=60)
            validator.gate.set()
            assert list((await store).store_ok) == [True] and list((await second).store_ok) == [True]
            assert len(server.protocol.storage.get(key).value) == 900
            # the same 900 entries again (the attack replayed its bytes): held, no check
            checks = validator.checks
            again = await stub.rpc_store(_store_request(asker, [key], [_entries("a", 900, now)]), timeout=60)
            assert list(again.store_ok) == [True] and validator.checks == checks
            # the same entries with an older expiration: held with a later one, refused unchecked
            stale = await stub.rpc_store(_store_request(asker, [key], [_entries("a", 900, now - 10)]), timeout=60)
            assert list(stale.store_ok) == [False] and validator.checks == checks
            # one changed entry with a later expiration is checked (only that one) and replaces the held one
            changed = _entries("a", 900, now)
            changed.store(b"a0", b"other", now + 601)  # a later expiration replaces it
            assert list((await stub.rpc_store(_store_request(asker, [key], [changed]), timeout=60)).store_ok) == [True]
            assert validator.checks == checks + 1 and server.protocol.storage.get(key).value.get(b"a0").value == b"other"
            # a store its sender cancels while the check runs: hivemind's table forgets the handler, and the
            # sender's slot stays taken until the check is done (an outside attack leaked 4.9 MB a cancelled store)
            validator.gate.clear()
            control = server.protocol.p2p._client.control
            cancelled = asyncio.create_task(stub.rpc_store(_store_request(asker, [other], [_entries("z", 50, now)]),
                                                           timeout=120))
            while validator.checks == checks + 1:
                await asyncio.sleep(0.05)
            cancelled.cancel()
            await asyncio.sleep(1.0)
            with pytest.raises(P2PHandlerError, match="one of them its own"):
                await stub.rpc_store(_store_request(asker, [other], [_entries("q", 5, now)]), timeout=60)
            validator.gate.set()
            for _ in range(100):
                if not control._handler_tasks and not server.protocol.__dict__["_stores_pending"]:
                    break
                await asyncio.sleep(0.1)
            assert not control._handler_tasks and not server.protocol.__dict__["_stores_pending"]
            # a dictionary whose last entry fails: refused whole; replayed, only the failing entry is checked again
            bad = _entries("c", 100, now)
            bad.store(b"c99", b"forged", now + 700)
            checks = validator.checks
            for _ in range(2):
                refused = await stub.rpc_store(_store_request(asker, [other], [bad]), timeout=60)
                assert list(refused.store_ok) == [False]
            assert validator.checks == checks + 100 + 1  # 99 good + 1 forged, then the forged one alone
            assert server.protocol.storage.get(other).value.get(b"c0") is None
        finally:
            validator.gate.set()
            for node in (third, pinger, asker, server):
                await node.shutdown()

    asyncio.run(main())


def test_the_hand_over_is_split_within_what_a_store_takes():
    """A node hands a newly met peer its keys in stores that peer's handler takes: at most 256 keys and 1,024
    entries each (a full key goes alone)."""
    from swarmnode.swarm.dht_process import split_handover

    now = get_dht_time()
    items = [(i, _entries(str(i), 300, now), now + 600) for i in range(10)] + [(10 + i, b"r", now) for i in range(600)]
    batches = split_handover(items)
    assert [it for b in batches for it in b] == items
    for batch in batches:
        assert len(batch) <= MAX_STORE_KEYS
        assert sum(len(v) if isinstance(v, DictionaryDHTValue) else 1 for _, v, _ in batch) <= MAX_STORE_ENTRIES
    # 3 + 3 + 3 dictionaries (900 entries each); the last one with 255 records (256 keys); 256 records; 89
    assert [len(b) for b in batches] == [3, 3, 3, 256, 256, 89]


def test_find_replies_share_a_byte_rate_and_small_keys_still_fit(monkeypatch):
    """Outside attack: finds of one full key, each cancelled by its sender after 10 ms, made a node queue every
    3 MB reply anyway (6.4 GB in 30 s, pings 1 of 9). All replies now share a token bucket of value bytes; past it
    a full key is answered as not found while a small owner-only key still fits."""
    from swarmnode.swarm import dht_reply

    monkeypatch.setattr(dht_reply, "REPLY_BYTES_PER_SECOND", 1)  # no refill within the test
    monkeypatch.setattr(dht_reply, "REPLY_BYTES_BURST", 4 * 1024 * 1024)

    async def main():
        server, asker = await _pair(harden=True)
        try:
            now = get_dht_time()
            big, small = DHTID.generate(source="swarm:manifests:1"), DHTID.generate(source="swarm:publisher:ab")
            assert server.protocol.storage.store(big, _full_dictionary("0", now), now + 600)
            assert server.protocol.storage.store(small, b"record", now + 600, subkey=b"owner")
            first = await asker.protocol.call_find(server.peer_id, [big, small])
            assert first[big][0] is not None and first[small][0] is not None  # within the burst
            second = await asker.protocol.call_find(server.peer_id, [big, small])
            assert second[big][0] is None  # the bucket is spent: the full key is left out ...
            assert second[small][0].value.get(b"owner").value == b"record"  # ... the small one still fits
        finally:
            await asker.shutdown()
            await server.shutdown()

    asyncio.run(main())


def test_the_handler_table_forgets_a_task_cancelled_before_it_started():
    """Outside attack: a store or find cancelled by its sender stayed in hivemind's table of handler tasks with its
    request bytes (the table forgets a task only when its handler returns), also when the cancel came before the
    task had started; the table now removes every task when it is done."""
    from types import SimpleNamespace

    from swarmnode.swarm.dht_reply import release_finished_handlers

    async def main():
        control = SimpleNamespace(_handler_tasks={})
        release_finished_handlers(SimpleNamespace(_client=SimpleNamespace(control=control)))

        async def handler():
            await asyncio.sleep(10)

        before = asyncio.create_task(handler())
        control._handler_tasks["before"] = before
        before.cancel()  # cancelled before its first step: no code of the handler ever runs
        during = asyncio.create_task(handler())
        control._handler_tasks["during"] = during
        await asyncio.sleep(0.01)
        during.cancel()
        done = asyncio.create_task(asyncio.sleep(0))
        control._handler_tasks["done"] = done
        await asyncio.sleep(0.05)
        assert control._handler_tasks == {}

    asyncio.run(main())


def test_one_sender_gets_its_own_find_rate_and_reply_bytes(monkeypatch):
    """Outside attack: finds of 16 full keys from two peer ids, each cancelled after 10 ms, stalled a node (pings 5
    of 11, reads 2 of 11), and one flooder could spend the node's whole reply rate. A sender past its finds is
    refused before any key is looked up, and past its value bytes gets small keys only, while another sender is
    answered in full and pings go on."""
    from swarmnode.swarm import dht_reply

    monkeypatch.setattr(dht_reply, "FINDS_PER_SENDER_PER_SECOND", 1e-6)  # no refill within the test
    monkeypatch.setattr(dht_reply, "FINDS_PER_SENDER_BURST", 6)
    monkeypatch.setattr(dht_reply, "REPLY_BYTES_PER_SENDER_PER_SECOND", 1e-6)
    monkeypatch.setattr(dht_reply, "REPLY_BYTES_PER_SENDER_BURST", 4 * 1024 * 1024)

    async def main():
        server, asker = await _pair(harden=True)
        other = await DHTNode.create(initial_peers=await server.get_visible_maddrs(),
                                     host_maddrs=["/ip4/127.0.0.1/tcp/0"], client_mode=True)
        try:
            now = get_dht_time()
            big, small = DHTID.generate(source="swarm:manifests:2"), DHTID.generate(source="swarm:publisher:cd")
            assert server.protocol.storage.store(big, _full_dictionary("1", now), now + 600)
            assert server.protocol.storage.store(small, b"record", now + 600, subkey=b"owner")
            stub = asker.protocol.get_stub(server.peer_id)
            first = await stub.rpc_find(_find_request(asker, [big, small]), timeout=30)
            assert [r.type for r in first.results] == [dht_pb2.FOUND_DICTIONARY] * 2  # within its bytes
            second = await stub.rpc_find(_find_request(asker, [big, small]), timeout=30)
            # its bytes are spent: the full key is left out, the small one still fits
            assert [r.type for r in second.results] == [dht_pb2.NOT_FOUND, dht_pb2.FOUND_DICTIONARY]
            # another sender is answered in full: the first did not spend the node's rate
            answer = await other.protocol.call_find(server.peer_id, [big, small])
            assert answer[big][0] is not None and len(answer[big][0].value) == 1000
            # the asker's finds: 6 at most (the burst; its bootstrap look-up and the 2 above spent some), then each
            # is refused before any lookup
            answered = 0
            with pytest.raises(P2PHandlerError, match="come faster than"):
                for _ in range(5):
                    await stub.rpc_find(_find_request(asker, [small]), timeout=30)
                    answered += 1
            assert answered <= 4, answered
            with pytest.raises(P2PHandlerError, match="come faster than"):
                await stub.rpc_find(_find_request(asker, [small]), timeout=30)
            assert await other.protocol.call_ping(server.peer_id) is not None
            answer = await other.protocol.call_find(server.peer_id, [small])
            assert answer[small][0].value.get(b"owner").value == b"record"
        finally:
            await other.shutdown()
            await asker.shutdown()
            await server.shutdown()

    asyncio.run(main())


def test_one_read_of_many_keys_asks_a_replica_a_few_times_not_once_a_key(monkeypatch):
    """Outside run: a reader polling 32 known publishers' keys every 2 s (one hivemind ``get`` per key) asked each
    replica 16-18 times a second, past a node's 16 finds a second from one sender; the refusals made it drop honest
    replicas from its routing table (empty after 6-26 s, with no attacker). ``SwarmDHT`` reads all keys of a read
    in one traversal (:func:`swarmnode.swarm.dht.get_latest_many`), which packs several keys into each find."""
    from swarmnode.swarm import dht_reply
    from swarmnode.swarm.dht import get_latest_many

    monkeypatch.setattr(dht_reply, "FINDS_PER_SENDER_PER_SECOND", 1e-6)  # no refill: the tokens count the finds

    async def main():
        server, asker = await _pair(harden=True)
        try:
            now = get_dht_time()
            keys = [f"swarm:publisher:{i:064x}" for i in range(33)] + ["swarm:heartbeats"]
            for i, key in enumerate(keys[:-1:3]):
                assert server.protocol.storage.store(DHTID.generate(source=key), MSGPackSerializer.dumps(f"record {i}"),
                                                     now + 600, subkey=MSGPackSerializer.dumps("owner"))
            record = server.protocol.__dict__["_find_senders"][asker.peer_id]
            before = record.finds.refill(time.monotonic())
            got = await get_latest_many(None, asker, keys, 30.0)
            batched = before - record.finds.refill(time.monotonic())
            found = [r.value[MSGPackSerializer.dumps("owner")].value for r in got if r is not None]
            assert found == [f"record {i}" for i in range(11)]  # every stored key, in order
            assert 1 <= batched <= 12, batched  # sqrt(34) = 5 keys a find: about 7
            before = record.finds.refill(time.monotonic())
            for key in keys[:20]:  # what one hivemind get per key costs the replica
                await asker.get(key, latest=True)
            assert before - record.finds.refill(time.monotonic()) > 19.9  # one find each
        finally:
            await asker.shutdown()
            await server.shutdown()

    asyncio.run(main())


def test_a_slow_replica_does_not_blank_a_read_of_many_keys():
    """Outside run: one replica answering every find 2.5 s late (inside hivemind's 3 s RPC timeout, so it is never
    dropped) kept every search of a 32-key read open past the read's deadline, and the read came back empty although
    the honest replica had answered at once. At the deadline each open search now ends with what it found."""
    from hivemind.utils.auth import AuthRole, AuthRPCWrapper

    from swarmnode.swarm.dht import get_latest_many

    async def slow_find(self, request, context):
        await asyncio.sleep(2.5)
        return await DHTProtocol.rpc_find(self, request, context)

    async def main():
        server = await DHTNode.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], cache_locally=False)
        await harden_dht_node(None, server, BUDGET)
        slow = await DHTNode.create(initial_peers=await server.get_visible_maddrs(), host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        proto = slow.protocol
        proto.rpc_find = types.MethodType(slow_find, proto)
        handle = DHTProtocol._get_handle_name(None, "rpc_find")
        await proto.p2p.remove_protobuf_handler(handle)
        await proto.p2p.add_protobuf_handler(handle, AuthRPCWrapper(proto, AuthRole.SERVICER, proto.authorizer).rpc_find,
                                             dht_pb2.FindRequest)
        asker = await DHTNode.create(initial_peers=[*await server.get_visible_maddrs(), *await slow.get_visible_maddrs()],
                                     host_maddrs=["/ip4/127.0.0.1/tcp/0"], client_mode=True)
        try:
            assert len(asker.protocol.routing_table.uid_to_peer_id) == 2  # the asker knows both replicas
            now = get_dht_time()
            keys = [f"swarm:publisher:{i:064x}" for i in range(32)]
            for i, key in enumerate(keys[::4]):
                assert server.protocol.storage.store(DHTID.generate(source=key), MSGPackSerializer.dumps(f"record {i}"),
                                                     now + 600, subkey=MSGPackSerializer.dumps("owner"))
            t0 = time.monotonic()
            got = await get_latest_many(None, asker, keys, 1.5)
            assert time.monotonic() - t0 < 2.5  # the deadline, not the slow replica, ends the read
            found = [r.value[MSGPackSerializer.dumps("owner")].value for r in got if r is not None]
            assert found == [f"record {i}" for i in range(8)]  # the honest replica's answers, every one
        finally:
            await slow.shutdown()
            await asker.shutdown()
            await server.shutdown()

    asyncio.run(main())


def test_a_key_that_does_not_decode_blanks_only_itself_in_a_batched_read():
    """An entry whose value does not decode makes hivemind's search of that key raise when it ends (validators
    refuse such entries under the swarm's keys; a replica without them may still hold one). In a batched read only
    that key reads as not found; the other keys of the read stand."""
    from swarmnode.swarm.dht import get_latest_many

    async def main():
        server, asker = await _pair(harden=True)
        try:
            now = get_dht_time()
            bad, good = DHTID.generate(source="swarm:manifests:1"), DHTID.generate(source="swarm:publisher:00")
            owner = MSGPackSerializer.dumps("owner")
            assert server.protocol.storage.store(bad, MSGPackSerializer.dumps(b"honest"), now + 600, subkey=owner)
            assert server.protocol.storage.store(bad, b"\xc1\xc1junk", now + 600, subkey=MSGPackSerializer.dumps("x"))
            assert server.protocol.storage.store(good, MSGPackSerializer.dumps(b"known"), now + 600, subkey=owner)
            got = await get_latest_many(None, asker, ["swarm:manifests:1", "swarm:publisher:00"], 3.0)
            assert got[0] is None and got[1].value[owner].value == b"known"
        finally:
            await asker.shutdown()
            await server.shutdown()

    asyncio.run(main())


def test_a_reply_cannot_end_a_search_with_its_own_expiration():
    """Outside run: a replica answering a key with a dictionary whose own expiration is +inf (empty, or holding only
    its owner's entry) ended every reader's search for the newest value at once, and honest entries from replicas
    not yet asked went missing (bucket, heartbeat and publisher keys: 4-5 of 6 reads). The reply's expiration is no
    validator's business; a reader now takes a dictionary's expiration from its latest entry, and an empty one as
    nothing found."""
    import math

    from swarmnode.swarm.dht_reply import unpack_find_results

    async def main():
        server, asker = await _pair(harden=True)
        try:
            now = get_dht_time()
            key = DHTID.generate(source="swarm:manifests:9")
            one = DictionaryDHTValue()
            one.store(MSGPackSerializer.dumps("owner"), MSGPackSerializer.dumps(b"record"), now + 100)
            replies = [dht_pb2.FindResult(type=dht_pb2.FOUND_DICTIONARY, value=MSGPackSerializer.dumps(d),
                                          expiration_time=math.inf) for d in (one, DictionaryDHTValue())]
            out = unpack_find_results(asker.protocol, [key, key], replies)
            value, _ = out[key]  # the second reply (empty) overwrote the first under the same key id
            assert value is None
            out = unpack_find_results(asker.protocol, [key], replies[:1])
            value, _ = out[key]
            assert value.expiration_time == now + 100 and value.value.latest_expiration_time == now + 100
        finally:
            await asker.shutdown()
            await server.shutdown()

    asyncio.run(main())


class _Message:
    """A message waiting for p2pd, as ``queued_bytes`` sees it."""

    def __init__(self, size: int) -> None:
        self.size = size

    def ByteSize(self) -> int:  # noqa: N802 - protobuf's name
        return self.size


def test_replies_carry_values_only_within_the_room_left_in_the_queue_to_p2pd(monkeypatch):
    """Outside attack: 8 peer ids cancelling finds of full keys queued 1,735 messages to p2pd; every ping, read and
    publish of the node waited behind them, until ~15 s after the attack. A reply now brings that queue to at most
    4 MiB; past it a sender gets a small allowance once a second (the handler is called directly, with a stand-in
    queue of waiting messages, and a stand-in clock)."""
    import collections
    import types

    from swarmnode.swarm import dht_reply

    clock = [1000.0]
    monkeypatch.setattr(dht_reply, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    async def main():
        server, asker = await _pair(harden=True)
        control = server.protocol.p2p._client.control
        real = control._pending_messages
        try:
            now = get_dht_time()
            big, small = DHTID.generate(source="swarm:manifests:3"), DHTID.generate(source="swarm:publisher:ef")
            assert server.protocol.storage.store(big, _full_dictionary("2", now), now + 600)
            assert server.protocol.storage.store(small, b"record", now + 600, subkey=b"owner")
            request = dht_pb2.FindRequest(keys=[big.to_bytes(), small.to_bytes()])  # no peer: no ping task

            async def find(sender: str, waiting: list[int]) -> list[int]:
                queue = types.SimpleNamespace(_queue=collections.deque(map(_Message, waiting)))
                queue.qsize = lambda: len(queue._queue)
                control._pending_messages = queue  # no await until restored: nothing else can put into it
                try:
                    reply = await dht_reply.rpc_find_bounded(server.protocol, request,
                                                             types.SimpleNamespace(remote_id=sender))
                finally:
                    control._pending_messages = real
                return [r.type for r in reply.results]

            FOUND, NONE = dht_pb2.FOUND_DICTIONARY, dht_pb2.NOT_FOUND
            assert dht_reply.queued_bytes(None) == 0.0
            assert await find("a", []) == [FOUND, FOUND]  # an empty queue: the full key fits
            clock[0] += 10
            assert await find("a", [3 << 19]) == [NONE, FOUND]  # 1.5 MiB waiting: the 2.9 MiB key would pass 4 MiB
            assert await find("a", [3 << 19]) == [NONE, FOUND]  # the small key fits the room, no allowance used
            assert await find("a", [3 << 20, 1 << 20]) == [NONE, FOUND]  # no room: the allowance
            assert await find("a", [3 << 20, 1 << 20]) == [NONE, NONE]  # used for this second
            assert await find("b", [3 << 20, 1 << 20]) == [NONE, FOUND]  # another sender has its own
            assert await find("c", [10] * (dht_reply.REPLY_QUEUE_LIMIT + 1)) == [NONE, FOUND]  # backed up by count
            clock[0] += 1.0
            assert await find("a", [3 << 20, 1 << 20]) == [NONE, FOUND]  # a second later, again
            clock[0] += 10
            assert await find("a", []) == [FOUND, FOUND]  # the queue drained: values again
        finally:
            control._pending_messages = real
            await asker.shutdown()
            await server.shutdown()

    asyncio.run(main())
