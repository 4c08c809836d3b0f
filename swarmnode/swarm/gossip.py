"""Gossip: the node's swarm layer -- publish pruned, signed rollout bundles; gather, re-verify and mix peers' ones.

:class:`SwarmClient` implements the node's ``SwarmHook`` (``swarmnode/node/hooks.py``) as a thin facade over objects
that own their state, on top of :class:`~swarmnode.swarm.dht.SwarmDHT` (signed, time-bucketed DHT records),
:class:`~swarmnode.swarm.transport.BundleServer` (bundle bodies over libp2p streams), :mod:`~swarmnode.swarm.wire`
(the only byte codec) and :class:`~swarmnode.swarm.verify.Verifier` (trust nothing):

- ``swarm/publisher.py`` (:class:`Publisher`): publish (prune, sign, split, serve, announce), manifest records,
  the publisher thread (record stores, heartbeats);
- ``swarm/fetcher.py`` (:class:`Fetcher`): the fetcher thread: DHT polls (known publishers first), manifests
  verified under the rate limit, fetches from the publisher and relays;
- ``swarm/scheduler.py`` (:class:`FetchScheduler`): the fair order, one manifest per digest, per-publisher limits
  and time budgets, manifest states and retries, the queue of fetched bodies;
- ``swarm/gather.py`` (:class:`Gatherer`): verification of the queue within a time budget, re-serving;
- ``swarm/admission.py`` (:class:`Admission`): young keys' caps and turns per step, carried trees, credit and
  charge, authorship moves;
- ``swarm/rates.py`` (:class:`HeartbeatBook`): our heartbeat's fields; peers' task rates and rescue requests;
- ``swarm/info.py``: ``swarm.json``, identity paths, ``list_peers`` (the CLI's helpers);
- ``swarm/counters.py``: the counters all three kinds of thread share.

SAPO-style and asynchronous (Swarm sAmpling Policy Optimization, arXiv 2509.08721; docs/reference/design.md §7): there
are no global rounds. A node publishes whenever it finishes a step and trains on whatever its peers published
recently; the network never blocks the round loop for longer than the configured timeouts.

Gather (main thread, :meth:`SwarmClient.gather`)
    drains the queue and verifies every body (``Verifier.verify_bundle``: signature, manifest, freshness,
    tasks, **every leaf re-scored**) on the caller's thread -- the main thread in a node, where the scorers'
    ``SIGALRM`` time limits work -- for at most ``gather_budget_s`` seconds (the rest waits for the next
    step); an accepted body is put into our ``BundleServer`` so others can fetch it from us; accepted trees
    become :class:`~swarmnode.rollout.peer_tree.PeerTree` s (rewards are **our** re-scores) and pass the per-key
    caps of :class:`~swarmnode.swarm.admission.Admission`. A tree from a producer with another tokenizer was
    re-tokenized by the verifier. Every tree carries *our* prompt for its TaskRef (``prompt_for``, built by the
    verifier): the sender's prompt text and ids never reach a Sample. Standing is earned only by
    :meth:`SwarmClient.credit`, called by the node after its update for the trees it trained on.

Bootstrap robustness (docs/reference/design.md §7): several initial peers may be given; :class:`SwarmDHT` starts
solo when none answers and keeps joining with backoff, so the node trains solo meanwhile; the state shows up in the
metrics (``swarm/connected``, ``swarm/solo``, ``swarm/peers``). A dead DHT is restarted by its watchdog; the
bundle server re-attaches and our records are re-stored.

Metrics (``publish`` and ``gather`` return disjoint keys; counters are per-step deltas, as the status
endpoint expects): ``swarm/bundles_published``, ``swarm/bundles_received`` (bodies verified this step),
``swarm/bundles_accepted``, ``swarm/rejected/<reason>``, ``swarm/manifests_rate_limited``,
``swarm/young_trees``, ``swarm/trees_capped``, ``swarm/trees_carried``, gauges ``swarm/peers``, ``swarm/banned``,
``swarm/connected``, ``swarm/solo``, ``swarm/pending``, plus the prune counters and latencies. The fetcher's
cumulative counters (``fetch/<reason>``, ``fetch_over_budget``, ``fetch_gave_up``, ...) are in
:meth:`SwarmClient.snapshot`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from cryptography.hazmat.primitives import serialization

from swarmnode import rundir
from swarmnode.config import RunConfig
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.tree import RolloutTree
from swarmnode.swarm import wire
from swarmnode.swarm.admission import Admission
from swarmnode.swarm.counters import SwarmCounters
from swarmnode.swarm.dht import SwarmDHT
from swarmnode.swarm.fetcher import Fetcher
from swarmnode.swarm.gather import AcceptedBundle, Gatherer
from swarmnode.swarm.identity import Identity, load_or_create
from swarmnode.swarm.info import (P2P_KEY_FILE, SWARM_INFO_FILE, default_identity_path, has_explicit_port,
                                  heartbeat_time_ok, identity_path_for, list_peers, read_swarm_info, write_swarm_info)
from swarmnode.swarm.prune import PruneRule
from swarmnode.swarm.publisher import Publisher
from swarmnode.swarm.publisher import flat_subtree as _flat_subtree  # noqa: F401 - tests/unit/train/test_rescue.py
from swarmnode.swarm.rates import HeartbeatBook, RescueRequest
from swarmnode.swarm.rates import fitting_heartbeat as _fitting_heartbeat  # noqa: F401 - test_rescue.py too
from swarmnode.swarm.scheduler import FetchScheduler
from swarmnode.swarm.transport import BundleServer, BundleStore
from swarmnode.swarm.verify import Rejection, Verifier, special_token_ids
from swarmnode.tasks.base import Scorer, Task, TaskRef

log = logging.getLogger(__name__)

__all__ = ["SWARM_INFO_FILE", "P2P_KEY_FILE", "AcceptedBundle", "RescueRequest", "SwarmClient", "SwarmPolicy",
           "build_swarm", "default_identity_path", "heartbeat_time_ok", "identity_path_for", "list_peers",
           "read_swarm_info"]

_fork_hook_installed = False


def _reset_signals_in_child() -> None:
    """Runs in every child forked from this process (hivemind forks its DHT process from the node).

    A forked child inherits the node's Python signal handlers, and the node's SIGTERM handler only *requests*
    a stop: a DHT process would then ignore the SIGTERM that ``multiprocessing`` (at exit) or ``SwarmDHT`` (on
    restart) sends it, and an interpreter exit would wait for it for ever. So a custom SIGTERM handler becomes
    the default (terminate) and a custom SIGINT handler becomes "ignore" (the node handles Ctrl-C and shuts
    its DHT down itself).
    """
    for sig, action in ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGINT, signal.SIG_IGN)):
        try:
            handler = signal.getsignal(sig)
            if callable(handler) and handler is not signal.default_int_handler:
                signal.signal(sig, action)
        except (ValueError, OSError):  # pragma: no cover - not the main thread / no such signal
            pass


def _install_fork_hook() -> None:
    global _fork_hook_installed
    if not _fork_hook_installed and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_reset_signals_in_child)
        _fork_hook_installed = True


class SwarmPolicy(Protocol):
    """The loaded policy as the swarm layer needs it (``swarmnode.policy.loading.Policy`` implements it; the swarm
    package does not import ``policy``): :func:`build_swarm` reads these and nothing else."""

    model: Any
    """The torch model (a ``transformers.PreTrainedModel``): its input-embedding rows bound the vocabulary; its
    ``generation_config.eos_token_id`` joins the tokenizer's EOS ids."""
    tokenizer: Any
    """The Hugging Face tokenizer: ``len()``, ``__call__(text, add_special_tokens=False)["input_ids"]``,
    ``decode(ids, skip_special_tokens=False)``, ``eos_token_id`` and its special-token tables."""
    model_id: str
    """The id published in bundle headers."""
    tokenizer_id: str
    """The tokenizer digest: a bundle with the same id keeps its token ids."""


