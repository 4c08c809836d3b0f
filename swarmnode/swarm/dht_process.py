"""The DHT's child processes: a hivemind DHT process that dies with the node, its p2pd, and talking to them.

``hivemind.DHT`` forks a child process that starts a go-libp2p daemon (``p2pd``). :class:`NodeBoundDHT` makes both
end with the node (parent-death signal, parent watch, no inherited listening sockets, own process group);
:func:`pipe_room` measures the request pipe before a write (a hung process must not block its caller);
:mod:`~swarmnode.swarm.result_channel` keeps the pipe its results come back on working when a process dies;
:func:`stop_dht_process` stops a process and cleans up after it. The coroutines :func:`startup_info`,
:func:`health_info`, :func:`read_visible_maddrs` and :func:`join_peers` run *inside* the DHT process
(``DHT.run_coroutine``). :class:`~swarmnode.swarm.dht_host.DHTHost` uses all of them.
:func:`harden_dht_node` installs :class:`KeyCappedStorage`, :class:`NoCache`, :func:`update_routing_table_chunked`,
:func:`validate_dictionary_bounded` and :func:`call_find_off_loop` in a running node: they bound what one key may
hold in this node's storage and what one reply may cost it (a flood of fresh keys past hivemind's 4 MiB reply cap
would otherwise fail every reply for that key and, with it, empty the routing tables of the nodes that ask).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import logging
import math
import os
import signal
import struct
import threading
import time
import types
from typing import Any, Sequence

from hivemind.dht import DHT, DHTNode
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.utils.timed_storage import TimedStorage, ValueWithExpiration
from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarmnode.swarm import result_channel
from swarmnode.swarm.dht_reply import (MAX_DICTIONARY_ENTRIES, MAX_STORE_ENTRIES, MAX_STORE_KEYS, SIZE_ATTRIBUTE,
                                      BoundedSerializer, TokenBucket, bound_request_handlers, call_find_off_loop)

__all__ = [
    "DEFAULT_MAX_KEY_BYTES",
    "KeyCappedStorage",
    "NoCache",
    "PARENT_WATCH_INTERVAL",
    "harden_dht_node",
    "split_handover",
    "update_routing_table_chunked",
    "validate_dictionary_bounded",
    "REQUEST_OVERHEAD",
    "NodeBoundDHT",
    "health_info",
    "join_peers",
    "pipe_room",
    "read_visible_maddrs",
    "startup_info",
    "stop_dht_process",
]

log = logging.getLogger("swarmnode.swarm.dht")  # all of the DHT's log lines under one name

try:  # Linux/macOS: measure the free space of the request pipe before writing to it
    import fcntl
    import termios
except ImportError:  # pragma: no cover - hivemind itself needs a Unix
    fcntl = termios = None  # type: ignore[assignment]
_F_GETPIPE_SZ = 1032  # Linux fcntl command; elsewhere the check is skipped
REQUEST_OVERHEAD = 2048  # bytes of a pickled request besides its value (method name, key, MPFuture)
#: Bytes one key's dictionary may hold in our storage (:class:`KeyCappedStorage`): 1 MiB under hivemind's 4 MiB
#: message cap, for the reply's other fields (nearest peers, expirations) and msgpack framing.
DEFAULT_MAX_KEY_BYTES = 3 * 1024 * 1024
ENTRY_OVERHEAD = 32  # bytes counted per dictionary entry besides its subkey and value (expiration, framing)
#: Entries one key's dictionary may hold (:class:`KeyCappedStorage`): every reader checks every entry's signature
#: in its DHT event loop, and 11,000 one-byte entries under the byte budget made a find take 7 s. A decoded
#: reply holds no longer array either (:class:`~swarmnode.swarm.dht_reply.BoundedSerializer`).
MAX_KEY_ENTRIES = MAX_DICTIONARY_ENTRIES


def pipe_room(dht: DHT) -> int | None:
    """Free bytes in the DHT's request pipe, or None when this OS cannot tell.

    ``DHT.store/get/run_coroutine`` write a pickled request into an ``mp.Pipe`` the DHT process reads from
    its event loop. If that process hangs, the pipe fills up and the next write blocks forever; checking the
    room first turns that into a bounded failure (rl-swarm #77 #102 saw the pipe errors of a sick DHT).
    """
    if fcntl is None:
        return None
    try:
        fd = dht._outer_pipe.fileno()
        unread = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        return fcntl.fcntl(fd, _F_GETPIPE_SZ) - unread
    except (OSError, ValueError, AttributeError):
        return None


# --------------------------------------------------------------------------- child processes
# The DHT runs in a forked child that starts p2pd. Both must end with the node: ``kill -9`` of the node (or
# the OOM killer) must not leave them holding the node's status port, its p2p identity or ~400 MB.
# * p2pd gets PR_SET_PDEATHSIG(SIGKILL): the kernel kills it when the DHT child (its parent) dies.
# * The DHT child watches its parent (``os.getppid()``) and exits when it changes (a parent-death signal
#   would be wrong here: it fires when the *thread* that forked the child ends, and restarts fork from
#   short-lived threads).
# * The DHT child closes the listening sockets it inherited by fork (the status server's port).
# * ``pid_file`` records both children (pid + start time); a node starting in the same run directory ends
#   the ones a killed predecessor left behind, by that record and never by process name.
_PR_SET_PDEATHSIG = 1
PARENT_WATCH_INTERVAL = 0.5  # seconds between the DHT child's checks that its parent still lives


def _libc_prctl():
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return None


_PRCTL = _libc_prctl() if os.name == "posix" and os.uname().sysname == "Linux" else None


def _die_with_parent() -> None:
    """``preexec_fn`` of p2pd: SIGKILL it when its parent (the DHT child) dies (Linux; elsewhere a no-op)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _close_inherited_listeners() -> int:
    """Close every listening socket this (just forked) process inherited; returns how many were closed."""
    import socket as _socket

    closed = 0
    try:
        fds = [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:  # pragma: no cover - no /proc
        return 0
    for fd in fds:
        if fd <= 2:
            continue
        try:
            if not _socket_is_listening(_socket, fd):
                continue
            os.close(fd)
            closed += 1
        except OSError:
            continue
    return closed


def _socket_is_listening(_socket: Any, fd: int) -> bool:
    import stat

    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        return False
    s = _socket.socket(fileno=fd)
    try:
        return bool(s.getsockopt(_socket.SOL_SOCKET, _socket.SO_ACCEPTCONN))
    finally:
        s.detach()


def _watch_parent(parent_pid: int, interval: float = PARENT_WATCH_INTERVAL) -> None:
    """Daemon thread of the DHT child: exit the process (p2pd follows by its death signal) once the parent is gone."""

    def loop() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=loop, name="swarm-dht-parent-watch", daemon=True).start()


class NodeBoundDHT(DHT):
    """``hivemind.DHT`` whose child process dies with the node, holds none of its sockets, and whose p2pd
    dies with it (see the comment above :data:`PARENT_WATCH_INTERVAL`). Creating one installs
    :func:`swarmnode.swarm.result_channel.install` first (the child must inherit its lock).

    :raises OSError: when the result channel's lock file cannot be created
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        result_channel.install()
        super().__init__(*args, **kwargs)

    def run(self) -> None:  # runs in the forked child
        try:  # own process group: a terminal's Ctrl-C (or a killpg of the node) reaches the node alone, which
            os.setpgid(0, 0)  # then stops its DHT in order instead of losing p2pd under it mid-step
        except OSError:  # pragma: no cover
            pass
        _close_inherited_listeners()
        _watch_parent(os.getppid() if self._parent_pid is None else self._parent_pid)
        real = asyncio.create_subprocess_exec

        async def exec_bound(*args: Any, **kwargs: Any):
            kwargs.setdefault("preexec_fn", _die_with_parent)
            kwargs.setdefault("start_new_session", True)  # p2pd: no terminal signals either
            return await real(*args, **kwargs)

        asyncio.create_subprocess_exec = exec_bound  # this process is the DHT's alone: only p2pd is started here
        asyncio.subprocess.create_subprocess_exec = exec_bound
        super().run()

    def shutdown(self) -> None:
        """Ask the DHT process to stop, wait ``shutdown_timeout`` s, then terminate it (logged at INFO: on a
        loaded machine a slow stop is normal, not an error)."""
        if self.is_alive():
            try:
                self._outer_pipe.send(("_shutdown", [], {}))
                self._outer_pipe.close()
            except (OSError, ValueError):
                pass
            self.join(self.shutdown_timeout)
            if self.is_alive():
                log.info("the DHT process did not stop within %.0f s; terminating it", self.shutdown_timeout)
                self.terminate()

    _parent_pid: int | None = None


# --------------------------------------------------------------------------- bounded storage
def _entry_bytes(subkey: Any, value: Any) -> int:
    sub = len(subkey) if isinstance(subkey, (bytes, str)) else 16
    return sub + (len(value) if isinstance(value, (bytes, bytearray)) else 0) + ENTRY_OVERHEAD


def dictionary_bytes(value: DictionaryDHTValue) -> int:
    """Bytes a dictionary value counts against :attr:`KeyCappedStorage.max_key_bytes` (its live entries'
    subkeys and values plus :data:`ENTRY_OVERHEAD` each)."""
    return sum(_entry_bytes(k, v) for k, (v, _) in value.items())


def compact_heap(storage: TimedStorage) -> None:
    """Drop a :class:`TimedStorage`'s stale expiration-heap entries once they outnumber its live ones.

    hivemind pushes one heap entry per store and drops it only when its expiration passes, so re-storing one
    subkey with a later expiration again and again grows the heap while the data stays the same size (an outside
    attack: 1,024 owners re-storing one key 1 ms later each time left a key of 1,033 entries with 409,395 heap
    entries, +127 MB in 75 s). Amortized O(1) a store."""
    if len(storage.expiration_heap) > 2 * len(storage.data) + 64:
        storage.expiration_heap = [storage.key_to_heap[k] for k in storage.data if k in storage.key_to_heap]
        heapq.heapify(storage.expiration_heap)
        storage.key_to_heap = {e.key: e for e in storage.expiration_heap}


class KeyCappedStorage(DHTLocalStorage):
    """hivemind's local DHT storage with a byte budget per key (the class of a running node's ``storage`` once
    :func:`harden_dht_node` ran; its ``cache`` becomes a :class:`NoCache`).

    hivemind answers a find request with a key's whole dictionary, and a reply over its 4 MiB message cap fails:
    the asker gets nothing from this replica *and removes it from its routing table*
    (``DHTProtocol.update_routing_table(responded=False)``). Anyone can add an entry to a shared key (a manifest
    bucket, the heartbeats) under a fresh signing key, so 1,000 free keys of 5 KB each made every replica's reply
    fail, emptied the routing tables of the nodes that read or stored that key, and left a reader unable to reach
    even the publisher keys of the peers it knew (docs/guide/swarm.md, trust table). Here a **new** subkey is
    refused once the key's dictionary would hold more than :attr:`max_key_bytes` (:func:`dictionary_bytes`) or
    more than :attr:`max_key_entries` entries (many tiny entries cost every reader a signature check each); a
    subkey already held may be replaced within the budget (an owner re-publishing its record); a whole dictionary
    over the budget is not stored. Expired entries do not count. Regular (non-dictionary) values are hivemind's as
    before; our validators refuse them under our keys anyway.

    :meth:`get` returns a **copy** of a dictionary value: hivemind's own reads (``DHTNode.get``) start their
    search from the stored dictionary object and merge every other replica's entries into it, which grew an
    honest node's storage past the budget without passing through :meth:`store_subkey` (an outside attack: one
    read took a node from 3.1 MB to 6.7 MB a key, after which its replies failed). :meth:`store_subkey` works on
    the stored object itself.

    The budget is first come, first served: a flood that arrives first fills a shared key and later entries are
    refused until its entries expire. Known publishers are read from their own keys
    (:meth:`swarmnode.swarm.dht.SwarmDHT.read_publishers`), which only their owner can write.
    """

    max_key_bytes: int = DEFAULT_MAX_KEY_BYTES
    max_key_entries: int = MAX_KEY_ENTRIES

    def get(self, key: Any) -> ValueWithExpiration | None:
        item = TimedStorage.get(self, key)
        if item is None or not isinstance(item.value, DictionaryDHTValue):
            return item
        copy = DictionaryDHTValue()
        for subkey, (value, expiration) in item.value.items():
            copy.store(subkey, value, expiration)
        copy.latest_expiration_time = item.value.latest_expiration_time
        return ValueWithExpiration(copy, item.expiration_time)

    def store(self, key: Any, value: Any, expiration_time: float, subkey: Any = None) -> bool:
        if subkey is not None:
            return self.store_subkey(key, subkey, value, expiration_time)
        if isinstance(value, DictionaryDHTValue) and dictionary_bytes(value) > self.max_key_bytes:
            return False
        return TimedStorage.store(self, key, value, expiration_time)

    def store_subkey(self, key: Any, subkey: Any, value: Any, expiration_time: float) -> bool:
        """hivemind's ``DHTLocalStorage.store_subkey`` on the stored object (not :meth:`get`'s copy), refusing
        what would take the key's dictionary past :attr:`max_key_bytes`."""
        current = TimedStorage.get(self, key)
        previous, previous_expiration = current if current is not None else (b"", -math.inf)
        if isinstance(previous, DictionaryDHTValue):
            held = previous.get(subkey)
            if held is None and len(previous) >= self.max_key_entries:
                return False
            total = dictionary_bytes(previous) + _entry_bytes(subkey, value)
            if held is not None:
                total -= _entry_bytes(subkey, held.value)
            if total > self.max_key_bytes:
                return False
            if expiration_time > previous.latest_expiration_time:
                TimedStorage.store(self, key, previous, expiration_time)  # refresh the key's expiration
                compact_heap(self)
            stored = previous.store(subkey, value, expiration_time)
            previous.__dict__.pop(SIZE_ATTRIBUTE, None)  # its find-reply size estimate (dht_reply._value_size)
            compact_heap(previous)
            return stored
        if _entry_bytes(subkey, value) > self.max_key_bytes:
            return False
        if isinstance(previous, bytes) and expiration_time > previous_expiration:
            new = DictionaryDHTValue()
            new.store(subkey, value, expiration_time)
            return TimedStorage.store(self, key, new, new.latest_expiration_time)
        return False


    def store_entries(self, key: Any, entries: Sequence[tuple[Any, Any, float]]) -> list[bool]:
        """:meth:`store_subkey` for several ``(subkey, value, expiration)`` entries of one key, in order, with the
        key's byte total computed once and then kept up to date (:meth:`store_subkey` recomputes it over the whole
        dictionary for every entry: a store of 1,024 entries cost the event loop 0.43 s, an outside attack).
        Returns per entry whether it was stored."""
        results: list[bool] = []
        total: int | None = None
        for subkey, value, expiration in entries:
            current = TimedStorage.get(self, key)
            previous = current.value if current is not None else None
            if not isinstance(previous, DictionaryDHTValue):
                results.append(self.store_subkey(key, subkey, value, expiration))
                total = None
                continue
            if total is None:
                total = dictionary_bytes(previous)
            held = previous.get(subkey)
            if held is None and len(previous) >= self.max_key_entries:
                results.append(False)
                continue
            new_total = total + _entry_bytes(subkey, value) - (_entry_bytes(subkey, held.value) if held else 0)
            if new_total > self.max_key_bytes:
                results.append(False)
                continue
            if expiration > previous.latest_expiration_time:
                TimedStorage.store(self, key, previous, expiration)  # refresh the key's expiration
            stored = previous.store(subkey, value, expiration)
            previous.__dict__.pop(SIZE_ATTRIBUTE, None)
            if stored:
                total = new_total
            results.append(stored)
        compact_heap(self)
        current = TimedStorage.get(self, key)
        if current is not None and isinstance(current.value, DictionaryDHTValue):
            compact_heap(current.value)
        return results


