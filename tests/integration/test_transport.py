"""Bundle transport over real hivemind P2P streams (p2pd on loopback), including hostile peers."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from swarmnode.swarm.dht import SwarmDHT
from swarmnode.swarm.transport import LENGTH_BYTES, STATUS_FOUND, BundleServer, BundleStore, FetchResult, sha256_hex

SWARM = "transport-swarm"


# --------------------------------------------------------------------------- BundleStore (pure)
def test_store_lru_by_total_bytes():
    store = BundleStore(max_total_bytes=10, max_item_bytes=6)
    d1 = store.put(b"aaaa")  # 4 bytes
    d2 = store.put(b"bbbb")  # 8 bytes in total
    assert d1 == sha256_hex(b"aaaa") == "61be55a8e2f6b4e172338bddf184d6dbee29c98853e0a0485ecee7f27b9af0b4"
    assert store.get(d1) == b"aaaa"  # d1 is now the most recently used
    d3 = store.put(b"cccc")  # 12 > 10: evict the least recently used (d2)
    assert d2 not in store and d1 in store and d3 in store
    assert store.total_bytes == 8 and len(store) == 2
    assert store.put(b"aaaa") == d1 and store.total_bytes == 8  # duplicate: no growth
    d4 = store.put(b"dddddd")  # order was (d3, d1); 8 + 6 = 14 > 10 evicts d3 only: 4 + 6 = 10 fits
    assert d3 not in store and d1 in store and d4 in store and store.total_bytes == 10
    with pytest.raises(ValueError, match="max_item_bytes"):
        store.put(b"x" * 7)
    with pytest.raises(ValueError, match="not the given digest"):
        store.put(b"abc", digest="0" * 64)
    with pytest.raises(TypeError, match="bytes"):
        store.put("text")
    with pytest.raises(ValueError, match="max_item_bytes <= max_total_bytes"):
        BundleStore(max_total_bytes=5, max_item_bytes=6)


def test_store_eviction_order_hand_computed():
    store = BundleStore(max_total_bytes=10, max_item_bytes=10)
    a, b, c = store.put(b"a" * 3), store.put(b"b" * 3), store.put(b"c" * 3)  # 9 bytes
    store.get(a)  # order (LRU first): b, c, a
    d = store.put(b"d" * 4)  # 9 + 4 = 13 > 10: evict b (LRU), then 6 + 4 = 10 fits
    assert b not in store and a in store and c in store and d in store
    assert store.total_bytes == 10


# --------------------------------------------------------------------------- hostile server (real peer)
class HostileServer(BundleServer):
    """A real peer on the swarm that misbehaves on purpose: ``mode`` is "lie", "hang" or "overclaim"."""

    mode = "lie"

    def _lookup(self, digest):
        return b"these are not the bytes you asked for"

    async def _serve(self, reader, writer):
        if self.mode == "lie":  # the honest protocol, serving _lookup's wrong bytes
            return await super()._serve(reader, writer)
        await reader.readexactly(36)
        if self.mode == "hang":  # accept the stream, read the request, never answer
            await asyncio.sleep(3600)
        elif self.mode == "overclaim":  # claim a 1 GiB body and start streaming garbage
            writer.write(STATUS_FOUND + (1 << 30).to_bytes(LENGTH_BYTES, "big"))
            for _ in range(64):
                writer.write(b"\0" * 65536)
                await writer.drain()
        elif self.mode == "short":  # claim 1000 bytes, send 10, close
            writer.write(STATUS_FOUND + (1000).to_bytes(LENGTH_BYTES, "big") + b"0123456789")
            await writer.drain()


def _node(**kw) -> SwarmDHT:
    kw.setdefault("swarm_ids", [SWARM])
    kw.setdefault("call_timeout", 5.0)
    kw.setdefault("health_interval", 0.5)
    kw.setdefault("join_backoff", (0.5, 2.0))
    return SwarmDHT(Ed25519PrivateKey.generate(), **kw)


@pytest.fixture(scope="module")
def net():
    a = _node()
    b = _node(initial_peers=a.visible_maddrs())
    h = _node(initial_peers=a.visible_maddrs())
    sa, sb = BundleServer(a), BundleServer(b, max_concurrent_fetches=2)
    sh = HostileServer(h)
    yield {"a": a, "b": b, "h": h, "sa": sa, "sb": sb, "sh": sh}
    for server in (sh, sb, sa):
        server.close()
    for node in (h, b, a):
        node.shutdown()


@pytest.mark.slow
def test_fetch_between_nodes_and_gossip(net):
    a, sa, sb, b = net["a"], net["sa"], net["sb"], net["b"]
    body = os.urandom(1_500_000)  # several 64 KiB chunks, above hivemind's unary message sizes
    digest = sa.put(body)
    assert digest == sha256_hex(body)
    contact = a.contact()
    assert contact.peer_id == a.peer_id == sa.peer_id and contact.maddrs[0].endswith("/p2p/" + a.peer_id)
    result = sb.fetch_result(contact.peer_id, digest, timeout=20, maddrs=contact.maddrs)
    assert result.reason == "ok" and result.body == body and result.nbytes == len(body)
    assert digest in sb.store  # re-served from now on (gossip)
    # A forgets it; A gets it back from B, who only had it because it fetched it
    sa.store = BundleStore()
    assert sa.fetch(b.peer_id, digest, timeout=20) == body
    # unknown digest
    missing = sb.fetch_result(a.peer_id, "ab" * 32, timeout=10)
    assert missing == FetchResult(None, "not_found", a.peer_id, 0)
    # own bundle: served locally
    assert sb.fetch(b.peer_id, digest, timeout=5) == body
    # several at once through the bounded pool (max_concurrent_fetches=2)
    bodies = [os.urandom(1000 + i) for i in range(5)]
    digests = [sa.put(x) for x in bodies]
    results = sb.fetch_many([(a.peer_id, d) for d in digests], timeout=20)
    assert [r.body for r in results] == bodies
    assert sb.counters["fetch_ok"] == 7  # first fetch + own bundle + 5 in the batch
    assert sa.counters["fetch_ok"] == 1
    deadline = time.monotonic() + 10  # the server counts a serve after its last drain, maybe after the client
    while time.monotonic() < deadline and sa.counters["served"] < 6:
        time.sleep(0.05)
    assert sa.counters["served"] == 6


@pytest.mark.slow
def test_oversized_body_is_aborted_before_reading(net):
    a, sa, sb = net["a"], net["sa"], net["sb"]
    body = os.urandom(300_000)
    digest = sa.put(body)
    result = sb.fetch_result(a.peer_id, digest, timeout=10, max_bytes=100_000)
    assert result.reason == "too_large" and result.body is None and result.nbytes == 0
    assert digest not in sb.store
    # a peer that declares 1 GiB and streams garbage is cut off at the header as well
    net["sh"].mode = "overclaim"
    result = sb.fetch_result(net["h"].peer_id, digest, timeout=10, max_bytes=100_000)
    assert result.reason == "too_large" and result.nbytes == 0


@pytest.mark.slow
def test_digest_mismatch_and_truncation_are_rejected(net):
    sb, h, sh = net["sb"], net["h"], net["sh"]
    wanted = sha256_hex(b"the real bundle")
    sh.mode = "lie"
    result = sb.fetch_result(h.peer_id, wanted, timeout=10)
    assert result.reason == "digest_mismatch" and result.body is None
    assert result.nbytes == len(b"these are not the bytes you asked for")
    assert wanted not in sb.store and sha256_hex(b"these are not the bytes you asked for") not in sb.store
    sh.mode = "short"
    result = sb.fetch_result(h.peer_id, wanted, timeout=10)
    assert result.reason == "truncated" and result.nbytes == 10


@pytest.mark.slow
def test_silent_peer_times_out_instead_of_hanging(net):
    sb, h, sh = net["sb"], net["h"], net["sh"]
    sh.mode = "hang"
    result = sb.fetch_result(h.peer_id, "cd" * 32, timeout=1.5)
    assert result == FetchResult(None, "timeout", h.peer_id, 0)
    # a batch larger than the pool (2 slots), all silent: every one times out, none hangs
    results = sb.fetch_many([(h.peer_id, f"{i:064x}") for i in range(3)], timeout=1.5)
    assert [r.reason for r in results] == ["timeout"] * 3
    # the client is still usable afterwards
    body = b"still fine"
    digest = net["sa"].put(body)
    assert sb.fetch(net["a"].peer_id, digest, timeout=10) == body
    sh.mode = "lie"


@pytest.mark.slow
def test_fetch_argument_errors(net):
    sb = net["sb"]
    with pytest.raises(ValueError, match="64 lowercase hex"):
        sb.fetch(net["a"].peer_id, "ABC", timeout=1)
    with pytest.raises(ValueError, match="PeerID"):
        sb.fetch("not-a-peer-id", "ab" * 32, timeout=1)
    with pytest.raises(ValueError, match="timeout"):
        sb.fetch(net["a"].peer_id, "ab" * 32, timeout=0)
    with pytest.raises(ValueError, match="max_bytes"):
        sb.fetch(net["a"].peer_id, "ab" * 32, timeout=1, max_bytes=0)
    with pytest.raises(ValueError, match="peer id"):
        sb.fetch(net["a"].peer_id, "ab" * 32, timeout=1, maddrs=["/ip4/127.0.0.1/tcp/5"])


@pytest.mark.slow
def test_server_survives_dht_restart(net):
    a, b, sa, sb = net["a"], net["b"], net["sa"], net["sb"]
    body = b"bundle served across a restart"
    digest = sb.put(body)
    old_peer, old_pid = b.peer_id, b.pid
    os.kill(old_pid, signal.SIGKILL)
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline and not (b.generation >= 2 and b.is_alive and sb.is_attached):
        time.sleep(0.2)
    assert b.is_alive and b.generation >= 2 and b.peer_id != old_peer and sb.is_attached
    # the handler was re-registered on the new daemon; the store (host process) survived
    result = sa.fetch_result(b.peer_id, digest, timeout=20)
    assert result.body == body, result
    # and B can fetch again too
    other = sa.put(b"from a after b restarted")
    assert sb.fetch(a.peer_id, other, timeout=20) == b"from a after b restarted"


# --------------------------------------------------------------------------- fair serving, no dialling
async def _idle_streams(server: BundleServer, target: str, n: int, stop: asyncio.Event, opened: list) -> None:
    """Keep ``n`` streams to ``target``'s bundle handler open that never send a request (reopened as the target
    closes them): the slot-holding attack of an outside test."""
    from hivemind.p2p import PeerID

    from swarmnode.swarm.transport import PROTOCOL

    peer = PeerID.from_base58(target)
    live: list = []
    while not stop.is_set():
        live = [(r, w) for r, w in live if not r.at_eof() and not w.is_closing()]
        while len(live) < n and not stop.is_set():
            try:
                _, r, w = await asyncio.wait_for(server._p2p.call_binary_stream_handler(peer, PROTOCOL), 10)
            except Exception:  # noqa: BLE001 - keep attacking
                await asyncio.sleep(0.05)
                continue
            live.append((r, w))
            opened.append(1)
        for r, _ in live:  # notice closed streams (a busy status, or EOF after the first-byte timeout)
            try:
                await asyncio.wait_for(r.read(1), 0.01)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                pass
        await asyncio.sleep(0.05)
    for _, w in live:
        w.close()


@pytest.mark.slow
def test_idle_streams_of_one_peer_do_not_starve_an_honest_fetcher(net):
    """24 (re-opened) idle streams from the hostile peer to A: A gives that peer at most ``max_serves_per_peer``
    slots and closes idle ones after ``first_byte_timeout``, so B's fetches from A all succeed meanwhile."""
    a, sa, sb, sh = net["a"], net["sa"], net["sb"], net["sh"]
    assert sa.max_serves_per_peer < 24 < sa.max_concurrent_serves + 24
    bodies = [os.urandom(20_000 + i) for i in range(6)]
    digests = [sa.put(x) for x in bodies]
    before = dict(sa.counters)
    stop_holder: dict = {}

    async def _attack() -> None:
        stop_holder["stop"] = asyncio.Event()
        await _idle_streams(sh, a.peer_id, 24, stop_holder["stop"], stop_holder.setdefault("opened", []))

    fut = sh._loop.submit(_attack())
    try:
        deadline = time.monotonic() + 60  # wait until the attack holds A's slots (a condition, not a sleep)
        while time.monotonic() < deadline and sa.counters["serve_busy_peer"] - before.get("serve_busy_peer", 0) < 8:
            time.sleep(0.1)
        assert sa.counters["serve_busy_peer"] - before.get("serve_busy_peer", 0) >= 8, dict(sa.counters)
        results = [sb.fetch_result(a.peer_id, d, timeout=20) for d in digests]
        assert [r.reason for r in results] == ["ok"] * len(digests)
        assert [r.body for r in results] == bodies
        # idle streams were closed by the first-byte timeout, not held until request_timeout
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sa.counters["serve_timeout"] - before.get("serve_timeout", 0) < 1:
            time.sleep(0.1)
        assert sa.counters["serve_timeout"] - before.get("serve_timeout", 0) >= 1
    finally:
        sh._loop.loop.call_soon_threadsafe(lambda: stop_holder.get("stop") and stop_holder["stop"].set())
        try:
            fut.result(30)
        except Exception:  # noqa: BLE001
            pass
    assert sa.serving <= sa.max_concurrent_serves


