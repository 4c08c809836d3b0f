"""The node's files and the command-line helpers of the swarm layer: ``swarm.json``, identity paths, the peer list.

What ``swarmnode peers`` and ``swarmnode swarm up`` read about a running node, and where a node keeps its key:

- :func:`write_swarm_info` / :func:`read_swarm_info`: ``swarm.json`` in the run directory (our peer id, public
  key, libp2p PeerID and multiaddrs; read by ``swarmnode peers --run-dir`` and ``swarmnode swarm up``), beside
  ``p2p.key`` (the libp2p identity, used only when ``swarm.net.host_maddrs`` has an explicit port, so that our
  bootstrap address survives restarts);
- :func:`default_identity_path` / :func:`identity_path_for`: the node's Ed25519 key file;
- :func:`list_peers`: the swarm as its signed DHT heartbeats show it (protocol/SPEC.md §5.3), with the time
  checks of :func:`heartbeat_time_ok` (the checks manifests get, docs/reference/design.md §7).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from swarmnode.config import RunConfig
from swarmnode.swarm import wire
from swarmnode.swarm.dht import SwarmDHT

log = logging.getLogger(__name__)

__all__ = [
    "P2P_KEY_FILE",
    "SWARM_INFO_FILE",
    "default_identity_path",
    "has_explicit_port",
    "heartbeat_time_ok",
    "identity_path_for",
    "list_peers",
    "read_swarm_info",
    "write_swarm_info",
]

SWARM_INFO_FILE = "swarm.json"
"""File in the run directory with this node's peer id, public key, libp2p PeerID and multiaddrs."""
P2P_KEY_FILE = "p2p.key"
"""libp2p identity file in the run directory (used when ``swarm.net.host_maddrs`` has an explicit port)."""


def default_identity_path() -> Path:
    """``$SWARMNODE_HOME/identity.pem`` (``SWARMNODE_HOME`` defaults to ``~/.swarmnode``)."""
    return Path(os.environ.get("SWARMNODE_HOME", Path.home() / ".swarmnode")) / "identity.pem"


def identity_path_for(cfg: RunConfig) -> Path:
    """The Ed25519 key file of a node: ``cfg.swarm.identity_path`` or :func:`default_identity_path`."""
    p = cfg.swarm.identity_path
    return Path(p).expanduser() if p else default_identity_path()


