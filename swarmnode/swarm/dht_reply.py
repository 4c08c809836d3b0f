"""What one DHT message may cost a node: bounded decoding, and find replies decoded off the event loop.

hivemind decodes what peers send with ``MSGPackSerializer.loads`` in the DHT process's event loop: find replies
(``DHTProtocol.call_find``), stores (``rpc_store``) and the values of a finished read (``DHTNode``'s search).
Two outside attacks broke that: 200 nested tuple extension types (714 bytes) overflowed the C stack and killed
the DHT process of any node that decoded them (a reader, or any node a store was sent to, no signature needed),
and replies just under our per-key bound, decoded back to back in the event loop, held it past hivemind's 3 s
RPC timeout so that pings and honest replies counted as failed and a reader's routing table emptied after every
read. :class:`BoundedSerializer` decodes with a bound on nesting and on array lengths;
:func:`call_find_off_loop` decodes find replies in one worker thread. On the serving side hivemind answered a find
request of any number of keys (150,000 held a node's loop past 60 s) and checked every entry of a store in its
event loop (a replayed 4 MB store of 24,000 signed entries silenced a node): :func:`rpc_find_bounded` and
:func:`rpc_store_bounded` bound both, and check stores in a worker thread. All are installed in a running node by
:func:`swarmnode.swarm.dht_process.harden_dht_node`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import math
import struct
import time
import types
from typing import Any, Sequence

import cachetools

from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.p2p import PeerID
from hivemind.proto import dht_pb2
from hivemind.utils.auth import AuthRole, AuthRPCWrapper
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import TimedStorage, ValueWithExpiration

from swarmnode.swarm.wire import unpack_dht_bytes

__all__ = ["FINDS_PER_SENDER_BURST", "FINDS_PER_SENDER_PER_SECOND", "FIND_SENDERS_TRACKED", "MAX_DICTIONARY_ENTRIES",
           "MAX_EXT_DEPTH", "MAX_FIND_KEYS", "MAX_MESSAGE_OBJECTS", "MAX_PENDING_STORES", "MAX_STORE_ENTRIES",
           "MAX_STORE_KEYS", "REPLY_BACKED_UP_BYTES", "REPLY_BYTES_BURST", "REPLY_BYTES_PER_SECOND",
           "REPLY_BYTES_PER_SENDER_BURST", "REPLY_BYTES_PER_SENDER_PER_SECOND", "REPLY_QUEUE_BYTES",
           "REPLY_QUEUE_LIMIT", "REPLY_VALUE_BYTES", "SIZE_ATTRIBUTE", "VERIFIED_ENTRIES", "VERIFIED_SECONDS",
           "BoundedSerializer", "TokenBucket", "bound_request_handlers", "call_find_off_loop", "check_store_items",
           "queued_bytes", "release_finished_handlers", "rpc_find_bounded", "rpc_store_bounded",
           "unpack_find_results"]

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
#: value bytes all find replies of a node carry, per second and at most at once (a token bucket): a full key is
#: ~3 MiB, and a flood of finds its senders cancel at once had a node queue ~6 GB of replies no one read
REPLY_BYTES_PER_SECOND = 32 * 1024 * 1024
REPLY_BYTES_BURST = 32 * 1024 * 1024
#: find requests one sender (libp2p peer id) may make, per second and at most at once; more are refused before any
#: key is looked up. An honest node asks one replica a few times a poll; an outside attack of finds for 16 full
#: keys from two peer ids, each cancelled after 10 ms, stalled a node (pings 5 of 11) until this bound
FINDS_PER_SENDER_PER_SECOND = 16.0
FINDS_PER_SENDER_BURST = 64
#: value bytes the find replies to one sender carry, per second and at most at once (within REPLY_BYTES_*): one
#: sender cannot spend the node's whole reply rate
REPLY_BYTES_PER_SENDER_PER_SECOND = 8 * 1024 * 1024
REPLY_BYTES_PER_SENDER_BURST = 8 * 1024 * 1024
#: senders whose find budgets are remembered (least recently seen forgotten first: a new one starts full)
FIND_SENDERS_TRACKED = 4096
#: messages waiting in the node's queue to p2pd past which the queue counts as backed up
REPLY_QUEUE_LIMIT = 8
#: bytes waiting in that queue (every message: replies, the node's own requests, pings) that a find reply may bring
#: it to; past it (or while backed up) a reply carries values only within a sender's REPLY_BACKED_UP_BYTES, at most
#: once a second. Everything the node sends waits behind this queue: 8 peer ids that cancelled finds of full keys
#: queued 1,735 messages, and pings, reads and publishes failed until ~15 s after the attack (an outside attack)
REPLY_QUEUE_BYTES = 4 * 1024 * 1024
REPLY_BACKED_UP_BYTES = 64 * 1024
#: entries one store request may carry that the node does not already hold (each one a signature check)
MAX_STORE_ENTRIES = MAX_DICTIONARY_ENTRIES
#: store requests waiting for the store worker at once (one a sender); more are refused at once
MAX_PENDING_STORES = 8
#: entries whose signature a node remembers having checked (a store of them again is not checked), and for how long
VERIFIED_ENTRIES = 65_536
VERIFIED_SECONDS = 60.0
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
    validators (``_validate_record`` / ``_validate_dictionary``); a value that fails counts as not found. A
    dictionary's expiration is its latest entry's (not the reply's claim), and an empty dictionary is not found.
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
            # the reply's own expiration is the replier's claim, checked by no validator: +inf ended every
            # search for the newest value at once (an outside run: honest entries missing from 1-2 of 6 reads);
            # a dictionary expires with its latest (validated) entry, and an empty one is nothing found
            latest = max((entry.expiration_time for _, entry in value.items()), default=None) if ok else None
            if latest is not None:
                value.latest_expiration_time = latest
            output[key] = (ValueWithExpiration(value, latest) if latest is not None else None), nearest
        else:
            log.error("unknown find result type %s from a DHT peer", result.type)
    return output


def _worker(self: DHTProtocol, name: str) -> concurrent.futures.ThreadPoolExecutor:
    """The protocol's one-thread pool ``name`` (``dht-find-decode`` or ``dht-store-check``), made on first use."""
    pool = self.__dict__.get(name)
    if pool is None:
        pool = self.__dict__[name] = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
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
        return await asyncio.get_running_loop().run_in_executor(_worker(self, "dht-find-decode"), unpack_find_results, self,
                                                                keys, results)
    except Exception:  # noqa: BLE001 - as hivemind: a peer whose call or reply fails is marked as failed
        log.debug("DHT find at %s failed", peer, exc_info=True)
        asyncio.create_task(self.update_routing_table(self.routing_table.get(peer_id=peer), peer, responded=False))
        return None


