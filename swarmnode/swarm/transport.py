"""Bundle bodies over hivemind P2P streams: a content-addressed server and a bounded fetch client.

The DHT holds only small manifests (hivemind caps a lookup reply at about 4 MiB; docs/reference/references.md §4.3);
bundle bodies travel here, over libp2p streams of the same ``p2pd`` the DHT uses. The host process gets
a replica of the DHT's daemon (``hivemind.P2P.replicate`` on the control socket reported by
:attr:`SwarmDHT.daemon_listen_maddr`, which is what ``DHT.replicate_p2p`` does in hivemind 1.1.12) and
registers a binary stream handler (``P2P.add_binary_stream_handler``) on its own asyncio loop, which runs
in a background thread; the synchronous API submits coroutines to that loop with timeouts.

Stream protocol ``/swarmnode/bundle/1.0.0`` (one request per stream):

* request: ``b"SNB1"`` + 32-byte raw SHA-256 digest (36 bytes);
* response: one status byte -- ``0x00`` found, ``0x01`` not found, ``0x02`` busy, ``0x03`` bad request --
  and, when found, an 8-byte big-endian body length followed by exactly that many body bytes.

The server bounds what any one peer can hold (measured: 24 idle streams from one peer took the
16 shared slots, and an honest peer's fetches went from 17 ok to 0 ok): at most ``max_concurrent_serves``
streams at once in total and ``max_serves_per_peer`` per remote libp2p PeerID (more get ``busy`` at once),
and a stream whose 36-byte request has not arrived ``first_byte_timeout`` seconds after it opened is closed
(an honest client writes its request right after opening the stream).

Dialling: the client never dials addresses taken from a peer's record (an earlier
version dialled any ``addrs`` entry of a manifest record whose ``/p2p/`` part matched, which made every node a
scanning / reflection tool for whoever writes a record). It opens the stream by PeerID only and lets
libp2p route it to the addresses libp2p itself observed for that PeerID (an open connection, the
identify exchange, the daemon's peer routing).

The client enforces, in order: a total ``timeout`` (stream open, request, reading; a peer that accepts
the stream and never answers costs at most ``timeout``); bounded concurrency (semaphore); the declared
length against ``max_bytes`` before reading (abort = close the stream); reading at most the declared
length in 64 KiB chunks; ``sha256(body) == digest`` after reading. Any failure returns ``None`` (the
reason is in :class:`FetchResult`), never an exception (docs/reference/design.md §6: no input from a peer can crash,
stall or OOM a node).

Gossip: a fetched body is cached in the bounded :class:`BundleStore` (LRU by total bytes) and served to
others under the same digest, so a bundle spreads beyond its publisher.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from hivemind.p2p import P2P, PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarmnode.swarm.dht import SwarmDHT, parse_multiaddr

__all__ = [
    "PROTOCOL",
    "BundleServer",
    "BundleStore",
    "FetchResult",
    "LENGTH_BYTES",
    "PROTOCOL",
    "REQUEST_LEN",
    "REQUEST_MAGIC",
    "STATUS_BAD_REQUEST",
    "STATUS_BUSY",
    "STATUS_FOUND",
    "STATUS_NOT_FOUND",
    "sha256_hex",
]

log = logging.getLogger(__name__)

PROTOCOL = "/swarmnode/bundle/1.0.0"
REQUEST_MAGIC = b"SNB1"
"""The first 4 bytes of a request (then the 32-byte raw SHA-256 digest)."""
REQUEST_LEN = len(REQUEST_MAGIC) + 32
"""Bytes of a request: 36."""
STATUS_FOUND, STATUS_NOT_FOUND, STATUS_BUSY, STATUS_BAD_REQUEST = b"\x00", b"\x01", b"\x02", b"\x03"
"""The response's status byte."""
LENGTH_BYTES = 8
"""Bytes of the big-endian body length that follows :data:`STATUS_FOUND`."""
_CHUNK = 64 * 1024
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")

DEFAULT_MAX_BUNDLE_BYTES = 4 * 1024 * 1024


def sha256_hex(body: bytes) -> str:
    """Lowercase hex SHA-256 of ``body`` (the content address of a bundle)."""
    return hashlib.sha256(body).hexdigest()


def _check_digest(digest: str) -> str:
    if not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
        raise ValueError(f"digest must be 64 lowercase hex chars (sha256), got {digest!r}")
    return digest


