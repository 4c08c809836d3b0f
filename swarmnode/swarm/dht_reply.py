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
import types
from typing import Any, Sequence

from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.p2p import PeerID
from hivemind.proto import dht_pb2
from hivemind.utils.auth import AuthRole, AuthRPCWrapper
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import TimedStorage, ValueWithExpiration

from swarmnode.swarm.wire import unpack_dht_bytes

__all__ = ["MAX_DICTIONARY_ENTRIES", "MAX_EXT_DEPTH", "MAX_FIND_KEYS", "MAX_MESSAGE_OBJECTS", "MAX_PENDING_STORES",
           "MAX_STORE_ENTRIES", "MAX_STORE_KEYS", "REPLY_VALUE_BYTES", "BoundedSerializer", "bound_request_handlers",
           "call_find_off_loop", "check_store_items", "rpc_find_bounded", "rpc_store_bounded", "unpack_find_results"]

log = logging.getLogger("swarmnode.swarm.dht")

MAX_DICTIONARY_ENTRIES = 1024  # entries of one key's dictionary, on the wire and in storage (KeyCappedStorage)
MAX_EXT_DEPTH = 8  # extension types nested in one another (ours nest 1: a dictionary of byte values)
#: objects in the arrays and maps of one message, all levels together, each container counting its elements
#: plus one: a full dictionary value counts 4 (its payload) + 1,025 (the items array) + 1,024 x 4 (the entries)
MAX_MESSAGE_OBJECTS = 5 * MAX_DICTIONARY_ENTRIES + 64
DICTIONARY_EXT_CODE = 0x50  # hivemind's DictionaryDHTValue (hivemind.dht.storage)
#: keys one find request may ask for: hivemind packs at most min(sqrt(keys of the read), 16) keys of a read into one
#: request (``DHTNode.get_many_by_id``, ``chunk_size``), and sqrt(keys) when it looks up where to store
MAX_FIND_KEYS = 64
#: keys one store request may carry (ours: the few keys of one publish, or a hand-over batch of at most as many)
MAX_STORE_KEYS = 256
#: entries one store request may carry that the node does not already hold (each one a signature check)
MAX_STORE_ENTRIES = MAX_DICTIONARY_ENTRIES
#: store requests waiting for the store worker at once; more are refused at once
MAX_PENDING_STORES = 4
#: value bytes one find reply carries (hivemind's message cap is 4 MiB; a key holds at most 3 MiB)
REPLY_VALUE_BYTES = 3 * 1024 * 1024 + 512 * 1024


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


def _value_size(value: Any) -> int:
    """Bytes a stored value adds to a find reply, estimated without encoding it."""
    if isinstance(value, DictionaryDHTValue):
        return sum((len(v) if isinstance(v, (bytes, bytearray)) else 0) + 64 for v, _ in value.data.values()) + 16
    return len(value) if isinstance(value, (bytes, bytearray)) else 64


async def rpc_find_bounded(self: DHTProtocol, request: dht_pb2.FindRequest, context: Any) -> dht_pb2.FindResponse:
    """hivemind 1.1's find handler (``DHTProtocol.rpc_find``: per key, the stored value and the ``bucket_size``
    nearest neighbours) with two bounds; registered for a running node's protocol by :func:`bound_request_handlers`
    (``self`` is that protocol, ``context`` hivemind's ``P2PContext``).

    - A request of more than :data:`MAX_FIND_KEYS` keys is refused with :class:`ValueError` (the caller gets an
      RPC error) before any key is looked up, and its sender is not added to the routing table. hivemind answered
      any number: one request of 150,000 keys (3.3 MB) held the node's DHT event loop past 60 s and took +120 MB
      (an outside attack), and no honest reader asks for more than 16 keys at once.
    - The values of one reply carry at most :data:`REPLY_VALUE_BYTES`: the smallest values go first, and a key
      whose value would pass the budget is answered as not found (with its neighbours). hivemind's reply for
      several full keys passed its 4 MiB message cap and failed whole, so the asker got nothing from this node,
      not even the small owner-only publisher keys asked beside a flooded bucket key, and dropped the node from its
      routing table. Results keep the order of ``request.keys``.

    :raises ValueError: a request of more than :data:`MAX_FIND_KEYS` keys
    """
    n_keys = len(request.keys)
    if n_keys > MAX_FIND_KEYS:
        raise ValueError(f"a DHT find request from {context.remote_id} asks for {n_keys} keys "
                         f"(at most {MAX_FIND_KEYS})")
    if request.peer:  # as hivemind: the asker joins the routing table once it answers a ping
        asyncio.create_task(self.rpc_ping(dht_pb2.PingRequest(peer=request.peer), context))
    key_ids = [DHTID.from_bytes(key) for key in request.keys]
    items = []
    for key_id in key_ids:  # hivemind's rule: the stored value, or the cached one if it expires later
        item, cached = self.storage.get(key_id), self.cache.get(key_id)
        if cached is not None and (item is None or cached.expiration_time > item.expiration_time):
            item = cached
        items.append(item)
    encoded: dict[int, bytes] = {}
    budget = REPLY_VALUE_BYTES
    by_size = sorted((i for i, item in enumerate(items) if item is not None), key=lambda i: _value_size(items[i].value))
    for i in by_size:
        value = items[i].value
        if _value_size(value) > budget:
            break
        data = self.serializer.dumps(value) if isinstance(value, DictionaryDHTValue) else value
        if len(data) > budget:
            break
        encoded[i] = data
        budget -= len(data)
    if len(encoded) < len(by_size):
        log.debug("DHT find from %s: %d of %d found values left out of the reply (value budget %d bytes)",
                  context.remote_id, len(by_size) - len(encoded), len(by_size), REPLY_VALUE_BYTES)
    exclude = DHTID.from_bytes(request.peer.node_id)
    response = dht_pb2.FindResponse(results=[], peer=self.node_info)
    for i, key_id in enumerate(key_ids):
        if i not in encoded:
            result = dht_pb2.FindResult(type=dht_pb2.NOT_FOUND)
        else:
            kind = dht_pb2.FOUND_DICTIONARY if isinstance(items[i].value, DictionaryDHTValue) else dht_pb2.FOUND_REGULAR
            result = dht_pb2.FindResult(type=kind, value=encoded[i], expiration_time=items[i].expiration_time)
        for node_id, peer_id in self.routing_table.get_nearest_neighbors(key_id, k=self.bucket_size, exclude=exclude):
            result.nearest_node_ids.append(node_id.to_bytes())
            result.nearest_peer_ids.append(peer_id.to_bytes())
        response.results.append(result)
    return response