class NoCache(DHTLocalStorage):
    """A DHT cache that keeps nothing (the class of a running node's ``cache`` once :func:`harden_dht_node` ran).

    hivemind answers a find with the storage's value *or* the cache's, whichever expires later, never both; and
    anyone may store into a node's cache (``call_store(in_cache=True)``). One cached entry per key expiring later
    than the honest ones hid every honest manifest and heartbeat of that key from every reader (an outside
    attack). Our reads ask every replica anyway (``latest=True``), so nothing is cached: every store is refused."""

    def store(self, key: Any, value: Any, expiration_time: float, subkey: Any = None) -> bool:
        return False

    def store_subkey(self, key: Any, subkey: Any, value: Any, expiration_time: float) -> bool:
        return False

    def store_entries(self, key: Any, entries: Sequence[tuple[Any, Any, float]]) -> list[bool]:
        return [False] * len(entries)


HANDOVER_BYTES = 1024 * 1024  # bytes of one store of the hand-over to a newly met node (update_routing_table_chunked)


def _value_bytes(value: Any) -> int:
    return dictionary_bytes(value) if isinstance(value, DictionaryDHTValue) else len(value) + ENTRY_OVERHEAD


def split_handover(items: Sequence[tuple[Any, Any, float]], max_bytes: int = HANDOVER_BYTES,
                   max_items: int = MAX_STORE_KEYS,
                   max_entries: int = MAX_STORE_ENTRIES) -> list[list[tuple[Any, Any, float]]]:
    """Split ``(key, value, expiration)`` items into batches of at most ``max_bytes`` (:func:`dictionary_bytes`
    for a dictionary value), ``max_items`` keys and ``max_entries`` entries (a dictionary's entries, 1 for a regular
    value): what a peer's store handler takes (:data:`~swarmnode.swarm.dht_reply.MAX_STORE_KEYS`,
    :data:`~swarmnode.swarm.dht_reply.MAX_STORE_ENTRIES`). An item over a bound goes alone; order is kept."""
    batches: list[list[tuple[Any, Any, float]]] = []
    size = entries = max_bytes + 1
    for item in items:
        n = _value_bytes(item[1])
        k = len(item[1]) if isinstance(item[1], DictionaryDHTValue) else 1
        if size + n > max_bytes or entries + k > max_entries or len(batches[-1]) >= max_items:
            batches.append([])
            size = entries = 0
        batches[-1].append(item)
        size += n
        entries += k
    return batches