def read_swarm_info(run_dir: str | os.PathLike) -> dict | None:
    """The ``swarm.json`` a running node wrote into ``run_dir`` (None when missing or unreadable).

    Keys: ``peer_id``, ``public_key`` (hex), ``swarm_id``, ``libp2p_peer_id``, ``maddrs`` (list of str),
    ``pid``, ``updated_at`` (seconds since the epoch).
    """
    try:
        return json.loads((Path(run_dir) / SWARM_INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_swarm_info(run_dir: Path, peer_id: str, public_key: bytes, swarm_id: str, dht: SwarmDHT) -> None:
    """Write ``swarm.json`` (the keys :func:`read_swarm_info` lists) atomically into ``run_dir``, with the DHT's
    current contact (libp2p PeerID and multiaddrs; None and [] while it has none). An OS error is logged, never
    raised."""
    contact = dht.contact()
    info = {
        "peer_id": peer_id,
        "public_key": public_key.hex(),
        "swarm_id": swarm_id,
        "libp2p_peer_id": contact.peer_id if contact else None,
        "maddrs": list(contact.maddrs) if contact else [],
        "pid": os.getpid(),
        "updated_at": time.time(),
    }
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / (SWARM_INFO_FILE + ".tmp")
        tmp.write_text(json.dumps(info, indent=1), encoding="utf-8")
        os.replace(tmp, run_dir / SWARM_INFO_FILE)
    except OSError as e:
        log.warning("could not write %s: %s", SWARM_INFO_FILE, e)


def has_explicit_port(maddrs: Sequence[str]) -> bool:
    """Whether any multiaddr names a TCP or UDP port other than 0 (then the libp2p key is kept in the run
    directory, so that our bootstrap address survives restarts)."""
    for m in maddrs:
        parts = m.strip("/").split("/")
        for proto, val in zip(parts, parts[1:]):
            if proto in ("tcp", "udp") and val != "0":
                return True
    return False


def heartbeat_time_ok(created_at: float, now: float, max_clock_skew: float, freshness_seconds: float) -> bool:
    """Whether a heartbeat's signed ``created_at`` (s since the epoch) passes the checks manifests get:
    ``now - freshness_seconds - max_clock_skew <= created_at <= now + max_clock_skew`` (a non-finite time fails)."""
    try:
        t = float(created_at)
    except (TypeError, ValueError):
        return False
    return math.isfinite(t) and now - freshness_seconds - max_clock_skew <= t <= now + max_clock_skew


def list_peers(
    swarm_id: str,
    initial_peers: Sequence[str],
    *,
    timeout: float = 15.0,
    bucket_seconds: float = 30.0,
    clock: Callable[[], float] = time.time,
    max_clock_skew: float = 30.0,
    freshness_seconds: float = 600.0,
) -> list[dict[str, Any]]:
    """The swarm as its DHT heartbeats show it (what ``swarmnode peers`` prints).

    Starts a throw-away DHT client (its own random key; it publishes nothing), joins through
    ``initial_peers``, reads ``{swarm_id}:heartbeats``, verifies every heartbeat (signature, signer == the
    DHT record's owner, swarm id) and shuts down.

    Args:
        swarm_id: the swarm.
        initial_peers: multiaddrs with ``/p2p/<PeerID>`` of any live node.
        timeout: seconds for joining and for the lookup, each.
        bucket_seconds: the swarm's ``bucket_seconds`` (only used to name protected keys).
        clock: wall clock (seconds since the epoch) for ``last_seen_s`` and the time checks.
        max_clock_skew / freshness_seconds: the swarm's ``max_clock_skew`` and ``freshness_seconds`` (s): a
            heartbeat created more than ``max_clock_skew`` in the future or more than ``freshness_seconds +
            max_clock_skew`` ago is left out, as manifests are (a future-dated heartbeat would otherwise show
            ``last_seen_s`` 0 and shadow its signer's real ones).

    Returns:
        Rows sorted by peer id: ``peer_id``, ``model_id``, ``step``, ``reward_mean``, ``accuracy``,
        ``samples_published``, ``samples_accepted``, ``samples_rejected``, ``last_seen_s``. Heartbeats that fail
        verification or the time checks are left out.

    Raises:
        ValueError: no initial peer, or a malformed multiaddr or swarm id.
        ConnectionError: no initial peer answered within ``timeout``.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if not initial_peers:
        raise ValueError("list_peers needs at least one initial peer (a multiaddr like "
                         "/ip4/1.2.3.4/tcp/31337/p2p/<PeerID>)")
    dht = SwarmDHT(Ed25519PrivateKey.generate(), swarm_ids=[swarm_id], initial_peers=list(initial_peers),
                   bucket_seconds=bucket_seconds, call_timeout=timeout, health_interval=0, client_mode=True,
                   start=False)
    try:
        dht.start()
        if not dht.connected and not dht.try_join(timeout=timeout):
            raise ConnectionError(f"none of the initial peers {list(initial_peers)} answered within {timeout:g} s")
        entries = dht.read_heartbeats(swarm_id, timeout=timeout)
    finally:
        dht.shutdown()
    rows: dict[str, dict[str, Any]] = {}
    now = clock()
    for owner, value in entries:
        try:
            env, hb = wire.decode(value, expected_kind=wire.KIND_HEARTBEAT)
        except wire.WireError:
            continue
        if env.public_key != owner or not isinstance(hb, wire.Heartbeat) or hb.swarm_id != swarm_id:
            continue
        if not heartbeat_time_ok(hb.created_at, now, max_clock_skew, freshness_seconds):
            continue
        prev = rows.get(hb.peer_id)
        if prev is not None and prev["created_at"] >= hb.created_at:
            continue
        rows[hb.peer_id] = {
            "peer_id": hb.peer_id, "model_id": hb.model_id, "step": hb.step, "reward_mean": hb.reward_mean,
            "accuracy": hb.accuracy, "samples_published": hb.samples_published,
            "samples_accepted": hb.samples_accepted, "samples_rejected": hb.samples_rejected,
            "last_seen_s": max(0.0, now - hb.created_at), "created_at": hb.created_at,
        }
    return [{k: v for k, v in rows[p].items() if k != "created_at"} for p in sorted(rows)]