def _held_entry(held: Any, subkey: Any, value: bytes, expiration: float) -> bool:
    """Whether ``held`` (a stored dictionary, read without a copy) holds this exact entry (a GIL-atomic lookup)."""
    if not isinstance(held, DictionaryDHTValue):
        return False
    try:
        item = held.data.get(subkey)
    except TypeError:  # an unhashable subkey
        return False
    return item is not None and item.value == value and item.expiration_time == expiration


def check_store_items(self: DHTProtocol, items: Sequence[tuple], held: dict) -> list:
    """Decode and check the items of one store request (runs in the store worker thread of
    :func:`rpc_store_bounded`; ``self`` is the protocol, ``held`` maps each key's DHTID to the dictionary the node
    holds under it). Returns per item ``None`` (refused) or what to store: ``("dict", [(subkey, value,
    expiration), ...])`` with the entries already held byte for byte left out unchecked, or ``("record", subkey or
    None, value, expiration)``.

    :raises ValueError: the request's entries not already held (a dictionary's entries, or one record each) number
        more than :data:`MAX_STORE_ENTRIES`, or an item does not decode
    """
    decoded: list = []
    entries = 0
    for key, tag, value_bytes, expiration, _in_cache in items:
        key_id = DHTID.from_bytes(key)
        if tag == self.IS_DICTIONARY:
            dictionary = self.serializer.loads(value_bytes)
            if not isinstance(dictionary, DictionaryDHTValue):
                raise ValueError("a DHT store of a whole dictionary carries another value")
            with dictionary.freeze():
                fresh = [(k, v, e) for k, (v, e) in dictionary.items()
                         if not _held_entry(held.get(key_id), k, v, e)]
            entries += len(fresh)
            decoded.append((key, dictionary, fresh))
        else:
            subkey = None if tag == self.IS_REGULAR_VALUE else self.serializer.loads(tag)
            entries += 1
            decoded.append((key, None, (subkey, value_bytes, expiration, tag)))
        if entries > MAX_STORE_ENTRIES:
            raise ValueError(f"a DHT store request of more than {MAX_STORE_ENTRIES} entries not already held")
    out: list = []
    for key, dictionary, payload in decoded:
        if dictionary is not None:  # hivemind: a whole dictionary is stored only if every entry passes
            whole = DictionaryDHTValue()
            for subkey, value, expiration in payload:
                whole.store(subkey, value, expiration)
            out.append(("dict", payload) if self._validate_dictionary(key, whole) else None)
        else:
            subkey, value, expiration, tag = payload
            out.append(("record", subkey, value, expiration) if self._validate_record(key, tag, value, expiration)
                       else None)
    return out


def _store_pool(self: DHTProtocol) -> concurrent.futures.ThreadPoolExecutor:
    pool = self.__dict__.get("_store_pool")
    if pool is None:
        pool = self.__dict__["_store_pool"] = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="dht-store-check")
    return pool