HANDOVER_EVERY_S = 60.0  # a peer id gets the hand-over at most once in this many seconds
MAX_HANDOVER_PEERS = 4096  # peer ids whose last hand-over is remembered
#: hand-over bytes to all newly met peers together, per second and at most at once (a token bucket); batches past it
#: are not sent (the keys' owners re-publish them). Every new peer id used to get the node's whole storage: 8 free
#: ids took a node storing 16 full keys to 8 x 48 MB of queued stores, behind which its pings waited for 15 s+
HANDOVER_BYTES_PER_SECOND = 2 * 1024 * 1024
HANDOVER_BYTES_BURST = 8 * 1024 * 1024


async def _send_handover(self: DHTProtocol, peer_id: Any, batches: list) -> None:
    """Send hand-over batches one store at a time, one hand-over of the node at a time (so at most one hand-over
    store waits in the node's queue to p2pd: its pings and replies wait behind at most that); stops at a failure."""
    lock = self.__dict__.get("_handover_lock")
    if lock is None:
        lock = self.__dict__["_handover_lock"] = asyncio.Lock()
    async with lock:
        for batch in batches:
            keys, values, expirations = zip(*batch)
            try:
                if not await self.call_store(peer_id, keys, values, expirations, in_cache=False):
                    return
            except Exception:  # noqa: BLE001 - as hivemind's fire-and-forget store: the peer is judged elsewhere
                return


