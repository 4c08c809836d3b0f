"""Gossip: the node's swarm layer -- publish pruned, signed rollout bundles; gather, re-verify and mix peers' ones.

:class:`SwarmClient` implements the node's ``SwarmHook`` (``swarmnode/node.py``) on top of the finished parts:
:class:`~swarmnode.swarm.dht.SwarmDHT` (signed, time-bucketed DHT records), :class:`~swarmnode.swarm.transport.
BundleServer` (bundle bodies over libp2p streams), :mod:`~swarmnode.swarm.wire` (the only byte codec),
:class:`~swarmnode.swarm.verify.Verifier` (trust nothing) and :mod:`~swarmnode.swarm.prune`.

SAPO-style and asynchronous (Swarm sAmpling Policy Optimization, arXiv 2509.08721; docs/reference/design.md §7): there are
no global rounds. A node publishes whenever it finishes a step and trains on whatever its peers published
recently; the network never blocks the round loop for longer than the configured timeouts.

Publish (main thread, :meth:`SwarmClient.publish`, CPU only)
    prune every tree (:func:`~swarmnode.swarm.prune.prune_trees`; trees without reward variance are not
    published) -> ``wire.bundle_from_trees`` -> sign and encode (split into several bundles when one would
    exceed ``swarm.max_bundle_bytes``) -> ``BundleServer.put`` (peers fetch the body from us) ->
    ``wire.manifest_for_bundle`` -> signed manifest appended to this time bucket's **manifest record**
    (protocol/SPEC.md §11: our newest manifests of the bucket plus our libp2p contact). The DHT store itself
    happens on the publisher thread.

Publisher thread
    stores the record of every changed bucket under ``{swarm}:manifests:{bucket}`` in our own subkey
    (``SwarmDHT.publish_manifest``, bounded by ``swarm.dht_timeout``), retries failed stores every second,
    re-stores after a DHT restart or after joining a swarm, and publishes a signed heartbeat every
    ``heartbeat_interval`` seconds (``swarmnode peers`` reads them). With ``swarm.curriculum.enabled`` the
    heartbeat carries our per-task success counts (``share_task_rates``; SPEC.md §5.3 ``rates``) and the thread
    reads the swarm's heartbeats every ``heartbeat_interval`` seconds, keeping each peer's newest valid rates
    (signature, owner, swarm id, allowlist, time checks) for ``peer_task_rates``. With ``swarm.rescue.enabled``
    the heartbeat carries the questions we got all wrong (``announce_rescue``; SPEC.md §5.3 ``rescue``), and
    the same reads keep each peer's newest valid requests for ``rescue_requests``; ``publish_rescue`` publishes
    our answers to them (docs/guide/swarm.md "Rescue").

Fetcher thread (every ``poll_interval`` seconds)
    reads the records of the current and the previous bucket (all of the last ``swarm.read_buckets`` buckets
    every ``bucket_seconds / 2`` seconds: each DHT read costs traffic in every replica), skips our own,
    decodes each record (``wire.decode_manifest_record``; a malformed record is charged to its owner, whose
    DHT signature covers it), verifies every new manifest (``Verifier.verify_manifest`` with the record owner as the expected
    signer) -- at most ``swarm.rate_limit_per_minute`` new manifests per publisher (the token bucket its bundles
    use too) -- and fetches announced bodies from the publisher, then from up to ``swarm.fetch_relays`` other
    live peers that may have cached it (re-serving is the gossip), each try bounded by ``swarm.fetch_timeout``
    and capped at the announced size. Bodies are **not** cached for re-serving before they are verified.
    Fetched bodies wait in a bounded queue (``swarm.max_pending_bundles``; when full, the oldest body of the
    publisher holding the most places -- ties: the least earned standing -- is dropped and its manifest fetched
    again later).

Fair fetching (an outside attack: future-dated manifests won a newest-first order, hanging bodies held every
fetch worker, and three such keys cut a victim's accepted honest bundles from 28/28 to 0/27)
    candidates are fetched **round-robin across publishers** (publishers that used the least fetch time this
    step first, then those with more earned standing, ties at random), each publisher's own newest first with
    future timestamps clamped to our clock; at most ``swarm.max_fetches_per_publisher`` fetches of one
    publisher run or wait at once, of ``swarm.max_concurrent_fetches`` in all; and every publisher has a
    **time budget per step** (``swarm.publisher_fetch_budget_seconds``, reset at each gather, at most once per
    ``fetch_timeout``): the seconds its fetches take are charged to it, including the tries at relays, and a
    publisher over budget waits for the next step. A publisher whose bodies hang spends its own budget and its
    own worker, not anyone else's. The scheme is work-conserving: workers that no publisher within its turn
    needs go to publishers over theirs, but never the last one, so an honest publisher that shows up next
    finds a free worker at once.

Young keys (an outside attack: four fresh keys took all four external slots)
    keys are free to mint, so :meth:`SwarmClient.gather` admits per step at most
    ``PeerBook.tree_cap`` trees of a young key (``swarm.young_key_trees``, growing by one per
    ``swarm.trees_per_earned_tree`` useful trees it had admitted before) and at most ``swarm.max_young_trees``
    trees of all young keys together (shared round-robin, most earned standing first, ties at random); a key with
    ``swarm.established_after`` useful trees is established and gets ``swarm.max_trees_per_peer``.
    A tree is *useful* when the node trained on it: some of its samples passed selection, the token budget,
    the likelihood screen and the share cap, and our re-scored rewards of its leaves differ (it carries an
    advantage). Only useful trees earn standing (:meth:`SwarmClient.credit`, called by the node after its
    update; ``PeerBook.record_earned``), so standing grows with time and verified, kept work, not with the
    number of keys or with trees that are admitted and then thrown away. Trees over a cap wait for the next
    steps (bounded, ``swarm/trees_carried``); what no longer fits, or waited longer than the read window, is
    dropped and counted (``swarm/trees_capped``).

Gather (main thread, :meth:`SwarmClient.gather`)
    drains the queue and verifies every body (``Verifier.verify_bundle``: signature, manifest, freshness,
    tasks, **every leaf re-scored**) on the caller's thread -- the main thread in a node, where the scorers'
    ``SIGALRM`` time limits work -- for at most ``gather_budget_s`` seconds (the rest waits for the next
    step); an accepted body is put into our ``BundleServer`` so others can fetch it from us; accepted trees
    become :class:`~swarmnode.rollout.peer_tree.PeerTree` s (rewards are **our** re-scores; the trainer's
    type is imported inside :meth:`SwarmClient.gather`, so importing the swarm package does not import
    ``train``). A tree from a producer with another tokenizer was re-tokenized by the verifier. Every tree,
    same tokenizer or not, carries *our* prompt for its TaskRef (``prompt_for``, built by the verifier): the
    sender's prompt text and ids never reach a Sample.

Bootstrap robustness (docs/reference/design.md §7): several initial peers may be given; :class:`SwarmDHT` starts solo when
none answers and keeps joining with backoff, so the node trains solo meanwhile; the state shows up in the
metrics (``swarm/connected``, ``swarm/solo``, ``swarm/peers``). A dead DHT is restarted by its watchdog; the
bundle server re-attaches and our records are re-stored.

Metrics (``publish`` and ``gather`` return disjoint keys; counters are per-step deltas, as the status
endpoint expects): ``swarm/bundles_published``, ``swarm/bundles_received`` (bodies verified this step),
``swarm/bundles_accepted``, ``swarm/rejected/<reason>``, ``swarm/manifests_rate_limited``,
``swarm/young_trees``, ``swarm/trees_capped``, ``swarm/trees_carried``, gauges ``swarm/peers``, ``swarm/banned``,
``swarm/connected``, ``swarm/solo``, ``swarm/pending``, plus the prune counters and latencies. The fetcher's
cumulative counters (``fetch/<reason>``, ``fetch_over_budget``, ``fetch_gave_up``, ...) are in
:meth:`SwarmClient.snapshot`.

Files in the run directory: ``swarm.json`` (our peer id, public key, libp2p PeerID and multiaddrs; read by
``swarmnode peers --run-dir`` and ``swarmnode swarm up``) and ``p2p.key`` (the libp2p identity, used only
when ``swarm.host_maddrs`` has an explicit port, so that our bootstrap address survives restarts).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import signal
import threading
import time
from collections import Counter, OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from cryptography.hazmat.primitives import serialization

from swarmnode.rollout.tree import RolloutTree
from swarmnode import rundir
from swarmnode.config import RunConfig
from swarmnode.swarm import wire
from swarmnode.swarm.dht import SwarmDHT, parse_multiaddr
from swarmnode.swarm.identity import Identity, load_or_create, peer_id_from_public_key
from swarmnode.swarm.prune import PruneRule, prune_tree, prune_trees
from swarmnode.swarm.transport import BundleServer, BundleStore
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.swarm.verify import Rejection, Verifier, special_token_ids
from swarmnode.tasks.base import Scorer, Task, TaskRef

log = logging.getLogger(__name__)

__all__ = [
    "SWARM_INFO_FILE",
    "P2P_KEY_FILE",
    "AcceptedBundle",
    "RescueRequest",
    "SwarmClient",
    "build_swarm",
    "default_identity_path",
    "heartbeat_time_ok",
    "identity_path_for",
    "list_peers",
    "read_swarm_info",
]

SWARM_INFO_FILE = "swarm.json"
"""File in the run directory with this node's peer id, public key, libp2p PeerID and multiaddrs."""
P2P_KEY_FILE = "p2p.key"
"""libp2p identity file in the run directory (used when ``swarm.host_maddrs`` has an explicit port)."""

