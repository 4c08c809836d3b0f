"""One hivemind DHT process kept running and callable: start, watchdog, restart, join, bounded calls.

:class:`DHTHost` is the process half of :class:`~swarmnode.swarm.dht.SwarmDHT` (its base class; the records half,
what the swarm stores and reads, is in :mod:`swarmnode.swarm.dht`). It starts a DHT process with the initial peers,
else solo, and keeps trying to join them; a watchdog thread restarts a dead or hung process with backoff and runs
the restart callbacks; every call into the process is bounded (pipe room checked first, ``result(timeout)``).
Why each of these exists: the module docstring of :mod:`swarmnode.swarm.dht`. The processes themselves (dying
with the node, stopping) are :mod:`swarmnode.swarm.dht_process`; the pipe their results come back on
:mod:`swarmnode.swarm.result_channel`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from hivemind.dht import DHT
from hivemind.utils.multiaddr import Multiaddr

from swarmnode.rundir import end_stale_children, write_children_file
from swarmnode.swarm.dht_process import (
    REQUEST_OVERHEAD,
    NodeBoundDHT,
    health_info,
    join_peers,
    pipe_room,
    read_visible_maddrs,
    startup_info,
    stop_dht_process,
)
from swarmnode.swarm.maddrs import check_listen_maddrs, loopback_only, parse_multiaddr
from swarmnode.swarm.validator import Ed25519RecordValidator

__all__ = ["DHTHost", "SwarmDHTStatus"]

log = logging.getLogger("swarmnode.swarm.dht")  # all of the DHT's log lines under one name


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


class DHTHost:
    """A hivemind DHT process that is started, watched, restarted and called with bounds (see module docstring).

    The subclass sets :attr:`validator` (the record validator every DHT process is started with) before
    :meth:`start`; :class:`~swarmnode.swarm.dht.SwarmDHT` does.

    :param initial_peers: bootstrap multiaddrs, each with ``/p2p/<peer id>``; empty = first node of a swarm
    :param host_maddrs: where p2pd listens (use ``/ip4/0.0.0.0/tcp/<port>`` to be reachable from elsewhere)
    :param announce_maddrs: public addresses to announce (explicit ports; port 0 is refused)
    :param call_timeout: default bound on each DHT call (s)
    :param startup_timeout: p2pd start-up timeout (s; hivemind's 15 s default is too short on slow boxes)
    :param health_interval: watchdog period (s); 0 disables the watchdog (call :meth:`check_health` yourself)
    :param join_backoff: (first, max) delay in seconds between attempts to join ``initial_peers``
    :param rejoin_interval: re-run the join even when connected, every this many seconds (hivemind #624:
        peers given the same bootstrap can end up in split DHTs); 0 disables the periodic re-join
    :param maddrs_refresh_interval: seconds a cached answer of :meth:`visible_maddrs` is used before the daemon
        is asked again
    :param p2p_identity_path: libp2p identity file (makes the PeerID stable across restarts); None lets
        hivemind pick a fresh identity each start
    :param client_mode: a DHT client refuses incoming DHT requests (for nodes that cannot be reached)
    :param dht_kwargs: extra keyword arguments for ``hivemind.DHT`` / ``DHTNode.create`` / ``P2P.create``
    :param pid_file: where to record the DHT child and its p2pd (pid + start time, JSON); on :meth:`start` the
        processes a killed predecessor recorded there are ended first (:func:`end_stale_children`); removed on
        :meth:`shutdown`. None records nothing.
    :param shutdown_grace: seconds a stopping DHT process gets to shut down before it is terminated
    :raises ValueError: on malformed multiaddrs, ids or limits (the message names the argument)
    """

    validator: Ed25519RecordValidator

    def __init__(
        self,
        *,
        initial_peers: Sequence[str] = (),
        host_maddrs: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",),
        announce_maddrs: Sequence[str] = (),
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
    ):
        for name, value in [("call_timeout", call_timeout), ("startup_timeout", startup_timeout)]:
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
        if health_interval < 0 or not (0 < join_backoff[0] <= join_backoff[1]):
            raise ValueError(f"need health_interval >= 0 and 0 < join_backoff[0] <= join_backoff[1], "
                             f"got {health_interval!r}, {join_backoff!r}")
        if isinstance(initial_peers, str):
            raise ValueError(f"initial_peers must be a list of multiaddrs, got the single string {initial_peers!r}")
        for text in initial_peers:
            parse_multiaddr(text)  # raises ValueError naming the bad entry
        self.initial_peers = [str(Multiaddr(m)) for m in initial_peers]
        self.host_maddrs = check_listen_maddrs(host_maddrs, "host_maddrs", allow_port_zero=True)
        self.announce_maddrs = check_listen_maddrs(announce_maddrs, "announce_maddrs", allow_port_zero=False)
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
        self._dht: DHT | None = None
        self._info: dict = {}
        self._lock = threading.RLock()  # guards self._dht swaps and pipe sends
        self._restart_lock = threading.Lock()
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._callbacks: list[Callable[[DHTHost], None]] = []
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

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> bool:
        """Start the DHT process (with bootstrap, else solo) and the watchdog. Never raises on network trouble.

        :returns: whether a DHT process is running afterwards (False: start-up failed; the watchdog retries)
        """
        if self._closed:
            raise RuntimeError("this DHTHost was shut down; create a new one")
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
        dht = NodeBoundDHT(
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
            stop_dht_process(dht, {})
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
                info = dht.run_coroutine(startup_info, return_future=True).result(max(self.call_timeout, 30.0))
                self._configure_dht(dht)
            except Exception as e:  # noqa: BLE001 - p2pd start / bootstrap failures are expected here
                if dht is not None:  # started but does not answer: do not leak the process
                    stop_dht_process(dht, {}, graceful=False)
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
                stop_dht_process(dht, info)
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

    def _configure_dht(self, dht: DHT) -> None:
        """Called once a new DHT process answers, before it is used (a subclass's hook: :class:`SwarmDHT` bounds
        its storage there). An exception fails that start attempt."""

    def _record_children(self, dht: DHT, info: dict) -> None:
        if self.pid_file is None:
            return
        try:
            write_children_file(self.pid_file, [dht.pid, info.get("p2pd_pid")], [info.get("daemon_listen_maddr", "")])
        except OSError as e:
            log.warning("cannot write %s: %s (a node killed now may leave its DHT processes behind)", self.pid_file, e)

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
            stop_dht_process(old, old_info, graceful=graceful)
            self._restarts += 1  # counted before the new generation shows, so a reader never sees one without it
            ok = self._start_dht()
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
        stop_dht_process(dht, info)
        if self.pid_file is not None:
            try:
                self.pid_file.unlink()
            except OSError:
                pass

    def __enter__(self) -> DHTHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def add_restart_callback(self, callback: Callable[[DHTHost], None]) -> None:
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
            health = self._call(lambda d: d.run_coroutine(health_info, return_future=True), self.call_timeout)
        except Exception as e:  # noqa: BLE001
            self._last_error = f"health: {type(e).__name__}: {e}"
            return None
        self._num_peers = int(health["num_peers"])
        return health

    def check_health(self) -> bool:
        """One watchdog step: probe the DHT, restart a dead one, (re)join initial peers when due (every
        ``rejoin_interval`` seconds, after failed joins with backoff, and at once when the routing table is empty).

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
        if self.initial_peers and self._num_peers == 0 and self._next_join > now + self._join_delay:
            # every neighbour left the routing table (hivemind drops a peer whose reply failed, or that refused a
            # request): join again now, not at the next periodic rejoin (an outside run saw a reader wait 300 s)
            self._next_join = now
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
                lambda d: d.run_coroutine(partial(join_peers, maddrs=list(peers), timeout=timeout), return_future=True),
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
                    lambda d: d.run_coroutine(partial(read_visible_maddrs, latest=True), return_future=True),
                    self.call_timeout,
                )
                self._maddrs_cache = (time.monotonic(), list(fresh))
            except Exception as e:  # noqa: BLE001
                self._last_error = f"maddrs: {type(e).__name__}: {e}"
                self._maddrs_cache = (time.monotonic(), cached)
        return list(self._maddrs_cache[1])

    # ------------------------------------------------------------------ bounded calls
    def _send(self, send: Callable[[DHT], Any], nbytes: int) -> Any:
        """Write one request into the DHT's pipe (serialized across threads); returns its MPFuture."""
        with self._lock:
            dht = self._dht
            if dht is None or not dht.is_alive():
                raise ConnectionError("the DHT process is not running")
            room = pipe_room(dht)
            if room is not None and room < nbytes + REQUEST_OVERHEAD:
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