async def update_routing_table_chunked(self: DHTProtocol, node_id: Any, peer_id: Any, responded: bool = True) -> None:
    """hivemind's ``DHTProtocol.update_routing_table`` with the hand-over to a newly met node split into stores of
    at most :data:`HANDOVER_BYTES` and sent to one peer id at most once per :data:`HANDOVER_EVERY_S`, within
    :data:`HANDOVER_BYTES_PER_SECOND` for all peers together, one store at a time (bound to a running node's protocol
    by :func:`harden_dht_node`; ``self`` is that protocol).

    When a node meets a peer it did not have in its routing table, hivemind sends that peer every stored key the
    peer should now replicate in **one** store; past the 4 MiB message cap that store fails, and a failed call
    removes the peer from the routing table again. Free keys each storing one 60 KB record under their own
    publisher key (1,000 of them, every one under the key budget) kept a newly joined honest node out of its
    neighbours' routing tables (in 1 of 12 and 0 of 12 samples; an outside attack). And since every request
    carries a node id its sender chooses, a peer sending pings with fresh node ids made a node repeat the
    hand-over each time (50 pings of ~100 B: 44 MB sent back). Which keys go is hivemind 1.1's rule."""
    node_id = node_id if node_id is not None else self.routing_table.get(peer_id=peer_id)
    if not responded or node_id is None or node_id in self.routing_table:
        return await DHTProtocol.update_routing_table(self, node_id, peer_id, responded)
    recent = self.__dict__.setdefault("_handovers", collections.OrderedDict())
    now = time.monotonic()
    if recent.get(peer_id) is None or now - recent[peer_id] >= HANDOVER_EVERY_S:
        recent[peer_id] = now
        recent.move_to_end(peer_id)
        while len(recent) > MAX_HANDOVER_PEERS:
            recent.popitem(last=False)
        data_to_send = []  # keys the new node should store and we are responsible for
        for key, item in list(self.storage.items()):
            neighbors = self.routing_table.get_nearest_neighbors(key, self.num_replicas, exclude=self.node_id)
            if neighbors:
                new_node_should_store = node_id.xor_distance(key) < neighbors[-1][0].xor_distance(key)
                this_node_is_responsible = self.node_id.xor_distance(key) < neighbors[0][0].xor_distance(key)
            if not neighbors or (new_node_should_store and this_node_is_responsible):
                data_to_send.append((key, item.value, item.expiration_time))
        bucket = self.__dict__.get("_handover_bytes")
        if bucket is None:
            bucket = self.__dict__["_handover_bytes"] = TokenBucket(HANDOVER_BYTES_PER_SECOND, HANDOVER_BYTES_BURST)
        bucket.refill(now)
        send = []
        for batch in split_handover(data_to_send):
            size = sum(_value_bytes(value) for _, value, _ in batch)
            if size > bucket.tokens:
                break
            bucket.tokens -= size
            send.append(batch)
        if send:
            asyncio.create_task(_send_handover(self, peer_id, send))
    maybe_node_to_ping = self.routing_table.add_or_update_node(node_id, peer_id)
    if maybe_node_to_ping is not None:  # table full: check the least recently seen node (Kademlia 2.2)
        asyncio.create_task(self.call_ping(maybe_node_to_ping[1]))


