"""The bundle fetch client: bodies by SHA-256 from a peer over a libp2p stream, bounded and verified
(docs/reference/design.md §6: no input from a peer can crash, stall or OOM a node).

:class:`BundleFetcher` is a mixin of :class:`~swarmnode.swarm.transport.BundleServer`; it reads the server's
``dht``, ``store``, ``default_max_bytes``, its loop thread, its replica of the DHT's daemon and its fetch
semaphore, and counts outcomes with the server's counters. What it enforces, in order: a total ``timeout``
(stream open, request, reading); bounded concurrency (``max_concurrent_fetches``); the declared length
against ``max_bytes`` before reading; reading at most the declared length in 64 KiB chunks; ``sha256(body) ==
digest``. It opens streams by PeerID only and never dials an address taken from a peer's record. A failure is a
:class:`~swarmnode.swarm.bundle_store.FetchResult` with its reason, never an exception.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from hivemind.p2p import PeerID

from swarmnode.swarm.bundle_store import (
    _CHUNK,
    LENGTH_BYTES,
    PROTOCOL,
    REQUEST_MAGIC,
    STATUS_BUSY,
    STATUS_FOUND,
    STATUS_NOT_FOUND,
    FetchResult,
    _check_digest,
    _to_peer_id,
    sha256_hex,
)
from swarmnode.swarm.maddrs import parse_multiaddr

# the transport's logger: these messages are the bundle transport's (log filters name it)
log = logging.getLogger("swarmnode.swarm.transport")


class BundleFetcher:
    """The fetching half of :class:`~swarmnode.swarm.transport.BundleServer` (a mixin; see the module docstring)."""

    @property
    def peer_id(self) -> str | None:
        """Base58 PeerID peers fetch from (the DHT daemon's); put it in manifests with :meth:`SwarmDHT.contact`."""
        return self.dht.peer_id

    def fetch(
        self,
        peer: PeerID | str,
        digest: str,
        *,
        timeout: float = 5.0,
        max_bytes: int | None = None,
        maddrs: Sequence[str] = (),
        cache: bool = True,
    ) -> bytes | None:
        """Fetch the body with sha256 ``digest`` from ``peer``; see :meth:`fetch_result`. Returns body or None."""
        return self.fetch_result(peer, digest, timeout=timeout, max_bytes=max_bytes, maddrs=maddrs, cache=cache).body

    def fetch_result(
        self,
        peer: PeerID | str,
        digest: str,
        *,
        timeout: float = 5.0,
        max_bytes: int | None = None,
        maddrs: Sequence[str] = (),
        cache: bool = True,
    ) -> FetchResult:
        """Fetch one body, verified, with the failure reason.

        :param peer: publisher's (or any caching peer's) libp2p PeerID, object or base58
        :param digest: 64 lowercase hex chars, sha256 of the wanted body
        :param timeout: total seconds, including waiting for a free fetch slot
        :param max_bytes: body-size cap (default ``default_max_bytes``); a larger declared body is refused
            before it is read
        :param maddrs: multiaddrs of ``peer`` from its record: checked for form (each must end in ``/p2p/<peer>``)
            but **never dialled** -- libp2p routes the stream by PeerID to addresses it observed itself
        :param cache: on success, store the body for re-serving (gossip)
        :raises ValueError: malformed ``peer``, ``digest``, ``timeout`` or ``max_bytes`` (the caller's bug,
            not the peer's)
        """
        peer_id = _to_peer_id(peer)
        _check_digest(digest)
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        max_bytes = self.default_max_bytes if max_bytes is None else max_bytes
        if not (isinstance(max_bytes, int) and max_bytes > 0):
            raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
        for m in maddrs:  # the caller's bug when malformed; never dialled (see the module docstring)
            parse_multiaddr(m)
        if self._closed or self._loop is None:
            return FetchResult(None, "error", peer_id.to_base58())
        self._ensure_attached(timeout)
        try:
            result = self._loop.run(self._fetch(peer_id, digest, float(timeout), max_bytes), timeout + 2.0)
        except Exception as e:  # noqa: BLE001 - includes the outer safety timeout
            result = FetchResult(None, "timeout" if isinstance(e, TimeoutError) else "error", peer_id.to_base58())
        self._count(f"fetch_{result.reason}")
        if result.ok:
            self._count("fetched_bytes", result.nbytes)
            if cache:
                try:
                    self.store.put(result.body, digest)
                except ValueError:
                    pass  # larger than the store's item cap: still returned, just not re-served
        return result

    def fetch_many(
        self,
        requests: Sequence[tuple[PeerID | str, str]],
        *,
        timeout: float = 5.0,
        max_bytes: int | None = None,
        cache: bool = True,
    ) -> list[FetchResult]:
        """Fetch several ``(peer, digest)`` pairs concurrently (at most ``max_concurrent_fetches`` at once).

        :param timeout: bound for the whole batch (s)
        :returns: one :class:`FetchResult` per request, in order
        """
        parsed = [(_to_peer_id(p), _check_digest(d)) for p, d in requests]
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        max_bytes = self.default_max_bytes if max_bytes is None else max_bytes
        if not parsed:
            return []
        if self._closed or self._loop is None:
            return [FetchResult(None, "error", p.to_base58()) for p, _ in parsed]
        self._ensure_attached(timeout)

        async def _all() -> list[FetchResult]:
            return list(await asyncio.gather(*(self._fetch(p, d, float(timeout), max_bytes) for p, d in parsed)))

        try:
            results = self._loop.run(_all(), timeout + 2.0)
        except Exception:  # noqa: BLE001
            results = [FetchResult(None, "timeout", p.to_base58()) for p, _ in parsed]
        for (_, digest), result in zip(parsed, results):
            self._count(f"fetch_{result.reason}")
            if result.ok and cache:
                try:
                    self.store.put(result.body, digest)
                except ValueError:
                    pass
        return results

    async def _fetch(
        self, peer_id: PeerID, digest: str, timeout: float, max_bytes: int
    ) -> FetchResult:
        peer = peer_id.to_base58()
        if peer == self.dht.peer_id:  # our own bundle: no network round-trip
            body = self.store.get(digest)
            return FetchResult(body, "ok" if body is not None else "not_found", peer, len(body or b""))
        progress = {"nbytes": 0}
        try:
            return await asyncio.wait_for(self._fetch_inner(peer_id, digest, max_bytes, progress), timeout)
        except asyncio.TimeoutError:
            return FetchResult(None, "timeout", peer, progress["nbytes"])
        except Exception as e:  # noqa: BLE001
            log.debug("fetch %s from %s failed: %s", digest[:12], peer, e)
            return FetchResult(None, "unreachable" if progress.get("stage") is None else "error", peer,
                               progress["nbytes"])

    async def _fetch_inner(
        self, peer_id: PeerID, digest: str, max_bytes: int, progress: dict
    ) -> FetchResult:
        peer = peer_id.to_base58()
        assert self._fetch_sem is not None
        async with self._fetch_sem:
            p2p = self._p2p
            if p2p is None:
                return FetchResult(None, "error", peer)
            # by PeerID only: addresses from records are never dialled; libp2p routes to what it observed
            _, reader, writer = await p2p.call_binary_stream_handler(peer_id, PROTOCOL)
            progress["stage"] = "open"
            try:
                writer.write(REQUEST_MAGIC + bytes.fromhex(digest))
                await writer.drain()
                status = await reader.readexactly(1)
                if status == STATUS_NOT_FOUND:
                    return FetchResult(None, "not_found", peer)
                if status == STATUS_BUSY:
                    return FetchResult(None, "busy", peer)
                if status != STATUS_FOUND:
                    return FetchResult(None, "bad_response", peer)
                length = int.from_bytes(await reader.readexactly(LENGTH_BYTES), "big")
                if length > max_bytes:
                    return FetchResult(None, "too_large", peer)  # abort before reading the body
                chunks: list[bytes] = []
                received = 0
                while received < length:
                    chunk = await reader.read(min(_CHUNK, length - received))
                    if not chunk:
                        return FetchResult(None, "truncated", peer, received)
                    received += len(chunk)
                    progress["nbytes"] = received
                    if received > max_bytes:  # cannot happen given the bound above; defensive
                        return FetchResult(None, "too_large", peer, received)
                    chunks.append(chunk)
                body = b"".join(chunks)
                if sha256_hex(body) != digest:
                    return FetchResult(None, "digest_mismatch", peer, received)
                return FetchResult(body, "ok", peer, received)
            finally:
                writer.close()

    def fetch_first(
        self,
        peers: Sequence[PeerID | str],
        digest: str,
        *,
        timeout_per_peer: float = 5.0,
        max_bytes: int | None = None,
        cache: bool = True,
    ) -> FetchResult:
        """Try ``peers`` in order (publisher first, then peers that cached it) until one serves ``digest``."""
        last = FetchResult(None, "not_found", "")
        for peer in peers:
            last = self.fetch_result(peer, digest, timeout=timeout_per_peer, max_bytes=max_bytes, cache=cache)
            if last.ok:
                return last
        return last
