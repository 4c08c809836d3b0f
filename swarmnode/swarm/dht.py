"""The swarm's DHT: signed, time-bucketed manifest and heartbeat records on a hivemind DHT.

:class:`SwarmDHT` wraps ``hivemind.DHT`` (a Kademlia DHT running in a forked child process that owns a
go-libp2p daemon, ``p2pd``) and survives the failures public bug reports describe (docs/reference/design.md §7,
docs/reference/references.md §4.4 and §6.1):

* **Bootstrap failure never crashes the node.** ``p2pd`` itself refuses to start when none of its
  bootstrap peers answers (``Daemon failed to start: ... failed to connect to bootstrap peers``, hivemind
  #657), whatever ``ensure_bootstrap_success`` says. So the DHT first starts with ``initial_peers``; if
  that fails it starts solo (no bootstrap), logs a loud warning, and a background watchdog keeps trying
  to join the initial peers with exponential backoff (connect + ping + self-lookup, the same three steps
  ``DHTNode.create`` performs). Several initial peers are allowed; one reachable peer is enough.
* **Every DHT call is bounded** (``return_future=True`` + ``result(timeout)``): a DHT with zero peers or a
  dead child process returns "no data" (None / empty list / False) instead of hanging (hivemind #71).
  ``get`` returning None is "no data" (rl-swarm #471).
* **Watchdog + restart.** A background thread checks every ``health_interval`` seconds that the DHT
  process is alive, answers a bounded call, and that its ``p2pd`` child is alive; two consecutive
  failures (or a dead process) trigger :meth:`SwarmDHT.restart` (rl-swarm #77 #102 #98). Restart
  callbacks let the bundle transport re-attach to the new daemon.
* **Hung or killed DHT processes.** Requests are written into the DHT's pipe only when it has room (a
  hung process would otherwise block the caller for ever). Results come back through hivemind's MPFuture
  pipe under a lock the kernel releases when its holder dies, and a pipe that a dying process left
  misframed is replaced (:mod:`~swarmnode.swarm.result_channel`); before, a process killed while holding
  hivemind's lock made every later DHT process hang at start-up, and replacing that lock let two processes
  write one pipe at once (``UnpicklingError``, then no DHT call of the node answered again).
* **Addresses are cached**: :meth:`SwarmDHT.visible_maddrs` asks the daemon at most once per
  ``maddrs_refresh_interval`` seconds (rl-swarm #489).
* **Records.** Manifests live under ``f"{swarm_id}:manifests:{bucket}"`` and heartbeats under
  ``f"{swarm_id}:heartbeats"``, one owner-marked subkey per publisher, signed by
  :class:`~swarmnode.swarm.validator.Ed25519RecordValidator`. A re-publish replaces our own entry (later
  expiration wins within a subkey). Reads use ``latest=True`` (subkey dictionaries are merged across
  replicas) and validate every entry again, dropping bad entries one by one (hivemind drops a whole
  dictionary when a single subkey is invalid, docs/reference/references.md §4.4).
* **Publisher keys.** A manifest record is also stored under the publisher's own key
  ``f"{swarm_id}:publisher:{hex(public key)}"`` and a heartbeat under ``f"{swarm_id}:heartbeat:{hex(public
  key)}"``, where validators accept their owner's entry alone
  (:func:`~swarmnode.swarm.validator.publisher_key`, :func:`~swarmnode.swarm.validator.publisher_heartbeat_key`).
  A shared key takes any number of fresh keys' entries up to a peer's key budget (and past hivemind's 4 MiB
  find-reply cap, about 350 entries of 12 KB, every replica's reply fails and the reader sees only its own
  storage); :meth:`SwarmDHT.read_publishers` and :meth:`SwarmDHT.read_heartbeats` (``known``) reach known
  peers anyway.
* **A byte budget per key** (and no cache, a chunked hand-over: :mod:`~swarmnode.swarm.dht_process`). A failed reply also removes the replica from the asker's routing table (hivemind's
  ``update_routing_table(responded=False)``), so a flooded key used to empty the routing tables of every node that
  read or stored it, after which even publisher keys were out of reach. Our storage refuses a new entry once a
  key's dictionary would pass ``max_key_bytes`` (3 MiB, :class:`~swarmnode.swarm.dht_process.KeyCappedStorage`),
  so our replies stay under the cap; only a replica that stores without a budget (an attacker's) fails its
  replies, and drops out of the askers' routing tables.

The API is synchronous and thread-safe; it never calls the DHT from inside the DHT's own coroutines.
Values are opaque bytes (the wire codec lives elsewhere).

Where each part lives: this module holds :class:`SwarmDHT`'s records (keys, publishing, reads and their
validation); its base class :class:`~swarmnode.swarm.dht_host.DHTHost` the process lifecycle (start, watchdog,
restart, join, health, bounded calls); :mod:`swarmnode.swarm.dht_process` the child processes themselves (dying
with the node, stopping them; the pipe their results come back on: :mod:`~swarmnode.swarm.result_channel`) and :mod:`swarmnode.swarm.maddrs` multiaddr parsing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht import DHT, DHTNode

from swarmnode.rundir import end_stale_children
from swarmnode.swarm.dht_host import DHTHost, SwarmDHTStatus
from swarmnode.swarm.dht_process import DEFAULT_MAX_KEY_BYTES, harden_dht_node
from swarmnode.swarm.maddrs import loopback_only, parse_multiaddr
from swarmnode.swarm.validator import (
    DEFAULT_MAX_CLOCK_SKEW,
    DEFAULT_MAX_VALUE_BYTES,
    Ed25519RecordValidator,
    SwarmKeySpace,
    heartbeat_key,
    manifest_key,
    parse_owner_marker,
    publisher_heartbeat_key,
    publisher_key,
    time_bucket,
)

__all__ = [
    "PeerContact",
    "SwarmDHT",
    "end_stale_children",
    "SwarmDHTStatus",
    "heartbeat_key",
    "MAX_READ_KEYS",
    "get_latest_many",
    "loopback_only",
    "manifest_key",
    "parse_multiaddr",
    "publisher_heartbeat_key",
    "publisher_key",
    "time_bucket",
]

log = logging.getLogger(__name__)

#: Keys one read may ask for (:meth:`SwarmDHT.read_publishers`, :meth:`SwarmDHT.read_heartbeats`); a DHT peer
#: answers at most 64 keys a find request (``dht_reply.MAX_FIND_KEYS``).
MAX_READ_KEYS = 64


async def get_latest_many(_dht: DHT, node: DHTNode, keys: Sequence[str], timeout: float) -> list[Any]:
    """Runs inside the DHT process: the newest value of every key in **one** traversal (hivemind's
    ``DHTNode.get_many`` with ``sufficient_expiration_time=inf``, as ``DHT.get(latest=True)`` per key).

    One traversal packs up to ``sqrt(len(keys))`` (at most 16) keys into each find request, so a replica near
    all the keys gets a few requests a read instead of one per key: a node reading 32 known publishers' keys
    every 2 s asked each replica 16-18 times a second, past a peer's 16 finds a second from one sender
    (``dht_reply.FINDS_PER_SENDER_PER_SECOND``), whose refusals made the reader drop honest replicas from its
    routing table (an outside run emptied a reader's table in 6-26 s with no attacker).

    A search for the newest value ends only when every replica it asked has answered, so one slow replica (an
    outside run: answers 2.5 s late, within hivemind's 3 s RPC timeout, about 7 finds of one read in sequence) kept
    every search of a read open past its deadline. At ``timeout`` each search still open is ended with what it has
    found so far (the entries merged from the replicas that answered), not dropped.

    :param keys: DHT keys (str), no repeats
    :param timeout: seconds to wait for the searches
    :returns: one entry per key, in order: hivemind's ``ValueWithExpiration`` (as found by ``timeout``) or None
        (nothing found by then, or the search failed)
    """
    import asyncio

    futures = await node.get_many(list(keys), sufficient_expiration_time=float("inf"), return_futures=True,
                                  num_workers=max(node.num_workers, len(keys)))
    pending = [f for f in futures.values() if not f.done()]
    if pending:
        await asyncio.wait(pending, timeout=max(0.0, timeout))
    out = []
    for key in keys:
        future = futures.get(key)
        if future is not None and not future.done():
            _end_search(node, key, future)
        if future is not None and future.done() and not future.cancelled() and future.exception() is None:
            out.append(future.result())
        else:
            out.append(None)
    return out


def _end_search(node: DHTNode, key: str, future: Any) -> None:
    """End the open search behind ``future`` with the value it has found so far: hivemind 1.1.12 keeps each search's
    state (``_SearchState``, with ``finish_search()``) in ``node.pending_get_requests`` while ``reuse_get_requests``
    is on (its default); a search not found there is cancelled (reads as not found)."""
    from hivemind.dht.routing import DHTID

    states = node.pending_get_requests.get(DHTID.generate(source=key), ())
    for state in list(states):
        if getattr(state, "future", None) is future:
            try:
                state.finish_search()  # decodes every entry found: one that does not decode raises
            except Exception:  # noqa: BLE001 - that key reads as not found, the read's other keys stand
                future.cancel()
            return
    future.cancel()


@dataclass(frozen=True)
class PeerContact:
    """How to reach a node's bundle server; goes into every manifest the node publishes.

    :param peer_id: base58 libp2p PeerID of the publisher's daemon (changes on restart unless
        ``p2p_identity_path`` is set)
    :param maddrs: multiaddrs (each ending in ``/p2p/<peer_id>``) the daemon announces
    """

    peer_id: str
    maddrs: tuple[str, ...] = ()


class SwarmDHT(DHTHost):
    """A hivemind DHT node holding this node's signed swarm records (see module docstring).

    :param private_key: this node's Ed25519 key (signs every record; its public key owns our subkeys)
    :param swarm_ids: swarms this node publishes in; their keys only accept owner-signed entries
    :param bucket_seconds: width of a manifest time bucket (s)
    :param manifest_ttl: seconds a published manifest lives (<= ``max_ttl``)
    :param heartbeat_ttl: seconds a heartbeat lives (<= ``max_ttl``)
    :param max_ttl: validator cap on any record's remaining lifetime (s)
    :param max_clock_skew: tolerated clock difference between peers (s)
    :param max_record_bytes: cap on one manifest/heartbeat (bytes); the whole dictionary of a key must stay
        under hivemind's 4 MiB reply cap
    :param max_key_bytes: byte budget of one key's dictionary in this node's storage (new entries past it are
        refused, :class:`~swarmnode.swarm.dht_process.KeyCappedStorage`); ``None``: hivemind's unbounded storage
        (only to stand in for a hostile replica in tests)
    :param start: start immediately (otherwise call :meth:`start`)
    :param host: every other keyword (initial peers, listen and announce addresses, timeouts, watchdog, join
        backoff, identity file, ``pid_file``) is :class:`~swarmnode.swarm.dht_host.DHTHost`'s and documented there
    :raises ValueError: on malformed multiaddrs, ids or limits (the message names the argument)
    :raises TypeError: ``private_key`` is not an ``Ed25519PrivateKey``
    """

    def __init__(
        self,
        private_key: Ed25519PrivateKey,
        *,
        swarm_ids: Iterable[str] = (),
        bucket_seconds: float = 30.0,
        manifest_ttl: float = 600.0,
        heartbeat_ttl: float = 120.0,
        max_ttl: float = 900.0,
        max_clock_skew: float = DEFAULT_MAX_CLOCK_SKEW,
        max_record_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        max_key_bytes: int | None = DEFAULT_MAX_KEY_BYTES,
        start: bool = True,
        **host: Any,
    ):
        if not isinstance(private_key, Ed25519PrivateKey):
            raise TypeError(f"private_key must be an Ed25519PrivateKey, got {type(private_key).__name__}")
        for name, value in [("manifest_ttl", manifest_ttl), ("heartbeat_ttl", heartbeat_ttl)]:
            if not (isinstance(value, (int, float)) and 0 < value <= max_ttl):
                raise ValueError(f"{name} must be in (0, max_ttl={max_ttl}] seconds, got {value!r}")
        if max_key_bytes is not None and not (isinstance(max_key_bytes, int) and not isinstance(max_key_bytes, bool)
                                              and 2 * max_record_bytes <= max_key_bytes <= DEFAULT_MAX_KEY_BYTES):
            raise ValueError(f"max_key_bytes must be an int in [2 * max_record_bytes = {2 * max_record_bytes}, "
                             f"{DEFAULT_MAX_KEY_BYTES}] (under hivemind's 4 MiB reply cap) or None, got {max_key_bytes!r}")
        super().__init__(**host)
        self.max_key_bytes = max_key_bytes
        self.swarm_ids = tuple(dict.fromkeys(swarm_ids))
        self.key_spaces = tuple(SwarmKeySpace(s, bucket_seconds) for s in self.swarm_ids)
        self.bucket_seconds = float(bucket_seconds)
        self.manifest_ttl = float(manifest_ttl)
        self.heartbeat_ttl = float(heartbeat_ttl)
        self.max_ttl = float(max_ttl)
        self.max_clock_skew = float(max_clock_skew)
        self.max_record_bytes = int(max_record_bytes)
        self.validator = Ed25519RecordValidator(
            private_key,
            key_spaces=self.key_spaces,
            max_ttl=max_ttl,
            max_clock_skew=max_clock_skew,
            max_value_bytes=max_record_bytes + 64,  # msgpack bin header of the opaque bytes
        )
        if start:
            self.start()

    def _configure_dht(self, dht: Any) -> None:
        """Bound every key's dictionary in the new DHT process's storage (``max_key_bytes``)."""
        if self.max_key_bytes is not None:
            dht.run_coroutine(partial(harden_dht_node, max_key_bytes=self.max_key_bytes),
                              return_future=True).result(max(self.call_timeout, 30.0))

    # ------------------------------------------------------------------ identity / addresses
    @property
    def public_key(self) -> bytes:
        """Raw 32-byte Ed25519 public key owning our records."""
        return self.validator.public_key

    def contact(self) -> PeerContact | None:
        """What a manifest needs to reach our bundle server (None while no DHT runs)."""
        peer = self.peer_id
        return None if peer is None else PeerContact(peer, tuple(self.visible_maddrs()))

    # ------------------------------------------------------------------ records
    def _check_swarm(self, swarm_id: str) -> None:
        if swarm_id not in self.swarm_ids:
            raise ValueError(f"swarm_id {swarm_id!r} is not one of this DHT's swarm_ids {list(self.swarm_ids)}")

    def _check_value(self, value: bytes, what: str) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"{what} must be bytes, got {type(value).__name__}")
        value = bytes(value)
        if len(value) > self.max_record_bytes:
            raise ValueError(f"{what} is {len(value)} bytes; the cap is max_record_bytes={self.max_record_bytes}")
        return value

    def _store(self, keys: Sequence[str], value: bytes, ttl: float, timeout: float | None) -> bool:
        """Store ``value`` under each of ``keys`` (our subkey), the stores sent at once and bounded together by
        ``timeout`` (default ``call_timeout``); True when hivemind reports every store done (at this node or a
        nearest replica)."""
        expiration = time.time() + ttl
        marker = self.validator.local_owner_marker
        deadline = time.monotonic() + (self.call_timeout if timeout is None else float(timeout))
        futures = []
        for key in keys:
            try:
                futures.append(self._send(
                    lambda d, key=key: d.store(key, value, expiration, subkey=marker, return_future=True), len(value)))
            except Exception as e:  # noqa: BLE001
                self._last_error = f"store: {type(e).__name__}: {e}"
                futures.append(None)
        all_ok = True
        for key, future in zip(keys, futures):
            ok = False
            if future is not None:
                try:
                    ok = future.result(max(0.0, deadline - time.monotonic()))
                except Exception as e:  # noqa: BLE001 - timeout or DHT error = not stored
                    future.cancel()
                    self._last_error = f"store {key}: {type(e).__name__}: {e}"
                    ok = False
            if isinstance(ok, dict):  # store_many-style answers
                ok = all(ok.values())
            if not ok:
                log.debug("DHT store of %s failed: %s", key, self._last_error)
            all_ok = all_ok and bool(ok)
        return all_ok

    def publish_manifest(self, swarm_id: str, bucket: int, manifest_bytes: bytes, timeout: float | None = None,
                         own_key: bool = True) -> bool:
        """Store our manifest for ``bucket`` under ``f"{swarm_id}:manifests:{bucket}"``, subkey = our owner marker.

        One record per publisher per bucket; publishing again replaces ours. Expires ``manifest_ttl`` s from now.
        With ``own_key`` the same record also replaces the one under our publisher key (pass False when
        re-publishing an older bucket than the newest one: the publisher key holds the newest record).

        :param timeout: bound for both stores together (s; default ``call_timeout``)
        :returns: whether hivemind reports every store done, at this node or a nearest replica (False on
            timeout or when no DHT runs; never raises for network trouble)
        :raises ValueError: unknown ``swarm_id``, bad bucket, or ``manifest_bytes`` over ``max_record_bytes``
        :raises TypeError: ``manifest_bytes`` is not bytes
        """
        self._check_swarm(swarm_id)
        key = manifest_key(swarm_id, bucket)
        value = self._check_value(manifest_bytes, "manifest_bytes")
        keys = [key, publisher_key(swarm_id, self.public_key)] if own_key else [key]
        return self._store(keys, value, self.manifest_ttl, timeout)

    def publish_heartbeat(self, swarm_id: str, heartbeat_bytes: bytes, timeout: float | None = None) -> bool:
        """Store our heartbeat under ``f"{swarm_id}:heartbeats"`` and under our own heartbeat key
        ``f"{swarm_id}:heartbeat:{hex(public key)}"`` (expires ``heartbeat_ttl`` s from now).

        :param timeout: bound for both stores together (s; default ``call_timeout``)
        :returns: whether hivemind reports both stores done, at this node or a nearest replica (False on
            timeout or when no DHT runs; never raises for network trouble)
        :raises ValueError: unknown ``swarm_id`` or ``heartbeat_bytes`` over ``max_record_bytes``
        :raises TypeError: ``heartbeat_bytes`` is not bytes
        """
        self._check_swarm(swarm_id)
        value = self._check_value(heartbeat_bytes, "heartbeat_bytes")
        return self._store([heartbeat_key(swarm_id), publisher_heartbeat_key(swarm_id, self.public_key)], value,
                           self.heartbeat_ttl, timeout)

    def _entries(self, result: Any) -> list[tuple[bytes, bytes]]:
        """Validate a ``DHT.get`` result entry by entry: [(publisher public key, value bytes)]."""
        if result is None:
            return []
        value = getattr(result, "value", None)
        if not isinstance(value, dict):
            return []  # a plain value under our key is never valid
        now = time.time()
        horizon = now + self.max_ttl + self.max_clock_skew
        out = []
        for subkey, entry in value.items():
            public_key = parse_owner_marker(subkey)
            if public_key is None:
                continue
            item = getattr(entry, "value", None)
            expiration = getattr(entry, "expiration_time", None)
            if not isinstance(item, bytes) or len(item) > self.max_record_bytes:
                continue
            if not isinstance(expiration, (int, float)) or not (now - self.max_clock_skew <= expiration <= horizon):
                continue
            out.append((public_key, item))
        out.sort()
        return out

    def _read(self, keys: list[str], timeout: float | None) -> list[list[tuple[bytes, bytes]]]:
        """Every key's valid entries (:meth:`_entries`), all keys in one traversal (:func:`get_latest_many`),
        bounded by ``timeout`` (default ``call_timeout``); a key not found in time reads as empty."""
        timeout = self.call_timeout if timeout is None else float(timeout)
        if not keys:
            return []
        inner = max(0.0, timeout - min(1.0, 0.2 * timeout))  # leave the answer time to come back
        try:
            results = self._call(lambda d: d.run_coroutine(partial(get_latest_many, keys=list(keys), timeout=inner),
                                                           return_future=True), timeout)
        except Exception as e:  # noqa: BLE001 - timeout or DHT error = no data
            self._last_error = f"get {keys[0]}{'...' if len(keys) > 1 else ''}: {type(e).__name__}: {e}"
            return [[] for _ in keys]
        if not isinstance(results, list) or len(results) != len(keys):
            return [[] for _ in keys]
        return [self._entries(result) for result in results]

    @staticmethod
    def _known_keys(public_keys: Sequence[bytes], what: str) -> list[bytes]:
        """``public_keys`` as raw bytes, repeats dropped (first kept); at most :data:`MAX_READ_KEYS` - 1."""
        pubs = []
        for p in public_keys:
            if not isinstance(p, (bytes, bytearray, memoryview)):
                raise ValueError(f"{what}: a public key is 32 raw bytes, got {type(p).__name__} {p!r:.80}")
            pubs.append(bytes(p))
        pubs = list(dict.fromkeys(pubs))
        if len(pubs) >= MAX_READ_KEYS:
            raise ValueError(f"{what}: at most {MAX_READ_KEYS - 1} public keys a read, got {len(pubs)}")
        return pubs

    def read_manifests(
        self, swarm_id: str, buckets: Sequence[int], timeout: float | None = None
    ) -> list[tuple[bytes, bytes]]:
        """All valid manifests stored under the given buckets.

        :param buckets: bucket indices (see :func:`time_bucket`), e.g. the last ``read_buckets`` ones; repeats
            read once; at most :data:`MAX_READ_KEYS`
        :param timeout: bound for all lookups together (s; default ``call_timeout``)
        :returns: ``[(publisher_public_key (32 bytes), manifest_bytes)]``, in bucket order, then by publisher;
            empty when nothing is found, on timeout, or when no DHT runs. Entries whose subkey is not an
            owner marker, whose value is not bytes or over the cap, or whose expiration is out of range are
            dropped one by one. The caller must still check that the manifest's signed publisher key equals
            the returned owner key.
        :raises ValueError: unknown ``swarm_id``, a bad bucket, or more than :data:`MAX_READ_KEYS` buckets
        """
        self._check_swarm(swarm_id)
        keys = list(dict.fromkeys(manifest_key(swarm_id, b) for b in buckets))
        if len(keys) > MAX_READ_KEYS:
            raise ValueError(f"read_manifests: at most {MAX_READ_KEYS} buckets a read, got {len(keys)}")
        return [entry for per_key in self._read(keys, timeout) for entry in per_key]

    def read_publishers(self, swarm_id: str, public_keys: Sequence[bytes],
                        timeout: float | None = None) -> list[tuple[bytes, bytes]]:
        """The newest manifest record of each given publisher, read from its own publisher key.

        :param public_keys: raw 32-byte Ed25519 public keys (e.g. the peers with earned standing); repeats are
            read once; fewer than :data:`MAX_READ_KEYS` distinct keys
        :param timeout: bound for all lookups together (s; default ``call_timeout``)
        :returns: ``[(publisher_public_key, record_bytes)]`` in the order of ``public_keys``; an entry whose
            owner is not the key's publisher is dropped (validators refuse those; a reader checks again)
        :raises ValueError: unknown ``swarm_id``, a key that is not 32 bytes, or too many keys
        """
        self._check_swarm(swarm_id)
        pubs = self._known_keys(public_keys, "read_publishers")
        keys = [publisher_key(swarm_id, p) for p in pubs]
        out = []
        for pub, per_key in zip(pubs, self._read(keys, timeout)):
            out.extend(entry for entry in per_key if entry[0] == pub)
        return out

    def read_heartbeats(self, swarm_id: str, timeout: float | None = None,
                        known: Sequence[bytes] = ()) -> list[tuple[bytes, bytes]]:
        """All valid heartbeats: ``[(publisher_public_key, heartbeat_bytes)]``.

        :param timeout: bound for all lookups together (s; default ``call_timeout``)
        :param known: raw 32-byte public keys of peers the caller knows (e.g. those with earned standing; repeats
            read once; fewer than :data:`MAX_READ_KEYS` distinct keys): their heartbeats are also read from their
            own heartbeat keys, which only they can write, so a flood of the shared key cannot hide them
        :returns: the known peers' own-key entries first (in the order of ``known``; an entry whose owner is not
            the key's owner is dropped), then the shared key's; a peer may appear twice (a reader keeps its
            newest). Same validation and "no data" rules as :meth:`read_manifests`.
        :raises ValueError: unknown ``swarm_id``, a known key that is not 32 bytes, or too many known keys
        """
        self._check_swarm(swarm_id)
        pubs = self._known_keys(known, "read_heartbeats")
        keys = [publisher_heartbeat_key(swarm_id, p) for p in pubs]
        per_key = self._read([*keys, heartbeat_key(swarm_id)], timeout)
        own = [entry for pub, entries in zip(pubs, per_key) for entry in entries if entry[0] == pub]
        return own + per_key[-1]

    def current_bucket(self, now: float | None = None) -> int:
        """``time_bucket(now, bucket_seconds)`` with ``now`` defaulting to ``time.time()``."""
        return time_bucket(time.time() if now is None else now, self.bucket_seconds)

    def recent_buckets(self, k: int, now: float | None = None) -> list[int]:
        """The ``k`` most recent bucket indices, newest last."""
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        current = self.current_bucket(now)
        return list(range(current - k + 1, current + 1))