def validate_dictionary_bounded(self: DHTProtocol, key_bytes: bytes, dictionary: DictionaryDHTValue) -> bool:
    """hivemind's ``DHTProtocol._validate_dictionary`` (every entry's record checked by our validator), refusing
    first, without checking a signature, a dictionary over our storage's per-key budget
    (:attr:`KeyCappedStorage.max_key_entries` entries or :attr:`KeyCappedStorage.max_key_bytes`); bound to a
    running node's protocol by :func:`harden_dht_node`; ``self`` is that protocol. It judges find replies and
    whole-dictionary stores: an attacker's own replica answering with 20,000 signed one-byte entries made every
    reader check 20,000 signatures in its DHT event loop (heartbeat reads timed out, pings to the reader failed and
    an honest node left a routing table; an outside attack). Such a reply counts as "not found" at that peer."""
    storage = self.storage
    limit_entries = getattr(storage, "max_key_entries", MAX_KEY_ENTRIES)
    limit_bytes = getattr(storage, "max_key_bytes", DEFAULT_MAX_KEY_BYTES)
    with dictionary.freeze():
        if len(dictionary.data) > limit_entries or dictionary_bytes(dictionary) > limit_bytes:
            return False
    return DHTProtocol._validate_dictionary(self, key_bytes, dictionary)


