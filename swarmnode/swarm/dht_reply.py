"""What one DHT message may cost a node: bounded decoding, and find replies decoded off the event loop.

hivemind decodes what peers send with ``MSGPackSerializer.loads`` in the DHT process's event loop: find replies
(``DHTProtocol.call_find``), stores (``rpc_store``) and the values of a finished read (``DHTNode``'s search).
Two outside attacks broke that: 200 nested tuple extension types (714 bytes) overflowed the C stack and killed
the DHT process of any node that decoded them (a reader, or any node a store was sent to, no signature needed),
and replies just under our per-key bound, decoded back to back in the event loop, held it past hivemind's 3 s
RPC timeout so that pings and honest replies counted as failed and a reader's routing table emptied after every
read. :class:`BoundedSerializer` decodes with a bound on nesting and on array lengths;
:func:`call_find_off_loop` decodes find replies in one worker thread. Both are installed in a running node by
:func:`swarmnode.swarm.dht_process.harden_dht_node`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any, Sequence

from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.p2p import PeerID
from hivemind.proto import dht_pb2
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import ValueWithExpiration

from swarmnode.swarm.wire import unpack_dht_bytes

__all__ = ["MAX_DICTIONARY_ENTRIES", "MAX_EXT_DEPTH", "MAX_MESSAGE_OBJECTS", "BoundedSerializer", "call_find_off_loop",
           "unpack_find_results"]

log = logging.getLogger("swarmnode.swarm.dht")

MAX_DICTIONARY_ENTRIES = 1024  # entries of one key's dictionary, on the wire and in storage (KeyCappedStorage)
MAX_EXT_DEPTH = 8  # extension types nested in one another (ours nest 1: a dictionary of byte values)
#: objects in the arrays and maps of one message, all levels together, each container counting its elements
#: plus one: a full dictionary value counts 4 (its payload) + 1,025 (the items array) + 1,024 x 4 (the entries)
MAX_MESSAGE_OBJECTS = 5 * MAX_DICTIONARY_ENTRIES + 64
DICTIONARY_EXT_CODE = 0x50  # hivemind's DictionaryDHTValue (hivemind.dht.storage)


class BoundedSerializer(MSGPackSerializer):
    """hivemind's ``MSGPackSerializer`` whose :meth:`loads` bounds what peer bytes may cost (the ``serializer`` of a
    running node's protocol once :func:`~swarmnode.swarm.dht_process.harden_dht_node` ran; ``dumps`` is hivemind's).

    It decodes what hivemind's decodes (plain msgpack, tuples, dictionary values) and refuses, with
    :class:`ValueError`, extension types nested more than :data:`MAX_EXT_DEPTH` deep (hivemind's recursive
    decoding overflowed the C stack at ~200 levels, 714 bytes, and the process died), any other extension type
    (hivemind's registered types decode their payload with the unbounded serializer), an array or map over
    :data:`MAX_DICTIONARY_ENTRIES` elements (refused at its header: :func:`swarmnode.swarm.wire.unpack_dht_bytes`),
    a message of more than :data:`MAX_MESSAGE_OBJECTS` objects in its arrays and maps, all levels together
    (refused as soon as the count passes it), a tuple whose payload is not an array, and a dictionary value not of
    hivemind's form ``[maxsize, latest expiration, [[subkey, value, expiration], ...]]``. hivemind turns the error
    into a failed call (find) or an RPC error (store)."""

    max_entries: int = MAX_DICTIONARY_ENTRIES
    max_ext_depth: int = MAX_EXT_DEPTH
    max_objects: int = MAX_MESSAGE_OBJECTS

    @classmethod
    def loads(cls, buf: bytes) -> object:
        depth = 0
        objects = 0

        def count(n: int) -> None:
            nonlocal objects
            objects += n
            if objects > cls.max_objects:
                raise ValueError(f"a DHT message of more than {cls.max_objects} msgpack objects in arrays and maps")

        def ext_hook(code: int, data: bytes) -> Any:
            nonlocal depth
            if depth >= cls.max_ext_depth:
                raise ValueError(f"msgpack extension types nested deeper than {cls.max_ext_depth}")
            depth += 1
            try:
                if code == cls._TUPLE_EXT_TYPE_CODE:
                    items = unpack(data)
                    if not isinstance(items, list):  # tuple("4 MiB of text") would be millions of objects
                        raise ValueError("a msgpack tuple's payload is an array")
                    return tuple(items)
                if code == DICTIONARY_EXT_CODE:
                    return _dictionary(unpack(data))
                raise ValueError(f"msgpack extension type {code:#x}: only tuples and DHT dictionaries are decoded")
            finally:
                depth -= 1

        def unpack(data: bytes) -> Any:
            return unpack_dht_bytes(data, ext_hook, cls.max_entries, count)

        return unpack(buf)


def _dictionary(obj: Any) -> DictionaryDHTValue:
    """hivemind's ``DictionaryDHTValue.unpackb`` on an already decoded payload, checking its form first."""
    if not (isinstance(obj, list) and len(obj) == 3 and isinstance(obj[2], list)):
        raise ValueError("a DHT dictionary value is [maxsize, latest expiration, items]")
    maxsize, latest_expiration_time, items = obj
    if not (maxsize is None or isinstance(maxsize, (int, float))) or not isinstance(latest_expiration_time,
                                                                                (int, float)):
        raise ValueError("a DHT dictionary value's maxsize and expiration are numbers")
    with DictionaryDHTValue(maxsize).freeze() as new_dict:
        for item in items:
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[2], (int, float))):
                raise ValueError("a DHT dictionary entry is [subkey, value, expiration]")
            try:
                new_dict.store(*item)
            except TypeError as e:  # an unhashable subkey
                raise ValueError(f"a DHT dictionary entry's subkey: {e}") from None
        new_dict.latest_expiration_time = latest_expiration_time
    return new_dict