_MSTATE_CAPACITY = 8192
#: Most peers whose curriculum rates are kept, and of them the most without earned standing (fresh keys).
_MAX_RATE_PEERS = 1024
_MAX_UNEARNED_RATE_PEERS = 64
#: Manifests remembered as paid (one rate-limit token each) per owner: more than one owner's records can hold
#: (``read_buckets`` x ``wire.MAX_RECORD_MANIFESTS``); and owners remembered (keys with earned standing kept first).
_PAID_PER_OWNER = 256
_MAX_PAID_OWNERS = 1024
_MAX_CARRY_TREES = 64  # verified trees over a per-step cap, carried to the next steps
# reads a flood cannot blind: the publishers with earned standing are read from their own publisher keys (at most
# this many, most standing first); of the owners without standing in the shared bucket keys, at most
# _NEW_OWNERS_PER_POLL (at random) have their records decoded and manifests verified per poll; a shared read over
# _SHARED_READ_SOFT_BYTES makes the next shared reads wait for the full-read cadence (bytes per poll bounded)
_KNOWN_PUBLISHERS_READ = 32
_NEW_OWNERS_PER_POLL = 16
_SHARED_READ_SOFT_BYTES = 256 * 1024
_MAX_OWNER_KEYS = 4096


class RescueRequest(tuple):
    """One question a peer asks to be answered (``SwarmClient.rescue_requests``): the pair ``(peer_id, ref)``,
    plus ``standing``, the asker's earned standing in our PeerBook when the list was made (int >= 0)."""

    def __new__(cls, peer_id: str, ref: TaskRef, standing: int = 0) -> "RescueRequest":
        obj = super().__new__(cls, (peer_id, ref))
        obj.standing = int(standing)
        return obj

    @property
    def peer_id(self) -> str:
        return self[0]

    @property
    def ref(self) -> TaskRef:
        return self[1]


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


def _has_explicit_port(maddrs: Sequence[str]) -> bool:
    for m in maddrs:
        parts = m.strip("/").split("/")
        for proto, val in zip(parts, parts[1:]):
            if proto in ("tcp", "udp") and val != "0":
                return True
    return False


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


@dataclass
class AcceptedBundle:
    """One bundle accepted by :meth:`SwarmClient.gather` (for benchmarks and tests).

    Attributes:
        digest: hex SHA-256 of the bundle envelope.
        publisher: the signer's peer id (``sn1…``).
        created_at: the bundle's signed creation time (s since the epoch).
        fetched_at / accepted_at: when the body arrived / was accepted here (s since the epoch).
        size: envelope bytes.
        num_trees / num_leaves: accepted trees and their leaves.
        sender: transport id the body came from (``p2p:<libp2p PeerID>``).
    """

    digest: str
    publisher: str
    created_at: float
    fetched_at: float
    accepted_at: float
    size: int
    num_trees: int
    num_leaves: int
    sender: str


@dataclass
class _Pending:
    body: bytes
    manifest: wire.Manifest
    sender: str
    fetched_at: float
    mdigest: bytes = b""  # the manifest it was fetched for (its state goes back to retry if the body is dropped)
    publisher: str = ""  # the manifest's owner (peer id)


@dataclass
class _MState:
    state: str  # "inflight" | "done" | "retry" (admitted: its token is paid) | "limited" (over the rate limit)
    tries: int = 0
    next_try: float = 0.0
    bundle_digest: bytes = b""  # of a verified manifest in retry: while that digest is in flight under another
    # manifest, poll lets it wait without verifying it again (outside attack F4: thousands of copies waiting on
    # one held digest cost ~1 ms of signature and task checks each, every poll)
    deferrals: int = 0  # polls in a row in which another manifest of the same digest was preferred to this one


def _has_contrast(vt: PeerTree) -> bool:
    """Our re-scored rewards of the tree's leaves differ (it can carry an advantage)."""
    try:
        r = vt.rewards()
    except ValueError:
        return False
    return len(r) >= 2 and max(r) - min(r) > 1e-9


def _flat_subtree(tree: RolloutTree, max_leaves: int) -> RolloutTree | None:
    """The subtree of ``tree``'s first ``max_leaves`` scored leaves of distinct completion text (node order), for a
    rescue answer without reward contrast; ``None`` when no leaf is scored."""
    kept: list[int] = []
    seen: set[str] = set()
    for lid in tree.leaves():
        n = tree.nodes[lid]
        if n.reward is None or not math.isfinite(float(n.reward)) or n.finish_reason in (None, "pruned"):
            continue
        text = tree.completion_text(lid)
        if text in seen:
            continue
        seen.add(text)
        kept.append(lid)
        if len(kept) >= max_leaves:
            break
    return tree.subtree(kept) if kept else None


def _fitting_heartbeat(beat: wire.Heartbeat, identity: Identity) -> bytes | None:
    """``beat`` encoded and signed; when it exceeds ``wire.MAX_HEARTBEAT_BYTES``, rescue refs are dropped from the
    end (then the key) until it fits. ``None`` (logged) when even that fails."""
    while True:
        try:
            return wire.encode_heartbeat(beat, identity)
        except wire.WireError as e:
            if e.reason != "too_large" or not beat.rescue:
                log.error("cannot encode our heartbeat: %s", e)
                return None
            beat.rescue = beat.rescue[:-1] or None


