"""The network parts of the hostile peer: the real hivemind DHT and bundle server, made to misbehave.

:func:`network_classes` defines (on first use, so that importing the package for the byte-level factory does not
import hivemind) a :class:`~swarmnode.swarm.dht.SwarmDHT` whose record validator forges signatures under other
publishers' subkeys and a :class:`~swarmnode.swarm.transport.BundleServer` whose stream handler misbehaves per
digest (silent, over-claiming, short, lying). :func:`store_signed_entries` and :func:`flood_bucket_key` write
pre-signed records straight into every DHT peer's storage, the way any peer can (docs/reference/design.md §7).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from typing import Any

from swarmnode.swarm import wire
from swarmnode.swarm.identity import Identity
from swarmnode.testing.adversary.factory import HostileFactory

__all__ = ["flood_bucket_key", "network_classes", "store_signed_entries"]

_NET_CLASSES: dict[str, type] = {}


async def _routing_peers(_dht: Any, node: Any) -> list[str]:
    """Runs inside the DHT process: base58 libp2p PeerIDs of the DHT routing table (every swarm node's bundle
    server answers on its DHT daemon's PeerID)."""
    return [p.to_base58() for p in node.protocol.routing_table.uid_to_peer_id.values()]


def network_classes() -> tuple[type, type, type]:
    """``(HostileDHT, HostileServer, BundleStore)``; defined on first use, so that importing the package for the
    byte-level factory does not import hivemind. (hivemind forks its DHT process, so the validator class is never
    pickled.)"""
    if _NET_CLASSES:
        return _NET_CLASSES["dht"], _NET_CLASSES["server"], _NET_CLASSES["store"]
    import asyncio
    from collections import Counter

    from swarmnode.swarm.dht import SwarmDHT
    from swarmnode.swarm.transport import (
        LENGTH_BYTES,
        REQUEST_LEN,
        REQUEST_MAGIC,
        STATUS_FOUND,
        BundleServer,
        BundleStore,
    )
    from swarmnode.swarm.validator import _SIG_PREFIX, Ed25519RecordValidator, owner_marker

    class ForgingValidator(Ed25519RecordValidator):
        """Signs *any* owner-marked record with its own key (a victim's subkey included); validates honestly."""

        def sign_value(self, record: Any) -> bytes:
            if b"[ed25519:" not in record.subkey:
                return record.value
            payload = self._payload(record.key, record.subkey, record.value, record.expiration_time)
            return record.value + _SIG_PREFIX + self._private_key.sign(payload) + b"]"

    class HostileDHT(SwarmDHT):
        """A :class:`SwarmDHT` whose validator forges signatures under other publishers' subkeys."""

        def __init__(self, private_key: Any, **kw: Any) -> None:
            start = kw.pop("start", True)
            super().__init__(private_key, start=False, **kw)
            v = self.validator
            self.validator = ForgingValidator(private_key, key_spaces=v.key_spaces, max_ttl=v.max_ttl,
                                              max_clock_skew=v.max_clock_skew, max_value_bytes=v.max_value_bytes)
            if start:
                self.start()

        def store_foreign(self, owner_key: bytes, key: str, value: bytes, ttl: float,
                          timeout: float | None = None) -> bool:
            """Store ``value`` under ``key`` in ``owner_key``'s subkey; True if any peer (or we) stored it."""
            expiration = time.time() + ttl
            subkey = owner_marker(owner_key)
            try:
                ok = self._call(lambda d: d.store(key, value, expiration, subkey=subkey, return_future=True),
                                self.call_timeout if timeout is None else timeout, nbytes=len(value))
            except Exception:  # noqa: BLE001 - refused or timed out: the attack failed, as it should
                return False
            return bool(all(ok.values()) if isinstance(ok, dict) else ok)

    class HostileServer(BundleServer):
        """A :class:`BundleServer` that misbehaves per digest: ``modes[digest]`` is ``"hang"`` (accept the stream,
        never answer), ``"overclaim"`` (declare 1 GiB), ``"short"`` (declare the size, send 10 bytes, close) or
        ``"lie"`` (serve ``lies[digest]``); other digests are served honestly from the store."""

        def __init__(self, dht: Any, store: Any, *, hang_seconds: float = 120.0, **kw: Any) -> None:
            super().__init__(dht, store, **kw)
            self.modes: OrderedDict[str, str] = OrderedDict()
            self.lies: OrderedDict[str, bytes] = OrderedDict()
            self.requests: Counter[str] = Counter()
            self.hang_seconds = float(hang_seconds)

        async def _serve(self, reader: Any, writer: Any) -> None:
            request = await asyncio.wait_for(reader.readexactly(REQUEST_LEN), self.request_timeout)
            digest = request[len(REQUEST_MAGIC):].hex()
            self.requests[digest] += 1
            mode = self.modes.get(digest)
            body = self.store.get(digest)
            if mode == "hang":  # until the client gives up and closes the stream (bounded)
                await asyncio.wait_for(reader.read(1), self.hang_seconds)
                return
            if mode == "overclaim":
                writer.write(STATUS_FOUND + (1 << 30).to_bytes(LENGTH_BYTES, "big"))
                await writer.drain()
                await asyncio.wait_for(reader.read(1), self.hang_seconds)
                return
            if mode == "short" and body is not None:
                writer.write(STATUS_FOUND + len(body).to_bytes(LENGTH_BYTES, "big") + body[:10])
                await writer.drain()
                return
            fake = self.lies.get(digest) if mode == "lie" else None
            if fake is not None:
                writer.write(STATUS_FOUND + len(fake).to_bytes(LENGTH_BYTES, "big") + fake)
                await writer.drain()
                return
            again = asyncio.StreamReader()  # the honest protocol, from the request already read
            again.feed_data(request)
            again.feed_eof()
            await super()._serve(again, writer)

    _NET_CLASSES.update(dht=HostileDHT, server=HostileServer, store=BundleStore)
    return HostileDHT, HostileServer, BundleStore


async def _store_signed_entries(_dht: Any, node: Any, key_id: bytes, path: str) -> tuple[int, int]:
    """Runs inside a DHT process: store the pre-signed ``(subkey, signed value, expiration)`` dictionary entries
    pickled in ``path`` (our own temporary file) under ``key_id`` on every peer of the routing table, 20 per
    request (hivemind's 4 MiB message cap), and in our own storage; returns (accepted stores, peers asked)."""
    import pickle

    from hivemind.dht.routing import DHTID

    with open(path, "rb") as f:
        entries = pickle.load(f)

    peers = list(node.protocol.routing_table.peer_id_to_uid.keys())
    kid = DHTID.from_bytes(key_id)
    proto = node.protocol
    ok = 0
    for marker, value, expiration in entries:  # our own storage too, through our own validator
        sub = proto.serializer.dumps(marker)
        if proto._validate_record(key_id, sub, value, expiration):
            ok += bool(proto.storage.store_subkey(kid, marker, value, expiration))
    for i in range(0, len(entries), 20):
        chunk = entries[i:i + 20]
        for peer in peers:
            res = await node.protocol.call_store(peer, [kid] * len(chunk), [v for _, v, _ in chunk],
                                                 [e for _, _, e in chunk], subkeys=[s for s, _, _ in chunk])
            ok += sum(bool(x) for x in (res or []))
    return ok, len(peers)


async def _forget_neighbours(_dht: Any, node: Any) -> int:
    """Runs inside a DHT process: remove every peer from the node's routing table (what hivemind does to each
    peer whose reply failed or that refused a request); returns how many were removed."""
    table = node.protocol.routing_table
    ids = list(table.uid_to_peer_id)
    for node_id in ids:
        del table[node_id]
    return len(ids)


def forget_neighbours(dht: Any, timeout: float = 30.0) -> int:
    """Empty the routing table of ``dht`` (a :class:`~swarmnode.swarm.dht.SwarmDHT`), as refused or failed
    replies from every neighbour would; returns how many peers it held."""
    return dht.run_coroutine(_forget_neighbours, timeout=timeout)


def store_signed_entries(dht: Any, key_id: bytes, entries: list[tuple[bytes, bytes, float]],
                         timeout: float = 120.0) -> tuple[int, int]:
    """Store pre-signed dictionary entries ``(subkey, signed value, expiration)`` under the 20-byte DHTID
    ``key_id`` in the local storage of ``dht`` (a :class:`~swarmnode.swarm.dht.SwarmDHT`; through its validator)
    and on every peer in its routing table.

    The entries reach the DHT process through a temporary file, not its request pipe: hivemind reads that pipe
    without blocking, and a request split by a busy pipe (anything over a few KiB on a loaded machine) makes
    the read fail with EAGAIN and the DHT process exit.

    Returns:
        ``(accepted stores summed over peers, peers asked)``.
    """
    import os
    import pickle
    import tempfile
    from functools import partial

    fd, path = tempfile.mkstemp(prefix="swarmnode-flood-", suffix=".pkl")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(list(entries), f)
        return dht.run_coroutine(partial(_store_signed_entries, key_id=key_id, path=path), timeout=timeout)
    finally:
        os.unlink(path)



def flood_bucket_key(dht: Any, factory: HostileFactory, swarm_id: str, peer_id: str, n_keys: int,
                     manifests_per_key: int = wire.MAX_RECORD_MANIFESTS, bucket: int | None = None, seed: int = 0,
                     ttl: float = 300.0) -> dict[str, Any]:
    """``n_keys`` free keys each store one full manifest record under the shared manifest key of ``bucket`` of
    swarm ``swarm_id``, correctly signed for the DHT by their own keys (what
    :meth:`~swarmnode.testing.adversary.peer.HostilePeer.flood_bucket_key` does; see there).

    Args:
        dht: the flooder's :class:`~swarmnode.swarm.dht.SwarmDHT` (its routing table is flooded).
        factory: builds the honest-looking bundles and manifests.
        swarm_id: the swarm whose manifest key is flooded.
        peer_id: the flooder's peer id (it seeds the free keys: ``seed`` and the key index do the rest).
        n_keys / manifests_per_key / bucket / seed / ttl: as in ``HostilePeer.flood_bucket_key`` (``ttl`` in s).

    Returns:
        ``{"keys", "record_bytes", "stored", "peers"}``.

    Raises:
        ConnectionError: no DHT daemon runs here.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils import MSGPackSerializer

    from swarmnode.swarm.validator import Ed25519RecordValidator, manifest_key, owner_marker

    bucket = dht.current_bucket() if bucket is None else int(bucket)
    key_id = DHTID.generate(source=manifest_key(swarm_id, bucket)).to_bytes()
    contact = dht.contact()
    if contact is None:
        raise ConnectionError("no DHT daemon runs")
    trees = factory.honest_trees(1, 4)
    expiration = time.time() + float(ttl)
    entries: list[tuple[bytes, bytes, float]] = []
    size = 0
    now = time.time()
    for i in range(int(n_keys)):
        seed_bytes = hashlib.sha256(f"flood {peer_id} {seed} {i}".encode()).digest()
        sk = Ed25519PrivateKey.from_private_bytes(seed_bytes)
        ident = Identity(sk)
        menvs = []
        for j in range(int(manifests_per_key)):
            b, env = factory.bundle(trees, created_at=now - 1.0 + j * 1e-3, identity=ident)
            menvs.append(factory.manifest(env, b, ident)[1])
        record = wire.encode_manifest_record(wire.ManifestRecord(menvs, contact.peer_id, []))
        size = len(record)
        v = Ed25519RecordValidator(sk)
        marker = owner_marker(ident.public_key_bytes)
        signed = v.sign_value(DHTRecord(key_id, MSGPackSerializer.dumps(marker), MSGPackSerializer.dumps(record),
                                        expiration))
        entries.append((marker, signed, expiration))
    stored, peers = store_signed_entries(dht, key_id, entries)
    return {"keys": int(n_keys), "record_bytes": size, "stored": stored, "peers": peers}