def _to_peer_id(peer: PeerID | str) -> PeerID:
    if isinstance(peer, PeerID):
        return peer
    if isinstance(peer, str):
        try:
            return PeerID.from_base58(peer)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"peer must be a base58 libp2p PeerID (e.g. 12D3KooW...), got {peer!r} ({e})") from None
    raise ValueError(f"peer must be a hivemind PeerID or its base58 str, got {type(peer).__name__}")


class BundleStore:
    """Thread-safe content-addressed byte store, evicting least-recently-used bodies beyond a byte budget.

    :param max_total_bytes: sum of stored body lengths never exceeds this
    :param max_item_bytes: larger bodies are refused
    :raises ValueError: on non-positive limits or ``max_item_bytes > max_total_bytes``
    """

    def __init__(self, max_total_bytes: int = 256 * 1024 * 1024, max_item_bytes: int = DEFAULT_MAX_BUNDLE_BYTES):
        if not (0 < max_item_bytes <= max_total_bytes):
            raise ValueError(f"need 0 < max_item_bytes <= max_total_bytes, got {max_item_bytes}, {max_total_bytes}")
        self.max_total_bytes = int(max_total_bytes)
        self.max_item_bytes = int(max_item_bytes)
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()

    def put(self, body: bytes, digest: str | None = None) -> str:
        """Store ``body`` (evicting LRU bodies as needed) and return its sha256 hex digest.

        :param digest: if given, must equal ``sha256_hex(body)``
        :raises TypeError: ``body`` is not bytes
        :raises ValueError: body over ``max_item_bytes`` or digest mismatch
        """
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise TypeError(f"body must be bytes, got {type(body).__name__}")
        body = bytes(body)
        if len(body) > self.max_item_bytes:
            raise ValueError(f"body is {len(body)} bytes; the store's max_item_bytes is {self.max_item_bytes}")
        actual = sha256_hex(body)
        if digest is not None and _check_digest(digest) != actual:
            raise ValueError(f"body hashes to {actual}, not the given digest {digest}")
        with self._lock:
            if actual in self._items:
                self._items.move_to_end(actual)
                return actual
            while self._items and self._total + len(body) > self.max_total_bytes:
                _, evicted = self._items.popitem(last=False)
                self._total -= len(evicted)
            self._items[actual] = body
            self._total += len(body)
        return actual

    def get(self, digest: str) -> bytes | None:
        """The body with this digest (marks it recently used), or None."""
        with self._lock:
            body = self._items.get(digest)
            if body is not None:
                self._items.move_to_end(digest)
            return body

    def __contains__(self, digest: object) -> bool:
        with self._lock:
            return digest in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    @property
    def total_bytes(self) -> int:
        """Sum of stored body lengths (bytes)."""
        with self._lock:
            return self._total


@dataclass(frozen=True)
class FetchResult:
    """Outcome of one fetch.

    :param body: the verified body, or None
    :param reason: ``"ok"``, ``"not_found"``, ``"busy"``, ``"too_large"``, ``"truncated"``,
        ``"digest_mismatch"``, ``"timeout"``, ``"unreachable"``, ``"bad_response"`` or ``"error"``
    :param peer: base58 PeerID asked
    :param nbytes: body bytes received (0 when aborted before the body)
    """

    body: bytes | None
    reason: str
    peer: str
    nbytes: int = 0

    @property
    def ok(self) -> bool:
        return self.body is not None