class TokenBucket:
    """A token bucket: ``rate`` tokens a second, at most ``burst``; it starts full.

    :param rate: tokens added per second (float, >= 0)
    :param burst: most tokens held (float, > 0)
    """

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst, self.tokens, self.last = float(rate), float(burst), float(burst), None

    def refill(self, now: float) -> float:
        """Add what ``now`` (``time.monotonic()`` seconds) brings since the last refill; returns the tokens held."""
        if self.last is not None:
            self.tokens = min(self.burst, self.tokens + max(0.0, now - self.last) * self.rate)
        self.last = now
        return self.tokens


class _Sender:
    """What one sender of find requests may still ask: finds, value bytes, and when it last used the backed-up
    allowance."""

    def __init__(self) -> None:
        self.finds = TokenBucket(FINDS_PER_SENDER_PER_SECOND, FINDS_PER_SENDER_BURST)
        self.values = TokenBucket(REPLY_BYTES_PER_SENDER_PER_SECOND, REPLY_BYTES_PER_SENDER_BURST)
        self.allowance_used = -math.inf


def _take_find(self: DHTProtocol, sender: Any, now: float) -> _Sender | None:
    """Spend one find of ``sender``'s budget; returns its record (buckets refilled to ``now``) or None when the
    sender has no find left (:data:`FINDS_PER_SENDER_PER_SECOND`)."""
    senders = self.__dict__.get("_find_senders")
    if senders is None:
        senders = self.__dict__["_find_senders"] = cachetools.LRUCache(FIND_SENDERS_TRACKED)
    record = senders.get(sender)
    if record is None:
        record = senders[sender] = _Sender()
    record.values.refill(now)
    if record.finds.refill(now) < 1.0:
        return None
    record.finds.tokens -= 1.0
    return record