# --------------------------------------------------------------------------- helpers (picklable coroutines)
async def harden_dht_node(_dht: DHT, node: DHTNode, max_key_bytes: int) -> int:
    """Runs inside the DHT process: make the node's storage a :class:`KeyCappedStorage` with a budget of
    ``max_key_bytes`` per key (its entries are kept), its cache a :class:`NoCache` (emptied; and the node caches
    nothing after a read, here nor at the nearest nodes: hivemind pushed a read's merged dictionary, over 4 MiB
    after a flood, to one nearby node, the call failed and that honest node left the reader's routing table), and
    its protocol's ``update_routing_table`` :func:`update_routing_table_chunked`, ``_validate_dictionary``
    :func:`validate_dictionary_bounded`, ``call_find`` :func:`~swarmnode.swarm.dht_reply.call_find_off_loop` and
    ``serializer`` :class:`~swarmnode.swarm.dht_reply.BoundedSerializer` (which also decodes stores and the values
    of a finished read; the protocol's class, under whose name its RPC handlers are registered, stays
    hivemind's), and serves find and store requests by the bounded handlers of
    :func:`~swarmnode.swarm.dht_reply.bound_request_handlers` (at most 64 keys a find, 3.5 MiB of values a
    reply; at most 256 keys and 1,024 entries not already held a store, checked off the event loop). Returns the budget.

    The last three restate hivemind 1.1's code in order to change one part of it (hivemind has no hook there):
    a hivemind upgrade must be checked against them."""
    node.protocol.storage.__class__ = KeyCappedStorage
    node.protocol.storage.max_key_bytes = int(max_key_bytes)
    node.protocol.cache.clear()
    node.protocol.cache.__class__ = NoCache
    node.cache_locally, node.cache_nearest, node.cache_on_store = False, 0, False
    node.protocol.update_routing_table = types.MethodType(update_routing_table_chunked, node.protocol)
    node.protocol._validate_dictionary = types.MethodType(validate_dictionary_bounded, node.protocol)
    node.protocol.call_find = types.MethodType(call_find_off_loop, node.protocol)
    node.protocol.serializer = BoundedSerializer
    await bound_request_handlers(node.protocol)
    return int(max_key_bytes)


