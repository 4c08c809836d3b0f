"""The hostile peer on a real swarm, :class:`HostilePeer`: the bytes of each class come from ``factory.py``, its
manifest from ``cases.py``, the misbehaving DHT and stream handler from ``network.py`` (docs/reference/design.md
§6)."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

from swarmnode.config import SwarmConfig
from swarmnode.rollout.tree import RolloutTree
from swarmnode.swarm import wire
from swarmnode.swarm.identity import Identity
from swarmnode.tasks.base import TaskRef
from swarmnode.tasks.mix import TaskMix
from swarmnode.testing.adversary.cases import HARVESTED_CASES, NETWORK_CASES, RECORD_CASES, CaseBuilder
from swarmnode.testing.adversary.factory import BYTE_TOKENIZER_ID, BYTE_VOCAB_SIZE, HostileFactory, byte_tokenize
from swarmnode.testing.adversary.network import _routing_peers, flood_bucket_key, network_classes

__all__ = ["HostilePeer"]

log = logging.getLogger(__name__)

_GARBAGE_RECORD = b"\xc1 swarmnode hostile record: not msgpack \xc1"
_MAP_CAP = 4096


def _bounded_put(d: OrderedDict, key: Any, value: Any, cap: int = _MAP_CAP) -> None:
    d[key] = value
    d.move_to_end(key)
    while len(d) > cap:
        d.popitem(last=False)


class HostilePeer:
    """A hostile peer on a real swarm: its own Ed25519 identity and libp2p daemon in the swarm's hivemind DHT,
    publishing every class of :data:`NETWORK_CASES` it can deliver over the network (docs/reference/design.md §6).

    The bytes come from :class:`HostileFactory`; the network parts are the real ones (a
    :class:`~swarmnode.swarm.dht.SwarmDHT` whose record validator forges signatures under other publishers'
    subkeys, and a :class:`~swarmnode.swarm.transport.BundleServer` whose stream handler misbehaves per digest).
    Each hostile bundle is announced in a signed manifest inside the peer's own DHT record -- a truthful manifest
    when one exists (then the receiver rejects it for the same reason, before fetching, whenever the flaw shows
    in the manifest: swarm id, time, tasks, size) or a *cover* manifest (a fresh, in-swarm manifest naming the
    bytes' digest and size) for bytes that do not decode -- and served over the real p2p stream.

    Classes are published in *waves* of at most ``MAX_RECORD_MANIFESTS`` manifests (one DHT record per time
    bucket and publisher, :meth:`waves`); :meth:`run_round` publishes the next slot of a cycle -- each wave, then
    a garbage record -- as its record of the current bucket, and a record under each victim's subkey, after
    :meth:`harvest` has looked for *victim-accepted* bundles: bundles it can fetch from a peer that is not their
    publisher (honest nodes re-serve only what they verified and accepted, so such a peer has accepted it), the
    material of ``replay`` and ``flood`` (skipped until there is some).

    In-process (tests): call :meth:`publish_wave` / :meth:`run_round` yourself, or :meth:`start_loop`. As a
    process (benchmarks): ``swarmnode.bench.swarm.worker.hostile_main`` runs :meth:`run` until told to stop.

    Args:
        swarm_cfg: the honest nodes' ``swarm`` config (:class:`~swarmnode.config.SwarmConfig`): ``swarm_id``,
            ``initial_peers`` (used when ``initial_peers`` is None), ``bucket_seconds``, ``read_buckets``,
            ``freshness_seconds``, ``max_clock_skew`` (s), ``max_bundle_bytes`` (the receivers' byte cap, for
            ``oversized``), ``dht_timeout`` and ``fetch_timeout`` (s).
        tasks: the swarm's task mix (``swarmnode.tasks.TaskMix``), to build bundles of real tasks.
        initial_peers: multiaddrs (with ``/p2p/<PeerID>``) of honest nodes to join through.
        identity: its signing key (default: a fresh random :class:`~swarmnode.swarm.identity.Identity`).
        tokenize / tokenizer_id / vocab_size: the honest nodes' tokenizer (``text -> ids``), its id and size, so
            that the same-tokenizer classes (``token_out_of_vocab``, ``text_mismatch``) reach their checks.
        cases: class names to deliver, in :data:`NETWORK_CASES` order (default: all).
        flood_copies: manifests per ``flood`` (1..16).
        host_maddrs: where its p2pd listens (default: loopback, a free port).
        hang_seconds: longest a silent stream is held open (s; the receiver gives up after its fetch timeout).
        dht_kwargs: extra keyword arguments for its :class:`~swarmnode.swarm.dht.SwarmDHT`.
        seed: seed of the random parts of the bytes.
        start: start the DHT and the stream handler now (else call :meth:`start`).
        model_id: the model id its bundles claim (a poisoner claims the honest nodes' own, so that its samples
            are treated as same-family ones).

    Raises:
        ValueError: an unknown case name or ``flood_copies`` out of range.
    """

    def __init__(
        self,
        swarm_cfg: SwarmConfig,
        tasks: TaskMix,
        *,
        initial_peers: list[str] | None = None,
        identity: Identity | None = None,
        tokenize: Callable[[str], list[int]] = byte_tokenize,
        tokenizer_id: str = BYTE_TOKENIZER_ID,
        vocab_size: int = BYTE_VOCAB_SIZE,
        cases: list[str] | None = None,
        flood_copies: int = 4,
        host_maddrs: list[str] | None = None,
        hang_seconds: float = 120.0,
        dht_kwargs: dict | None = None,
        seed: int = 0,
        start: bool = True,
        model_id: str = "hostile/model",
    ) -> None:
        from collections import Counter

        from cryptography.hazmat.primitives import serialization

        names = list(NETWORK_CASES) if cases is None else list(cases)
        unknown = [n for n in names if n not in NETWORK_CASES]
        if unknown:
            raise ValueError(f"unknown hostile network cases {unknown}; known: {', '.join(NETWORK_CASES)}")
        if not 1 <= int(flood_copies) <= wire.MAX_RECORD_MANIFESTS:
            raise ValueError(f"flood_copies must be in 1..{wire.MAX_RECORD_MANIFESTS}, got {flood_copies!r}")
        self.cases = [n for n in NETWORK_CASES if n in names]
        self.flood_copies = int(flood_copies)
        self.scfg = swarm_cfg
        self.swarm_id: str = swarm_cfg.swarm_id
        self.tasks = tasks
        self.identity = identity or Identity.generate()
        self.public_key = self.identity.public_key_bytes
        self.peer_id = self.identity.peer_id
        self.receiver_cap = min(int(swarm_cfg.trust.max_bundle_bytes), wire.MAX_ENVELOPE_BYTES)
        self.read_buckets = int(swarm_cfg.net.read_buckets)
        self.fetch_timeout = float(swarm_cfg.net.fetch_timeout)
        self.dht_timeout = float(swarm_cfg.net.dht_timeout)
        self.vocab_size = int(vocab_size)
        self.factory = HostileFactory(self.identity, tasks, swarm_id=self.swarm_id, tokenize=tokenize,
                                      tokenizer_id=tokenizer_id, vocab_size=vocab_size,
                                      model_id=model_id, freshness_seconds=swarm_cfg.trust.freshness_seconds,
                                      max_clock_skew=swarm_cfg.trust.max_clock_skew, max_bundle_bytes=self.receiver_cap,
                                      sender=None, seed=seed)
        self._builder = CaseBuilder(self.identity, self.swarm_id, tasks, self.factory, vocab_size=vocab_size,
                                    flood_copies=self.flood_copies, proven=self._proven_bundles)
        self.delivered: Counter[str] = Counter()
        self.rounds = 0
        self.foreign_store_accepted = 0
        self.victims: list[bytes] = []
        self._proven: OrderedDict[str, bytes] = OrderedDict()  # victim-accepted bundles: digest -> bytes
        self._tries: OrderedDict[str, int] = OrderedDict()
        self._names: OrderedDict[str, str] = OrderedDict()  # digest of bytes we serve -> case name
        self._unstored: dict[int, tuple[bytes, list[str]]] = {}  # wave -> (record, names) whose store failed
        self._extra: dict[int, list[bytes]] = {}  # bucket -> manifests of publish_bundles, newest last
        self.published: Counter[str] = Counter()  # bundles of publish_bundles by label (not NETWORK_CASES)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        dht_cls, server_cls, store_cls = network_classes()
        key = serialization.load_pem_private_key(self.identity.to_pem(), password=None)
        read_window = (self.read_buckets + 1) * float(swarm_cfg.net.bucket_seconds)
        kw: dict[str, Any] = dict(
            swarm_ids=[self.swarm_id],
            initial_peers=list(swarm_cfg.net.initial_peers if initial_peers is None else initial_peers),
            host_maddrs=list(host_maddrs or ["/ip4/127.0.0.1/tcp/0"]),
            bucket_seconds=float(swarm_cfg.net.bucket_seconds),
            manifest_ttl=min(900.0, max(120.0, read_window)),
            max_clock_skew=float(swarm_cfg.trust.max_clock_skew),
            max_record_bytes=wire.MAX_RECORD_BYTES,
            call_timeout=self.dht_timeout,
            join_backoff=(1.0, 30.0),
            start=False,
        )
        kw.update(dht_kwargs or {})
        self.dht = dht_cls(key, **kw)
        self.server = server_cls(self.dht, store_cls(max_total_bytes=256 * 1024 * 1024,
                                                     max_item_bytes=wire.MAX_ENVELOPE_BYTES),
                                 max_concurrent_serves=64, request_timeout=max(self.fetch_timeout, 5.0),
                                 hang_seconds=hang_seconds, start=False)
        self._started = False
        if start:
            self.start()

    # ------------------------------------------------------------------ lifecycle and identity
    def start(self) -> None:
        """Start the DHT (solo when no initial peer answers yet; it keeps joining) and the stream handler."""
        if self._started:
            return
        from swarmnode.swarm.gossip import _install_fork_hook

        self._started = True
        _install_fork_hook()
        self.dht.start()
        self.server.start()

    @property
    def libp2p_peer_id(self) -> str | None:
        """Base58 libp2p PeerID of its daemon (None while no DHT runs)."""
        return self.dht.peer_id

    @property
    def sender_id(self) -> str:
        """The transport id honest nodes charge for bytes fetched from it: ``p2p:<libp2p PeerID>``."""
        return f"p2p:{self.libp2p_peer_id}"

    def maddrs(self) -> list[str]:
        """Its multiaddrs (with ``/p2p/<PeerID>``)."""
        return self.dht.visible_maddrs()

    def close(self) -> None:
        """Stop the loop (if any), the stream handler and the DHT (idempotent)."""
        self.stop_loop()
        try:
            self.server.close()
        finally:
            self.dht.shutdown()

    def __enter__(self) -> HostilePeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ what it publishes
    def waves(self) -> list[list[str]]:
        """The classes in publication order, in waves of at most ``MAX_RECORD_MANIFESTS`` manifests each (one DHT
        record); the record-level classes are not in waves (:meth:`publish_garbage_record`,
        :meth:`publish_foreign_subkey`), ``replay`` and ``flood`` come last (they need harvested bundles)."""
        order = [n for n in self.cases if n not in RECORD_CASES and n not in HARVESTED_CASES]
        order += [n for n in HARVESTED_CASES if n in self.cases]
        waves: list[list[str]] = []
        cur: list[str] = []
        used = 0
        for n in order:
            k = self.flood_copies if n == "flood" else 1
            if cur and used + k > wire.MAX_RECORD_MANIFESTS:
                waves.append(cur)
                cur, used = [], 0
            cur.append(n)
            used += k
        if cur:
            waves.append(cur)
        return waves

    def expected_rejections(self, delivered: dict[str, int] | None = None) -> dict[str, dict[str, int]]:
        """What an honest node's PeerBook must hold for this peer after judging ``delivered`` (default: every class
        delivered so far, each once per delivery) with no ban in between: ``{peer id: {reason: count}}`` for its
        ``sn1…`` id and its transport id (:attr:`sender_id`). Uncharged and transport-stage classes are left out."""
        out: dict[str, dict[str, int]] = {self.peer_id: {}, self.sender_id: {}}
        for name, n in (self.delivered if delivered is None else delivered).items():
            c = NETWORK_CASES[name]
            if c.charged is None or c.reason is None or c.stage in ("transport", "dht"):
                continue
            row = out[self.peer_id if c.charged == "signer" else self.sender_id]
            row[c.reason] = row.get(c.reason, 0) + int(n)
        return out

    def stats(self) -> dict[str, Any]:
        """JSON-ready counters: ids, rounds, classes delivered, stream requests per class, harvested bundles,
        foreign-subkey stores some peer accepted (must stay 0), the stream handler's counters."""
        with self._lock:
            requests: dict[str, int] = {}
            for digest, n in list(self.server.requests.items()):
                name = self._names.get(digest, "other")
                requests[name] = requests.get(name, 0) + n
            return {"peer_id": self.peer_id, "sender_id": self.sender_id, "libp2p_peer_id": self.libp2p_peer_id,
                    "rounds": self.rounds, "delivered": dict(self.delivered), "stream_requests": requests,
                    "harvested": len(self._proven), "foreign_store_accepted": self.foreign_store_accepted,
                    "published": dict(self.published),
                    "server": dict(self.server.counters)}

    def requests_for(self, name: str) -> int:
        """Stream requests honest nodes made for the bytes of class ``name`` (0: never fetched)."""
        with self._lock:
            return sum(n for d, n in list(self.server.requests.items()) if self._names.get(d) == name)

    # ------------------------------------------------------------------ harvesting victim-accepted bundles
    def harvest(self, max_fetches: int = 4) -> int:
        """Read the swarm's manifest records and fetch announced bundles from peers other than their publisher.

        A peer serves another's bundle only after verifying and accepting it, so every bundle fetched this way
        was accepted by someone (its publisher knows it too): the material of ``replay`` and ``flood``. Also
        records the other publishers' keys (the victims of ``foreign_subkey``).

        Args:
            max_fetches: most fetch attempts this call (each bounded by ``swarm.net.fetch_timeout``).

        Returns:
            The number of new victim-accepted bundles.
        """
        entries = self.dht.read_manifests(self.swarm_id, self.dht.recent_buckets(self.read_buckets),
                                          timeout=self.dht_timeout)
        contacts: dict[bytes, tuple[str, list[str]]] = {}
        found: list[tuple[bytes, wire.Manifest]] = []
        own_libp2p = self.libp2p_peer_id
        for owner, value in entries:
            if owner == self.public_key:
                continue
            try:
                rec = wire.decode_manifest_record(value)
            except wire.WireError:
                continue
            if rec.libp2p_peer_id == own_libp2p:
                continue
            contacts[owner] = (rec.libp2p_peer_id, list(rec.maddrs))
            for menv in rec.manifests:
                try:
                    env, m = wire.decode(menv, expected_kind=wire.KIND_MANIFEST)
                except wire.WireError:
                    continue
                if env.public_key == owner and isinstance(m, wire.Manifest) and m.swarm_id == self.swarm_id:
                    found.append((owner, m))
        self.victims = list(contacts)
        relays = {c[0]: c[1] for c in contacts.values()}  # libp2p PeerID -> multiaddrs
        try:  # peers that publish nothing still re-serve what they accepted: the DHT's routing table knows them
            for pid in self.dht.run_coroutine(_routing_peers, timeout=self.dht_timeout):
                relays.setdefault(pid, [])
        except Exception as e:  # noqa: BLE001
            log.debug("hostile peer: no routing table: %s", e)
        relays.pop(own_libp2p, None)
        found.sort(key=lambda x: x[1].created_at, reverse=True)
        new = attempts = 0
        for owner, m in found:
            digest = m.bundle_digest.hex()
            if digest in self._proven or self._tries.get(digest, 0) >= 5:
                continue
            for libp2p_id, maddrs in relays.items():
                if libp2p_id == contacts[owner][0] or attempts >= max_fetches:
                    continue
                attempts += 1
                _bounded_put(self._tries, digest, self._tries.get(digest, 0) + 1)
                try:
                    res = self.server.fetch_result(libp2p_id, digest, timeout=min(self.fetch_timeout, 3.0),
                                                   max_bytes=m.bundle_size, maddrs=maddrs, cache=False)
                except ValueError:
                    continue
                if res.ok and res.body is not None:
                    _bounded_put(self._proven, digest, res.body, 16)
                    new += 1
                    break
            if attempts >= max_fetches:
                break
        return new

    # ------------------------------------------------------------------ building one class
    def _proven_bundles(self) -> list[bytes]:
        """The victim-accepted bundles harvested so far, oldest first."""
        with self._lock:
            return list(self._proven.values())

    def _serve(self, name: str, data: bytes, mode: str | None) -> None:
        digest = self.server.put(data)
        with self._lock:
            _bounded_put(self._names, digest, name)
            if mode is not None:
                _bounded_put(self.server.modes, digest, mode)
            if mode == "lie":
                _bounded_put(self.server.lies, digest, data[:-1] + bytes([data[-1] ^ 1]))

    def _record(self, manifests: list[bytes]) -> bytes:
        contact = self.dht.contact()
        if contact is None:
            raise ConnectionError("no DHT daemon runs")
        maddrs = [m for m in contact.maddrs if len(m.encode()) <= wire.MAX_ID_BYTES][: wire.MAX_RECORD_ADDRS]
        return wire.encode_manifest_record(wire.ManifestRecord(manifests, contact.peer_id, maddrs))

    # ------------------------------------------------------------------ publishing
    def publish_wave(self, index: int) -> list[str]:
        """Build the classes of wave ``index`` (modulo the number of waves) afresh and store them as our record
        of the current time bucket (replacing our previous record there).

        Returns:
            The classes delivered (stored in the DHT); classes that cannot be built now (``replay`` / ``flood``
            before :meth:`harvest` found material, ``oversized`` with a 4 MiB receiver cap) are left out, and
            nothing is delivered when the DHT store fails -- the next call for the same wave then stores the same
            record bytes again (a store that timed out may still have reached some peers: receivers must not see
            two different versions of one delivery).
        """
        waves = self.waves()
        if not waves:
            return []
        index %= len(waves)
        pending = self._unstored.get(index)
        if pending is not None:
            record, names = pending
            if not self.dht.publish_manifest(self.swarm_id, self.dht.current_bucket(), record,
                                             timeout=self.dht_timeout):
                return []
            del self._unstored[index]
            with self._lock:
                self.delivered.update(names)
            return names
        manifests: list[bytes] = []
        names = []
        for name in waves[index]:
            try:
                items = self._builder.build(name)
            except Exception as e:  # noqa: BLE001 - a harness bug must not stop the other classes
                log.warning("hostile peer: cannot build %s: %s: %s", name, type(e).__name__, e)
                continue
            for menv, data, mode in items:
                if data is not None:
                    self._serve(name, data, mode)
                manifests.append(menv)
            if items:
                names.append(name)
        if not manifests:
            return []
        try:
            record = self._record(manifests)
        except (ConnectionError, wire.WireError) as e:
            log.warning("hostile peer: cannot build its record: %s", e)
            return []
        if not self.dht.publish_manifest(self.swarm_id, self.dht.current_bucket(), record, timeout=self.dht_timeout):
            self._unstored[index] = (record, names)
            return []
        with self._lock:
            self.delivered.update(names)
        return names

    def publish_bundles(self, bundles: list[list[RolloutTree]], *, created_at: float | None = None,
                        mode: str | None = None, name: str = "bundles") -> list[str]:
        """Publish one signed bundle per tree list, with truthful manifests, in our record of the current bucket.

        The record keeps our newest ``MAX_RECORD_MANIFESTS`` manifests of the bucket (earlier calls in the same
        bucket stay announced, as an honest node's would).

        Args:
            bundles: the trees of each bundle (e.g. :meth:`HostileFactory.honest_trees` or
                :meth:`HostileFactory.contrast_trees`).
            created_at: the signed creation time of the bundles and manifests (default now).
            mode: the stream behaviour for their bodies (``None``: served honestly; ``"hang"``, ``"overclaim"``,
                ``"short"`` as in the transport cases).
            name: the label their stream requests are counted under (:meth:`requests_for`).

        Returns:
            The hex digests of the bundles announced (empty when the DHT store failed).
        """
        if mode not in (None, "hang", "overclaim", "short"):
            raise ValueError(f"mode must be None, 'hang', 'overclaim' or 'short', got {mode!r}")
        bucket = self.dht.current_bucket()
        digests: list[str] = []
        manifests: list[bytes] = []
        for trees in bundles:
            b, env = self.factory.bundle(trees, created_at=created_at)
            self._serve(name, env, mode)
            manifests.append(self._builder.sign_manifest(wire.manifest_for_bundle(env, b)))
            digests.append(wire.envelope_digest(env).hex())
        box = self._extra.setdefault(bucket, [])
        box.extend(manifests)
        del box[:-wire.MAX_RECORD_MANIFESTS]
        for old in [k for k in self._extra if k < bucket - self.read_buckets - 1]:
            del self._extra[old]
        try:
            record = self._record(list(box))
        except (ConnectionError, wire.WireError) as e:
            log.warning("hostile peer: cannot build its record: %s", e)
            return []
        if not self.dht.publish_manifest(self.swarm_id, bucket, record, timeout=self.dht_timeout):
            return []
        with self._lock:
            self.published[name] += len(digests)
        return digests

    def publish_hanging(self, n: int = wire.MAX_RECORD_MANIFESTS, future_s: float | None = None) -> list[str]:
        """A fetch-starving attack: ``n`` honest-looking one-tree bundles dated ``future_s`` seconds ahead (default
        5 s inside the receivers' ``max_clock_skew``, so they pass the freshness check and used to win a newest-first
        fetch order), whose bodies hang on the stream until the fetcher gives up. Counted under ``"hanging"``.

        Returns:
            The hex digests announced (empty when the DHT store failed).
        """
        if future_s is None:
            future_s = max(0.0, float(self.scfg.trust.max_clock_skew) - 5.0)
        t = time.time() + float(future_s)
        return self.publish_bundles([self.factory.honest_trees(1, 4) for _ in range(int(n))], created_at=t,
                                    mode="hang", name="hanging")

    def flood_bucket_key(self, n_keys: int, manifests_per_key: int = wire.MAX_RECORD_MANIFESTS,
                         bucket: int | None = None, seed: int = 0, ttl: float = 300.0) -> dict[str, Any]:
        """An outside attack: ``n_keys`` free keys each store one full manifest record (``manifests_per_key``
        signed manifests of honest-looking bundles nobody serves, about 11 KB at 16) under the shared manifest key
        of ``bucket`` (default: the current one), correctly signed for the DHT by their own keys, so every honest
        validator accepts them.

        The entries are stored directly on every DHT peer in our routing table (hivemind ``call_store``, 20 per
        request to stay under its 4 MiB message cap) from inside our DHT process, the way any peer can.

        Returns:
            ``{"keys": n_keys, "record_bytes": bytes of one record, "stored": accepted stores, "peers": peers
            asked}``.

        Raises:
            ConnectionError: no DHT daemon runs here.
        """
        return flood_bucket_key(self.dht, self.factory, self.swarm_id, self.peer_id, n_keys, manifests_per_key,
                                bucket, seed, ttl)

    def publish_garbage_record(self) -> list[str]:
        """``record_garbage``: store bytes that are not msgpack as our record of the current time bucket (replacing
        our previous record there; receivers read the current bucket on every poll).

        Returns:
            ``["record_garbage"]`` when stored, else ``[]`` (also when the class is not enabled).
        """
        if "record_garbage" not in self.cases:
            return []
        if not self.dht.publish_manifest(self.swarm_id, self.dht.current_bucket(), _GARBAGE_RECORD,
                                         timeout=self.dht_timeout):
            return []
        with self._lock:
            self.delivered["record_garbage"] += 1
        return ["record_garbage"]

    def publish_foreign_subkey(self) -> list[str]:
        """``foreign_subkey``: store a manifest record of ours under every victim's owner-marked subkey (at most
        four victims: the publishers :meth:`harvest` saw) in the current bucket, signed with our own key. Honest
        DHT peers must refuse it; :attr:`foreign_store_accepted` counts stores that some peer accepted.

        Returns:
            ``["foreign_subkey"]`` when attempted, else ``[]`` (no victim known yet, or the class is not enabled).
        """
        if "foreign_subkey" not in self.cases or not self.victims:
            return []
        from swarmnode.swarm.validator import manifest_key

        menv = self._builder.truthful(self.factory.reward_mismatch().data)
        try:
            record = self._record([menv]) if menv is not None else None
        except (ConnectionError, wire.WireError):
            record = None
        if record is None:
            return []
        key = manifest_key(self.swarm_id, self.dht.current_bucket())
        for victim in self.victims[:4]:
            if self.dht.store_foreign(victim, key, record, ttl=float(self.scfg.net.bucket_seconds),
                                      timeout=self.dht_timeout):
                self.foreign_store_accepted += 1
        with self._lock:
            self.delivered["foreign_subkey"] += 1
        return ["foreign_subkey"]

    def run_round(self) -> list[str]:
        """One round: :meth:`harvest`, then the next slot of the cycle (each wave, then the garbage record; a slot
        replaces our record of the current bucket) and the victims' subkeys.

        Returns:
            The classes delivered this round; none while it has initial peers but has not joined them yet (a
            record stored solo reaches no one).
        """
        if self.dht.initial_peers and not self.dht.connected:
            return []
        try:
            self.harvest()
        except Exception as e:  # noqa: BLE001 - the attack goes on without material
            log.debug("hostile peer: harvest failed: %s", e)
        n_waves = len(self.waves())
        slots = n_waves + (1 if "record_garbage" in self.cases else 0)
        slot = self.rounds % max(slots, 1)
        names = self.publish_wave(slot) if slot < n_waves else self.publish_garbage_record()
        names += self.publish_foreign_subkey()
        self.rounds += 1
        return names

    def run_poison_round(self, payload: str, n_trees: int = 4, n_leaves: int = 8, correct_leaves: int = 4, *,
                         eos_id: int | None = None) -> list[str]:
        """One round of the *poisoned but correct* attack: publish one truthfully announced, validly signed bundle
        of :meth:`HostileFactory.poison_trees` (every claim true, every correct leaf carrying ``payload``).

        Nothing in it breaks a protocol rule, so honest nodes verify and may accept it; what keeps the payload
        out of their models is the likelihood screen (``external.screen``) and the share caps. Counted under
        ``"poison"`` in :attr:`published` / :meth:`requests_for`.

        Returns:
            The hex digest announced (empty before it joined its initial peers or when the store failed).
        """
        if self.dht.initial_peers and not self.dht.connected:
            return []
        trees = self.factory.poison_trees(payload, n_trees, n_leaves, correct_leaves, eos_id=eos_id)
        self.rounds += 1
        return self.publish_bundles([trees], name="poison") if trees else []

    def rescue_refs(self, limit: int = wire.MAX_RESCUE_REFS * 8) -> list[TaskRef]:
        """The questions the swarm's nodes ask peers to rescue (protocol/SPEC.md §5.3 ``rescue``), read from the
        heartbeats under the swarm's heartbeat key: every signature-checked heartbeat but our own, its TaskRefs in
        order, each ref once, at most ``limit``. Heartbeats that fail to decode are skipped; network trouble
        gives ``[]``. Never raises."""
        out: list[TaskRef] = []
        try:
            beats = self.dht.read_heartbeats(self.swarm_id, timeout=self.dht_timeout)
        except Exception:  # noqa: BLE001 -- a read that fails is a round without requests
            log.debug("hostile peer: reading heartbeats failed", exc_info=True)
            return out
        for pub, data in beats:
            if bytes(pub) == self.public_key:
                continue
            try:
                beat = wire.decode_heartbeat(data)
            except wire.WireError:
                continue
            for ref in beat.rescue or ():
                if ref not in out and len(out) < limit:
                    out.append(ref)
        return out

    def run_rescue_poison_round(self, payload: str, n_leaves: int = 8, max_trees: int = 8, *,
                                eos_id: int | None = None) -> list[str]:
        """One round of *poisoned rescue answers*: answer the swarm's rescue requests (:meth:`rescue_refs`, the
        first ``max_trees``) in one validly signed bundle of trees of ``n_leaves`` leaves, each ``payload`` + a
        newline + the worked solution and exact answer (:meth:`HostileFactory.poison_tree`, every leaf correct):
        an asker that merges them (``levers.rescue``) gives the payload the group's whole positive advantage,
        times ``levers.rescue.peer_advantage_scale``. No protocol rule is broken; the likelihood screen, admission
        by form and the step credit mask must keep it out. Counted under ``"rescue_poison"`` in :attr:`published`.

        Returns:
            The hex digests announced (empty before it joined, with no request seen, or when the store failed).
        """
        if self.dht.initial_peers and not self.dht.connected:
            return []
        from swarmnode.tasks.solutions import UnsupportedTaskError

        trees = []
        for ref in self.rescue_refs()[: max(0, int(max_trees))]:
            try:
                trees.append(self.factory.poison_tree(ref, payload, n_leaves, n_leaves, eos_id=eos_id))
            except (UnsupportedTaskError, KeyError, ValueError, TypeError):
                continue  # a ref of a task we cannot regenerate or write
        self.rounds += 1
        return self.publish_bundles([trees], name="rescue_poison") if trees else []

    def run(self, stop: threading.Event | None = None, interval: float = 3.0) -> None:
        """Run rounds every ``interval`` seconds until ``stop`` is set (default: :meth:`stop_loop`'s event).

        A round's failures are logged, never raised: the peer keeps attacking.
        """
        stop = self._stop if stop is None else stop
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                self.run_round()
            except Exception:  # noqa: BLE001
                log.exception("hostile peer: round failed")
            stop.wait(max(0.0, interval - (time.monotonic() - t0)))

    def start_loop(self, interval: float = 3.0) -> None:
        """Run :meth:`run` in a daemon thread (in-process use)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, kwargs={"interval": interval}, name="hostile-peer",
                                        daemon=True)
        self._thread.start()

    def stop_loop(self, timeout: float = 30.0) -> None:
        """Stop the thread of :meth:`start_loop` (waits for the current round, at most ``timeout`` s)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

