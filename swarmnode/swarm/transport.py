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

Modules: this one is the server (:class:`BundleServer`: attaching to the daemon, bounded serving); its fetch
methods are :class:`~swarmnode.swarm.bundle_fetch.BundleFetcher`'s, and the protocol's constants,
:class:`BundleStore` and :class:`FetchResult` live in :mod:`swarmnode.swarm.bundle_store` (all re-exported here).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Any

from hivemind.p2p import P2P
from hivemind.utils.multiaddr import Multiaddr

from swarmnode.swarm.bundle_fetch import BundleFetcher
from swarmnode.swarm.bundle_store import (
    _CHUNK,
    DEFAULT_MAX_BUNDLE_BYTES,
    LENGTH_BYTES,
    PROTOCOL,
    REQUEST_LEN,
    REQUEST_MAGIC,
    STATUS_BAD_REQUEST,
    STATUS_BUSY,
    STATUS_FOUND,
    STATUS_NOT_FOUND,
    BundleStore,
    FetchResult,
    sha256_hex,
)
from swarmnode.swarm.dht import SwarmDHT

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


class BundleServer(BundleFetcher):
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