async def startup_info(_dht: DHT, node: DHTNode) -> dict:
    """Runs inside the DHT process: identity and daemon facts needed by the host process."""
    p2p = node.p2p
    child = getattr(p2p, "_child", None)
    try:
        maddrs = [str(m) for m in await node.get_visible_maddrs(latest=False)]
    except Exception:  # noqa: BLE001 - a daemon without addresses still works for outgoing calls
        maddrs = []
    return {
        "peer_id": node.peer_id.to_base58(),
        "daemon_listen_maddr": str(p2p.daemon_listen_maddr),
        "p2pd_pid": child.pid if child is not None else None,
        "maddrs": maddrs,
    }


async def health_info(_dht: DHT, node: DHTNode) -> dict:
    """Runs inside the DHT process: routing-table size and whether p2pd is still running."""
    child = getattr(node.p2p, "_child", None)
    p2pd_alive = child is None or child.returncode is None
    return {"num_peers": len(node.protocol.routing_table.uid_to_peer_id), "p2pd_alive": p2pd_alive}


async def read_visible_maddrs(_dht: DHT, node: DHTNode, latest: bool) -> list[str]:
    """Runs inside the DHT process: the multiaddrs (with ``/p2p/<peer id>``) other peers can dial."""
    return [str(m) for m in await node.get_visible_maddrs(latest=latest)]


