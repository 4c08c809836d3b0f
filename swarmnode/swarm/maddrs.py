"""Multiaddr parsing and checks for the swarm's DHT and bundle transport (libp2p addresses as strings).

A peer's address is a multiaddr ending in ``/p2p/<base58 peer id>``, e.g. ``/ip4/1.2.3.4/tcp/31337/p2p/12D3KooW…``;
listen and announce addresses have no peer id. Every function here raises ``ValueError`` naming the bad entry
(:func:`loopback_only` never raises).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

__all__ = ["check_listen_maddrs", "loopback_only", "parse_multiaddr"]


def parse_multiaddr(text: str) -> tuple[str, str]:
    """Split a peer multiaddr into (transport part, base58 libp2p peer id).

    :param text: e.g. ``"/ip4/1.2.3.4/tcp/31337/p2p/12D3KooW..."``
    :raises ValueError: if ``text`` is not a multiaddr or has no ``/p2p/<peer id>`` component
    """
    if not isinstance(text, str):
        raise ValueError(f"a multiaddr must be a str like /ip4/1.2.3.4/tcp/31337/p2p/<peer id>, got {text!r}")
    try:
        maddr = Multiaddr(text)
        peer = maddr["p2p"]
        PeerID.from_base58(peer)
    except Exception as e:  # noqa: BLE001
        raise ValueError(
            f"expected a multiaddr with a peer id like /ip4/1.2.3.4/tcp/31337/p2p/<peer id>, got {text!r} ({e})"
        ) from None
    return str(maddr.decapsulate(Multiaddr(f"/p2p/{peer}"))), peer


def check_listen_maddrs(maddrs: Sequence[str], name: str, allow_port_zero: bool) -> list[str]:
    """``maddrs`` normalized (``str(Multiaddr(text))`` each) for the listen/announce argument ``name``.

    :param allow_port_zero: False for announced addresses (port 0 cannot be announced)
    :raises ValueError: a single string instead of a list, a text that is not a multiaddr, or a port 0 where
        ``allow_port_zero`` is False (the message names ``name`` and the entry)
    """
    if isinstance(maddrs, str):
        raise ValueError(f"{name} must be a list of multiaddrs, got the single string {maddrs!r}")
    out = []
    for text in maddrs:
        try:
            maddr = Multiaddr(text)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"{name}: {text!r} is not a multiaddr like /ip4/0.0.0.0/tcp/31337 ({e})") from None
        if not allow_port_zero and any(proto in maddr and maddr[proto] == "0" for proto in ("tcp", "udp")):
            raise ValueError(f"{name}: {text!r} needs an explicit port (port 0 cannot be announced)")
        out.append(str(maddr))
    return out


def loopback_only(maddrs: Sequence[str]) -> bool:
    """Whether every multiaddr in ``maddrs`` (strings such as ``/ip4/127.0.0.1/tcp/0`` or ``/ip6/::1/tcp/4001/p2p/…``)
    names a loopback address: ``/ip4/127.x.x.x`` or ``/ip6/::1``. Names (``/dns4/…``), other addresses and an empty
    list give False."""
    if not maddrs:
        return False
    for m in maddrs:
        parts = str(m).split("/")
        if len(parts) < 3:
            return False
        proto, addr = parts[1], parts[2]
        try:
            if proto not in ("ip4", "ip6") or not ipaddress.ip_address(addr).is_loopback:
                return False
        except ValueError:
            return False
    return True