async def rpc_store_bounded(self: DHTProtocol, request: dht_pb2.StoreRequest, context: Any) -> dht_pb2.StoreResponse:
    """hivemind 1.1's store handler (``DHTProtocol.rpc_store``) with its records checked in one worker thread and
    bounded; registered for a running node's protocol by :func:`bound_request_handlers` (``self`` is the protocol).

    - More than :data:`MAX_STORE_KEYS` keys, or more than :data:`MAX_PENDING_STORES` store requests already
      waiting for the worker: refused with :class:`ValueError` before anything is decoded.
    - Decoding and signature checks run in one worker thread (not the DHT event loop, which keeps answering pings
      and find requests), and a request's entries not already held byte for byte count against
      :data:`MAX_STORE_ENTRIES`; past it the whole request is refused (:func:`check_store_items`). An outside attack
      sent one store of 24 whole dictionaries of 1,000 fresh signed entries each (4 MB, under every per-key bound)
      and replayed it: each took a loaded node 3.3 s of signature checks in its event loop, and with four in flight
      1 of 20 pings was answered and the node's watchdog restarted its DHT.
    - Entries already held byte for byte are neither checked nor stored again. What passes is stored as hivemind
      does, on the event loop.

    :raises ValueError: a request over the bounds above, or whose fields differ in length or do not decode
    """
    n_keys = len(request.keys)
    if n_keys > MAX_STORE_KEYS:
        raise ValueError(f"a DHT store request from {context.remote_id} carries {n_keys} keys "
                         f"(at most {MAX_STORE_KEYS})")
    if not (n_keys == len(request.subkeys) == len(request.values) == len(request.expiration_time)
            == len(request.in_cache)):
        raise ValueError(f"a DHT store request from {context.remote_id} has fields of different lengths")
    pending = self.__dict__.get("_stores_pending", 0)
    if pending >= MAX_PENDING_STORES:
        raise ValueError(f"a DHT store request from {context.remote_id} refused: {pending} stores are being checked")
    if request.peer:  # as hivemind: the sender joins the routing table once it answers a ping
        asyncio.create_task(self.rpc_ping(dht_pb2.PingRequest(peer=request.peer), context))
    items = list(zip(request.keys, request.subkeys, request.values, request.expiration_time, request.in_cache))
    held = {}
    for key in {item[0] for item in items}:
        key_id = DHTID.from_bytes(key)
        stored = TimedStorage.get(self.storage, key_id)  # the stored object, not KeyCappedStorage.get's copy
        held[key_id] = stored.value if stored is not None else None
    self.__dict__["_stores_pending"] = pending + 1
    try:
        checked = await asyncio.get_running_loop().run_in_executor(_store_pool(self), check_store_items, self,
                                                                   items, held)
    finally:
        self.__dict__["_stores_pending"] -= 1
    response = dht_pb2.StoreResponse(store_ok=[], peer=self.node_info)
    for (key, _tag, _value, _expiration, in_cache), result in zip(items, checked):
        key_id = DHTID.from_bytes(key)
        storage = self.cache if in_cache else self.storage
        if result is None:
            response.store_ok.append(False)
        elif result[0] == "dict":
            response.store_ok.append(all([storage.store_subkey(key_id, k, v, e) for k, v, e in result[1]]))
        else:
            _, subkey, value, expiration = result
            ok = (storage.store(key_id, value, expiration) if subkey is None
                  else storage.store_subkey(key_id, subkey, value, expiration))
            response.store_ok.append(ok)
    return response


async def bound_request_handlers(protocol: DHTProtocol) -> None:
    """Serve a running node's find and store requests with :func:`rpc_find_bounded` and :func:`rpc_store_bounded`.

    hivemind registers the protocol's handlers with p2pd once, when the protocol is created, as the bound methods
    of that moment; so this sets the two methods on the protocol and registers them again, by hivemind's public
    ``P2P.remove_protobuf_handler`` / ``add_protobuf_handler`` under the same names (through hivemind's
    ``AuthRPCWrapper``, as ``DHTProtocol.create`` does). Between the two calls, a few milliseconds at start, a
    find or store sent to this node fails as if it had not answered. A client-mode node serves no requests and is
    left as it is. Runs in the DHT process."""
    if protocol.client_mode:
        return
    protocol.rpc_find = types.MethodType(rpc_find_bounded, protocol)
    protocol.rpc_store = types.MethodType(rpc_store_bounded, protocol)
    wrapper = AuthRPCWrapper(protocol, AuthRole.SERVICER, protocol.authorizer)
    for name, request_type in (("rpc_find", dht_pb2.FindRequest), ("rpc_store", dht_pb2.StoreRequest)):
        handle = DHTProtocol._get_handle_name(None, name)
        await protocol.p2p.remove_protobuf_handler(handle)
        await protocol.p2p.add_protobuf_handler(handle, getattr(wrapper, name), request_type)