def queued_bytes(queue: Any) -> float:
    """Bytes of the messages waiting in ``queue`` (hivemind's ``ControlClient._pending_messages``, protobuf messages
    to p2pd): 0 when there is no such queue, ``inf`` past :data:`REPLY_QUEUE_LIMIT` messages (not summed then)."""
    if queue is None:
        return 0.0
    if queue.qsize() > REPLY_QUEUE_LIMIT:
        return math.inf
    try:
        return float(sum(message.ByteSize() for message in list(queue._queue)))
    except Exception:  # noqa: BLE001 - hivemind's internals changed: count messages only
        return 0.0


SIZE_ATTRIBUTE = "_swarmnode_reply_size"  # a dictionary's cached estimate: (entries, heap length, bytes)


def _value_size(value: Any) -> int:
    """Bytes a stored value adds to a find reply, estimated without encoding it. A dictionary's estimate is kept on
    the object until its entries or expiration heap change (:class:`~swarmnode.swarm.dht_process.KeyCappedStorage`
    also drops it on every store): walking 16 full keys of 1,024 entries for every find was 91% of a victim's CPU
    under finds from 8 peer ids (an outside attack; pings 0 of 10)."""
    if isinstance(value, DictionaryDHTValue):
        signature = (len(value.data), len(value.expiration_heap))
        cached = value.__dict__.get(SIZE_ATTRIBUTE)
        if cached is not None and cached[:2] == signature:
            return cached[2]
        size = sum((len(item.value) if isinstance(item.value, (bytes, bytearray)) else 0) + 64
                   for item in value.data.values()) + 16
        value.__dict__[SIZE_ATTRIBUTE] = (*signature, size)
        return size
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
    - All replies together carry at most :data:`REPLY_BYTES_PER_SECOND` of values a second (a burst of
      :data:`REPLY_BYTES_BURST`), and a reply brings the node's queue of messages to p2pd to at most
      :data:`REPLY_QUEUE_BYTES` (:func:`queued_bytes`; backed up past :data:`REPLY_QUEUE_LIMIT` messages); beyond
      that a sender gets at most :data:`REPLY_BACKED_UP_BYTES` of values once a second. The keys that do not fit
      are answered as not found, the smallest values still first. An outside attack sent finds of one full key and cancelled each after 10 ms: hivemind queued
      every reply for sending anyway (6.4 GB in 30 s, pings 1 of 9). A key asked twice in one request is answered
      once.
    - Per sender (the libp2p peer id of the connection): at most :data:`FINDS_PER_SENDER_PER_SECOND` finds a
      second (a burst of :data:`FINDS_PER_SENDER_BURST`), refused with :class:`ValueError` before any key is looked
      up, and at most :data:`REPLY_BYTES_PER_SENDER_PER_SECOND` of values (so one sender cannot spend the rate
      above). Finds of 16 full keys from two peer ids, cancelled after 10 ms, stalled a node (pings 5 of 11).

    :raises ValueError: a request of more than :data:`MAX_FIND_KEYS` keys, or from a sender past its find rate
    """
    n_keys = len(request.keys)
    if n_keys > MAX_FIND_KEYS:
        raise ValueError(f"a DHT find request from {context.remote_id} asks for {n_keys} keys "
                         f"(at most {MAX_FIND_KEYS})")
    now = time.monotonic()
    sender = _take_find(self, context.remote_id, now)
    if sender is None:
        raise ValueError(f"DHT find requests from {context.remote_id} come faster than "
                         f"{FINDS_PER_SENDER_PER_SECOND:g} a second (at most {FINDS_PER_SENDER_BURST} at once)")
    if request.peer:  # as hivemind: the asker joins the routing table once it answers a ping
        asyncio.create_task(self.rpc_ping(dht_pb2.PingRequest(peer=request.peer), context))
    key_ids = [DHTID.from_bytes(key) for key in request.keys]
    items: list = []
    seen: set = set()
    for key_id in key_ids:  # hivemind's rule: the stored value, or the cached one if it expires later
        if key_id in seen:  # a key asked twice is answered once (64 copies of one full key cost 0.4 s of loop each)
            items.append(None)
            continue
        seen.add(key_id)
        # the stored object itself (no copy: it is only encoded here, on the loop that alone changes it)
        item, cached = TimedStorage.get(self.storage, key_id), self.cache.get(key_id)
        if cached is not None and (item is None or cached.expiration_time > item.expiration_time):
            item = cached
        items.append(item)
    encoded: dict[int, bytes] = {}
    replies = self.__dict__.get("_reply_bytes")
    if replies is None:
        replies = self.__dict__["_reply_bytes"] = TokenBucket(REPLY_BYTES_PER_SECOND, REPLY_BYTES_BURST)
    budget = int(min(REPLY_VALUE_BYTES, replies.refill(now), sender.values.tokens))
    control = getattr(getattr(getattr(self, "p2p", None), "_client", None), "control", None)
    outgoing = getattr(control, "_pending_messages", None)
    room = REPLY_QUEUE_BYTES - queued_bytes(outgoing)
    backed_up = room < budget
    if backed_up:  # replies are not leaving as fast as made: a small allowance a sender a second, within the room
        allowance = REPLY_BACKED_UP_BYTES if now - sender.allowance_used >= 1.0 else 0
        budget = min(budget, max(int(room) if room > 0 else 0, allowance))
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
    spent = sum(map(len, encoded.values()))
    replies.tokens -= spent
    sender.values.tokens -= spent
    if backed_up and spent > max(0.0, room):
        sender.allowance_used = now  # its backed-up allowance is used for this second
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


def _held(held: Any, subkey: Any) -> Any:
    """The entry ``held`` (a stored dictionary, read without a copy) keeps under ``subkey``, or None (a GIL-atomic
    lookup)."""
    if not isinstance(held, DictionaryDHTValue):
        return None
    try:
        return held.data.get(subkey)
    except TypeError:  # an unhashable subkey
        return None


def _digest(key: bytes, subkey: bytes, value: bytes, expiration: float) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in (key, subkey, value):
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    h.update(struct.pack(">d", expiration))
    return h.digest()


def _verified(self: DHTProtocol) -> cachetools.TTLCache:
    cache = self.__dict__.get("_verified_entries")
    if cache is None:
        cache = self.__dict__["_verified_entries"] = cachetools.TTLCache(VERIFIED_ENTRIES, VERIFIED_SECONDS)
    return cache


def check_store_items(self: DHTProtocol, items: Sequence[tuple], held: dict) -> list:
    """Decode and check the items of one store request (runs in the store worker thread of
    :func:`rpc_store_bounded`; ``self`` is the protocol, ``held`` maps each key's DHTID to the dictionary the node
    holds under it). Returns per item ``None`` (refused) or ``(entries to store, entries left out as held)``, each
    entry ``(subkey or None for a regular value, value, expiration)``.

    An entry whose subkey the node already holds with the same or a later expiration is left out unchecked: the
    storage would refuse it or already holds it (a replay of valid entries with an older expiration was checked and
    refused on every replay, an outside attack). An entry whose signature this node checked in the last
    :data:`VERIFIED_SECONDS` (the same key, subkey, value and expiration) is not checked again. What is left counts
    against :data:`MAX_STORE_ENTRIES` and is checked by the protocol's validators in order, each one that passes
    remembered; an item is refused at its first entry that fails (a whole dictionary with it, as in hivemind).

    :raises ValueError: more than :data:`MAX_STORE_ENTRIES` entries to check, or an item that does not decode
    """
    verified = _verified(self)
    decoded: list = []
    to_check = 0
    for key, tag, value_bytes, expiration, _in_cache in items:
        key_id = DHTID.from_bytes(key)
        if tag == self.IS_DICTIONARY:
            dictionary = self.serializer.loads(value_bytes)
            if not isinstance(dictionary, DictionaryDHTValue):
                raise ValueError("a DHT store of a whole dictionary carries another value")
            with dictionary.freeze():
                entries = [(k, v, e) for k, (v, e) in dictionary.items()]
            records = [(k, self.serializer.dumps(k), v, e) for k, v, e in entries]
        else:
            subkey = None if tag == self.IS_REGULAR_VALUE else self.serializer.loads(tag)
            records = [(subkey, tag, value_bytes, expiration)]
        keep, left_out, unchecked = [], [], []
        for subkey, subkey_bytes, value, exp in records:
            prior = _held(held.get(key_id), subkey) if subkey is not None else None
            if prior is not None and prior.expiration_time >= exp:
                left_out.append(prior.value == value and prior.expiration_time == exp)
                continue
            digest = _digest(key, subkey_bytes, value, exp)
            if digest not in verified:
                unchecked.append((subkey, subkey_bytes, value, exp, digest))
            keep.append((subkey, value, exp))
        to_check += len(unchecked)
        if to_check > MAX_STORE_ENTRIES:
            raise ValueError(f"a DHT store request of more than {MAX_STORE_ENTRIES} entries to check")
        decoded.append((key, tag, keep, left_out, unchecked))
    out: list = []
    for key, _tag, keep, left_out, unchecked in decoded:
        ok = True
        for _, subkey_bytes, value, exp, digest in unchecked:  # hivemind's check of each entry, stopping at the first
            if not self._validate_record(key, subkey_bytes, value, exp):  # that fails (which refuses its item)
                ok = False
                break
            verified[digest] = True  # a replay with one entry changed checks only that one
        out.append((keep, left_out) if ok else None)
    return out


def _store(storage: Any, key_id: DHTID, entries: list) -> list[bool]:
    regular = [storage.store(key_id, value, exp) for subkey, value, exp in entries if subkey is None]
    sub = [(subkey, value, exp) for subkey, value, exp in entries if subkey is not None]
    if hasattr(storage, "store_entries"):
        return regular + storage.store_entries(key_id, sub)
    return regular + [storage.store_subkey(key_id, subkey, value, exp) for subkey, value, exp in sub]


async def rpc_store_bounded(self: DHTProtocol, request: dht_pb2.StoreRequest, context: Any) -> dht_pb2.StoreResponse:
    """hivemind 1.1's store handler (``DHTProtocol.rpc_store``) with its records checked in one worker thread and
    bounded; registered for a running node's protocol by :func:`bound_request_handlers` (``self`` is the protocol).

    - Refused with :class:`ValueError` before anything is decoded: more than :data:`MAX_STORE_KEYS` keys, a key's
      whole dictionary twice in one request, a sender that already has a store waiting for the worker, or
      :data:`MAX_PENDING_STORES` stores waiting.
    - Decoding and signature checks run in one worker thread (not the DHT event loop, which keeps answering pings
      and find requests); entries already held with the same or a later expiration, or checked in the last
      :data:`VERIFIED_SECONDS`, are not checked again, and at most :data:`MAX_STORE_ENTRIES` are checked a request
      (:func:`check_store_items`). Outside attacks: one store of 24 whole dictionaries of 1,000 fresh signed
      entries (4 MB, under every per-key bound), replayed, took a loaded node 3.3 s of signature checks in its event
      loop each (pings 1 of 20 with four in flight; its watchdog restarted the DHT); then, on the first version of
      this handler, valid entries replayed with an older expiration were checked on every replay, and their storing
      cost O(entries^2) in the loop (pings 6 of 20).
    - What passes is stored on the event loop, one key's entries at a time (``KeyCappedStorage.store_entries``).

    :raises ValueError: a request over the bounds above, or whose fields differ in length or do not decode
    """
    n_keys = len(request.keys)
    sender = context.remote_id
    if n_keys > MAX_STORE_KEYS:
        raise ValueError(f"a DHT store request from {sender} carries {n_keys} keys (at most {MAX_STORE_KEYS})")
    if not (n_keys == len(request.subkeys) == len(request.values) == len(request.expiration_time)
            == len(request.in_cache)):
        raise ValueError(f"a DHT store request from {sender} has fields of different lengths")
    whole = [key for key, tag in zip(request.keys, request.subkeys) if tag == self.IS_DICTIONARY]
    if len(set(whole)) < len(whole):
        raise ValueError(f"a DHT store request from {sender} carries a key's whole dictionary twice")
    pending = self.__dict__.setdefault("_stores_pending", {})
    if sender in pending or len(pending) >= MAX_PENDING_STORES:
        raise ValueError(f"a DHT store request from {sender} refused: {len(pending)} stores are being checked"
                         f"{' (one of them its own)' if sender in pending else ''}")
    if request.peer:  # as hivemind: the sender joins the routing table once it answers a ping
        asyncio.create_task(self.rpc_ping(dht_pb2.PingRequest(peer=request.peer), context))
    items = list(zip(request.keys, request.subkeys, request.values, request.expiration_time, request.in_cache))
    held = {}
    for key in {item[0] for item in items}:
        key_id = DHTID.from_bytes(key)
        stored = TimedStorage.get(self.storage, key_id)  # the stored object, not KeyCappedStorage.get's copy
        held[key_id] = stored.value if stored is not None else None
    pending[sender] = True
    job = asyncio.get_running_loop().run_in_executor(_worker(self, "dht-store-check"), check_store_items, self, items, held)
    job.add_done_callback(lambda _job: pending.pop(sender, None))  # the slot is free once the check is done
    try:
        checked = await asyncio.shield(job)
    except asyncio.CancelledError:  # the sender gave up: end as an error (a cancelled handler task stays in
        raise ValueError(f"a DHT store request from {sender} was cancelled") from None  # hivemind's table)
    response = dht_pb2.StoreResponse(store_ok=[], peer=self.node_info)
    for (key, _tag, _value, _expiration, in_cache), result in zip(items, checked):
        if result is None:
            response.store_ok.append(False)
            continue
        keep, left_out = result
        stored = _store(self.cache if in_cache else self.storage, DHTID.from_bytes(key), keep)
        response.store_ok.append(all(stored) and all(left_out))
    return response


class _ForgetfulTasks(dict):
    """hivemind's table of running handler tasks, each removed once its task is done, however it ends."""

    def __setitem__(self, call_id: Any, task: Any) -> None:
        super().__setitem__(call_id, task)
        task.add_done_callback(lambda _task, call_id=call_id: self.pop(call_id, None))