class SwarmClient:
    """The node's swarm layer: ``publish`` and ``gather`` of the ``SwarmHook`` protocol (see module docstring);
    it wires the publisher, the fetcher and its scheduler, admission and the heartbeat book, and delegates to them.

    Args:
        cfg: the node's :class:`~swarmnode.config.RunConfig` (``cfg.swarm`` with its ``net`` and
            ``trust`` sections holds every swarm knob; ``cfg.external.max_external_completion_length`` caps
            external completions, ``cfg.levers`` says whether heartbeats carry rates and rescue requests;
            ``cfg.sampling.max_prompt_length`` bounds re-prompted external prompts).
        identity: this node's Ed25519 :class:`~swarmnode.swarm.identity.Identity` (signs bundles, manifests,
            heartbeats and DHT records).
        tasks: the task set (a :class:`~swarmnode.tasks.base.Scorer`, ``swarmnode.tasks.mix.TaskMix``): the verifier
            regenerates and re-scores tasks with it.
        vocab_size: our vocabulary size (int >= 1; every token id we publish is below it).
        model_id / tokenizer_id: our ids (bundle header; a bundle with our tokenizer id keeps its token ids).
        retokenize: ``text -> list[int]`` in our vocabulary, for bundles from another tokenizer; ``None``
            refuses them (``tokenizer_mismatch``).
        run_dir: the run directory (``swarm.json``, ``p2p.key``); ``None`` writes nothing.
        detokenize: ``list[int] -> str`` of our tokenizer, special tokens included (what a completion's ids
            say is what we score); same-tokenizer bundles must satisfy ``text == detokenize(ids)``; ``None``
            trusts their ids.
        prompt_for: ``Task -> prompt text`` in our own format: every accepted external tree is trained under
            it (``retokenize(prompt_for(task))``, left-truncated to ``max_prompt_length``), never under the
            sender's prompt. ``None``: the bare question text.
        prune: the :class:`~swarmnode.swarm.prune.PruneRule` (default ``PruneRule()``).
        poll_interval: seconds between DHT polls (default ``swarm.net.poll_interval``, which the config
            derives as ``min(2, bucket_seconds / 4)`` when unset).
        heartbeat_interval: seconds between heartbeats (default ``swarm.net.heartbeat_interval``).
        gather_budget_s: seconds :meth:`gather` spends verifying (default ``swarm.net.gather_budget_seconds``,
            derived as ``swarm.net.fetch_timeout`` when unset); the rest of the queue waits for the next call.
        max_pending: fetched bodies waiting for verification (default ``swarm.net.max_pending_bundles``).
        max_concurrent_fetches: outgoing fetches at once (default ``swarm.net.max_concurrent_fetches``).
        store_bytes: bytes of bundle bodies kept for serving, LRU (default ``swarm.net.store_bytes``).
            Every other knob (fetch retries and relays, per-publisher fetch limits and budget, serving limits,
            young-key caps) is read from ``cfg.swarm.net`` and ``cfg.swarm.trust`` only; see
            ``swarmnode/config/swarm.py``.
        dht_kwargs: extra keyword arguments for :class:`SwarmDHT` (e.g. ``health_interval``, ``join_backoff``).
        on_accept: optional callback ``(AcceptedBundle) -> None`` run by :meth:`gather` for each accepted bundle.
        start: start the DHT, the bundle server and the threads now (else call :meth:`start`).
        verifier_kwargs: extra keyword arguments for the :class:`~swarmnode.swarm.verify.Verifier` (our
            tokenizer's ``special_ids``, ``eos_ids``, ``encode``; see :func:`build_swarm`).

    Raises:
        ValueError / TypeError: malformed multiaddrs, swarm id or arguments (the message names the field).
    """

    def __init__(
        self,
        cfg: RunConfig,
        identity: Identity,
        tasks: Scorer,
        vocab_size: int,
        model_id: str,
        tokenizer_id: str,
        retokenize: Callable[[str], list[int]] | None = None,
        run_dir: str | os.PathLike | None = None,
        *,
        detokenize: Callable[[list[int]], str] | None = None,
        prompt_for: Callable[[Task], str] | None = None,
        prune: PruneRule | None = None,
        poll_interval: float | None = None,
        heartbeat_interval: float | None = None,
        gather_budget_s: float | None = None,
        max_pending: int | None = None,
        max_concurrent_fetches: int | None = None,
        store_bytes: int | None = None,
        dht_kwargs: dict | None = None,
        on_accept: Callable[[AcceptedBundle], None] | None = None,
        start: bool = True,
        verifier_kwargs: dict | None = None,
    ) -> None:
        if not isinstance(identity, Identity):
            raise TypeError(f"identity must be a swarmnode.swarm.identity.Identity, got {type(identity).__name__}")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an int >= 1, got {vocab_size!r}")
        self.cfg = cfg
        self.scfg = sc = cfg.swarm
        # an argument given here wins over cfg.swarm.net.<the same knob>; RunConfig checks the bounds of the config
        # and fills its derived values, so only the arguments (tests and benchmarks pass them) are checked here
        if ((max_pending is not None and int(max_pending) < 1)
                or (max_concurrent_fetches is not None and int(max_concurrent_fetches) < 1)
                or (heartbeat_interval is not None and not heartbeat_interval > 0)):
            raise ValueError("need max_pending >= 1, max_concurrent_fetches >= 1 and heartbeat_interval > 0; got "
                             f"{max_pending!r}, {max_concurrent_fetches!r}, {heartbeat_interval!r}")
        poll_interval = sc.net.poll_interval if poll_interval is None else poll_interval
        heartbeat_interval = sc.net.heartbeat_interval if heartbeat_interval is None else heartbeat_interval
        gather_budget_s = sc.net.gather_budget_seconds if gather_budget_s is None else gather_budget_s
        self.max_pending = int(sc.net.max_pending_bundles if max_pending is None else max_pending)
        self.max_concurrent_fetches = int(sc.net.max_concurrent_fetches if max_concurrent_fetches is None
                                          else max_concurrent_fetches)
        store_bytes = int(sc.net.store_bytes if store_bytes is None else store_bytes)
        self.fetch_retries = int(sc.net.fetch_retries)
        self.fetch_relays = int(sc.net.fetch_relays)
        self.max_fetches_per_publisher = int(sc.net.max_fetches_per_publisher)
        self.publisher_budget_s = float(sc.net.publisher_fetch_budget_seconds)
        self.max_young_trees = int(sc.trust.max_young_trees)
        self.swarm_id: str = sc.swarm_id
        self.identity = identity
        self.public_key = identity.public_key_bytes
        self.peer_id = identity.peer_id
        self.tasks = tasks
        self.vocab_size = vocab_size
        self.model_id = model_id
        self.tokenizer_id = tokenizer_id
        self.retokenize = retokenize
        self.prompt_for = prompt_for
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.prune_rule = prune or PruneRule()
        self.poll_interval = float(poll_interval)
        self.heartbeat_interval = float(heartbeat_interval)
        self.gather_budget_s = float(gather_budget_s)
        self.max_bundle_bytes = min(int(sc.trust.max_bundle_bytes), wire.MAX_ENVELOPE_BYTES)
        self.max_prompt_length = int(cfg.sampling.max_prompt_length)

        max_comp = int(cfg.external.max_external_completion_length)
        self.verifier = Verifier(sc, tasks, vocab_size, tokenizer_id, retokenize, detokenize=detokenize,
                                 prompt_for=prompt_for, max_prompt_length=self.max_prompt_length,
                                 max_completion_tokens=max_comp, **(verifier_kwargs or {}))
        self.peers = self.verifier.peers
        self.dht = self._make_dht(identity, dht_kwargs)
        self.server = BundleServer(
            self.dht,
            BundleStore(max_total_bytes=max(store_bytes, self.max_bundle_bytes), max_item_bytes=self.max_bundle_bytes),
            max_concurrent_fetches=self.max_concurrent_fetches,
            max_concurrent_serves=int(sc.net.max_concurrent_serves),
            max_serves_per_peer=int(sc.net.max_serves_per_peer),
            first_byte_timeout=float(sc.net.serve_first_byte_timeout),
            request_timeout=sc.net.fetch_timeout,
            default_max_bytes=self.max_bundle_bytes,
            start=False,
        )
        self._vlock = threading.Lock()  # the Verifier is not thread-safe
        self.counters = SwarmCounters()
        res = cfg.levers.rescue
        self.curriculum_enabled = bool(cfg.levers.curriculum.enabled)
        self.rescue_enabled = bool(res.enabled)
        self.book = HeartbeatBook(self.swarm_id, self.peer_id, self.peers, lambda key: self.verifier._allowed_key(key),
                                  max_clock_skew=sc.trust.max_clock_skew,
                                  freshness_seconds=sc.trust.freshness_seconds,
                                  curriculum=self.curriculum_enabled, rescue=self.rescue_enabled,
                                  max_rescue_requests=int(res.max_requests))
        self.admission = Admission(self.peers, young_key_trees=sc.trust.young_key_trees,
                                   trees_per_earned_tree=sc.trust.trees_per_earned_tree,
                                   max_trees_per_peer=sc.trust.max_trees_per_peer,
                                   established_after=sc.trust.established_after,
                                   max_young_trees=self.max_young_trees,
                                   window_s=(sc.net.read_buckets + 1) * float(sc.net.bucket_seconds))
        self.scheduler = FetchScheduler(self.peers, self.counters, max_concurrent_fetches=self.max_concurrent_fetches,
                                        max_fetches_per_publisher=self.max_fetches_per_publisher,
                                        fetch_retries=self.fetch_retries, publisher_budget_s=self.publisher_budget_s,
                                        max_pending=self.max_pending, fetch_timeout=float(sc.net.fetch_timeout),
                                        bucket_seconds=float(sc.net.bucket_seconds))
        self.publisher = Publisher(self.dht, self.server, self.verifier, self._vlock, identity, self.book,
                                   self.counters, self._write_info, swarm_id=self.swarm_id, vocab_size=vocab_size,
                                   model_id=model_id, tokenizer_id=tokenizer_id, prune=self.prune_rule, scfg=sc,
                                   heartbeat_interval=self.heartbeat_interval, max_bundle_bytes=self.max_bundle_bytes,
                                   known_peers=lambda: self.fetcher.known_publishers())
        self.fetcher = Fetcher(self.dht, self.server, self.verifier, self._vlock, self.scheduler, self.counters,
                               self._reject, swarm_id=self.swarm_id, public_key=self.public_key, scfg=sc,
                               poll_interval=self.poll_interval, fetch_relays=self.fetch_relays,
                               max_bundle_bytes=self.max_bundle_bytes,
                               max_concurrent_fetches=self.max_concurrent_fetches)
        self.gatherer = Gatherer(self.verifier, self._vlock, self.server, self.scheduler, self.admission, self.book,
                                 self.counters, self._reject, self._gauges, gather_budget_s=self.gather_budget_s,
                                 on_accept=on_accept)
        self.accepted = self.gatherer.accepted
        self._started = False
        self._closed = False
        if start:
            self.start()

    def _make_dht(self, identity: Identity, dht_kwargs: dict | None) -> SwarmDHT:
        """Our :class:`SwarmDHT` (not started): record lifetimes from the read window and heartbeat interval."""
        sc = self.scfg
        key = serialization.load_pem_private_key(identity.to_pem(), password=None)
        p2p_key = None
        if self.run_dir is not None and has_explicit_port(sc.net.host_maddrs):
            self.run_dir.mkdir(parents=True, exist_ok=True)
            p2p_key = str(self.run_dir / P2P_KEY_FILE)
        read_window = (sc.net.read_buckets + 1) * sc.net.bucket_seconds
        kw: dict[str, Any] = dict(
            swarm_ids=[self.swarm_id],
            initial_peers=list(sc.net.initial_peers),
            host_maddrs=list(sc.net.host_maddrs),
            announce_maddrs=list(sc.net.announce_maddrs),
            bucket_seconds=sc.net.bucket_seconds,
            manifest_ttl=min(900.0, max(120.0, read_window)),
            heartbeat_ttl=min(900.0, max(60.0, 6 * self.heartbeat_interval)),
            max_clock_skew=sc.trust.max_clock_skew,
            max_record_bytes=wire.MAX_RECORD_BYTES,
            call_timeout=sc.net.dht_timeout,
            p2p_identity_path=p2p_key,
            join_backoff=(1.0, 30.0),
            pid_file=str(self.run_dir / rundir.CHILDREN_FILE) if self.run_dir is not None else None,
            start=False,
        )
        kw.update(dht_kwargs or {})
        return SwarmDHT(key, **kw)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the DHT (solo if no initial peer answers), the bundle server and the background threads."""
        if self._closed:
            raise RuntimeError("this SwarmClient was closed; create a new one")
        if self._started:
            return
        self._started = True
        _install_fork_hook()
        self.dht.start()
        self.server.start()
        self.dht.add_restart_callback(lambda _dht: self.publisher.after_restart())
        self._write_info()
        self.publisher.start()
        self.fetcher.start()
        st = self.dht.status()
        log.info("swarm %s: peer %s, libp2p %s at %s, %s", self.swarm_id, self.peer_id, st.peer_id, st.maddrs,
                 "solo (joining in the background)" if st.solo_fallback or not st.connected else
                 f"{st.num_peers} DHT peer(s)")

    def close(self) -> None:
        """Stop the threads, the bundle server and the DHT (idempotent; bounded by the DHT's timeouts)."""
        if self._closed:
            return
        self._closed = True
        self.fetcher.stop.set()
        self.publisher.close(timeout=self.scfg.net.dht_timeout + 5)
        self.fetcher.close(timeout=self.scfg.net.dht_timeout + 5)
        try:
            self.server.close()
        finally:
            self.dht.shutdown()

    def recover(self, reason: str) -> None:
        """Restart the DHT (``SwarmHook.recover``: the node calls it after a stall in the swarm layer)."""
        self.dht.restart(reason=reason)

    def __enter__(self) -> SwarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_info(self) -> None:
        if self.run_dir is not None:
            write_swarm_info(self.run_dir, self.peer_id, self.public_key, self.swarm_id, self.dht)

    # ------------------------------------------------------------------ standing
    def charge(self, peer_id: str, reason: str, n: int = 1) -> None:
        """The trainer rejected ``n`` of ``peer_id``'s samples under ``reason`` (``SwarmHook.charge`` in
        node/hooks.py, applied by node/loop.py; e.g. the likelihood screen): ``n`` soft rejections in the
        peer's PeerBook record (no strike, no ban:
        a screen can err on an honest peer), so its reputation and ``swarmnode peers`` show them, and one earned
        tree taken back per charge (``PeerBook.record_unearned``): a key whose junk is rejected every step cannot
        keep standing it bought with one copied tree (outside attack: two such keys held the young pool)."""
        self.admission.charge(peer_id, reason, n)

    def credit(self, peer_id: str, n: int = 1) -> None:
        """The node trained on ``n`` useful trees of ``peer_id`` this step (``SwarmHook.credit`` in
        node/hooks.py, applied by node/loop.py): ``n`` trees of earned standing (``PeerBook.record_earned``;
        ``n`` is clamped to [0, max_trees_per_peer]).

        Standing is earned here, after the update, and not at admission: a tree that is admitted but never
        trained on (over the token budget, cut by the share cap, rejected by the screen) was not useful
        (outside attacks: junk trees over the per-step token budget made a fresh key established in 16 steps;
        junk the screen rejected every step did it in 11)."""
        self.admission.credit(peer_id, n)

    # ------------------------------------------------------------------ state
    def maddrs(self) -> list[str]:
        """Multiaddrs (with ``/p2p/<libp2p PeerID>``) other nodes can bootstrap from."""
        return self.dht.visible_maddrs()

    def pending_digests(self) -> set[str]:
        """Hex digests of the fetched bundle bodies waiting for the next :meth:`gather` (tests, benchmarks)."""
        with self.scheduler.lock:
            return {p.manifest.bundle_digest.hex() for p in self.scheduler.pending}

    def note_accuracy(self, accuracy: float | None) -> None:
        """Record the last held-out accuracy in [0, 1] for the next heartbeats."""
        self.book.note_accuracy(accuracy)

    def share_task_rates(self, rates: dict[str, tuple[int, int]] | None) -> None:
        """Our per-task success counts (task key -> ``(n, k)``, :meth:`swarmnode.tasks.curriculum.LocalRates.counts`)
        for the next heartbeats (SPEC.md §5.3 ``rates``); entries the codec would refuse are left out, ``None``
        or ``{}`` sends heartbeats without rates. Never raises."""
        self.book.share_task_rates(rates)

    def peer_task_rates(self) -> list[Any]:
        """The peers' per-task success counts from their newest valid heartbeats (read every
        ``heartbeat_interval`` seconds while ``levers.curriculum.enabled``), as
        :class:`swarmnode.tasks.curriculum.PeerRates`: one entry per peer id, ``age_s`` measured from when WE
        first read that heartbeat, ``standing`` the peer's earned standing; banned peers are left out. The
        curriculum (``combine_rates``) does the rest; nothing here is trusted. Never raises."""
        return self.book.peer_task_rates()

    def note_peer_rates(self, entries: Sequence[tuple[bytes, bytes]]) -> None:
        """Keep each peer's newest valid curriculum rates and rescue requests from heartbeat records
        ``[(publisher public key, heartbeat envelope bytes)]`` (untrusted; :meth:`HeartbeatBook.note_peer_rates`:
        a flood of fresh keys evicts fresh keys, never a peer with standing). Never raises."""
        self.book.note_peer_rates(entries)

    def announce_rescue(self, refs: Sequence[TaskRef] | None) -> None:
        """The questions (TaskRefs) we got all wrong, for our next heartbeats (SPEC.md §5.3 ``rescue``;
        ``levers.rescue.enabled`` only). Non-TaskRefs, duplicates and refs the codec would refuse are left out;
        at most ``levers.rescue.max_requests`` (and ``wire.MAX_RESCUE_REFS``) are kept, the first ones given; if
        the heartbeat would exceed ``wire.MAX_HEARTBEAT_BYTES`` the last ones are dropped when it is built.
        ``None`` or ``[]`` sends heartbeats without the key. Never raises."""
        self.book.announce_rescue(refs)

    def rescue_refs(self) -> list[TaskRef]:
        """The TaskRefs our heartbeats announce now (``announce_rescue``; empty with rescue off)."""
        return self.book.rescue_refs()

    def rescue_requests(self) -> list[RescueRequest]:
        """The questions peers ask us to answer, from their newest valid heartbeats (``levers.rescue.enabled``
        only; read on the curriculum's cadence, every ``heartbeat_interval`` seconds): one
        :class:`RescueRequest` ``(peer_id, TaskRef)`` per ref, with the asker's earned standing. Left out:
        banned peers, ourselves, and heartbeats older than ``swarm.trust.freshness_seconds`` (from when WE first read
        them). Untrusted claims: the node decides what it answers (``swarmnode/train/rescue.py``). Bounded: at
        most ``rates.MAX_RATE_PEERS`` askers (``rates.MAX_UNEARNED_RATE_PEERS`` of them without standing) x
        ``wire.MAX_RESCUE_REFS`` refs. Never raises."""
        return self.book.rescue_requests()

    # ------------------------------------------------------------------ publish (main thread)
    def publish(self, trees: list[RolloutTree], step: int, policy_version: int) -> dict[str, Any]:
        """Prune, sign and announce ``trees`` (scored local trees of step ``step``); returns metrics.

        CPU only: the DHT store runs on the publisher thread. Never raises on network trouble; a tree the
        codec refuses (e.g. a token id beyond ``vocab_size``) is dropped and counted
        (``swarm/publish_errors``).
        """
        return self.publisher.publish(trees, step, policy_version)

    def publish_rescue(self, trees: list[RolloutTree], step: int, policy_version: int) -> dict[str, Any]:
        """Publish our answers to peers' rescue requests: scored trees of their questions, each with at least one
        leaf our verifier found exactly correct (the node sends only those), as ordinary signed bundles.

        Pruning as :meth:`publish` (``swarm.prune``), except that a tree without reward contrast (every leaf
        correct) is not dropped: its first ``max_leaves`` leaves of distinct text are published (the asker
        brings the contrast: its own wrong leaves). The byte and tree caps of :meth:`publish` hold. Does not
        touch the heartbeat's step or reward mean. Returns ``rescue/published_trees``,
        ``rescue/published_leaves`` and ``rescue/published_bytes``. Never raises on network trouble."""
        return self.publisher.publish_rescue(trees, policy_version)

    # ------------------------------------------------------------------ fetch (fetcher thread)
    def poll(self) -> int:
        """One fetcher step (:meth:`Fetcher.poll`): read recent manifest records, verify new manifests, start
        fetches. Runs on the fetcher thread every ``poll_interval`` seconds (public for tests and benchmarks).

        Returns:
            The number of fetches started.
        """
        return self.fetcher.poll()

    def _reject(self, r: Rejection, num_leaves: int = 0) -> None:
        # a re-read of a record we already judged is not news; a stale record is simply old (not counted)
        if r.reason == "duplicate" or (r.reason == "stale" and not r.charged):
            return
        self.counters.reject(r.reason)
        self.book.add(rejected=num_leaves)

    def _gauges(self) -> dict[str, Any]:
        st = self.dht.status()
        return {
            "swarm/peers": st.num_peers if st.alive else 0,
            "swarm/connected": bool(st.connected),
            "swarm/solo": bool(st.solo_fallback or not st.connected),
            "swarm/dht_restarts": st.restarts,
            "swarm/banned": len(self.peers.banned()),
        }

    # ------------------------------------------------------------------ gather (main thread)
    def gather(self, step: int, policy_version: int) -> tuple[list[PeerTree], dict[str, Any]]:
        """Verify the fetched bundles (at most ``gather_budget_s`` s) and return their trees plus metrics.

        Returns:
            ``(trees, metrics)``: :class:`swarmnode.rollout.peer_tree.PeerTree` s (one per accepted tree, leaf
            rewards are **our** re-scores, every tree carries **our** prompt for its TaskRef -- the verifier
            builds it with ``prompt_for``, same tokenizer or not -- and ``received_at`` is when its body
            arrived here) and the metrics of the module docstring.

        Never raises on network trouble or hostile input; rejected input is counted, never returned.
        """
        return self.gather_verified(step, policy_version)

    def gather_verified(self, step: int, policy_version: int) -> tuple[list[PeerTree], dict[str, Any]]:
        """:meth:`gather` without the conversion: the accepted :class:`PeerTree` s and the metrics.

        A step boundary for the swarm layer: the per-publisher fetch budgets start afresh (at most once per
        ``fetch_timeout``), and the verified trees pass the per-key caps of :class:`Admission` (young keys).
        Bounded by ``gather_budget_s``, waits for the verifier (busy on the fetcher thread) included; what is
        left waits for the next step (:meth:`Gatherer.gather`).
        """
        return self.gatherer.gather()

    def _admit(self, trees: list[PeerTree]) -> tuple[list[PeerTree], int, int]:
        """:meth:`Admission.admit` with the questions we asked (kept for tests/integration/test_curriculum.py and
        tests/unit/train/test_rescue.py, which call it here)."""
        return self.admission.admit(trees, {r.key() for r in self.rescue_refs()})

    @property
    def _carry(self) -> list:
        """The trees waiting over a cap (:attr:`Admission.carry`; kept for tests/integration/test_curriculum.py)."""
        return self.admission.carry

    # ------------------------------------------------------------------ reporting
    def snapshot(self) -> dict[str, Any]:
        """Cumulative counters, the DHT status and the verifier/peer-book snapshot (JSON-ready)."""
        st = self.dht.status()
        counts, rejected = self.counters.snapshot()
        pending = self.scheduler.pending_count()
        with self._vlock:
            ver = self.verifier.snapshot()
        return {"peer_id": self.peer_id, "swarm_id": self.swarm_id, "counts": counts, "rejected": rejected,
                "pending": pending, "dht": st.__dict__, "verifier": ver,
                "server": dict(self.server.counters)}


def build_swarm(
    cfg: RunConfig,
    policy: SwarmPolicy,
    tasks: Scorer,
    run_dir: str | os.PathLike,
    *,
    model_id: str | None = None,
    prompt_for: Callable[[Task], str] | None = None,
    identity: Identity | None = None,
    **kwargs: Any,
) -> SwarmClient:
    """The :class:`SwarmClient` of a node (what ``swarmnode run`` uses when ``swarm.enabled``).

    Args:
        cfg: the node's RunConfig.
        policy: the loaded policy as a :class:`SwarmPolicy` (``swarmnode.policy.loading.Policy``).
        tasks: the node's task set (a :class:`~swarmnode.tasks.base.Scorer`: its TaskMix).
        run_dir: the node's run directory.
        model_id: the id to publish under (default ``policy.model_id``; a resumed node passes its base model id).
        prompt_for: ``Task -> prompt text`` (the node's ``prompt_for``), for re-prompting re-tokenized trees.
        identity: the signing identity (default: ``load_or_create(identity_path_for(cfg))``).
        kwargs: passed to :class:`SwarmClient` (its arguments override the ``cfg.swarm`` knobs of the same
            meaning; everything else comes from ``cfg.swarm``).

    Returns:
        A started :class:`SwarmClient`.

    Raises:
        swarmnode.swarm.identity.IdentityError: the key file exists but is not a readable Ed25519 key.
        ValueError: malformed multiaddrs or swarm id (message names the field).
    """
    if identity is None:
        path = identity_path_for(cfg)
        path.parent.mkdir(parents=True, exist_ok=True)
        identity = load_or_create(path)
    tok = policy.tokenizer
    vocab = len(tok)
    try:
        vocab = max(vocab, int(policy.model.get_input_embeddings().weight.shape[0]))
    except Exception:  # noqa: BLE001 - a model without input embeddings: the tokenizer's size
        pass

    def retokenize(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def detokenize(ids: list[int]) -> str:  # special tokens INCLUDED: we score what the trained ids say
        return tok.decode(list(ids), skip_special_tokens=False)

    eos: set[int] = set()
    for src in (getattr(tok, "eos_token_id", None),
                getattr(getattr(policy.model, "generation_config", None), "eos_token_id", None)):
        for t in (src if isinstance(src, (list, tuple)) else [src]):
            if isinstance(t, int):
                eos.add(t)
    vkw = {"special_ids": special_token_ids(tok), "eos_ids": eos, "encode": retokenize}
    vkw.update(kwargs.pop("verifier_kwargs", None) or {})
    return SwarmClient(cfg, identity, tasks, vocab, model_id or policy.model_id, policy.tokenizer_id,
                       retokenize, run_dir, detokenize=detokenize, prompt_for=prompt_for, verifier_kwargs=vkw,
                       **kwargs)