def unpack_find_results(self: DHTProtocol, keys: Sequence[DHTID], results: Sequence[Any]) -> dict:
    """hivemind 1.1's unpacking of a find reply (``DHTProtocol.call_find`` after the call returned): per key,
    ``(ValueWithExpiration | None, {neighbour DHTID: PeerID})``, every value decoded and checked by our
    validators (``_validate_record`` / ``_validate_dictionary``); a value that fails counts as not found.
    Runs in :func:`call_find_off_loop`'s worker thread. ``self`` is the protocol.

    :raises Exception: whatever decoding a malformed reply raises (the caller counts the peer as failed)
    """
    output: dict = {}
    for key, result in zip(keys, results):
        key_bytes = DHTID.to_bytes(key)
        nearest = dict(zip(map(DHTID.from_bytes, result.nearest_node_ids), map(PeerID, result.nearest_peer_ids)))
        if result.type == dht_pb2.NOT_FOUND:
            output[key] = None, nearest
        elif result.type == dht_pb2.FOUND_REGULAR:
            ok = self._validate_record(key_bytes, self.IS_REGULAR_VALUE, result.value, result.expiration_time)
            output[key] = (ValueWithExpiration(result.value, result.expiration_time) if ok else None), nearest
        elif result.type == dht_pb2.FOUND_DICTIONARY:
            value = self.serializer.loads(result.value)
            ok = self._validate_dictionary(key_bytes, value)
            output[key] = (ValueWithExpiration(value, result.expiration_time) if ok else None), nearest
        else:
            log.error("unknown find result type %s from a DHT peer", result.type)
    return output


def _decode_pool(self: DHTProtocol) -> concurrent.futures.ThreadPoolExecutor:
    pool = self.__dict__.get("_decode_pool")
    if pool is None:
        pool = self.__dict__["_decode_pool"] = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="dht-find-decode")
    return pool


async def call_find_off_loop(self: DHTProtocol, peer: PeerID, keys: Any) -> dict | None:
    """hivemind 1.1's ``DHTProtocol.call_find`` with each reply decoded and validated in one worker thread
    (:func:`unpack_find_results`) instead of the DHT event loop (bound to a running node's protocol by
    :func:`~swarmnode.swarm.dht_process.harden_dht_node`; ``self`` is that protocol). Returns what hivemind's
    returns: per key ``(value or None, nearest neighbours)``, or ``None`` when the peer did not answer or its reply
    does not decode (the peer then counts as failed and leaves the routing table, as in hivemind).

    Decoding a reply of ~3 MiB and checking its up to 1,024 signatures takes a loaded 2-core machine ~0.6 s.
    One read of a few keys has several replicas answer at once; in the event loop their replies ran back to
    back, and every other call waiting meanwhile, an honest replica's reply or a ping from a neighbour, passed
    hivemind's 3 s RPC timeout, counted as failed and left the routing table: two attacker replicas just under
    the key budget under the keys a poll reads emptied a reader's routing table after every read (an outside
    attack). Here the loop only waits: pings are answered and honest replies are taken as they arrive, and the
    peer that answered is marked as responded before its reply is decoded. The worker is one thread, so
    decoding costs at most one core and our validators run one at a time."""
    keys = list(keys)
    find_request = dht_pb2.FindRequest(keys=list(map(DHTID.to_bytes, keys)), peer=self.node_info)
    try:
        async with self.rpc_semaphore:
            response = await self.get_stub(peer).rpc_find(find_request, timeout=self.wait_timeout)
        if response.peer and response.peer.node_id:
            asyncio.create_task(self.update_routing_table(DHTID.from_bytes(response.peer.node_id), peer,
                                                          responded=True))
        if len(keys) != len(response.results):
            raise ValueError(f"find reply has {len(response.results)} results for {len(keys)} keys")
        results = list(response.results)
        return await asyncio.get_running_loop().run_in_executor(_decode_pool(self), unpack_find_results, self,
                                                                keys, results)
    except Exception:  # noqa: BLE001 - as hivemind: a peer whose call or reply fails is marked as failed
        log.debug("DHT find at %s failed", peer, exc_info=True)
        asyncio.create_task(self.update_routing_table(self.routing_table.get(peer_id=peer), peer, responded=False))
        return None