async def join_peers(_dht: DHT, node: DHTNode, maddrs: list[str], timeout: float) -> int:
    """Runs inside the DHT process: connect to, ping and look ourselves up through ``maddrs``.

    Mirrors the three bootstrap stages of ``DHTNode.create`` (hivemind 1.1.12 ``dht/node.py``). Returns
    how many of the peers answered the DHT ping.
    """
    by_peer: dict[str, list[Multiaddr]] = {}
    for text in maddrs:
        maddr = Multiaddr(text)
        peer = maddr["p2p"]
        by_peer.setdefault(peer, []).append(maddr.decapsulate(Multiaddr(f"/p2p/{peer}")))

    async def one(peer_b58: str, addrs: list[Multiaddr]):
        peer_id = PeerID.from_base58(peer_b58)
        if peer_id == node.peer_id:
            return None
        try:
            await asyncio.wait_for(node.p2p._client.connect(peer_id, addrs), timeout)
        except Exception:  # noqa: BLE001 - unreachable peer
            return None
        return await node.protocol.call_ping(peer_id)

    results = await asyncio.gather(*(one(p, a) for p, a in by_peer.items()), return_exceptions=True)
    answered = sum(1 for r in results if r is not None and not isinstance(r, BaseException))
    if answered:
        try:
            await asyncio.wait_for(node.find_nearest_nodes([node.node_id]), timeout)
        except Exception:  # noqa: BLE001 - the routing table already holds the pinged peers
            pass
    return answered


def stop_dht_process(dht: DHT | None, info: dict, graceful: bool = True) -> None:
    """Stop a DHT process and what it leaves behind: its p2pd (when orphaned) and p2pd's control socket file.

    :param dht: the process (None: nothing to do)
    :param info: its :func:`startup_info` (``p2pd_pid``, ``daemon_listen_maddr``), or ``{}`` when unknown
    :param graceful: ask it to shut down first (skipped when its request pipe is full: that write would block);
        then SIGTERM, then SIGKILL. After a process that did not exit cleanly, results travel through a fresh
        pipe (:func:`~swarmnode.swarm.result_channel.after_unclean_exit`: it may have left half a message).
        Never raises.
    """
    if dht is None:
        return
    clean = False
    try:
        room = pipe_room(dht)
        if graceful and dht.is_alive() and (room is None or room >= 4096):
            dht.shutdown()  # graceful (never blocks on a full pipe), then SIGTERM after shutdown_timeout
            clean = dht.exitcode == 0
        if dht.is_alive():
            dht.terminate()
            dht.join(1)
        if dht.is_alive():
            dht.kill()
            dht.join(5)
    except Exception as e:  # noqa: BLE001
        log.debug("error while stopping the DHT process: %s", e)
    if not clean:  # it died, hung or was killed: it may have left half a message in the result pipe
        result_channel.after_unclean_exit()
    # p2pd normally exits with its parent; make sure an orphan does not keep the port
    pid, sock = info.get("p2pd_pid"), info.get("daemon_listen_maddr", "")
    if pid:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            if b"p2pd" in cmdline and sock.split("/unix")[-1].encode() in cmdline:
                os.kill(pid, signal.SIGTERM)
        except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
            pass
    # a killed DHT process cannot remove its daemon's control socket file; do it for it
    if sock.startswith("/unix/"):
        path = sock[len("/unix"):]
        if os.path.basename(path).startswith("hivemind-p2pd-"):
            try:
                os.remove(path)
            except OSError:
                pass