def _unknown_libp2p_peer_id() -> str:
    """A well-formed libp2p PeerID (identity multihash of an Ed25519 key) of no running node."""
    from cryptography.hazmat.primitives import serialization
    from hivemind.p2p import PeerID

    raw = Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                 serialization.PublicFormat.Raw)
    return PeerID(b"\x00\x24\x08\x01\x12\x20" + raw).to_base58()


@pytest.mark.slow
def test_addresses_from_records_are_never_dialled(net):
    """A record names an address the attacker picked (here a TCP listener of ours that counts connections) for a
    PeerID: the fetch goes by PeerID only, so nothing connects to that address; a fetch from a real peer with a
    bogus address in ``maddrs`` still works (libp2p routes by PeerID)."""
    import socket
    import threading

    a, sa, sb = net["a"], net["sa"], net["sb"]
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    lsock.settimeout(0.2)
    port = lsock.getsockname()[1]
    accepted: list = []
    stop = threading.Event()

    def _accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except OSError:
                continue
            accepted.append(1)
            conn.close()

    t = threading.Thread(target=_accept, daemon=True)
    t.start()
    try:
        ghost = _unknown_libp2p_peer_id()
        res = sb.fetch_result(ghost, "ab" * 32, timeout=3, maddrs=[f"/ip4/127.0.0.1/tcp/{port}/p2p/{ghost}"])
        assert not res.ok and res.reason in ("unreachable", "timeout", "error")
        body = b"routed by peer id"
        digest = sa.put(body)
        res = sb.fetch_result(a.peer_id, digest, timeout=20, maddrs=[f"/ip4/127.0.0.1/tcp/{port}/p2p/{a.peer_id}"])
        assert res.body == body
        # a dial would have reached the listener within the fetches' timeouts; give a late one time to show up
        time.sleep(0.5)
        assert accepted == []
    finally:
        stop.set()
        t.join(5)
        lsock.close()
