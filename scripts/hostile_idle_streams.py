"""Outside attack: how many honest fetches succeed while one peer keeps 24 idle bundle streams open.

Three real hivemind DHT nodes (p2pd) on loopback: A serves 20 bodies, H keeps 24 streams to A's bundle
handler open without ever sending a request (re-opening them as A closes them), B fetches the 20 bodies from
A one after the other (5 s timeout each). Prints the fetch reasons and A's server counters.

    PYTHONPATH=$PWD python scripts/hostile_idle_streams.py

The same attack loop is asserted in
``tests/integration/test_transport.py::test_idle_streams_of_one_peer_do_not_starve_an_honest_fetcher``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.p2p import PeerID

from swarmnode.swarm.dht import SwarmDHT
from swarmnode.swarm.transport import PROTOCOL, BundleServer


def _node(**kw) -> SwarmDHT:
    return SwarmDHT(Ed25519PrivateKey.generate(), swarm_ids=["idle-streams"], call_timeout=5.0, health_interval=0.5,
                    join_backoff=(0.5, 2.0), **kw)


def main(n_idle: int = 24, n_fetches: int = 20) -> dict:
    """Run the measurement; returns ``{"fetches": {reason: count}, "server": A's counters}``."""
    a = _node()
    b = _node(initial_peers=a.visible_maddrs())
    h = _node(initial_peers=a.visible_maddrs())
    sa, sb, sh = BundleServer(a), BundleServer(b), BundleServer(h)
    try:
        digests = [sa.put(os.urandom(20_000 + i)) for i in range(n_fetches)]
        state: dict = {}

        async def attack() -> None:
            state["stop"] = asyncio.Event()
            peer = PeerID.from_base58(a.peer_id)
            live: list = []
            while not state["stop"].is_set():
                live = [(r, w) for r, w in live if not r.at_eof() and not w.is_closing()]
                while len(live) < n_idle and not state["stop"].is_set():
                    try:
                        _, r, w = await asyncio.wait_for(sh._p2p.call_binary_stream_handler(peer, PROTOCOL), 10)
                        live.append((r, w))
                    except Exception:  # noqa: BLE001 - keep attacking
                        await asyncio.sleep(0.05)
                for r, _ in live:
                    try:
                        await asyncio.wait_for(r.read(1), 0.01)
                    except Exception:  # noqa: BLE001
                        pass
                await asyncio.sleep(0.05)

        fut = sh._loop.submit(attack())
        time.sleep(5)  # let the attack fill A's slots (a measurement, not a test)
        reasons = [sb.fetch_result(a.peer_id, d, timeout=5).reason for d in digests]
        sh._loop.loop.call_soon_threadsafe(state["stop"].set)
        try:
            fut.result(30)
        except Exception:  # noqa: BLE001
            pass
        return {"fetches": {r: reasons.count(r) for r in sorted(set(reasons))}, "server": dict(sa.counters)}
    finally:
        for s in (sh, sb, sa):
            s.close()
        for n in (h, b, a):
            n.shutdown()


if __name__ == "__main__":
    print(json.dumps(main()))