class SwarmClient:
    """The node's swarm layer: ``publish`` and ``gather`` of the ``SwarmHook`` protocol (see module docstring).

    Args:
        cfg: the node's :class:`~swarmnode.config.RunConfig` (``cfg.swarm`` holds every swarm knob;
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
        poll_interval: seconds between DHT polls (default ``swarm.poll_interval``, whose None means
            ``min(2, bucket_seconds / 4)``).
        heartbeat_interval: seconds between heartbeats (default ``swarm.heartbeat_interval``).
        gather_budget_s: seconds :meth:`gather` spends verifying (default ``swarm.gather_budget_seconds``, whose
            None means ``swarm.fetch_timeout``); the rest of the queue waits for the next call.
        max_pending: fetched bodies waiting for verification (default ``swarm.max_pending_bundles``).
        max_concurrent_fetches: outgoing fetches at once (default ``swarm.max_concurrent_fetches``).
        store_bytes: bytes of bundle bodies kept for serving, LRU (default ``swarm.store_bytes``).
            Every other knob (fetch retries and relays, per-publisher fetch limits and budget, serving limits,
            young-key caps) is read from ``cfg.swarm`` only; see ``swarmnode/config.py``.
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
        self.scfg = cfg.swarm

        sc = self.scfg  # an argument given here wins over cfg.swarm.<the same knob>
        poll_interval = sc.poll_interval if poll_interval is None else poll_interval
        heartbeat_interval = sc.heartbeat_interval if heartbeat_interval is None else heartbeat_interval
        gather_budget_s = sc.gather_budget_seconds if gather_budget_s is None else gather_budget_s
        max_pending = int(sc.max_pending_bundles if max_pending is None else max_pending)
        max_concurrent_fetches = int(sc.max_concurrent_fetches if max_concurrent_fetches is None
                                     else max_concurrent_fetches)
        store_bytes = int(sc.store_bytes if store_bytes is None else store_bytes)
        if max_pending < 1 or max_concurrent_fetches < 1 or not heartbeat_interval > 0:
            raise ValueError("need swarm.max_pending_bundles >= 1, swarm.max_concurrent_fetches >= 1 and "
                             f"swarm.heartbeat_interval > 0; got {max_pending}, {max_concurrent_fetches}, "
                             f"{heartbeat_interval!r}")
        self.fetch_retries = int(sc.fetch_retries)
        self.fetch_relays = int(sc.fetch_relays)
        self.max_fetches_per_publisher = int(sc.max_fetches_per_publisher)
        budget = sc.publisher_fetch_budget_seconds
        self.publisher_budget_s = float(budget) if budget else 2.0 * float(self.scfg.fetch_timeout)
        self.young_key_trees = int(sc.young_key_trees)
        self.trees_per_earned_tree = int(sc.trees_per_earned_tree)
        self.max_trees_per_peer = int(sc.max_trees_per_peer)
        self.established_after = int(sc.established_after)
        young_pool = sc.max_young_trees
        self.max_young_trees = int(young_pool) if young_pool is not None else max(1, int(sc.num_external) // 2)
        if (self.fetch_retries < 1 or self.fetch_relays < 0 or self.max_fetches_per_publisher < 1
                or self.young_key_trees < 0 or self.trees_per_earned_tree < 1 or self.max_trees_per_peer < 1
                or self.established_after < 0 or self.max_young_trees < 0):
            raise ValueError("swarm knobs out of range: need fetch_retries >= 1, fetch_relays >= 0, "
                             "max_fetches_per_publisher >= 1, young_key_trees >= 0, trees_per_earned_tree >= 1, "
                             "max_trees_per_peer >= 1, established_after >= 0, max_young_trees >= 0")
        self.swarm_id: str = self.scfg.swarm_id
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
        self.poll_interval = float(poll_interval) if poll_interval else min(2.0, self.scfg.bucket_seconds / 4)
        self.heartbeat_interval = float(heartbeat_interval)
        self.gather_budget_s = float(gather_budget_s) if gather_budget_s else float(self.scfg.fetch_timeout)
        self.max_pending = int(max_pending)
        self.max_bundle_bytes = min(int(self.scfg.max_bundle_bytes), wire.MAX_ENVELOPE_BYTES)
        self.max_prompt_length = int(cfg.sampling.max_prompt_length)
        self.on_accept = on_accept
        self.max_concurrent_fetches = int(max_concurrent_fetches)
        self._full_read_every = max(1, round(self.scfg.bucket_seconds / (2 * self.poll_interval)))

        max_comp = self.scfg.max_external_completion_length or cfg.sampling.max_completion_length
        self.verifier = Verifier(self.scfg, tasks, vocab_size, tokenizer_id, retokenize, detokenize=detokenize,
                                 prompt_for=prompt_for, max_prompt_length=self.max_prompt_length,
                                 max_completion_tokens=max_comp, **(verifier_kwargs or {}))
        self.peers = self.verifier.peers

        key = serialization.load_pem_private_key(identity.to_pem(), password=None)
        p2p_key = None
        if self.run_dir is not None and _has_explicit_port(self.scfg.host_maddrs):
            self.run_dir.mkdir(parents=True, exist_ok=True)
            p2p_key = str(self.run_dir / P2P_KEY_FILE)
        read_window = (self.scfg.read_buckets + 1) * self.scfg.bucket_seconds
        kw: dict[str, Any] = dict(
            swarm_ids=[self.swarm_id],
            initial_peers=list(self.scfg.initial_peers),
            host_maddrs=list(self.scfg.host_maddrs),
            announce_maddrs=list(self.scfg.announce_maddrs),
            bucket_seconds=self.scfg.bucket_seconds,
            manifest_ttl=min(900.0, max(120.0, read_window)),
            heartbeat_ttl=min(900.0, max(60.0, 6 * heartbeat_interval)),
            max_clock_skew=self.scfg.max_clock_skew,
            max_record_bytes=wire.MAX_RECORD_BYTES,
            call_timeout=self.scfg.dht_timeout,
            p2p_identity_path=p2p_key,
            join_backoff=(1.0, 30.0),
            pid_file=str(self.run_dir / rundir.CHILDREN_FILE) if self.run_dir is not None else None,
            start=False,
        )
        kw.update(dht_kwargs or {})
        self.dht = SwarmDHT(key, **kw)  # type: ignore[arg-type]
        self.server = BundleServer(
            self.dht,
            BundleStore(max_total_bytes=max(store_bytes, self.max_bundle_bytes), max_item_bytes=self.max_bundle_bytes),
            max_concurrent_fetches=max_concurrent_fetches,
            max_concurrent_serves=int(sc.max_concurrent_serves),
            max_serves_per_peer=int(sc.max_serves_per_peer),
            first_byte_timeout=float(sc.serve_first_byte_timeout),
            request_timeout=self.scfg.fetch_timeout,
            default_max_bytes=self.max_bundle_bytes,
            start=False,
        )
        self._lock = threading.Lock()          # counters, queue, outbox, contacts, manifest states
        self._vlock = threading.Lock()         # the Verifier is not thread-safe
        self._stop = threading.Event()
        self._wake_publisher = threading.Event()
        self._pending: deque[_Pending] = deque()
        self._outbox: dict[int, list[bytes]] = {}
        self._dirty: set[int] = set()
        self._contacts: OrderedDict[str, tuple[str, float]] = OrderedDict()  # owner -> (libp2p PeerID, seen)
        self._paid: OrderedDict[str, OrderedDict[bytes, None]] = OrderedDict()  # owner -> manifests it paid for
        self._inflight_by_pub: Counter[str] = Counter()  # fetches running or queued, per publisher
        self._unearned_inflight: set[str] = set()  # publishers without standing when their fetch started
        self._unearned_slots = max(1, max_concurrent_fetches // 2)
        self._spent: Counter[str] = Counter()  # fetch seconds per publisher this step
        # trees over a per-step cap: (first seen, tree, key was young then); gather thread only
        self._carry: list[tuple[float, PeerTree, bool]] = []
        self._young_served: OrderedDict[str, int] = OrderedDict()  # young key -> the last admission turn it got
        self._young_waiting: OrderedDict[str, int] = OrderedDict()  # young key never served -> turn it first waited
        self._young_turn = 0
        self._budget_reset_at = time.monotonic()
        self._mstate: OrderedDict[bytes, _MState] = OrderedDict()
        # when we first read each manifest (monotonic s; bounded like _mstate): a copy of a bundle can only be
        # announced after its publisher's manifest, so among keys of equal standing the earlier one is fetched
        self._first_seen: OrderedDict[bytes, float] = OrderedDict()
        self._owner_keys: OrderedDict[str, bytes] = OrderedDict()  # record owner's peer id -> its public key
        self._last_shared_bytes = 0  # bytes the last read of the shared bucket keys returned
        self._wanted: set[str] = set()  # bundle digests in flight or queued
        self._counts: Counter[str] = Counter()
        self._reported: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()
        self._rejected_reported: Counter[str] = Counter()
        self._hb: dict[str, Any] = {"step": 0, "reward_mean": None, "accuracy": None, "npub": 0, "nacc": 0, "nrej": 0,
                                    "rates": None, "rescue": None}
        self._last_hb = -math.inf
        cur = getattr(self.scfg, "curriculum", None)
        self.curriculum_enabled = bool(getattr(cur, "enabled", False))
        self._peer_rates: OrderedDict[str, tuple[float, float, dict]] = OrderedDict()  # peer -> (t, first seen, rates)
        res = getattr(self.scfg, "rescue", None)
        self.rescue_enabled = bool(getattr(res, "enabled", False))
        # peer -> (signed time, first seen (monotonic), TaskRefs it asks for); bounded like _peer_rates
        self._peer_rescue: OrderedDict[str, tuple[float, float, list[TaskRef]]] = OrderedDict()
        self._last_rates_read = -math.inf
        self._was_connected = False
        self._threads: list[threading.Thread] = []
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent_fetches, thread_name_prefix="swarm-fetch")
        self._inflight = 0
        self.accepted: deque[AcceptedBundle] = deque(maxlen=4096)
        self._started = False
        self._closed = False
        if start:
            self.start()

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
        self.dht.add_restart_callback(self._after_restart)
        self._write_info()
        for target, name in ((self._publisher_loop, "swarm-publisher"), (self._fetch_loop, "swarm-fetcher")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        st = self.dht.status()
        log.info("swarm %s: peer %s, libp2p %s at %s, %s", self.swarm_id, self.peer_id, st.peer_id, st.maddrs,
                 "solo (joining in the background)" if st.solo_fallback or not st.connected else
                 f"{st.num_peers} DHT peer(s)")

    def charge(self, peer_id: str, reason: str, n: int = 1) -> None:
        """The trainer rejected ``n`` of ``peer_id``'s samples under ``reason`` (node.py ``SwarmHook.charge``,
        e.g. the likelihood screen): ``n`` soft rejections in the peer's PeerBook record (no strike, no ban:
        a screen can err on an honest peer), so its reputation and ``swarmnode peers`` show them, and one earned
        tree taken back per charge (``PeerBook.record_unearned``): a key whose junk is rejected every step cannot
        keep standing it bought with one copied tree (outside attack: two such keys held the young pool)."""
        n = max(0, min(int(n), 1024))
        peer_id = str(peer_id)
        for _ in range(n):
            self.peers.record_reject(peer_id, str(reason), False, "rejected by the trainer")
        if n:
            self.peers.record_unearned(peer_id, 1)

    def credit(self, peer_id: str, n: int = 1) -> None:
        """The node trained on ``n`` useful trees of ``peer_id`` this step (node.py ``SwarmHook.credit``): ``n``
        trees of earned standing (``PeerBook.record_earned``; ``n`` is clamped to [0, max_trees_per_peer]).

        Standing is earned here, after the update, and not at admission: a tree that is admitted but never
        trained on (over the token budget, cut by the share cap, rejected by the screen) was not useful
        (outside attacks: junk trees over the per-step token budget made a fresh key established in 16 steps;
        junk the screen rejected every step did it in 11)."""
        n = max(0, min(int(n), self.max_trees_per_peer))
        if n:
            self.peers.record_earned(str(peer_id), n)

    def close(self) -> None:
        """Stop the threads, the bundle server and the DHT (idempotent; bounded by the DHT's timeouts)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake_publisher.set()
        for t in self._threads:
            t.join(timeout=self.scfg.dht_timeout + 5)
        self._pool.shutdown(wait=False, cancel_futures=True)
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

    def _after_restart(self, _dht: SwarmDHT) -> None:
        with self._lock:
            self._dirty.update(self._outbox)
        self._last_hb = -math.inf
        self._write_info()
        self._wake_publisher.set()

    def _write_info(self) -> None:
        if self.run_dir is None:
            return
        contact = self.dht.contact()
        info = {
            "peer_id": self.peer_id,
            "public_key": self.public_key.hex(),
            "swarm_id": self.swarm_id,
            "libp2p_peer_id": contact.peer_id if contact else None,
            "maddrs": list(contact.maddrs) if contact else [],
            "pid": os.getpid(),
            "updated_at": time.time(),
        }
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.run_dir / (SWARM_INFO_FILE + ".tmp")
            tmp.write_text(json.dumps(info, indent=1), encoding="utf-8")
            os.replace(tmp, self.run_dir / SWARM_INFO_FILE)
        except OSError as e:
            log.warning("could not write %s: %s", SWARM_INFO_FILE, e)

    # ------------------------------------------------------------------ state
    def maddrs(self) -> list[str]:
        """Multiaddrs (with ``/p2p/<libp2p PeerID>``) other nodes can bootstrap from."""
        return self.dht.visible_maddrs()

    def pending_digests(self) -> set[str]:
        """Hex digests of the fetched bundle bodies waiting for the next :meth:`gather` (tests, benchmarks)."""
        with self._lock:
            return {p.manifest.bundle_digest.hex() for p in self._pending}

    def note_accuracy(self, accuracy: float | None) -> None:
        """Record the last held-out accuracy in [0, 1] for the next heartbeats."""
        if accuracy is None or (isinstance(accuracy, (int, float)) and 0.0 <= accuracy <= 1.0):
            with self._lock:
                self._hb["accuracy"] = None if accuracy is None else float(accuracy)

    def share_task_rates(self, rates: dict[str, tuple[int, int]] | None) -> None:
        """Our per-task success counts (task key -> ``(n, k)``, :meth:`swarmnode.tasks.curriculum.LocalRates.counts`)
        for the next heartbeats (SPEC.md §5.3 ``rates``); entries the codec would refuse are left out, ``None``
        or ``{}`` sends heartbeats without rates. Never raises."""
        clean: dict[str, tuple[int, int]] = {}
        for key, v in (rates or {}).items():
            try:
                n, k = int(v[0]), int(v[1])
            except (TypeError, ValueError, IndexError, OverflowError):
                continue
            if (isinstance(key, str) and 0 < len(key.encode("utf-8")) <= wire.MAX_TASK_KEY_BYTES
                    and 1 <= n <= wire.MAX_RATE_COUNT and 0 <= k <= n):
                clean[key] = (n, k)
            if len(clean) >= wire.MAX_RATE_TASKS:
                break
        with self._lock:
            self._hb["rates"] = clean or None

    def peer_task_rates(self) -> list[Any]:
        """The peers' per-task success counts from their newest valid heartbeats (read every
        ``heartbeat_interval`` seconds while ``swarm.curriculum.enabled``), as
        :class:`swarmnode.tasks.curriculum.PeerRates`: one entry per peer id, ``age_s`` measured from when WE
        first read that heartbeat, ``standing`` the peer's earned standing; banned peers are left out. The
        curriculum (``combine_rates``) does the rest; nothing here is trusted. Never raises."""
        from swarmnode.tasks.curriculum import PeerRates

        now, now_wall = time.monotonic(), time.time()
        skew = float(self.scfg.max_clock_skew)
        with self._lock:
            items = list(self._peer_rates.items())
        out = []
        for pid, (t, seen, rates) in items:
            if self.peers.is_banned(pid):
                continue
            # our clock decides; the signed time can only make a rate older (a heartbeat read again after an
            # eviction is no fresher than it is), never younger
            age = max(now - seen, now_wall - t - skew)
            out.append(PeerRates(peer_id=pid, rates=dict(rates), age_s=age, standing=self.peers.earned(pid)))
        return out

    def announce_rescue(self, refs: Sequence[TaskRef] | None) -> None:
        """The questions (TaskRefs) we got all wrong, for our next heartbeats (SPEC.md §5.3 ``rescue``;
        ``swarm.rescue.enabled`` only). Non-TaskRefs, duplicates and refs the codec would refuse are left out;
        at most ``swarm.rescue.max_requests`` (and ``wire.MAX_RESCUE_REFS``) are kept, the first ones given; if
        the heartbeat would exceed ``wire.MAX_HEARTBEAT_BYTES`` the last ones are dropped when it is built.
        ``None`` or ``[]`` sends heartbeats without the key. Never raises."""
        limit = wire.MAX_RESCUE_REFS
        res = getattr(self.scfg, "rescue", None)
        limit = min(limit, int(getattr(res, "max_requests", limit)))
        clean: list[TaskRef] = []
        for r in refs or []:
            if not isinstance(r, TaskRef) or r in clean:
                continue
            try:
                wire._task_ref(wire._enc_task(r, "rescue"), "rescue")  # the receiver's bounds
            except wire.WireError:
                continue
            clean.append(r)
            if len(clean) >= limit:
                break
        with self._lock:
            self._hb["rescue"] = clean or None

    def rescue_refs(self) -> list[TaskRef]:
        """The TaskRefs our heartbeats announce now (``announce_rescue``; empty with rescue off)."""
        with self._lock:
            return list(self._hb["rescue"] or []) if self.rescue_enabled else []

    def rescue_requests(self) -> list[RescueRequest]:
        """The questions peers ask us to answer, from their newest valid heartbeats (``swarm.rescue.enabled``
        only; read on the curriculum's cadence, every ``heartbeat_interval`` seconds): one
        :class:`RescueRequest` ``(peer_id, TaskRef)`` per ref, with the asker's earned standing. Left out:
        banned peers, ourselves, and heartbeats older than ``swarm.freshness_seconds`` (from when WE first read
        them). Untrusted claims: the node decides what it answers (``swarmnode/train/rescue.py``). Bounded: at
        most ``_MAX_RATE_PEERS`` askers (``_MAX_UNEARNED_RATE_PEERS`` of them without standing) x
        ``wire.MAX_RESCUE_REFS`` refs. Never raises."""
        if not self.rescue_enabled:
            return []
        now, now_wall = time.monotonic(), time.time()
        skew, fresh = float(self.scfg.max_clock_skew), float(self.scfg.freshness_seconds)
        with self._lock:
            items = list(self._peer_rescue.items())
        out: list[RescueRequest] = []
        for pid, (t, seen, refs) in items:
            if self.peers.is_banned(pid) or max(now - seen, now_wall - t - skew) > fresh:
                continue
            standing = self.peers.earned(pid)
            out.extend(RescueRequest(pid, r, standing) for r in refs)
        return out

    def publish_rescue(self, trees: list[RolloutTree], step: int, policy_version: int) -> dict[str, Any]:
        """Publish our answers to peers' rescue requests: scored trees of their questions, each with at least one
        leaf our verifier found exactly correct (the node sends only those), as ordinary signed bundles.

        Pruning as :meth:`publish` (``swarm.prune``), except that a tree without reward contrast (every leaf
        correct) is not dropped: its first ``max_leaves`` leaves of distinct text are published (the asker
        brings the contrast: its own wrong leaves). The byte and tree caps of :meth:`publish` hold. Does not
        touch the heartbeat's step or reward mean. Returns ``rescue/published_trees``,
        ``rescue/published_leaves`` and ``rescue/published_bytes``. Never raises on network trouble."""
        pruned: list[RolloutTree] = []
        for t in trees:
            p = prune_tree(t, self.prune_rule)
            if p is None:
                p = _flat_subtree(t, self.prune_rule.max_leaves)
            if p is not None:
                pruned.append(p)
        n_trees, n_leaves, n_bytes, _ = self._publish_pruned(pruned, int(policy_version))
        return {"rescue/published_trees": n_trees, "rescue/published_leaves": n_leaves,
                "rescue/published_bytes": n_bytes}

    def _read_peer_rates(self) -> None:
        """Read the swarm's heartbeats and keep each peer's newest valid rates (publisher thread)."""
        self.note_peer_rates(self.dht.read_heartbeats(self.swarm_id, timeout=self.scfg.dht_timeout))

    def note_peer_rates(self, entries: Sequence[tuple[bytes, bytes]]) -> None:
        """Keep each peer's newest valid curriculum rates from heartbeat records (untrusted).

        Args:
            entries: ``[(publisher public key, heartbeat envelope bytes)]`` as
                :meth:`swarmnode.swarm.dht.SwarmDHT.read_heartbeats` returns them; anything that does not decode,
                verify, match its owner key and this swarm, or pass the time checks is skipped.

        Peers with earned standing are read first and kept first: at most :data:`_MAX_RATE_PEERS` peers are
        kept, of which at most :data:`_MAX_UNEARNED_RATE_PEERS` without standing (the least recently updated
        go first), so a flood of fresh keys evicts fresh keys, never a peer with standing. Never raises."""
        now_wall, now = time.time(), time.monotonic()
        salt = os.urandom(8)

        def read_order(entry: tuple[bytes, bytes]) -> tuple[bool, bytes]:
            try:
                pid = peer_id_from_public_key(bytes(entry[0]))
            except Exception:  # noqa: BLE001 - a malformed owner key sorts last
                return (True, b"")
            return (self.peers.earned(pid) <= 0, hashlib.blake2b(pid.encode(), key=salt).digest())

        entries = sorted((e for e in entries if isinstance(e, tuple) and len(e) == 2), key=read_order)[:4096]
        for owner, value in entries:
            try:
                env, hb = wire.decode(value, expected_kind=wire.KIND_HEARTBEAT)
            except wire.WireError:
                continue
            if (env.public_key != owner or not isinstance(hb, wire.Heartbeat) or hb.swarm_id != self.swarm_id
                    or hb.peer_id == self.peer_id):
                continue
            if not (hb.task_rates or (self.rescue_enabled and (hb.rescue or hb.peer_id in self._peer_rescue))):
                continue
            if not heartbeat_time_ok(hb.created_at, now_wall, self.scfg.max_clock_skew, self.scfg.freshness_seconds):
                continue
            if not self.verifier._allowed_key(env.public_key):  # a private swarm counts only its members
                continue
            with self._lock:
                prev = self._peer_rates.get(hb.peer_id)
                if hb.task_rates and (prev is None or prev[0] < hb.created_at):
                    self._peer_rates[hb.peer_id] = (hb.created_at, now, dict(hb.task_rates))
                    self._peer_rates.move_to_end(hb.peer_id)
                prev_r = self._peer_rescue.get(hb.peer_id)
                if self.rescue_enabled and (prev_r is None or prev_r[0] < hb.created_at):
                    if hb.rescue:
                        self._peer_rescue[hb.peer_id] = (hb.created_at, now, list(hb.rescue))
                        self._peer_rescue.move_to_end(hb.peer_id)
                    else:  # a newer heartbeat without the key: the peer asks for nothing now
                        self._peer_rescue.pop(hb.peer_id, None)
        for book in (self._peer_rates, self._peer_rescue):
            with self._lock:
                held = list(book)
            unearned = [p for p in held if self.peers.earned(p) <= 0]  # least recently updated first
            with self._lock:
                for p in unearned[: max(0, len(unearned) - _MAX_UNEARNED_RATE_PEERS)]:
                    book.pop(p, None)
                while len(book) > _MAX_RATE_PEERS:
                    book.popitem(last=False)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def _reject(self, r: Rejection, num_leaves: int = 0) -> None:
        # a re-read of a record we already judged is not news; a stale record is simply old (not counted)
        if r.reason == "duplicate" or (r.reason == "stale" and not r.charged):
            return
        with self._lock:
            self._rejected[r.reason] += 1
            self._hb["nrej"] += num_leaves

    def _deltas(self, keys: Sequence[str]) -> dict[str, int]:
        with self._lock:
            out = {}
            for k in keys:
                out[f"swarm/{k}"] = self._counts[k] - self._reported[k]
                self._reported[k] = self._counts[k]
            return out

    def _gauges(self) -> dict[str, Any]:
        st = self.dht.status()
        return {
            "swarm/peers": st.num_peers if st.alive else 0,
            "swarm/connected": bool(st.connected),
            "swarm/solo": bool(st.solo_fallback or not st.connected),
            "swarm/dht_restarts": st.restarts,
            "swarm/banned": len(self.peers.banned()),
        }

    # ------------------------------------------------------------------ publish (main thread)
    def publish(self, trees: list[RolloutTree], step: int, policy_version: int) -> dict[str, Any]:
        """Prune, sign and announce ``trees`` (scored local trees of step ``step``); returns metrics.

        CPU only: the DHT store runs on the publisher thread. Never raises on network trouble; a tree the
        codec refuses (e.g. a token id beyond ``vocab_size``) is dropped and counted
        (``swarm/publish_errors``).
        """
        t0 = time.perf_counter()
        rewards = [float(t.nodes[i].reward) for t in trees for i in t.leaves() if t.nodes[i].reward is not None]
        with self._lock:
            self._hb["step"] = int(step) + 1
            self._hb["reward_mean"] = (min(max(sum(rewards) / len(rewards), 0.0), wire.MAX_REWARD)
                                       if rewards else None)
        pruned, pst = prune_trees(trees, self.prune_rule)
        m: dict[str, Any] = pst.as_metrics()
        n_trees, n_leaves, n_bytes, n_manifest_bytes = self._publish_pruned(pruned, int(policy_version))
        m.update(self._deltas(["bundles_published", "publish_errors"]))
        m.update({"swarm/published_trees": n_trees, "swarm/published_leaves": n_leaves,
                  "swarm/published_bytes": n_bytes, "swarm/manifest_bytes": n_manifest_bytes,
                  "swarm/publish_s": time.perf_counter() - t0})
        return m

    def _publish_pruned(self, pruned: list[RolloutTree], policy_version: int) -> tuple[int, int, int, int]:
        """Sign, serve and announce already pruned trees; returns (trees, leaves, bundle bytes, manifest bytes)."""
        n_bytes = n_manifest_bytes = n_leaves = n_trees = 0
        now = time.time()
        for envelope, bundle in self._bundles(pruned, int(policy_version), now):
            self.server.put(envelope)
            with self._vlock:  # an echo of our own rollouts is a duplicate / replay, never an external sample
                self.verifier.note_published(envelope, bundle)
            manifest = wire.manifest_for_bundle(envelope, bundle)
            menv = wire.encode_manifest(manifest, self.identity)
            bucket = self.dht.current_bucket(bundle.created_at)
            with self._lock:
                box = self._outbox.setdefault(bucket, [])
                box.append(menv)
                del box[:-wire.MAX_RECORD_MANIFESTS]
                self._dirty.add(bucket)
                for old in [b for b in self._outbox if b <= bucket - self.scfg.read_buckets - 1]:
                    del self._outbox[old]
                    self._dirty.discard(old)
                self._counts["bundles_published"] += 1
                self._hb["npub"] += bundle.num_leaves()
            n_bytes += len(envelope)
            n_manifest_bytes += len(menv)
            n_leaves += bundle.num_leaves()
            n_trees += len(bundle.trees)
        if n_trees:
            self._wake_publisher.set()
        return n_trees, n_leaves, n_bytes, n_manifest_bytes

    def _bundles(self, trees: list[RolloutTree], policy_version: int,
                 now: float) -> list[tuple[bytes, wire.RolloutBundle]]:
        """Encode ``trees`` into signed bundles, each within the byte and tree caps (split in halves as needed)."""
        out: list[tuple[bytes, wire.RolloutBundle]] = []
        todo = [trees[i:i + wire.MAX_TREES_PER_BUNDLE] for i in range(0, len(trees), wire.MAX_TREES_PER_BUNDLE)]
        while todo:
            chunk = todo.pop(0)
            if not chunk:
                continue
            bundle = wire.bundle_from_trees(chunk, swarm_id=self.swarm_id, publisher_key=self.public_key,
                                            vocab_size=self.vocab_size, model_id=self.model_id,
                                            tokenizer_id=self.tokenizer_id, policy_version=policy_version,
                                            created_at=now)
            try:
                envelope = wire.encode_bundle(bundle, self.identity)
            except wire.WireError as e:
                if e.reason == "too_large" and len(chunk) > 1:
                    half = len(chunk) // 2
                    todo[:0] = [chunk[:half], chunk[half:]]
                    continue
                if len(chunk) > 1:  # find the offending tree(s): encode one by one
                    todo[:0] = [[t] for t in chunk]
                    continue
                self._count("publish_errors")
                log.warning("not publishing a tree of task %s: %s", chunk[0].task.key(), e)
                continue
            if len(envelope) > self.max_bundle_bytes:
                if len(chunk) > 1:
                    half = len(chunk) // 2
                    todo[:0] = [chunk[:half], chunk[half:]]
                else:
                    self._count("publish_errors")
                    log.warning("not publishing a tree of task %s: %d bytes exceed swarm.max_bundle_bytes=%d",
                                chunk[0].task.key(), len(envelope), self.max_bundle_bytes)
                continue
            out.append((envelope, bundle))
        return out

    # ------------------------------------------------------------------ publisher thread
    def _record_bytes(self, bucket: int) -> bytes | None:
        contact = self.dht.contact()
        if contact is None:
            return None
        with self._lock:
            manifests = list(self._outbox.get(bucket, []))
        maddrs = [m for m in contact.maddrs if len(m.encode()) <= wire.MAX_ID_BYTES][: wire.MAX_RECORD_ADDRS]
        while manifests:
            try:
                return wire.encode_manifest_record(wire.ManifestRecord(manifests, contact.peer_id, maddrs))
            except wire.WireError as e:
                if e.reason != "too_large":
                    log.error("cannot encode our manifest record: %s", e)
                    return None
                manifests = manifests[1:]  # drop the oldest until it fits
        return None

    def _publisher_loop(self) -> None:
        while not self._stop.is_set():
            self._wake_publisher.wait(1.0)
            self._wake_publisher.clear()
            if self._stop.is_set():
                break
            try:
                self._publisher_step()
            except Exception:  # noqa: BLE001 - the thread must survive everything
                log.exception("swarm publisher step failed")

    def _publisher_step(self) -> None:
        connected = self.dht.connected
        if connected and not self._was_connected:  # just joined: our solo-stored records live only with us
            with self._lock:
                self._dirty.update(self._outbox)
            self._write_info()
        self._was_connected = connected
        with self._lock:
            dirty = sorted(self._dirty)
            newest = max(self._outbox, default=None)
        for bucket in dirty:
            data = self._record_bytes(bucket)
            if data is None:
                continue
            ok = self.dht.publish_manifest(self.swarm_id, bucket, data, timeout=self.scfg.dht_timeout,
                                           own_key=bucket == newest)
            if ok:
                with self._lock:
                    self._dirty.discard(bucket)
                    self._counts["records_stored"] += 1
                    self._counts["record_bytes"] += len(data)
            else:
                self._count("record_store_failures")
        if time.monotonic() - self._last_hb >= self.heartbeat_interval:
            with self._lock:
                hb = dict(self._hb)
            beat = wire.Heartbeat(swarm_id=self.swarm_id, peer_id=self.peer_id, model_id=self.model_id[:256],
                                  step=hb["step"], reward_mean=hb["reward_mean"], accuracy=hb["accuracy"],
                                  samples_published=hb["npub"], samples_accepted=hb["nacc"],
                                  samples_rejected=hb["nrej"], created_at=time.time(),
                                  task_rates=hb["rates"] if self.curriculum_enabled else None,
                                  rescue=list(hb["rescue"] or []) or None if self.rescue_enabled else None)
            data = _fitting_heartbeat(beat, self.identity)
            if data is not None and self.dht.publish_heartbeat(self.swarm_id, data, timeout=self.scfg.dht_timeout):
                self._last_hb = time.monotonic()
        if ((self.curriculum_enabled or self.rescue_enabled)
                and time.monotonic() - self._last_rates_read >= self.heartbeat_interval):
            self._last_rates_read = time.monotonic()
            self._read_peer_rates()

    # ------------------------------------------------------------------ fetcher thread
    def _fetch_loop(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - the thread must survive everything
                log.exception("swarm poll failed")

    def poll(self) -> int:
        """One fetcher step: read recent manifest records, verify new manifests, start fetches.

        Runs on the fetcher thread every ``poll_interval`` seconds (public for tests and benchmarks).

        Returns:
            The number of fetches started.
        """
        if not self.dht.is_alive:
            return 0
        # new manifests land in the current bucket (or the previous one, stored late): those two are read every
        # poll; all ``read_buckets`` only every ``_full_read_every`` polls (a DHT read costs N^2 traffic)
        buckets = self.dht.recent_buckets(self.scfg.read_buckets)
        with self._lock:
            full = self._counts["polls"] % self._full_read_every == 0
            shared = full or self._last_shared_bytes <= _SHARED_READ_SOFT_BYTES
        if not full:
            buckets = buckets[-2:]
        # known publishers first, from their own keys: no flood of the shared keys can hide them
        known = self._known_publishers()
        entries = self.dht.read_publishers(self.swarm_id, known, timeout=self.scfg.dht_timeout) if known else []
        shared_entries = (self.dht.read_manifests(self.swarm_id, buckets, timeout=self.scfg.dht_timeout)
                          if shared else [])
        now = time.monotonic()
        with self._lock:
            self._counts["polls"] += 1
            self._counts["known_publisher_records"] += len(entries)
            if shared:
                self._last_shared_bytes = sum(len(v) for _, v in shared_entries)
            else:
                self._counts["shared_reads_skipped"] += 1
            self._counts["dht_read_bytes"] += sum(len(v) for _, v in entries) + sum(len(v) for _, v in shared_entries)
        entries = self._poll_entries(entries, shared_entries, set(known))
        candidates: list[tuple[wire.Manifest, bytes, str]] = []
        for owner, value in entries:
            if owner == self.public_key:
                continue
            owner_id = peer_id_from_public_key(owner)
            with self._lock:
                self._owner_keys[owner_id] = owner
                self._owner_keys.move_to_end(owner_id)
                while len(self._owner_keys) > _MAX_OWNER_KEYS:
                    self._owner_keys.popitem(last=False)
            if self.peers.is_banned(owner_id):  # no work and no state for a banned key's records
                continue
            try:
                rec = wire.decode_manifest_record(value)
            except wire.WireError as e:
                digest = hashlib.sha256(value).digest()
                if self._mark(digest, now):
                    self.peers.record_reject(owner_id, e.reason, True, f"manifest record: {e.detail}")
                    with self._lock:
                        self._rejected[e.reason] += 1
                continue
            self._note_contact(owner_id, rec)
            for menv in rec.manifests:
                mdigest = hashlib.sha256(menv).digest()
                with self._lock:
                    st = self._mstate.get(mdigest)
                    if st is not None and (st.state in ("done", "inflight") or now < st.next_try):
                        continue
                    if st is not None and st.state == "retry" and st.bundle_digest.hex() in self._wanted:
                        st.next_try = now + 1.0  # its digest is still on its way under another manifest
                        continue
                paid = self._paid_for(owner_id, mdigest)
                if ((st is None or st.state == "limited") and not paid and not self.peers.is_banned(owner_id)
                        and not self.peers.allow(owner_id)):
                    # a new manifest over its publisher's rate limit (swarm.rate_limit_per_minute): looked at again
                    # once a token is back, never verified before that. The token taken here pays for the bundle
                    # too (gather verifies it prepaid): one token per bundle, whatever retries its fetch needs
                    self._count("manifests_rate_limited")
                    self._set_state(mdigest, "limited", 0, now + 60.0 / max(float(self.peers.rate_limit_per_minute),
                                                                            1e-3))
                    continue
                if not paid:
                    self._note_paid(owner_id, mdigest)
                try:
                    with self._vlock:
                        manifest = self.verifier.verify_manifest(menv, owner)
                except Rejection as r:
                    self._reject(r)
                    self._set_state(mdigest, "done")
                    continue
                candidates.append((manifest, mdigest, owner_id))
        candidates = self._one_per_digest(candidates, now)
        self._new_step(force=False)
        started = 0
        waiting: list[tuple[wire.Manifest, bytes, str]] = []
        for c in self._fair_order(candidates):
            res = self._start(*c, extra=False)
            if res is None:
                break  # closing
            if res == "wait":
                waiting.append(c)
            started += res == "started"
        # work-conserving: spare workers go to publishers over their turn (concurrency or budget), but never the
        # last worker, so a publisher within its turn that shows up next finds one free at once
        spare = max(1, self.max_concurrent_fetches - 1)
        for c in waiting:
            with self._lock:
                if self._inflight >= spare:
                    break
            res = self._start(*c, extra=True)
            if res is None:
                break
            started += res == "started"
        return started

    def _known_publishers(self) -> list[bytes]:
        """Public keys of the publishers with earned standing whose keys we saw, most standing first (at most
        ``_KNOWN_PUBLISHERS_READ``): read from their own publisher keys every poll."""
        with self._lock:
            owners = list(self._owner_keys.items())
        ranked = [(self.peers.earned(pid), pub) for pid, pub in owners]
        ranked = [(e, pub) for e, pub in ranked if e > 0 and not self.peers.is_banned(peer_id_from_public_key(pub))]
        ranked.sort(key=lambda x: -x[0])
        return [pub for _, pub in ranked[:_KNOWN_PUBLISHERS_READ]]

    def _poll_entries(self, own: list[tuple[bytes, bytes]], shared: list[tuple[bytes, bytes]],
                      known: set[bytes]) -> list[tuple[bytes, bytes]]:
        """The records one poll looks at: every record of a known publisher (its own key, then the shared keys),
        then those of at most ``_NEW_OWNERS_PER_POLL`` other owners chosen at random (the rest are looked at in
        later polls), so a flood of fresh keys costs the reader a bounded number of decodes and verifications
        per poll and never comes before a publisher with standing. Duplicate (owner, record) pairs are dropped."""
        seen: set[tuple[bytes, bytes]] = set()
        first: list[tuple[bytes, bytes]] = []
        others: dict[bytes, list[tuple[bytes, bytes]]] = {}
        for owner, value in [*own, *shared]:
            if (owner, value) in seen:
                continue
            seen.add((owner, value))
            if owner in known:
                first.append((owner, value))
            else:
                others.setdefault(owner, []).append((owner, value))
        chosen = list(others)
        if len(chosen) > _NEW_OWNERS_PER_POLL:
            chosen = random.sample(chosen, _NEW_OWNERS_PER_POLL)
            self._count("new_owners_deferred", len(others) - _NEW_OWNERS_PER_POLL)
        return first + [e for owner in chosen for e in others[owner]]

    def _one_per_digest(self, candidates: list[tuple[wire.Manifest, bytes, str]],
                        now: float) -> list[tuple[wire.Manifest, bytes, str]]:
        """Keep one manifest per bundle digest, ranked by: its publisher can start a fetch now (under its
        concurrency limit and fetch budget), then the most earned standing, then the manifest we read first (a copy
        can only be announced after the manifest it copies), then at random. The others (copies of a bundle
        re-announced under other keys, their tokens paid) wait in ``retry`` and are looked at again after 2 s,
        twice as long each time they lose again (at most 64 s), so copies cost few verifications while their
        digest waits.

        Without this, fresh copier keys, first in the fair order because they had used no fetch time this step,
        took an established publisher's digest first and held it for a fetch timeout each (outside attack F5: its
        bundles a step late). Standing alone is not enough: a key with more standing that keeps itself over its
        own fetch budget would win every digest it copies and never start the fetch, so the publisher's manifest
        was deferred until it went stale (second attack, HIGH); hence a publisher that can start goes first."""
        best: dict[bytes, tuple[tuple[bool, int, float, float], tuple[wire.Manifest, bytes, str]]] = {}
        deferred: list[tuple[wire.Manifest, bytes, str]] = []
        with self._lock:
            busy = {pub for pub, n in self._inflight_by_pub.items() if n >= self.max_fetches_per_publisher}
            busy |= {pub for pub, t in self._spent.items() if t >= self.publisher_budget_s}
            for _, mdigest, _ in candidates:
                if mdigest not in self._first_seen:
                    self._first_seen[mdigest] = now
            while len(self._first_seen) > _MSTATE_CAPACITY:
                self._first_seen.popitem(last=False)
            seen = {md: self._first_seen[md] for _, md, _ in candidates}
        for c in candidates:
            rank = (c[2] not in busy, self.peers.earned(c[2]), -seen[c[1]], random.random())
            held = best.get(c[0].bundle_digest)
            if held is None or rank > held[0]:
                if held is not None:
                    deferred.append(held[1])
                best[c[0].bundle_digest] = (rank, c)
            else:
                deferred.append(c)
        with self._lock:
            for m, mdigest, _ in deferred:
                # looked at again after 2, 4, 8, ... 64 s: each look verifies it again, and keys may announce
                # thousands of copies of one digest
                prev = self._mstate.get(mdigest)
                n = (prev.deferrals if prev else 0) + 1
                self._mstate[mdigest] = _MState("retry", prev.tries if prev else 0, now + 2.0 ** min(n, 6),
                                                m.bundle_digest, n)
                self._mstate.move_to_end(mdigest)
            self._trim_states()
        return [c for _, c in best.values()]

    def _start(self, manifest: wire.Manifest, mdigest: bytes, owner_id: str, extra: bool) -> str | None:
        """Start one fetch: ``"started"``, ``"skip"`` (already wanted, or the queue is full), ``"wait"`` (the
        publisher's turn is over: at its concurrency limit or over its budget; ``extra`` starts it anyway, on
        spare capacity) or None (the pool is shut down). Publishers without earned standing together hold at most
        half the fetch workers (at least one)."""
        unearned = self.peers.earned(owner_id) <= 0
        with self._lock:
            prev = self._mstate.get(mdigest)
            tries = prev.tries if prev else 0
            bdigest = manifest.bundle_digest.hex()
            if bdigest in self._wanted:
                # the same digest is on its way under another manifest (maybe a copy by a key whose body hangs or
                # lies): this one (its token is paid) is looked at again once that fetch is over, never given up
                self._mstate[mdigest] = _MState("retry", tries, time.monotonic() + 1.0, manifest.bundle_digest)
                return "skip"
            if self._inflight >= 2 * self.max_concurrent_fetches:  # the rest waits for the next poll
                self._mstate[mdigest] = _MState("retry", tries, 0.0, manifest.bundle_digest)
                return "skip"
            if not extra and (self._inflight_by_pub[owner_id] >= self.max_fetches_per_publisher
                              or self._spent[owner_id] >= self.publisher_budget_s):
                self._mstate[mdigest] = _MState("retry", tries, 0.0, manifest.bundle_digest)
                return "wait"
            if unearned and sum(n for p, n in self._inflight_by_pub.items()
                                if p in self._unearned_inflight) >= self._unearned_slots:
                # keys without standing share half the fetch workers: the rest is always free for known publishers
                self._mstate[mdigest] = _MState("retry", tries, time.monotonic() + 1.0, manifest.bundle_digest)
                return "skip"
            if unearned:
                self._unearned_inflight.add(owner_id)
            self._wanted.add(bdigest)
            self._mstate[mdigest] = _MState("inflight", tries)
            self._mstate.move_to_end(mdigest)
            self._trim_states()
            self._inflight += 1
            self._inflight_by_pub[owner_id] += 1
        try:
            self._pool.submit(self._fetch_one, manifest, mdigest, owner_id, extra)
        except RuntimeError:  # the pool is shut down (closing)
            with self._lock:
                self._inflight -= 1
                self._inflight_by_pub[owner_id] -= 1
                self._wanted.discard(bdigest)
                self._mstate[mdigest] = _MState("retry", tries, 0.0, manifest.bundle_digest)
            return None
        return "started"

    def _fair_order(self, candidates: list[tuple[wire.Manifest, bytes, str]]) -> list[tuple[wire.Manifest, bytes, str]]:
        """Round-robin across publishers: in each round the publishers with earned standing before those without,
        then those that used the least fetch time this step, then more earned standing, ties at random; each
        publisher's own candidates newest first, with times in
        the future clamped to our clock (a future-dated manifest is no newer than one made now)."""
        wall = time.time()
        by_pub: dict[str, list[tuple[wire.Manifest, bytes, str]]] = {}
        for c in candidates:
            by_pub.setdefault(c[2], []).append(c)
        for lst in by_pub.values():
            lst.sort(key=lambda c: min(float(c[0].created_at), wall), reverse=True)
        pubs = list(by_pub)
        random.shuffle(pubs)
        with self._lock:
            spent = dict(self._spent)
        # publishers with standing before fresh keys within each round, then the least fetch time this step
        pubs.sort(key=lambda p: (self.peers.earned(p) <= 0, spent.get(p, 0.0), -self.peers.earned(p)))
        out: list[tuple[wire.Manifest, bytes, str]] = []
        depth = max((len(v) for v in by_pub.values()), default=0)
        for i in range(depth):
            out.extend(by_pub[p][i] for p in pubs if i < len(by_pub[p]))
        return out

    def _paid_for(self, owner_id: str, mdigest: bytes) -> bool:
        """True when ``owner_id`` already paid a rate-limit token for this manifest. Kept apart from the manifest
        states, which other keys' floods can push out: a publisher is never charged twice for one manifest."""
        with self._lock:
            return mdigest in self._paid.get(owner_id, ())

    def _note_paid(self, owner_id: str, mdigest: bytes) -> None:
        """Remember a paid manifest: at most :data:`_PAID_PER_OWNER` per owner (more than it can have live) and
        :data:`_MAX_PAID_OWNERS` owners, those without earned standing forgotten first, least recent first."""
        with self._lock:
            mine = self._paid.setdefault(owner_id, OrderedDict())
            mine[mdigest] = None
            while len(mine) > _PAID_PER_OWNER:
                mine.popitem(last=False)
            self._paid.move_to_end(owner_id)
            if len(self._paid) <= _MAX_PAID_OWNERS:
                return
            owners = list(self._paid)
        unearned = [p for p in owners if self.peers.earned(p) <= 0]
        with self._lock:
            for p in (unearned + owners)[: max(0, len(self._paid) - _MAX_PAID_OWNERS)]:
                self._paid.pop(p, None)

    def _mark(self, digest: bytes, now: float) -> bool:
        """Mark a record/manifest digest as judged; True the first time."""
        with self._lock:
            if digest in self._mstate:
                return False
            self._mstate[digest] = _MState("done")
            self._trim_states()
            return True

    def _set_state(self, mdigest: bytes, state: str, tries: int = 0, next_try: float = 0.0) -> None:
        with self._lock:
            self._mstate[mdigest] = _MState(state, tries, next_try)
            self._mstate.move_to_end(mdigest)
            self._trim_states()

    def _trim_states(self) -> None:
        while len(self._mstate) > _MSTATE_CAPACITY:
            self._mstate.popitem(last=False)

    def _note_contact(self, owner_id: str, rec: wire.ManifestRecord) -> None:
        """Remember the record owner's libp2p PeerID. The record's ``addrs`` are **never** used for dialling
        (an address in a peer's record can point anywhere): fetches go by PeerID and libp2p routes them to addresses it observed itself."""
        try:
            parse_multiaddr(f"/ip4/127.0.0.1/tcp/1/p2p/{rec.libp2p_peer_id}")
        except ValueError:
            return  # not a libp2p PeerID: nothing to fetch from
        with self._lock:
            self._contacts[owner_id] = (rec.libp2p_peer_id, time.monotonic())
            self._contacts.move_to_end(owner_id)
            while len(self._contacts) > 1024:
                self._contacts.popitem(last=False)

    def _sources(self, publisher: str) -> list[str]:
        """libp2p PeerIDs to ask: the publisher's first, then up to ``swarm.fetch_relays`` other recently seen
        peers (who may have cached it)."""
        with self._lock:
            contacts = dict(self._contacts)
        out = []
        if publisher in contacts:
            out.append(contacts[publisher][0])
        horizon = time.monotonic() - (self.scfg.read_buckets + 1) * self.scfg.bucket_seconds
        others = [c[0] for p, c in contacts.items() if p != publisher and c[1] >= horizon]
        random.shuffle(others)
        out.extend(others[:self.fetch_relays])
        return out

    def _new_step(self, force: bool = False) -> None:
        """Reset the per-publisher fetch budgets: at a gather (a step) at most once per ``fetch_timeout``, or from
        the fetcher when no gather came for ``bucket_seconds`` (``force=False`` there)."""
        now = time.monotonic()
        with self._lock:
            gap = now - self._budget_reset_at
            if (force and gap >= float(self.scfg.fetch_timeout)) or gap >= float(self.scfg.bucket_seconds):
                self._spent.clear()
                self._budget_reset_at = now

    def _budget_left(self, publisher: str) -> float:
        with self._lock:
            return self.publisher_budget_s - self._spent[publisher]

    def _fetch_one(self, manifest: wire.Manifest, mdigest: bytes, publisher: str, extra: bool = False) -> None:
        """Fetch one announced body (fetch worker thread); ``extra``: started on spare capacity, so the
        publisher's budget does not stop it (its time is still charged)."""
        bdigest = manifest.bundle_digest.hex()
        ok = False
        attempts = 0
        try:
            for libp2p_id in self._sources(publisher):
                if self._stop.is_set():
                    break
                left = float(self.scfg.fetch_timeout) if extra else self._budget_left(publisher)
                if left <= 0:  # this publisher spent its budget for the step: the rest waits for the next one
                    self._count("fetch_over_budget")
                    break
                attempts += 1
                t0 = time.monotonic()
                try:
                    res = self.server.fetch_result(libp2p_id, bdigest, timeout=min(float(self.scfg.fetch_timeout),
                                                                                  max(1.0, left)),
                                                   max_bytes=min(manifest.bundle_size, self.max_bundle_bytes),
                                                   cache=False)
                finally:
                    with self._lock:
                        self._spent[publisher] += time.monotonic() - t0
                self._count(f"fetch/{res.reason}")
                if res.ok and res.body is not None:
                    item = _Pending(res.body, manifest, f"p2p:{libp2p_id}", time.time(), mdigest, publisher)
                    with self._lock:
                        if len(self._pending) >= self.max_pending:
                            self._drop_pending()
                        self._pending.append(item)
                        self._counts["bytes_fetched"] += len(res.body)
                        prev = self._mstate.get(mdigest)
                        self._mstate[mdigest] = _MState("done", (prev.tries if prev else 0) + 1)
                    ok = True
                    break
        except Exception:  # noqa: BLE001
            log.exception("bundle fetch failed")
        finally:
            with self._lock:
                self._inflight -= 1
                self._inflight_by_pub[publisher] -= 1
                if self._inflight_by_pub[publisher] <= 0:
                    del self._inflight_by_pub[publisher]
                    self._unearned_inflight.discard(publisher)
                # on success "done" was set with the queued body (and "retry" again if it has been dropped since)
                if not ok:
                    self._wanted.discard(bdigest)
                    prev = self._mstate.get(mdigest)
                    tries = (prev.tries if prev else 0) + (1 if attempts else 0)
                    if not attempts:  # never tried (over budget / closing): not the publisher's failure
                        self._mstate[mdigest] = _MState("retry", tries, 0.0, manifest.bundle_digest)
                    elif tries >= self.fetch_retries:
                        self._mstate[mdigest] = _MState("done", tries)
                        self._counts["fetch_gave_up"] += 1
                    else:
                        self._mstate[mdigest] = _MState("retry", tries, time.monotonic() + 2.0 ** tries,
                                                         manifest.bundle_digest)

    def _drop_pending(self) -> None:
        """Make room in the full queue of fetched bodies (caller holds ``_lock``): the oldest body of the publisher
        holding the most places goes (ties: the least earned standing), so a flood of many small bundles drops its
        own bodies, not an honest publisher's one; its manifest goes back to ``retry`` (its rate-limit token is
        paid), never given up."""
        held = Counter(p.publisher for p in self._pending)
        worst = max(held, key=lambda pub: (held[pub], -self.peers.earned(pub)))  # ties: the least standing
        victim = next(p for p in self._pending if p.publisher == worst)
        self._pending.remove(victim)
        self._wanted.discard(victim.manifest.bundle_digest.hex())
        self._counts["dropped_queue_full"] += 1
        if victim.mdigest:
            prev = self._mstate.get(victim.mdigest)
            self._mstate[victim.mdigest] = _MState("retry", prev.tries if prev else 0, time.monotonic() + 2.0,
                                                   victim.manifest.bundle_digest)

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
        ``fetch_timeout``), and the verified trees pass the per-key caps of :meth:`_admit` (young keys). Bounded
        by ``gather_budget_s``, waits for the verifier (busy on the fetcher thread) included; what is left waits
        for the next step.
        """
        t0 = time.monotonic()
        self._new_step(force=True)
        with self._lock:
            items = list(self._pending)
            self._pending.clear()
        out: list[PeerTree] = []
        received = retok = 0
        latencies: list[float] = []
        for k, item in enumerate(items):
            left = self.gather_budget_s - (time.monotonic() - t0)
            # the verifier is shared with the fetcher thread: wait for it within the budget only, never unbounded
            if left < 0 or not self._vlock.acquire(timeout=max(left, 0.0)):
                with self._lock:  # the rest waits for the next step
                    self._pending.extendleft(reversed(items[k:]))
                break
            received += 1
            try:
                with self._lock:
                    committed = self._first_seen.get(item.mdigest) if item.mdigest else None
                try:
                    vts = self.verifier.verify_bundle(item.body, item.manifest, item.sender,
                                                      received_at=item.fetched_at, prepaid=True,
                                                      committed_at=committed)
                finally:
                    changes = self.verifier.take_authorship_changes()
                    self._vlock.release()
                    self._move_authorship(changes)
            except Rejection as r:
                self._reject(r, item.manifest.num_leaves)
                continue
            finally:
                with self._lock:
                    self._wanted.discard(item.manifest.bundle_digest.hex())
            try:
                self.server.put(item.body)  # re-serve what we verified: this is the gossip
            except ValueError:
                pass
            now = time.time()
            n_leaves = sum(len(v.tree.leaves()) for v in vts)
            with self._lock:
                self._counts["bundles_accepted"] += 1
                self._hb["nacc"] += n_leaves
            latencies.append(max(0.0, now - item.manifest.created_at))
            acc = AcceptedBundle(item.manifest.bundle_digest.hex(), vts[0].peer_id, item.manifest.created_at,
                                 item.fetched_at, now, len(item.body), len(vts), n_leaves, item.sender)
            self.accepted.append(acc)
            if self.on_accept is not None:
                try:
                    self.on_accept(acc)
                except Exception:  # noqa: BLE001
                    log.exception("on_accept callback failed")
            retok += sum(1 for v in vts if not v.same_tokenizer)
            out.extend(vts)
        out, young, capped = self._admit(out)
        with self._lock:
            self._counts["bundles_received"] += received
            pending = len(self._pending)
            rejected = {f"swarm/rejected/{r}": n - self._rejected_reported[r]
                        for r, n in self._rejected.items() if n - self._rejected_reported[r]}
            self._rejected_reported = Counter(self._rejected)
        m: dict[str, Any] = self._deltas(["bundles_received", "bundles_accepted", "dropped_queue_full",
                                          "fetch_gave_up", "bytes_fetched", "manifests_rate_limited"])
        m.update(rejected)
        m.update(self._gauges())
        m.update({
            "swarm/pending": pending,
            "swarm/external_trees": len(out),
            "swarm/young_trees": young,
            "swarm/trees_capped": capped,
            "swarm/trees_carried": len(self._carry),
            "swarm/retokenized_trees": retok,
            "swarm/gather_s": time.monotonic() - t0,
        })
        if latencies:
            latencies.sort()
            m["swarm/latency_p50_s"] = latencies[len(latencies) // 2]
            m["swarm/latency_max_s"] = latencies[-1]
        return out, m

    def _move_authorship(self, changes: list[tuple[str, str | None]]) -> None:
        """Apply the verifier's authorship changes (``Verifier.take_authorship_changes``): per tree, the key that
        held its content loses one earned tree, and the key whose manifest we read first (None: a tie, no one)
        gains one. A copier verified before the author thus earns nothing once the author's bundle arrives, and
        the author earns what its trees were worth (outside attack: a copier verified first took 32 trained
        samples and +1 standing a step, the author 0)."""
        for loser, winner in changes:
            self.peers.record_unearned(loser, 1)
            if winner is not None:
                self.peers.record_earned(winner, 1)
            self._count("authorship_moved" if winner is not None else "authorship_disputed")

    def _admit(self, trees: list[PeerTree]) -> tuple[list[PeerTree], int, int]:
        """The per-step caps on trees per key (Sybil resistance; module docstring, "Young keys").

        An established key (``PeerBook.earned >= swarm.established_after``) gets up to ``swarm.max_trees_per_peer``
        trees; a young key up to ``PeerBook.tree_cap`` (``swarm.young_key_trees + earned //
        swarm.trees_per_earned_tree``), and all young keys together up to ``swarm.max_young_trees``, handed out
        one tree per key per turn (a young key's trees whose rewards do not differ are dropped first: they have
        nothing to train and must not take a slot), the key that has waited longest first: a key's place is the
        turn it last got a slot, or, never served, the turn it first waited; ties in random order. Every young key
        with something to train gets a turn at least once per ``ceil(young keys / max_young_trees)`` steps; no
        standing a copied tree buys moves it ahead (outside attack: two keys with one earned tree each took both
        slots every step and locked an honest newcomer out), and fresh keys minted every step queue behind a key
        that has been waiting (outside attack: with "never served goes first", two fresh keys a step took both
        slots and an honest newcomer was admitted 1 step in 12). Admission earns
        nothing (standing comes from :meth:`credit`, once the node trained on a tree); the trees of an
        established key are marked ``PeerTree.established`` (what cross-node expansion requires), but only
        when the key was already established when the tree first arrived: a tree carried over while its key was
        young stays unmarked even if the key becomes established before it is admitted.

        Trees over a cap are not lost at once: they are carried to the next steps (older first), at most
        ``max_trees_per_peer`` per key and ``_MAX_CARRY_TREES`` in all, for at most the read window
        (``(read_buckets + 1) * bucket_seconds``); beyond that they are dropped.

        Returns:
            ``(admitted trees, admitted trees of young keys, trees dropped this step)``: dropped by a cap, by
            age, or as a young key's tree without reward contrast.
        """
        now = time.monotonic()
        horizon = now - (self.scfg.read_buckets + 1) * float(self.scfg.bucket_seconds)
        dropped = sum(1 for t0, _, _ in self._carry if t0 < horizon)
        arrived_young = {vt.peer_id: self.peers.is_young(vt.peer_id, self.established_after) for vt in trees}
        items = ([(t0, vt, y) for t0, vt, y in self._carry if t0 >= horizon]
                 + [(now, vt, arrived_young[vt.peer_id]) for vt in trees])
        self._carry = []
        if not items:
            return [], 0, dropped
        asked = {r.key() for r in self.rescue_refs()}
        by_peer: dict[str, list[int]] = {}
        for i, (_, vt, _) in enumerate(items):
            by_peer.setdefault(vt.peer_id, []).append(i)
        keep: set[int] = set()
        gone: set[int] = set()  # young keys' trees without reward contrast
        young: dict[str, list[int]] = {}
        for peer, idx in by_peer.items():
            if self.peers.is_young(peer, self.established_after):
                # an answer to a question we asked carries no contrast of its own (our wrong leaves bring it)
                flat = {i for i in idx if not _has_contrast(items[i][1]) and items[i][1].task_key not in asked}
                if flat:  # no advantage, nothing to train: such trees take no slot of the young pool
                    gone |= flat
                    idx = [i for i in idx if i not in flat]
                cap = self.peers.tree_cap(peer, base=self.young_key_trees, per=self.trees_per_earned_tree,
                                          ceiling=max(self.young_key_trees, self.max_trees_per_peer))
                young[peer] = idx[:cap]
            else:
                keep.update(idx[:self.max_trees_per_peer])
                for i in idx:
                    items[i][1].established = not items[i][2]
        pool = self.max_young_trees
        order = [p for p in young if young[p]]
        self._young_turn += 1
        for p in order:  # a key's place in the queue: the turn it last got a slot, else the turn it first waited
            if p not in self._young_served and p not in self._young_waiting \
                    and len(self._young_waiting) < _MAX_OWNER_KEYS:  # full: a new key waits at the back
                self._young_waiting[p] = self._young_turn
        random.shuffle(order)  # ties in a random order; then the key that has waited longest goes first:
        order.sort(key=lambda p: (self._young_served[p], 1) if p in self._young_served  # waiting since after turn t
                   else (self._young_waiting.get(p, self._young_turn), 0))  # waiting since before turn t
        n_young = 0
        while pool > 0 and any(young[p] for p in order):
            for p in order:
                if pool > 0 and young[p]:
                    keep.add(young[p].pop(0))
                    pool -= 1
                    n_young += 1
                    self._young_served[p] = self._young_turn
                    self._young_served.move_to_end(p)
                    self._young_waiting.pop(p, None)
        while len(self._young_served) > _MAX_OWNER_KEYS:
            self._young_served.popitem(last=False)
        out = [vt for i, (_, vt, _) in enumerate(items) if i in keep]
        carry: list[tuple[float, PeerTree, bool]] = []
        per_peer: Counter[str] = Counter()
        dropped += len(gone)
        for i, (t0, vt, arrived) in enumerate(items):
            if i in keep or i in gone:
                continue
            if per_peer[vt.peer_id] < self.max_trees_per_peer:
                per_peer[vt.peer_id] += 1
                carry.append((t0, vt, arrived))
            else:
                dropped += 1
        if len(carry) > _MAX_CARRY_TREES:  # the oldest go first
            dropped += len(carry) - _MAX_CARRY_TREES
            carry = carry[-_MAX_CARRY_TREES:]
        self._carry = carry
        return out, n_young, dropped

    # ------------------------------------------------------------------ reporting
    def snapshot(self) -> dict[str, Any]:
        """Cumulative counters, the DHT status and the verifier/peer-book snapshot (JSON-ready)."""
        st = self.dht.status()
        with self._lock:
            counts = dict(self._counts)
            rejected = dict(self._rejected)
            pending = len(self._pending)
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