def release_finished_handlers(p2p: Any) -> None:
    """Make hivemind's p2pd control client forget a request handler's task however the task ends.

    hivemind 1.1.12 (``ControlClient._handle_persistent_request``) removes a handler's task from its table only when
    the handler returns; a call its sender cancels (p2pd's ``cancel``) stays there with its request bytes, also
    when the cancel comes before the task has started: outside attacks cancelling pre-signed 1,024-entry stores
    after 10 ms grew a node from 240 MB to 1,096 MB in 30 s, and 3 MB stores to 1,657 MB. Here the table removes
    each task when it is done (a done callback, which runs for a task cancelled before it started). Replaces the
    running client's table (no hook exists); a hivemind upgrade must be checked against it. Runs in the DHT
    process."""
    control = p2p._client.control
    control._handler_tasks = _ForgetfulTasks(control._handler_tasks)


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
    release_finished_handlers(protocol.p2p)
    protocol.rpc_find = types.MethodType(rpc_find_bounded, protocol)
    protocol.rpc_store = types.MethodType(rpc_store_bounded, protocol)
    wrapper = AuthRPCWrapper(protocol, AuthRole.SERVICER, protocol.authorizer)
    for name, request_type in (("rpc_find", dht_pb2.FindRequest), ("rpc_store", dht_pb2.StoreRequest)):
        handle = DHTProtocol._get_handle_name(None, name)
        await protocol.p2p.remove_protobuf_handler(handle)
        await protocol.p2p.add_protobuf_handler(handle, getattr(wrapper, name), request_type)