class _LoopThread:
    """An asyncio event loop running forever in a daemon thread."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine, timeout: float) -> Any:
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"operation did not finish in {timeout:.1f} s") from None

    def close(self) -> None:
        if self.loop.is_closed():
            return

        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(5)
        except Exception:  # noqa: BLE001
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


class BundleServer:
    """Serves bundle bodies by digest on the DHT's libp2p daemon and fetches them from peers.

    :param dht: a started :class:`SwarmDHT`; the server re-attaches itself after each DHT restart
    :param store: where served bodies live (a new 256 MiB :class:`BundleStore` if None)
    :param max_concurrent_fetches: outgoing fetches running at once (more wait, within their timeout)
    :param max_concurrent_serves: incoming streams served at once, all peers together (more get ``busy``)
    :param max_serves_per_peer: incoming streams served at once for one remote libp2p PeerID (more get ``busy``)
    :param first_byte_timeout: seconds a client may take, after opening a stream, to send its 36-byte request
        (default ``min(2.0, request_timeout)``)
    :param request_timeout: seconds for each write to a client (x4 per 64 KiB chunk of a body)
    :param default_max_bytes: body-size cap of :meth:`fetch` when ``max_bytes`` is not given
    :param attach_timeout: seconds to attach to the daemon
    :param start: attach now (otherwise call :meth:`start`)
    """

    def __init__(
        self,
        dht: SwarmDHT,
        store: BundleStore | None = None,
        *,
        max_concurrent_fetches: int = 8,
        max_concurrent_serves: int = 16,
        max_serves_per_peer: int = 4,
        first_byte_timeout: float | None = None,
        request_timeout: float = 5.0,
        default_max_bytes: int = DEFAULT_MAX_BUNDLE_BYTES,
        attach_timeout: float = 30.0,
        start: bool = True,
    ):
        if not isinstance(dht, SwarmDHT):
            raise TypeError(f"dht must be a SwarmDHT, got {type(dht).__name__}")
        if max_concurrent_fetches < 1 or max_concurrent_serves < 1 or request_timeout <= 0 or default_max_bytes < 1:
            raise ValueError("need max_concurrent_fetches >= 1, max_concurrent_serves >= 1, request_timeout > 0, "
                             "default_max_bytes >= 1")
        if max_serves_per_peer < 1 or (first_byte_timeout is not None and not first_byte_timeout > 0):
            raise ValueError(f"need max_serves_per_peer >= 1 and first_byte_timeout > 0, got {max_serves_per_peer!r}, "
                             f"{first_byte_timeout!r}")
        self.dht = dht
        self.store = store if store is not None else BundleStore()
        self.max_concurrent_fetches = int(max_concurrent_fetches)
        self.max_concurrent_serves = int(max_concurrent_serves)
        self.max_serves_per_peer = int(max_serves_per_peer)
        self.request_timeout = float(request_timeout)
        self.first_byte_timeout = (min(2.0, self.request_timeout) if first_byte_timeout is None
                                   else float(first_byte_timeout))
        self.default_max_bytes = int(default_max_bytes)
        self.attach_timeout = float(attach_timeout)
        self.counters: Counter[str] = Counter()
        self._counters_lock = threading.Lock()
        self._loop: _LoopThread | None = None
        self._p2p: P2P | None = None
        self._attached_to: str | None = None
        self._fetch_sem: asyncio.Semaphore | None = None
        self._attach_lock: asyncio.Lock | None = None
        self._serving = 0
        self._serving_by_peer: Counter[str] = Counter()
        self._last_attach_try = -1e9
        self._closed = False
        self._started = False
        if start:
            self.start()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> bool:
        """Start the loop thread and attach to the DHT's daemon. Returns whether the handler is registered."""
        if self._closed:
            raise RuntimeError("this BundleServer was closed; create a new one")
        if not self._started:
            self._started = True
            self._loop = _LoopThread("swarm-bundle-loop")
            self._loop.run(self._init_loop_state(), 10)
            self.dht.add_restart_callback(lambda _dht: self.reattach())
        return self.reattach()

    @property
    def is_attached(self) -> bool:
        """Whether the handler is registered on the DHT's *current* daemon (briefly False right after a
        DHT restart, until the restart callback has re-attached)."""
        maddr = self.dht.daemon_listen_maddr
        return maddr is not None and maddr == self._attached_to

    def _ensure_attached(self, timeout: float) -> None:
        """Re-attach from a fetch when the restart callback has not (yet); at most once per 5 s, bounded."""
        maddr = self.dht.daemon_listen_maddr
        now = time.monotonic()
        if maddr is not None and maddr != self._attached_to and now - self._last_attach_try >= 5.0:
            self._last_attach_try = now
            self.reattach(timeout=timeout)

    async def _init_loop_state(self) -> None:
        self._fetch_sem = asyncio.Semaphore(self.max_concurrent_fetches)
        self._attach_lock = asyncio.Lock()

    def reattach(self, timeout: float | None = None) -> bool:
        """(Re-)register the stream handler on the DHT's current daemon; True on success.

        :param timeout: seconds (default ``attach_timeout``)
        """
        if self._closed or self._loop is None:
            return False
        maddr = self.dht.daemon_listen_maddr
        if maddr is None:
            log.warning("bundle server: no DHT daemon to attach to")
            return False
        if maddr == self._attached_to:
            return True
        try:
            self._loop.run(self._attach(maddr), self.attach_timeout if timeout is None else timeout)
        except Exception as e:  # noqa: BLE001
            log.warning("bundle server could not attach to %s: %s", maddr, e)
            return False
        return True

    async def _attach(self, daemon_maddr: str) -> None:
        async with self._attach_lock:  # serialize concurrent re-attaches (watchdog callback vs. fetch)
            if daemon_maddr != self._attached_to:
                await self._attach_locked(daemon_maddr)

    async def _attach_locked(self, daemon_maddr: str) -> None:
        p2p = await P2P.replicate(Multiaddr(daemon_maddr))
        try:
            await p2p.add_binary_stream_handler(PROTOCOL, self._handle)
        except BaseException:
            p2p._terminate()
            raise
        old, self._p2p, self._attached_to = self._p2p, p2p, daemon_maddr
        if old is not None:
            old._terminate()  # the replica owns no process; this closes its sockets only
        log.info("bundle server attached to %s as %s", daemon_maddr, p2p.peer_id)

    def close(self) -> None:
        """Unregister and stop the loop thread (idempotent). Does not shut the DHT down."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None:
            p2p = self._p2p

            async def _detach() -> None:
                if p2p is not None:
                    try:
                        await asyncio.wait_for(p2p.remove_binary_stream_handler(PROTOCOL), 2)
                    except Exception:  # noqa: BLE001 - the daemon may be gone already
                        pass
                    p2p._terminate()

            try:
                self._loop.run(_detach(), 5)
            except Exception:  # noqa: BLE001
                pass
            self._loop.close()

    def __enter__(self) -> BundleServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _count(self, key: str, n: int = 1) -> None:
        with self._counters_lock:
            self.counters[key] += n

    # ------------------------------------------------------------------ serving
    def put(self, body: bytes) -> str:
        """Make ``body`` available to peers; returns its sha256 hex digest (goes into the manifest)."""
        return self.store.put(body)

    def _lookup(self, digest: str) -> bytes | None:
        """Body to serve for ``digest`` (hook for tests of hostile peers)."""
        return self.store.get(digest)

    @property
    def serving(self) -> int:
        """Incoming streams being served right now (all peers)."""
        return self._serving

    async def _handle(self, stream_info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str(getattr(stream_info, "peer_id", None) or "?")
        try:
            if self._serving >= self.max_concurrent_serves or self._serving_by_peer[peer] >= self.max_serves_per_peer:
                self._count("serve_busy" if self._serving >= self.max_concurrent_serves else "serve_busy_peer")
                writer.write(STATUS_BUSY)
                await asyncio.wait_for(writer.drain(), self.request_timeout)
                return
            self._serving += 1
            self._serving_by_peer[peer] += 1
            try:
                await self._serve(reader, writer)
            finally:
                self._serving -= 1
                self._serving_by_peer[peer] -= 1
                if self._serving_by_peer[peer] <= 0:
                    del self._serving_by_peer[peer]
        except asyncio.CancelledError:  # the server is closing; this task is the connection's top level
            pass
        except asyncio.TimeoutError:
            self._count("serve_timeout")
        except Exception as e:  # noqa: BLE001 - a misbehaving or departed client must not disturb the server
            self._count("serve_error")
            log.debug("bundle serve failed: %s", e)
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # an honest client writes its 36 bytes right after opening the stream: an idle stream is closed soon
        request = await asyncio.wait_for(reader.readexactly(REQUEST_LEN), self.first_byte_timeout)
        if not request.startswith(REQUEST_MAGIC):
            self._count("serve_bad_request")
            writer.write(STATUS_BAD_REQUEST)
            await asyncio.wait_for(writer.drain(), self.request_timeout)
            return
        body = self._lookup(request[len(REQUEST_MAGIC):].hex())
        if body is None:
            self._count("serve_not_found")
            writer.write(STATUS_NOT_FOUND)
            await asyncio.wait_for(writer.drain(), self.request_timeout)
            return
        writer.write(STATUS_FOUND + len(body).to_bytes(LENGTH_BYTES, "big"))
        view = memoryview(body)
        for offset in range(0, len(body), _CHUNK):
            writer.write(view[offset : offset + _CHUNK])
            # a slow reader gets request_timeout per chunk of 64 KiB at least
            await asyncio.wait_for(writer.drain(), 4 * self.request_timeout)
        await asyncio.wait_for(writer.drain(), 4 * self.request_timeout)
        self._count("served")
        self._count("served_bytes", len(body))

    # ------------------------------------------------------------------ fetching
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
