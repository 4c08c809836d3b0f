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
  hung process would otherwise block the caller for ever), and after a DHT process dies uncleanly
  hivemind's cross-process MPFuture locks are replaced before the next fork (a process killed while
  holding them makes every later DHT process hang at start-up).
* **Addresses are cached**: :meth:`SwarmDHT.visible_maddrs` asks the daemon at most once per
  ``maddrs_refresh_interval`` seconds (rl-swarm #489).
* **Records.** Manifests live under ``f"{swarm_id}:manifests:{bucket}"`` and heartbeats under
  ``f"{swarm_id}:heartbeats"``, one owner-marked subkey per publisher, signed by
  :class:`~swarmnode.swarm.validator.Ed25519RecordValidator`. A re-publish replaces our own entry (later
  expiration wins within a subkey). Reads use ``latest=True`` (subkey dictionaries are merged across
  replicas) and validate every entry again, dropping bad entries one by one (hivemind drops a whole
  dictionary when a single subkey is invalid, docs/reference/references.md §4.4).
* **Publisher keys.** A manifest record is also stored under the publisher's own key
  ``f"{swarm_id}:publisher:{hex(public key)}"``, where validators accept its owner's entry alone
  (:func:`~swarmnode.swarm.validator.publisher_key`). A shared bucket key takes any number of fresh keys'
  entries, and past hivemind's 4 MiB find-reply cap (about 350 entries of 12 KB) every replica's reply fails
  and the reader sees only its own storage; :meth:`SwarmDHT.read_publishers` reaches known publishers anyway.

The API is synchronous and thread-safe; it never calls the DHT from inside the DHT's own coroutines.
Values are opaque bytes (the wire codec lives elsewhere).
"""

from __future__ import annotations

import asyncio
import ipaddress
import concurrent.futures
import logging
import math
import os
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht import DHT
from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarmnode.rundir import end_stale_children, write_children_file
from swarmnode.swarm.validator import (
    DEFAULT_MAX_CLOCK_SKEW,
    DEFAULT_MAX_VALUE_BYTES,
    Ed25519RecordValidator,
    SwarmKeySpace,
    heartbeat_key,
    manifest_key,
    parse_owner_marker,
    publisher_key,
    time_bucket,
)

__all__ = [
    "PeerContact",
    "SwarmDHT",
    "end_stale_children",
    "SwarmDHTStatus",
    "heartbeat_key",
    "loopback_only",
    "manifest_key",
    "parse_multiaddr",
    "publisher_key",
    "time_bucket",
]

log = logging.getLogger(__name__)

try:  # Linux/macOS: measure the free space of the request pipe before writing to it
    import fcntl
    import termios
except ImportError:  # pragma: no cover - hivemind itself needs a Unix
    fcntl = termios = None  # type: ignore[assignment]
_F_GETPIPE_SZ = 1032  # Linux fcntl command; elsewhere the check is skipped
_REQUEST_OVERHEAD = 2048  # bytes of a pickled request besides its value (method name, key, MPFuture)


def _pipe_room(dht: DHT) -> int | None:
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


class _NodeBoundDHT(DHT):
    """``hivemind.DHT`` whose child process dies with the node, holds none of its sockets, and whose p2pd
    dies with it (see the comment above :data:`PARENT_WATCH_INTERVAL`)."""

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


# --------------------------------------------------------------------------- helpers (picklable coroutines)
async def _startup_info(_dht: DHT, node: Any) -> dict:
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


async def _health(_dht: DHT, node: Any) -> dict:
    """Runs inside the DHT process: routing-table size and whether p2pd is still running."""
    child = getattr(node.p2p, "_child", None)
    p2pd_alive = child is None or child.returncode is None
    return {"num_peers": len(node.protocol.routing_table.uid_to_peer_id), "p2pd_alive": p2pd_alive}


async def _visible_maddrs(_dht: DHT, node: Any, latest: bool) -> list[str]:
    return [str(m) for m in await node.get_visible_maddrs(latest=latest)]


async def _join(_dht: DHT, node: Any, maddrs: list[str], timeout: float) -> int:
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


def _fresh_mpfuture_locks() -> None:
    """Give processes forked from now on fresh copies of hivemind's cross-process MPFuture locks.

    hivemind 1.1.12 serializes every result a DHT process sends back with a *global* ``mp.Lock``
    (``MPFuture._update_lock``; also ``_initialization_lock`` and ``SharedBytes._lock``) shared by every
    process forked from ours. A DHT process killed or frozen while holding it (OOM killer, SIGKILL, a stop
    right after it answered) leaves it locked for ever, and every DHT process started afterwards hangs on
    its first ``set_result`` (its ready signal), so restarts never succeed. Replacing the lock objects in
    this process before the next fork gives the new DHT process working locks; futures already in flight
    keep using the current receiver pipe, which is left untouched (unlike ``MPFuture.reset_backend``).
    """
    import multiprocessing as mp

    from hivemind.utils.mpfuture import MPFuture, SharedBytes

    MPFuture._initialization_lock = mp.Lock()
    MPFuture._update_lock = mp.Lock()
    SharedBytes._lock = mp.Lock()


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


def _check_listen_maddrs(maddrs: Sequence[str], name: str, allow_port_zero: bool) -> list[str]:
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


@dataclass(frozen=True)
class PeerContact:
    """How to reach a node's bundle server; goes into every manifest the node publishes.

    :param peer_id: base58 libp2p PeerID of the publisher's daemon (changes on restart unless
        ``p2p_identity_path`` is set)
    :param maddrs: multiaddrs (each ending in ``/p2p/<peer_id>``) the daemon announces
    """

    peer_id: str
    maddrs: tuple[str, ...] = ()


@dataclass
class SwarmDHTStatus:
    """Snapshot for status displays and metrics (all fields plain Python values)."""

    alive: bool
    connected: bool
    num_peers: int
    solo_fallback: bool
    restarts: int
    join_attempts: int
    last_error: str | None
    peer_id: str | None
    maddrs: list[str] = field(default_factory=list)


class SwarmDHT:
    """A hivemind DHT node holding this node's signed swarm records (see module docstring).

    :param private_key: this node's Ed25519 key (signs every record; its public key owns our subkeys)
    :param swarm_ids: swarms this node publishes in; their keys only accept owner-signed entries
    :param initial_peers: bootstrap multiaddrs, each with ``/p2p/<peer id>``; empty = first node of a swarm
    :param host_maddrs: where p2pd listens (use ``/ip4/0.0.0.0/tcp/<port>`` to be reachable from elsewhere)
    :param announce_maddrs: public addresses to announce (explicit ports; port 0 is refused)
    :param bucket_seconds: width of a manifest time bucket (s)
    :param manifest_ttl: seconds a published manifest lives (<= ``max_ttl``)
    :param heartbeat_ttl: seconds a heartbeat lives (<= ``max_ttl``)
    :param max_ttl: validator cap on any record's remaining lifetime (s)
    :param max_clock_skew: tolerated clock difference between peers (s)
    :param max_record_bytes: cap on one manifest/heartbeat (bytes); the whole dictionary of a key must stay
        under hivemind's 4 MiB reply cap
    :param call_timeout: default bound on each DHT call (s)
    :param startup_timeout: p2pd start-up timeout (s; hivemind's 15 s default is too short on slow boxes)
    :param health_interval: watchdog period (s); 0 disables the watchdog (call :meth:`check_health` yourself)
    :param join_backoff: (first, max) delay in seconds between attempts to join ``initial_peers``
    :param rejoin_interval: re-run the join even when connected, every this many seconds (hivemind #624:
        peers given the same bootstrap can end up in split DHTs); 0 disables the periodic re-join
    :param p2p_identity_path: libp2p identity file (makes the PeerID stable across restarts); None lets
        hivemind pick a fresh identity each start
    :param client_mode: a DHT client refuses incoming DHT requests (for nodes that cannot be reached)
    :param dht_kwargs: extra keyword arguments for ``hivemind.DHT`` / ``DHTNode.create`` / ``P2P.create``
    :param pid_file: where to record the DHT child and its p2pd (pid + start time, JSON); on :meth:`start` the
        processes a killed predecessor recorded there are ended first (:func:`end_stale_children`); removed on
        :meth:`shutdown`. None records nothing.
    :param shutdown_grace: seconds a stopping DHT process gets to shut down before it is terminated
    :param start: start immediately (otherwise call :meth:`start`)
    :raises ValueError: on malformed multiaddrs, ids or limits (the message names the argument)
    """

    def __init__(
        self,
        private_key: Ed25519PrivateKey,
        *,
        swarm_ids: Iterable[str] = (),
        initial_peers: Sequence[str] = (),
        host_maddrs: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",),
        announce_maddrs: Sequence[str] = (),
        bucket_seconds: float = 30.0,
        manifest_ttl: float = 600.0,
        heartbeat_ttl: float = 120.0,
        max_ttl: float = 900.0,
        max_clock_skew: float = DEFAULT_MAX_CLOCK_SKEW,
        max_record_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        call_timeout: float = 10.0,
        startup_timeout: float = 120.0,
        health_interval: float = 5.0,
        join_backoff: tuple[float, float] = (1.0, 60.0),
        rejoin_interval: float = 300.0,
        maddrs_refresh_interval: float = 300.0,
        p2p_identity_path: str | None = None,
        client_mode: bool = False,
        dht_kwargs: dict | None = None,
        pid_file: str | os.PathLike | None = None,
        shutdown_grace: float = 15.0,
        start: bool = True,
    ):
        if not isinstance(private_key, Ed25519PrivateKey):
            raise TypeError(f"private_key must be an Ed25519PrivateKey, got {type(private_key).__name__}")
        for name, value in [("manifest_ttl", manifest_ttl), ("heartbeat_ttl", heartbeat_ttl)]:
            if not (isinstance(value, (int, float)) and 0 < value <= max_ttl):
                raise ValueError(f"{name} must be in (0, max_ttl={max_ttl}] seconds, got {value!r}")
        for name, value in [("call_timeout", call_timeout), ("startup_timeout", startup_timeout)]:
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
        if health_interval < 0 or not (0 < join_backoff[0] <= join_backoff[1]):
            raise ValueError(f"need health_interval >= 0 and 0 < join_backoff[0] <= join_backoff[1], "
                             f"got {health_interval!r}, {join_backoff!r}")
        self.swarm_ids = tuple(dict.fromkeys(swarm_ids))
        self.key_spaces = tuple(SwarmKeySpace(s, bucket_seconds) for s in self.swarm_ids)
        if isinstance(initial_peers, str):
            raise ValueError(f"initial_peers must be a list of multiaddrs, got the single string {initial_peers!r}")
        for text in initial_peers:
            parse_multiaddr(text)  # raises ValueError naming the bad entry
        self.initial_peers = [str(Multiaddr(m)) for m in initial_peers]
        self.host_maddrs = _check_listen_maddrs(host_maddrs, "host_maddrs", allow_port_zero=True)
        self.announce_maddrs = _check_listen_maddrs(announce_maddrs, "announce_maddrs", allow_port_zero=False)
        self.bucket_seconds = float(bucket_seconds)
        self.manifest_ttl = float(manifest_ttl)
        self.heartbeat_ttl = float(heartbeat_ttl)
        self.max_ttl = float(max_ttl)
        self.max_clock_skew = float(max_clock_skew)
        self.max_record_bytes = int(max_record_bytes)
        self.call_timeout = float(call_timeout)
        self.startup_timeout = float(startup_timeout)
        self.health_interval = float(health_interval)
        self.join_backoff = (float(join_backoff[0]), float(join_backoff[1]))
        self.rejoin_interval = float(rejoin_interval)
        self.maddrs_refresh_interval = float(maddrs_refresh_interval)
        self.p2p_identity_path = p2p_identity_path
        self.client_mode = bool(client_mode)
        self.dht_kwargs = dict(dht_kwargs or {})
        self.pid_file = Path(pid_file) if pid_file is not None else None
        self.shutdown_grace = float(shutdown_grace)

        self.validator = Ed25519RecordValidator(
            private_key,
            key_spaces=self.key_spaces,
            max_ttl=max_ttl,
            max_clock_skew=max_clock_skew,
            max_value_bytes=max_record_bytes + 64,  # msgpack bin header of the opaque bytes
        )
        self._dht: DHT | None = None
        self._info: dict = {}
        self._lock = threading.RLock()  # guards self._dht swaps and pipe sends
        self._restart_lock = threading.Lock()
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._callbacks: list[Callable[[SwarmDHT], None]] = []
        self._num_peers = 0
        self._health_failures = 0
        self._solo_fallback = False
        self._restarts = 0
        self._join_attempts = 0
        self._next_join = 0.0
        self._join_delay = self.join_backoff[0]
        self._maddrs_cache: tuple[float, list[str]] = (0.0, [])
        self._last_error: str | None = None
        self._next_restart = 0.0
        self._restart_delay = self.join_backoff[0]
        self._generation = 0
        self._started = False
        self._closed = False
        if start:
            self.start()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> bool:
        """Start the DHT process (with bootstrap, else solo) and the watchdog. Never raises on network trouble.

        :returns: whether a DHT process is running afterwards (False: start-up failed; the watchdog retries)
        """
        if self._closed:
            raise RuntimeError("this SwarmDHT was shut down; create a new one")
        if self._started:
            return self.is_alive
        self._started = True
        if self.pid_file is not None:
            end_stale_children(self.pid_file)
        ok = self._start_dht()
        if self.health_interval > 0:
            self._watchdog = threading.Thread(target=self._watchdog_loop, name="swarm-dht-watchdog", daemon=True)
            self._watchdog.start()
        return ok

    def hivemind_kwargs(self, initial_peers: list[str]) -> dict[str, Any]:
        """Keyword arguments of the hivemind ``DHT`` (and through it of p2pd) for these ``initial_peers``.

        A swarm that lives on loopback only (every listen address, announced address and initial peer on
        127.0.0.0/8 or ::1, as ``swarmnode swarm up`` runs it) starts p2pd without NAT port mapping and AutoNAT:
        there is no router to map a port on and no outside peer to ask. ``dht_kwargs`` given to the constructor
        override everything here (``dht_kwargs={"auto_nat": True}`` turns AutoNAT back on).
        """
        kwargs: dict[str, Any] = dict(
            host_maddrs=self.host_maddrs,
            startup_timeout=self.startup_timeout,
            ensure_bootstrap_success=False,
            client_mode=self.client_mode,
            shutdown_timeout=self.shutdown_grace,
        )
        if self.announce_maddrs:
            kwargs["announce_maddrs"] = self.announce_maddrs
        if self.p2p_identity_path is not None:
            kwargs["identity_path"] = self.p2p_identity_path
        if loopback_only([*self.host_maddrs, *(self.announce_maddrs or []), *initial_peers]):
            kwargs.update(auto_nat=False, nat_port_map=False)
        kwargs.update(self.dht_kwargs)
        return kwargs

    def _make_dht(self, initial_peers: list[str]) -> DHT:
        kwargs = self.hivemind_kwargs(initial_peers)
        dht = _NodeBoundDHT(
            initial_peers=initial_peers or None,
            start=False,
            record_validators=[self.validator],
            **kwargs,
        )
        dht._parent_pid = os.getpid()
        dht.run_in_background(await_ready=False)
        try:
            dht.wait_until_ready(timeout=self.startup_timeout + 2 * self.call_timeout)
        except BaseException:
            self._kill_dht(dht, {})
            raise
        return dht

    def _start_dht(self) -> bool:
        """Start a DHT process: with initial peers first, then solo. Returns whether one is running."""
        attempts: list[list[str]] = [self.initial_peers, []] if self.initial_peers else [[]]
        for peers in attempts:
            if self._closed:  # shut down meanwhile: start nothing more
                return False
            dht = None
            try:
                dht = self._make_dht(peers)
                # part of start-up: a loaded machine may need more than one call_timeout here
                info = dht.run_coroutine(_startup_info, return_future=True).result(max(self.call_timeout, 30.0))
            except Exception as e:  # noqa: BLE001 - p2pd start / bootstrap failures are expected here
                if dht is not None:  # started but does not answer: do not leak the process
                    self._kill_dht(dht, {}, graceful=False)
                self._last_error = f"{type(e).__name__}: {e}"
                if peers:
                    log.warning(
                        "DHT could not start with initial peers %s (%s); starting SOLO and retrying to join "
                        "in the background", peers, self._last_error,
                    )
                else:
                    log.error("DHT could not start even solo: %s", self._last_error)
                continue
            with self._lock:
                closed = self._closed
                if not closed:
                    self._dht, self._info = dht, info
                    self._generation += 1
            if closed:  # shut down while this one was starting (a restart under way): it must not outlive us
                self._kill_dht(dht, info)
                return False
            self._solo_fallback = bool(self.initial_peers) and not peers
            self._health_failures = 0
            self._maddrs_cache = (time.monotonic(), list(info["maddrs"]))
            self._record_children(dht, info)
            self._join_delay = self.join_backoff[0]
            self._refresh_peer_count()
            if self._solo_fallback or (self.initial_peers and self._num_peers == 0):
                self._next_join = 0.0  # join at the watchdog's next step
            else:
                self._next_join = time.monotonic() + self.rejoin_interval if self.rejoin_interval > 0 else math.inf
            log.info("DHT started: peer id %s, maddrs %s, solo=%s", info["peer_id"], info["maddrs"],
                     self._solo_fallback or not self.initial_peers)
            return True
        return False

    def _record_children(self, dht: DHT, info: dict) -> None:
        if self.pid_file is None:
            return
        try:
            write_children_file(self.pid_file, [dht.pid, info.get("p2pd_pid")], [info.get("daemon_listen_maddr", "")])
        except OSError as e:
            log.warning("cannot write %s: %s (a node killed now may leave its DHT processes behind)", self.pid_file, e)

    def _kill_dht(self, dht: DHT | None, info: dict, graceful: bool = True) -> None:
        if dht is None:
            return
        clean = False
        try:
            room = _pipe_room(dht)
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
        if not clean:  # it died, hung or was killed: it may have taken hivemind's shared locks with it
            _fresh_mpfuture_locks()
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

    def restart(self, reason: str = "requested", if_generation: int | None = None, graceful: bool = True) -> bool:
        """Stop the current DHT process (if any) and start a fresh one; run the restart callbacks.

        :param reason: logged
        :param if_generation: restart only if :attr:`generation` still equals this (so that a watchdog and a
            caller that both saw the same dead DHT restart it once, not twice)
        :param graceful: ask the old process to shut down first (False: kill it; used for a hung process)
        :returns: whether a DHT process is running afterwards
        """
        with self._restart_lock:
            if self._closed:
                return False
            if if_generation is not None and if_generation != self._generation:
                return self.is_alive  # someone else restarted it meanwhile
            log.warning("restarting the DHT (%s)", reason)
            with self._lock:
                old, old_info = self._dht, self._info
                self._dht, self._info = None, {}
            self._kill_dht(old, old_info, graceful=graceful)
            ok = self._start_dht()
            self._restarts += 1
            if ok:
                for callback in list(self._callbacks):
                    try:
                        callback(self)
                    except Exception:  # noqa: BLE001
                        log.exception("DHT restart callback failed")
            return ok

    def shutdown(self) -> None:
        """Stop the watchdog and the DHT process (idempotent; bounded).

        A restart under way (the watchdog starting a new DHT process, up to ``startup_timeout`` s and more per
        attempt) is waited for at most ``shutdown_grace`` s: then the current process, if any, is stopped without
        it, and the restart kills the process it was starting once that returns (:meth:`_start_dht` sees the
        shutdown), so a node's stop never waits for the network."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=self.call_timeout + 5)
        restart_done = self._restart_lock.acquire(timeout=self.shutdown_grace)
        if not restart_done:
            log.info("a DHT restart is still under way after %.0f s; stopping without waiting for it",
                     self.shutdown_grace)
        try:
            swapped = self._lock.acquire(timeout=self.shutdown_grace)  # held only around swaps and pipe writes
            try:
                dht, info = self._dht, self._info
                self._dht, self._info = None, {}
            finally:
                if swapped:
                    self._lock.release()
        finally:
            if restart_done:
                self._restart_lock.release()
        self._kill_dht(dht, info)
        if self.pid_file is not None:
            try:
                self.pid_file.unlink()
            except OSError:
                pass

    def __enter__(self) -> SwarmDHT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def add_restart_callback(self, callback: Callable[[SwarmDHT], None]) -> None:
        """Call ``callback(self)`` (from the watchdog thread) after every successful restart."""
        self._callbacks.append(callback)

    # ------------------------------------------------------------------ health
    @property
    def is_alive(self) -> bool:
        """Whether the DHT child process is running."""
        dht = self._dht
        try:
            return dht is not None and dht.is_alive()
        except Exception:  # noqa: BLE001
            return False

    @property
    def num_peers(self) -> int:
        """DHT peers in the routing table at the last health check (no DHT call)."""
        return self._num_peers if self.is_alive else 0

    @property
    def connected(self) -> bool:
        """Whether the node knew at least one DHT peer at the last health check."""
        return self.num_peers > 0

    @property
    def restarts(self) -> int:
        """How many times :meth:`restart` ran (successful or not)."""
        return self._restarts

    @property
    def generation(self) -> int:
        """Incremented each time a DHT process starts successfully (1 after the first start)."""
        return self._generation

    @property
    def pid(self) -> int | None:
        """PID of the DHT child process (its p2pd is a child of it); None while none runs."""
        dht = self._dht
        return dht.pid if dht is not None else None

    def _refresh_peer_count(self) -> dict | None:
        try:
            health = self._call(lambda d: d.run_coroutine(_health, return_future=True), self.call_timeout)
        except Exception as e:  # noqa: BLE001
            self._last_error = f"health: {type(e).__name__}: {e}"
            return None
        self._num_peers = int(health["num_peers"])
        return health

    def check_health(self) -> bool:
        """One watchdog step: probe the DHT, restart a dead one, (re)join initial peers when due.

        :returns: whether the DHT answered (after a restart, whether the new one runs)
        """
        if self._closed:
            return False
        now = time.monotonic()
        generation = self._generation
        if not self.is_alive:
            if now < self._next_restart:
                return False
            ok = self.restart("DHT process is not running", if_generation=generation)
            self._after_restart_attempt(ok, now)
            return ok
        health = self._refresh_peer_count()
        if health is None or not health.get("p2pd_alive", True):
            self._health_failures += 1
            dead_p2pd = health is not None and not health.get("p2pd_alive", True)
            if dead_p2pd or self._health_failures >= 2:
                if now < self._next_restart:
                    return False
                ok = self.restart("p2pd died" if dead_p2pd else "DHT does not answer", if_generation=generation,
                                  graceful=dead_p2pd)
                self._after_restart_attempt(ok, now)
                return ok
            return False
        self._health_failures = 0
        if self.initial_peers and now >= self._next_join:
            self.try_join()
        return True

    def _after_restart_attempt(self, ok: bool, now: float) -> None:
        if ok:
            self._restart_delay = self.join_backoff[0]
            self._next_restart = 0.0
        else:
            self._next_restart = now + self._restart_delay
            self._restart_delay = min(self._restart_delay * 2, self.join_backoff[1])

    def try_join(self, peers: Sequence[str] | None = None, timeout: float | None = None) -> bool:
        """Connect to ``peers`` (default: ``initial_peers``), ping them and look ourselves up.

        :returns: whether at least one peer answered; failures schedule the next automatic attempt with
            exponential backoff (``join_backoff``)
        """
        if peers is None:
            peers = self.initial_peers
        else:
            for text in peers:
                parse_multiaddr(text)
            peers = [str(Multiaddr(m)) for m in peers]
        if not peers:
            return False
        timeout = self.call_timeout if timeout is None else float(timeout)
        self._join_attempts += 1
        try:
            answered = self._call(
                lambda d: d.run_coroutine(partial(_join, maddrs=list(peers), timeout=timeout), return_future=True),
                timeout * 2 + 1,
            )
        except Exception as e:  # noqa: BLE001
            self._last_error = f"join: {type(e).__name__}: {e}"
            answered = 0
        now = time.monotonic()
        if answered:
            if self._solo_fallback:
                log.warning("DHT joined the swarm through %d initial peer(s) after a solo start", answered)
            self._solo_fallback = False
            self._join_delay = self.join_backoff[0]
            self._next_join = now + self.rejoin_interval if self.rejoin_interval > 0 else math.inf
            self._refresh_peer_count()
            return True
        if self._num_peers > 0 and self.rejoin_interval > 0:  # still connected through other peers
            self._next_join = now + self.rejoin_interval
        else:
            self._next_join = now + self._join_delay
            self._join_delay = min(self._join_delay * 2, self.join_backoff[1])
        log.info("DHT join attempt failed; next attempt in %.1f s", self._next_join - now)
        return False

    def _watchdog_loop(self) -> None:
        while not self._stop.wait(self.health_interval):
            try:
                self.check_health()
            except Exception:  # noqa: BLE001 - the watchdog must survive everything
                log.exception("DHT watchdog step failed")

    def status(self) -> SwarmDHTStatus:
        """Snapshot of the DHT's state (no network call)."""
        return SwarmDHTStatus(
            alive=self.is_alive,
            connected=self.connected,
            num_peers=self.num_peers,
            solo_fallback=self._solo_fallback,
            restarts=self._restarts,
            join_attempts=self._join_attempts,
            last_error=self._last_error,
            peer_id=self._info.get("peer_id"),
            maddrs=list(self._maddrs_cache[1]),
        )

    # ------------------------------------------------------------------ identity / addresses
    @property
    def public_key(self) -> bytes:
        """Raw 32-byte Ed25519 public key owning our records."""
        return self.validator.public_key

    @property
    def peer_id(self) -> str | None:
        """Base58 libp2p PeerID of the running daemon (None while no DHT runs)."""
        return self._info.get("peer_id")

    @property
    def daemon_listen_maddr(self) -> str | None:
        """Control socket of the running p2pd (for ``hivemind.P2P.replicate``); None while no DHT runs."""
        return self._info.get("daemon_listen_maddr")

    def visible_maddrs(self, refresh: bool = False) -> list[str]:
        """Multiaddrs (with ``/p2p/<peer id>``) other peers can dial; cached.

        :param refresh: ask the daemon again if the cache is older than ``maddrs_refresh_interval``
        """
        stamp, cached = self._maddrs_cache
        if refresh and time.monotonic() - stamp >= self.maddrs_refresh_interval:
            try:
                fresh = self._call(
                    lambda d: d.run_coroutine(partial(_visible_maddrs, latest=True), return_future=True),
                    self.call_timeout,
                )
                self._maddrs_cache = (time.monotonic(), list(fresh))
            except Exception as e:  # noqa: BLE001
                self._last_error = f"maddrs: {type(e).__name__}: {e}"
                self._maddrs_cache = (time.monotonic(), cached)
        return list(self._maddrs_cache[1])

    def contact(self) -> PeerContact | None:
        """What a manifest needs to reach our bundle server (None while no DHT runs)."""
        peer = self.peer_id
        return None if peer is None else PeerContact(peer, tuple(self.visible_maddrs()))

    # ------------------------------------------------------------------ bounded calls
    def _send(self, send: Callable[[DHT], Any], nbytes: int) -> Any:
        """Write one request into the DHT's pipe (serialized across threads); returns its MPFuture."""
        with self._lock:
            dht = self._dht
            if dht is None or not dht.is_alive():
                raise ConnectionError("the DHT process is not running")
            room = _pipe_room(dht)
            if room is not None and room < nbytes + _REQUEST_OVERHEAD:
                raise TimeoutError("the DHT process is not reading its request pipe (pipe full)")
            return send(dht)

    def _call(self, send: Callable[[DHT], Any], timeout: float, nbytes: int = 0) -> Any:
        """Send one request to the DHT process and wait at most ``timeout`` s.

        :param nbytes: size of the request's payload (for the pipe-room check)
        :raises ConnectionError: when no DHT process runs
        :raises TimeoutError: when it does not answer in time (the request is cancelled) or cannot take requests
        """
        future = self._send(send, nbytes)
        try:
            return future.result(timeout)
        except (concurrent.futures.TimeoutError, TimeoutError):
            future.cancel()
            raise TimeoutError(f"DHT call did not finish in {timeout:.1f} s") from None

    def run_coroutine(self, coro: Callable[[DHT, Any], Any], timeout: float | None = None) -> Any:
        """Run ``coro(dht, node)`` inside the DHT process, bounded by ``timeout`` (default ``call_timeout``).

        ``coro`` must be picklable (a module-level async function or a ``functools.partial`` of one).

        :raises ConnectionError, TimeoutError: as :meth:`_call`
        """
        return self._call(lambda d: d.run_coroutine(coro, return_future=True),
                          self.call_timeout if timeout is None else timeout)

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

    def _store(self, key: str, value: bytes, ttl: float, timeout: float | None) -> bool:
        expiration = time.time() + ttl
        marker = self.validator.local_owner_marker
        try:
            ok = self._call(
                lambda d: d.store(key, value, expiration, subkey=marker, return_future=True),
                self.call_timeout if timeout is None else timeout,
                nbytes=len(value),
            )
        except Exception as e:  # noqa: BLE001
            self._last_error = f"store: {type(e).__name__}: {e}"
            log.debug("DHT store of %s failed: %s", key, self._last_error)
            return False
        if isinstance(ok, dict):  # store_many-style answers
            ok = all(ok.values())
        return bool(ok)

    def publish_manifest(self, swarm_id: str, bucket: int, manifest_bytes: bytes, timeout: float | None = None,
                         own_key: bool = True) -> bool:
        """Store our manifest for ``bucket`` under ``f"{swarm_id}:manifests:{bucket}"``, subkey = our owner marker.

        One record per publisher per bucket; publishing again replaces ours. Expires ``manifest_ttl`` s from now.
        With ``own_key`` the same record also replaces the one under our publisher key (pass False when
        re-publishing an older bucket than the newest one: the publisher key holds the newest record).

        :returns: whether at least this node stored it (False on timeout or when no DHT runs; never raises
            for network trouble)
        :raises ValueError: unknown ``swarm_id``, bad bucket, or ``manifest_bytes`` over ``max_record_bytes``
        :raises TypeError: ``manifest_bytes`` is not bytes
        """
        self._check_swarm(swarm_id)
        key = manifest_key(swarm_id, bucket)
        value = self._check_value(manifest_bytes, "manifest_bytes")
        ok = self._store(key, value, self.manifest_ttl, timeout)
        if own_key:
            ok = self._store(publisher_key(swarm_id, self.public_key), value, self.manifest_ttl, timeout) and ok
        return ok

    def publish_heartbeat(self, swarm_id: str, heartbeat_bytes: bytes, timeout: float | None = None) -> bool:
        """Store our heartbeat under ``f"{swarm_id}:heartbeats"`` (expires ``heartbeat_ttl`` s from now)."""
        self._check_swarm(swarm_id)
        return self._store(heartbeat_key(swarm_id), self._check_value(heartbeat_bytes, "heartbeat_bytes"),
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
        timeout = self.call_timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + timeout
        futures = []
        for key in keys:
            try:
                futures.append(self._send(lambda d, key=key: d.get(key, latest=True, return_future=True), 0))
            except Exception as e:  # noqa: BLE001
                self._last_error = f"get: {type(e).__name__}: {e}"
                futures.append(None)
        results = []
        for key, future in zip(keys, futures):
            if future is None:
                results.append([])
                continue
            try:
                results.append(self._entries(future.result(max(0.0, deadline - time.monotonic()))))
            except Exception as e:  # noqa: BLE001 - timeout or DHT error = no data
                future.cancel()
                self._last_error = f"get {key}: {type(e).__name__}: {e}"
                results.append([])
        return results

    def read_manifests(
        self, swarm_id: str, buckets: Sequence[int], timeout: float | None = None
    ) -> list[tuple[bytes, bytes]]:
        """All valid manifests stored under the given buckets.

        :param buckets: bucket indices (see :func:`time_bucket`), e.g. the last ``read_buckets`` ones
        :param timeout: bound for all lookups together (s; default ``call_timeout``)
        :returns: ``[(publisher_public_key (32 bytes), manifest_bytes)]``, sorted by bucket then publisher;
            empty when nothing is found, on timeout, or when no DHT runs. Entries whose subkey is not an
            owner marker, whose value is not bytes or over the cap, or whose expiration is out of range are
            dropped one by one. The caller must still check that the manifest's signed publisher key equals
            the returned owner key.
        """
        self._check_swarm(swarm_id)
        keys = [manifest_key(swarm_id, b) for b in buckets]
        return [entry for per_key in self._read(keys, timeout) for entry in per_key]

    def read_publishers(self, swarm_id: str, public_keys: Sequence[bytes],
                        timeout: float | None = None) -> list[tuple[bytes, bytes]]:
        """The newest manifest record of each given publisher, read from its own publisher key.

        :param public_keys: raw 32-byte Ed25519 public keys (e.g. the peers with earned standing)
        :param timeout: bound for all lookups together (s; default ``call_timeout``)
        :returns: ``[(publisher_public_key, record_bytes)]`` in the order of ``public_keys``; an entry whose
            owner is not the key's publisher is dropped (validators refuse those; a reader checks again)
        :raises ValueError: unknown ``swarm_id`` or a key that is not 32 bytes
        """
        self._check_swarm(swarm_id)
        pubs = [bytes(p) for p in public_keys]
        keys = [publisher_key(swarm_id, p) for p in pubs]
        out = []
        for pub, per_key in zip(pubs, self._read(keys, timeout)):
            out.extend(entry for entry in per_key if entry[0] == pub)
        return out

    def read_heartbeats(self, swarm_id: str, timeout: float | None = None) -> list[tuple[bytes, bytes]]:
        """All valid heartbeats: ``[(publisher_public_key, heartbeat_bytes)]``.

        Same validation and "no data" rules as :meth:`read_manifests`.
        """
        self._check_swarm(swarm_id)
        return self._read([heartbeat_key(swarm_id)], timeout)[0]

    def current_bucket(self, now: float | None = None) -> int:
        """``time_bucket(now, bucket_seconds)`` with ``now`` defaulting to ``time.time()``."""
        return time_bucket(time.time() if now is None else now, self.bucket_seconds)

    def recent_buckets(self, k: int, now: float | None = None) -> list[int]:
        """The ``k`` most recent bucket indices, newest last."""
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        current = self.current_bucket(now)
        return list(range(current - k + 1, current + 1))
