"""What one find or store request may ask of a node: real hivemind DHT nodes and p2pd on loopback."""

from __future__ import annotations

import asyncio

import pytest
from hivemind.dht.node import DHTNode
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.p2p import P2PHandlerError
from hivemind.proto import dht_pb2
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.swarm.dht_process import harden_dht_node
from swarmnode.swarm.dht_reply import MAX_FIND_KEYS, MAX_STORE_KEYS, REPLY_VALUE_BYTES

BUDGET = 3 * 1024 * 1024


def _full_dictionary(tag: str, now: float) -> DictionaryDHTValue:
    """A dictionary at the key budget: 1,000 entries of 3,000 bytes (3.06 MB)."""
    value = DictionaryDHTValue()
    for i in range(1000):
        value.store(f"{tag}{i}".encode(), bytes([i % 251]) * 3000, now + 600)
    return value


async def _pair(harden: bool):
    server = await DHTNode.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], cache_locally=False)
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
