"""Trust nothing: the layered verification of manifests and bundles from peers (docs/reference/design.md §6).

Every byte from the network is hostile until proven otherwise. :class:`Verifier` runs the checks cheapest
first and stops at the first failure, raising :class:`Rejection` (the only exception that leaves
:meth:`Verifier.verify_manifest` / :meth:`Verifier.verify_bundle`) after charging it to a peer in the
:class:`~swarmnode.swarm.peers.PeerBook`. The order follows docs/reference/design.md §6 and the staged verifiers in
docs/reference/references.md §5 (grail's pipeline: schema -> tokens -> prompt -> environment re-run -> reward within
abs 1e-6; prime-rl: re-derive what the task was, never take it from the worker):

====  =========================================================  ==============================================
step  check                                                      reason (hard/soft)
====  =========================================================  ==============================================
 0    peer banned / rate limit (token bucket), before any work   ``banned``, ``rate_limited`` (not charged)
 1    input is bytes; ``len <= swarm.trust.max_bundle_bytes``          ``malformed``, ``too_large`` (soft)
 1b   fetched bytes vs their manifest: size and SHA-256          ``manifest_mismatch`` (hard, to the sender)
 1c   exact bytes seen before (bounded TTL set of digests)       ``duplicate`` (soft)
 2    envelope: msgpack limits, schema, version, canonical      wire reasons (soft, to the sender)
 3    Ed25519 signature; DHT record owner == manifest signer     ``bad_signature`` (hard, to the sender),
                                                                 ``owner_mismatch`` (hard, to the record owner)
 4    allowlist (private swarm), before the body is parsed       ``not_allowed`` (soft)
 2'   body: msgpack limits, schema, shape, vocab, canonical      wire reasons (hard, to the signer: the
                                                                 signature proves the bytes are its own)
 3'   decoded bundle == its manifest                             ``manifest_mismatch`` (hard, to the manifest's
                                                                 publisher)
 4'   swarm id; protocol version (wire)                          ``wrong_swarm`` (soft), ``bad_version`` (soft)
 5    ``now - skew - freshness <= t <= now + skew``              ``stale``, ``future`` (soft; a stale
                                                                 *manifest* is not charged: old records
                                                                 stay in the DHT until they expire)
 6    every TaskRef in this swarm's training task set            ``foreign_task`` (hard)
      at most ``max_seeds_per_source`` dataset seeds per source  ``too_large`` (soft)
      token ids < our vocab size when the tokenizer id is ours   ``vocab`` (hard)
      tokenizer differs and no re-tokenizer                      ``tokenizer_mismatch`` (not charged)
      every leaf not marked pruned carries a claimed reward      ``missing_reward`` (soft)
      at least one leaf not marked pruned                        ``pruned_only`` (soft)
      leaf text bounded (chars per leaf and per bundle)          ``too_large`` (soft)
      (other tokenizer: segment texts re-tokenized into ours)    ``retokenize_failed`` (not charged)
      completion TOKENS per leaf <= max_completion_tokens        ``too_long`` (soft)
      task regenerated; its question is inside the prompt text   ``prompt_mismatch`` (soft)
      our prompt + completion tokens over all leaves (bundle     ``too_many_tokens`` (soft)
      expanded into samples) <= max_bundle_tokens
      no special token in a completion but one final EOS         ``special_token`` (uncharged; that tree is dropped,
                                                                 the bundle only when no tree is left)
      text == detokenize(ids) (same tokenizer, when given)       ``text_mismatch`` (soft)
      encode(decode(ids)) == ids (same tokenizer), else that     ``not_roundtrip`` (not charged) only when the
      tree is re-encoded with ``encode`` (segment by segment,    re-encoded ids decode to another text or break
      log-probs dropped); its new ids pass the special-token     a token cap: that tree is dropped, the bundle
      check and both token caps again                            only when no tree is left
      normalized tree content seen before (copy / re-signing)    ``replay`` (not charged, the tree is dropped;
                                                                 soft when it copies OUR rollouts)
      EVERY live leaf re-scored with ``tasks.rescore``           ``reward_mismatch`` (hard, whole bundle)
      re-scoring within ``verify_budget_s``                      ``verify_timeout`` (soft)
====  =========================================================  ==============================================

Hard rejections are strikes towards a ban (``swarm.trust.ban_after``); soft ones lower the reputation only.

Attribution
-----------
Before a signature verifies, nothing proves who made the bytes: failures are charged to the peer that
delivered them (``sender``, the transport-level id the caller passes; for a manifest the DHT record owner,
whom the DHT record signature authenticates), or to :data:`~swarmnode.swarm.peers.UNATTRIBUTED` when
unknown. Only ``bad_signature`` is hard there (an honest relay forwards bytes unchanged, so it never
delivers a forged signature); other envelope failures are soft (a broken transfer looks the same). For a
manifest, whose bytes the record owner signed inside its DHT record, ``malformed``, ``schema`` and
``non_canonical`` are hard too. Once the signature verifies, everything wrong *inside* the body is the
signer's and hard. Context failures that a relay could cause by replaying someone else's signed bytes
(``wrong_swarm``, ``stale``, ``future``, ``duplicate``, ``not_allowed``) are soft and charged to the
sender when known, else to the signer. A decoded bundle that differs from the manifest that announced it is
charged to that manifest's publisher: when the bundle is someone else's genuine signed bytes, the announcer
lied, not the bundle's signer (a hostile peer wrapping an honest peer's bundle in its own manifest would
otherwise get the honest peer banned), and the bytes are not marked as judged, so their publisher's own
announcement is still verified.

Our own bundles
---------------
:meth:`Verifier.note_published` remembers the bytes and the tree contents of every bundle we publish, so a
peer that echoes them back to us -- as they are (``duplicate``) or re-signed under its own key (``replay``)
-- never becomes an external sample attributed to it.

Claimed rewards (step 6)
------------------------
A claimed reward is compared with **our** re-score of the leaf's completion (``tasks.rescore(task, text) ->
{"correct", "partial", "format"}``). ``correct`` is exact (1 only for the verifier's full score of 1.0) and
0 whenever the answer format rule fails (one ``<answer>…</answer>``, nothing but whitespace after it:
:func:`~swarmnode.tasks.verifiers.format_reward`); ``partial`` is the dataset's raw score, so a peer that
keeps partial credit for its local rewards (``tasks.partial_credit``) is not called a liar. The format bonus
weight is a local setting (``tasks.format_reward``), so the claim is checked up to one unknown weight
``w ∈ [0, 1]`` per bundle: a leaf with ``format == 0`` must claim ``correct`` or ``partial`` (abs tol
:data:`REWARD_TOL` = 1e-6, as grail's reward stage); leaves with ``format == 1`` must claim ``correct + w`` or
``partial + w`` with the **same** ``w`` for the whole bundle (within ``2·tol``). Anything else is
``reward_mismatch``, a hard rejection of the whole bundle. A leaf that is not pruned must carry a claim
(``missing_reward``). Accepted trees carry **our** rewards (exact ``correct + our format_reward · format``;
partial credit never reaches an external sample), never the claims.

The ids are the truth
---------------------
What we score is the text a leaf's ids decode to **with special tokens included** (``detokenize`` must not
skip them), after one final EOS id (``eos_ids``) is stripped; any other special token id (``special_ids``,
see :func:`special_token_ids`) rejects the bundle (``special_token``). With the tokenizer id equal to ours,
ids must be ``< our_vocab_size`` (hard ``vocab``), the leaf's text fields must equal the decoded text
(``text_mismatch``), and the ids are trained as they are only when they round-trip, ``encode(decode(ids)) ==
ids``: the reward belongs to the ids we train on, and ids our tokenizer never emits for their text are not
trained. A byte-level BPE sampler emits such ids honestly (``Ġlobsters`` + ``ty`` where the tokenizer writes
``Ġlobster`` + ``st`` + ``y``; 7.7% of the embedded BPE model's samples at temperature 1), so a tree with a leaf
that does not round-trip takes the foreign-tokenizer path instead of being dropped: every segment text is
re-encoded with ``encode`` (tree structure kept, a segment's final EOS id kept), behaviour log-probs are
dropped (no off-policy ratio uses the peer's claims for ids it did not sample), ``same_tokenizer`` is False,
and the new ids go through the same checks as any ids: no special token (a text that spells ``<|im_end|>`` in
ordinary tokens re-encodes to the special token: ``special_token``), they must decode to exactly the text
already decoded from the sender's ids and compared with its text fields (a text our normalizer changes is
``not_roundtrip``), and both token caps are recounted on them (a tree pushed over ``max_completion_tokens``, or
pushing the bundle over ``max_bundle_tokens``, largest growth first, is ``not_roundtrip``). What trains is
therefore always our encoding of the scored text, and the sender's non-canonical ids carry nothing past the
checks but that text. A tree with a ``special_token`` or ``not_roundtrip`` leaf is dropped and counted, the
rest of the bundle stays (honest samplers produce both now and then; neither is charged);
``stats["canonicalized_trees"]`` counts the re-encoded trees that were accepted. With another tokenizer every
segment text is re-tokenized with ``retokenize`` (tree structure kept), behaviour log-probs are dropped,
``same_tokenizer`` is False, and we score what *our* ids decode to (characters our tokenizer cannot represent
become its unknown token, a special token: rejected). **Without** ``detokenize``
the ids are trusted to match the text (bare test setups only). Lengths are counted in tokens of our
vocabulary: ``max_completion_tokens`` per leaf (``external.max_external_completion_length``, the node's
``sampling.max_completion_length`` by default) and ``max_bundle_tokens`` for the bundle expanded into samples
(our prompt + completion for every leaf: a node shared by many leaves counts once per leaf), checked by
prefix sums before any text is concatenated or scored.

Our own prompt
--------------
We cannot rebuild the peer's prompt, and we must not train on it (an attacker's system prompt or a 16k-token
prompt would reach the trainer). So the sender's prompt is only *checked*: the regenerated question must be
contained in its prompt text (and, with ``detokenize`` and the same tokenizer, in ``detokenize(prompt_ids)``;
soft ``prompt_mismatch``: an honest node that left-truncates a long prompt fails it too). Then every accepted
tree gets **our** prompt for its TaskRef (``prompt_for(task)``, encoded with ``encode``, left-truncated to
``max_prompt_length``), same tokenizer or not.

Copies, replays and staleness
-----------------------------
A tree's content key (:func:`content_key`) is its TaskRef plus the sorted, normalized (NFKC, lower case,
whitespace collapsed) texts of its live leaves, equal texts once: a copy re-signed under another key, at
another time, with a trailing space, reordered or duplicated leaves has the same key. Each leaf is remembered
too (:func:`leaf_keys`), and a tree none of whose leaves is new is a copy as well (a subset or regrouping of
seen leaves; an outside attack earned standing with copies whose one leaf was duplicated). A tree with some new
leaves is accepted whole; its seen leaves are marked (:attr:`PeerTree.copied_leaves`): they train but earn the
signer no standing (a copy with one new leaf added earned the copier the author's contrast). Keys of accepted trees (and of our own published trees,
:meth:`Verifier.note_published`) are kept until ``seen_capacity`` evicts them, oldest first (or for
``replay_window_s`` when ``swarm.trust.replay_window_seconds`` is set): a copy re-signed with a fresh time can be
trained at any age, so no time window covers every tree that could still be trained (an outside attack
replayed trees right after a 6 h window). A copy is dropped without charging anyone (the real author must
never pay for a copier who raced ahead) except a copy of **our own** rollouts, which proves the signer copied
(soft ``replay``). Authorship goes to the earliest commitment: a copy from a key whose manifest we read before
the holder's takes the content's standing over, a tie disputes it (``committed_at`` of
:meth:`Verifier.verify_bundle`, protocol/SPEC.md §5.1). Each leaf remembers the tree it first came in, and a tree
(kept or dropped) claims each earlier tree more than half of whose leaves it holds, and each earlier tree it lies
wholly inside when its leaves have reward contrast of their own, once per earlier tree: the author's original takes
back a copy that added leaves (however many), a subset or a split. Claims apply when the bundle is accepted
or every tree of it was a copy. Leaves marked ``pruned`` are never scored nor
returned. Staleness is the receiver's measurement: :attr:`PeerTree.received_at` is the arrival time the
caller passes (``received_at``), never the signed policy version (which stays a claim in
``PeerTree.policy_version``) or the signed creation time (bounded by the freshness check).

Bounds
------
Bytes are capped before decoding; msgpack runs with explicit limits (wire); seen-bundle and seen-manifest
digest sets are bounded (capacity and TTL ``freshness + 2·skew``, after which the freshness check rejects the
same bytes anyway), the content-key set by capacity and ``replay_window_s``; leaf texts (characters) and
completions and bundles (tokens) are length-checked by prefix sums before any concatenation; at most ``max_seeds_per_source`` dataset
seeds are regenerated per source and bundle; re-scoring stops after ``verify_budget_s`` (checked between
leaves; each reasoning-gym ``score_answer`` is itself bounded by ``SIGALRM`` on the **main thread** only:
call the verifier from the main thread or a worker process).

Where each check lives
----------------------
This module: :class:`Verifier` (its settings, the memories, the entry points). A manifest's checks:
:mod:`~swarmnode.swarm.manifest_checks`; a bundle's, steps 0 to 6 in order: :mod:`~swarmnode.swarm.bundle_checks`,
with the ids' checks in :mod:`~swarmnode.swarm.tokens`, content keys and authorship in
:mod:`~swarmnode.swarm.content` and the bounded memories in :mod:`~swarmnode.swarm.replay`. Reason codes and
:class:`Rejection`: :mod:`~swarmnode.swarm.rejection`.
"""


from __future__ import annotations

import hashlib
import logging
import math
import time
from typing import Any, Callable, Collection, Sequence

from swarmnode.config import SwarmConfig
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.swarm import wire
from swarmnode.swarm.bundle_checks import REWARD_TOL, BundleChecks
from swarmnode.swarm.content import claim_authorship, content_key, leaf_keys, leaf_path, tree_digest
from swarmnode.swarm.identity import peer_id_from_public_key
from swarmnode.swarm.manifest_checks import ManifestChecks
from swarmnode.swarm.peers import UNATTRIBUTED, LogLimiter, PeerBook
from swarmnode.swarm.rejection import (
    HARD_REASONS,
    REASONS,
    SOFT_REASONS,
    UNCHARGED_REASONS,
    Rejection,
)
from swarmnode.swarm.replay import ReplayMemory, TTLSet
from swarmnode.swarm.tokens import special_token_ids
from swarmnode.tasks.base import Scorer, Task

log = logging.getLogger(__name__)

__all__ = [
    "REASONS",
    "HARD_REASONS",
    "SOFT_REASONS",
    "UNCHARGED_REASONS",
    "REWARD_TOL",
    "Rejection",
    "PeerTree",
    "Verifier",
    "content_key",
    "leaf_keys",
    "special_token_ids",
    "tree_digest",
    "verify_many",
]


class Verifier(ManifestChecks, BundleChecks):
    """Layered verification of peers' manifests and bundles (see the module docstring for every step).

    Args:
        swarm_cfg: the ``swarm`` config (:class:`~swarmnode.config.SwarmConfig`): ``swarm_id``,
            ``allowlist`` (hex public keys or ``sn1…`` peer ids; empty = open swarm) and its ``trust`` section:
            ``freshness_seconds``, ``max_clock_skew``, ``max_bundle_bytes``, ``ban_after``, ``ban_seconds``,
            ``rate_limit_per_minute``, ``replay_window_seconds``, ``max_bundle_tokens``, ``established_after``.
        tasks: the task set, a :class:`~swarmnode.tasks.base.Scorer` (``contains``, ``get``, ``rescore``,
            ``format_reward``; ``tasks.TaskMix``).
        our_vocab_size: our tokenizer's vocabulary size (int >= 1).
        our_tokenizer_id: our tokenizer id (a bundle with the same id keeps its token ids).
        retokenize: ``text -> list[int]`` in our vocabulary, used when a bundle's tokenizer differs; ``None``
            rejects such bundles (``tokenizer_mismatch``, not charged).
        peers: the :class:`PeerBook`; default: a new one from ``swarm_cfg``.
        clock: wall-clock seconds since the epoch (``time.time``); bundle timestamps are compared with it.
        detokenize: ``list[int] -> str`` of our tokenizer; when given, same-tokenizer leaves must satisfy
            ``detokenize(completion ids) == completion text`` and the prompt ids must contain the question.
        max_completion_chars: most characters of one leaf's completion text that we score.
        max_scored_chars: most completion characters scored per bundle (sum over leaves).
        max_seeds_per_source: most distinct dataset seeds per task source in one bundle.
        verify_budget_s: seconds of re-scoring per bundle (checked between leaves).
        seen_capacity: capacity of each seen-digest set (bundle digests, tree digests, manifest digests).
        timer: monotonic seconds for the re-scoring budget (``time.monotonic``).
        encode: ``text -> list[int]`` of OUR tokenizer (no special tokens added; default ``retokenize``): builds
            our prompts, checks that same-tokenizer ids round-trip (``encode(decode(ids)) == ids``) and re-encodes
            the trees whose ids do not.
        special_ids: our tokenizer's special token ids (``tokenizer.all_special_ids``): a completion holding one
            is rejected (``special_token``), except one final EOS.
        eos_ids: ids that may end a completion (one, last); stripped before the text is decoded and scored.
        prompt_for: ``Task -> prompt text`` in OUR format (the node's ``prompt_for``): every accepted tree is
            trained under it (encoded with ``encode``, left-truncated to ``max_prompt_length``), never under the
            sender's prompt. ``None``: the question text alone (or, without ``encode``, the tree's own prompt --
            bare test setups only).
        max_prompt_length: most tokens of our prompt (``sampling.max_prompt_length``).
        max_completion_tokens: most tokens of one leaf's completion (in our vocabulary); the node passes
            ``external.max_external_completion_length`` (which the config derives from
            ``sampling.max_completion_length`` when unset); default ``wire.MAX_COMPLETION_TOKENS``.
        max_bundle_tokens: most tokens of the bundle expanded into samples (our prompt + completion per leaf);
            default ``swarm.trust.max_bundle_tokens``.
        replay_window_s: seconds the normalized content of accepted trees is remembered (default
            ``swarm.trust.replay_window_seconds``, at least the freshness window; None there = until ``seen_capacity``
            evicts it).

    Not thread-safe (the seen-digest sets are plain ordered dicts): use one verifier from one thread, the
    main thread if reasoning-gym's ``SIGALRM`` time limit on each ``score_answer`` should apply.

    Raises:
        ValueError: an argument out of range.
    """

    def __init__(
        self,
        swarm_cfg: SwarmConfig,
        tasks: Scorer,
        our_vocab_size: int,
        our_tokenizer_id: str,
        retokenize: Callable[[str], list[int]] | None = None,
        peers: PeerBook | None = None,
        clock: Callable[[], float] = time.time,
        *,
        detokenize: Callable[[list[int]], str] | None = None,
        max_completion_chars: int = 64 * 1024,
        max_scored_chars: int = 8 * 1024 * 1024,
        max_seeds_per_source: int = 4,
        verify_budget_s: float = 10.0,
        seen_capacity: int = 65536,
        timer: Callable[[], float] = time.monotonic,
        encode: Callable[[str], list[int]] | None = None,
        special_ids: Collection[int] = (),
        eos_ids: Collection[int] = (),
        prompt_for: Callable[[Task], str] | None = None,
        max_prompt_length: int = 512,
        max_completion_tokens: int | None = None,
        max_bundle_tokens: int | None = None,
        replay_window_s: float | None = None,
    ) -> None:
        if isinstance(our_vocab_size, bool) or not isinstance(our_vocab_size, int) or our_vocab_size < 1:
            raise ValueError(f"our_vocab_size must be an int >= 1, got {our_vocab_size!r}")
        if not isinstance(our_tokenizer_id, str):
            raise ValueError(f"our_tokenizer_id must be a string, got {type(our_tokenizer_id).__name__}")
        for name, v in (("max_completion_chars", max_completion_chars), ("max_scored_chars", max_scored_chars),
                        ("max_seeds_per_source", max_seeds_per_source), ("seen_capacity", seen_capacity)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if not (verify_budget_s > 0):
            raise ValueError(f"verify_budget_s must be > 0, got {verify_budget_s!r}")
        if max_completion_tokens is None:
            max_completion_tokens = wire.MAX_COMPLETION_TOKENS
        if max_bundle_tokens is None:
            max_bundle_tokens = swarm_cfg.trust.max_bundle_tokens
        for name, v in (("max_completion_tokens", max_completion_tokens), ("max_bundle_tokens", max_bundle_tokens),
                        ("max_prompt_length", max_prompt_length)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        self.cfg = swarm_cfg
        self.tasks = tasks
        self.swarm_id: str = swarm_cfg.swarm_id
        self.our_vocab_size = our_vocab_size
        self.our_tokenizer_id = our_tokenizer_id
        self.retokenize = retokenize
        self.detokenize = detokenize
        self.encode = encode if encode is not None else retokenize
        self.special_ids = frozenset(int(t) for t in special_ids)
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.prompt_for = prompt_for
        self.max_prompt_length = int(max_prompt_length)
        self.max_completion_tokens = int(max_completion_tokens)
        self.max_bundle_tokens = int(max_bundle_tokens)
        self.clock = clock
        self.freshness = float(swarm_cfg.trust.freshness_seconds)
        self.skew = float(swarm_cfg.trust.max_clock_skew)
        self.max_bundle_bytes = min(int(swarm_cfg.trust.max_bundle_bytes), wire.MAX_ENVELOPE_BYTES)
        self.max_completion_chars = max_completion_chars
        self.max_scored_chars = max_scored_chars
        self.max_seeds_per_source = max_seeds_per_source
        self.verify_budget_s = float(verify_budget_s)
        self.timer = timer
        self.allow_keys: set[str] = set()
        self.allow_peer_ids: set[str] = set()
        for entry in swarm_cfg.allowlist or []:
            e = str(entry).strip().lower()
            if e.startswith("sn1"):
                self.allow_peer_ids.add(e)
            else:
                self.allow_keys.add(e)
        if peers is None:
            peers = PeerBook(
                ban_after=int(swarm_cfg.trust.ban_after),
                ban_seconds=float(swarm_cfg.trust.ban_seconds),
                rate_limit_per_minute=float(swarm_cfg.trust.rate_limit_per_minute),
                clock=clock,
            )
        self.peers = peers
        ttl = self.freshness + 2.0 * self.skew
        self._seen_bundles = TTLSet(seen_capacity, ttl, clock)     # envelope digest -> verdict reason
        window = replay_window_s if replay_window_s is not None else swarm_cfg.trust.replay_window_seconds
        # no window: remembered until the capacity evicts it (a re-signed tree is fresh at any age)
        self.replay_window_s = math.inf if window is None else max(float(window), ttl)
        # content_key -> "own" | (holder peer id | None, commitment time | None, worth 0 | 1) (tree keys)
        #   | (first signer, commitment time, tree content key, distinct leaves of that tree) (leaf keys)
        self._seen_content = ReplayMemory(seen_capacity, self.replay_window_s, clock)
        self._young_after = int(swarm_cfg.trust.established_after)  # standing that puts a signer's trees in protected memory
        self._authorship_changes: list[tuple[str, str | None]] = []
        self._seen_manifests = TTLSet(seen_capacity, ttl, clock)   # manifest digest -> (verdict, bundle digest | peer)
        self._internal_log = LogLimiter(10.0)
        self.stats: dict[str, Any] = {
            "manifests_accepted": 0, "bundles_accepted": 0, "trees_accepted": 0, "leaves_accepted": 0,
            "trees_replayed": 0, "retokenized_trees": 0, "canonicalized_trees": 0, "leaves_pruned_dropped": 0,
            "rejected": {},
        }

    # ================================================================== helpers
    def _reject(self, reason: str, detail: str, peer: str | None, hard: bool, charge: bool = True) -> Rejection:
        peer = peer or UNATTRIBUTED
        charge = charge and reason not in UNCHARGED_REASONS
        if reason in UNCHARGED_REASONS:
            hard = False
        if charge:
            self.peers.record_reject(peer, reason, hard, detail)
        return Rejection(reason, detail, peer, hard, charged=charge)

    def _count(self, r: Rejection) -> None:
        rej = self.stats["rejected"]
        rej[r.reason] = rej.get(r.reason, 0) + 1

    def _allowed_key(self, public_key: bytes) -> bool:
        if not self.allow_keys and not self.allow_peer_ids:
            return True
        return public_key.hex() in self.allow_keys or peer_id_from_public_key(public_key) in self.allow_peer_ids

    def _freshness(self, t: float) -> tuple[str, str] | None:
        now = self.clock()
        if t > now + self.skew:
            return "future", f"created {t - now:.1f} s in the future (allowed clock skew {self.skew:g} s)"
        if now - t > self.freshness + self.skew:
            return "stale", (f"created {now - t:.1f} s ago (freshness window {self.freshness:g} s + skew "
                             f"{self.skew:g} s)")
        return None

    def note_published(self, envelope: bytes, bundle: wire.RolloutBundle) -> None:
        """Remember a bundle we published: its exact bytes (``duplicate``) and its trees' contents (``replay``).

        Args:
            envelope: the signed envelope bytes we serve.
            bundle: the :class:`~swarmnode.swarm.wire.RolloutBundle` inside it.

        A peer that sends our own rollouts back -- as they are or re-signed under its own key -- is then
        rejected like any other copy instead of becoming an external sample attributed to it. Bounded like the
        other seen-digest sets (capacity and TTL).
        """
        self._seen_bundles.add(hashlib.sha256(bytes(envelope)).digest(), "own")
        for wt in bundle.trees:
            texts = ["".join(wt.nodes[k].text for k in leaf_path(wt, j)) for j in wt.leaves()
                     if wt.nodes[j].finish_reason != "pruned"]
            if texts:
                for k in [content_key(wt.task, texts), *leaf_keys(wt.task, texts)]:
                    self._seen_content.add(k, "own")

    def seen(self, bundle_digest: bytes | str) -> bool:
        """True when a bundle with this envelope digest (32 bytes or hex) already got a verdict.

        Nodes call it before fetching a manifest's bundle.
        """
        try:
            d = bytes.fromhex(bundle_digest) if isinstance(bundle_digest, str) else bytes(bundle_digest)
        except (ValueError, TypeError):
            return False
        return d in self._seen_bundles

    def snapshot(self) -> dict:
        """Verifier counters (accepted manifests/bundles/trees/leaves, rejections by reason) and the PeerBook."""
        out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.stats.items()}
        out["seen_bundles"] = len(self._seen_bundles)
        out["seen_trees"] = len(self._seen_content)
        out["peers"] = self.peers.snapshot()
        return out

    def _guard(self, fn: Callable[[], Any], peer_hint: str) -> Any:
        try:
            return fn()
        except Rejection as r:
            self._count(r)
            raise
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - nothing but Rejection may leave the verifier
            self._internal_log.log(log, logging.ERROR, "verifier bug on input from %s: %s: %s", peer_hint,
                                   type(e).__name__, str(e)[:200])
            r = Rejection("internal", f"{type(e).__name__}: {str(e)[:200]}", peer_hint, False, charged=False)
            self._count(r)
            raise r from None

    # ================================================================== manifests
    def verify_manifest(self, data: bytes, record_owner: bytes | None = None) -> wire.Manifest:
        """Verify a manifest read from the DHT.

        Args:
            data: the manifest envelope bytes (the DHT record's value).
            record_owner: raw 32-byte public key of the DHT record's owner (the subkey's owner marker, checked
                by the DHT record validator), or ``None`` when unknown.

        Returns:
            The decoded :class:`~swarmnode.swarm.wire.Manifest`. A manifest seen before is returned again as
            long as its bundle has not been verified (the caller may retry the fetch).

        Raises:
            Rejection: any failed check. A manifest for a bundle that already got a verdict raises an
            uncharged ``duplicate`` (re-reading the DHT returns the same records every poll), and a manifest
            rejected before raises its earlier reason again, uncharged.
        """
        owner_id: str | None = None
        if isinstance(record_owner, (bytes, bytearray)) and len(record_owner) == 32:
            owner_id = peer_id_from_public_key(bytes(record_owner))
        return self._guard(lambda: self._verify_manifest(data, record_owner, owner_id), owner_id or UNATTRIBUTED)

    # ================================================================== bundles
    def verify_bundle(self, data: bytes, manifest: wire.Manifest | None = None,
                      sender: str | None = None, *, received_at: float | None = None,
                      prepaid: bool = False, committed_at: float | None = None) -> list[PeerTree]:
        """Verify a bundle and return its accepted trees with our own re-scored rewards.

        Args:
            data: the bundle envelope bytes as received.
            manifest: the (already verified) manifest that announced the bundle, when it was fetched for one:
                size, digest and contents must match it.
            sender: transport-level id of the peer that delivered the bytes, when known (charged for failures
                before the signature verifies).
            received_at: our wall clock (unix seconds) when the bytes arrived (default: ``clock()`` now); it
                becomes :attr:`PeerTree.received_at`, the receiver-measured age of the tree (a signed policy
                version or creation time is never the measure of staleness).
            prepaid: the publisher's rate-limit token for this bundle was already taken when its ``manifest``
                was admitted (the swarm client's poll does that), so step 0 checks bans only. One token per
                bundle: charging the manifest and then the bundle again would let new manifests of a peer that
                publishes faster than the limit drain the bucket before any of its fetched bundles is verified,
                and no bundle of that honest peer would ever be accepted. Requires ``manifest``.
            committed_at: when we first read the manifest that announced this bundle (any clock, the same for
                every call; the swarm client passes its monotonic first-read time). Authorship of a tree's
                content goes to the earliest commitment: a later copy from a key whose manifest we read
                *earlier* than the first holder's takes the authorship over, a tie disputes it (no one keeps
                it); :meth:`take_authorship_changes` hands these changes to the caller, which moves the
                standing. ``None``: no claim (the first verified keeps the content, as before).

        Returns:
            The accepted trees (at least one), in bundle order, minus trees dropped as ``replay``.

        Raises:
            Rejection: any failed check (see the module docstring). Nothing else.
        """
        hint = sender or (peer_id_from_public_key(manifest.publisher_key)
                          if isinstance(manifest, wire.Manifest) and len(manifest.publisher_key) == 32
                          else UNATTRIBUTED)
        return self._guard(lambda: self._verify_bundle(data, manifest, sender, received_at, prepaid, committed_at),
                           hint)

    def _claim_authorship(self, key: bytes, seen: Any, signer: str, committed_at: float | None) -> None:
        """A copy of content ``key`` from ``signer``: move or dispute its authorship (see ``committed_at`` of
        :meth:`verify_bundle`; :func:`~swarmnode.swarm.content.claim_authorship`)."""
        change = claim_authorship(self._seen_content, key, seen, signer, committed_at)
        if change is not None:
            self._authorship_changes.append(change)
            if len(self._authorship_changes) > 4096:  # nobody took them: keep the newest
                del self._authorship_changes[:-4096]

    def _apply_claims(self, keys: list[bytes], signer: str, committed_at: float | None) -> None:
        """Claim each earlier tree of ``keys`` once for ``signer`` (:meth:`_claim_authorship` on its current
        memory value), after the bundle's checks passed or when every tree of it was a copy."""
        for key in dict.fromkeys(keys):
            self._claim_authorship(key, self._seen_content.get(key), signer, committed_at)

    def _leaf_holder(self, value: Any) -> Any:
        """Who holds a leaf now, from its memory value: ``(signer, commitment time, tree key, tree leaves)`` names
        the tree it first came in, whose holder holds it (authorship moves per tree; its first signer once that
        tree is forgotten); a ``(holder, time, worth)`` value is a one-leaf tree's own. Other values (``"own"``, ``None``,
        an in-bundle marker) are returned as they are."""
        if isinstance(value, tuple) and len(value) == 3:
            return value[0]
        if not (isinstance(value, tuple) and len(value) == 4):
            return value
        tree = self._seen_content.get(value[2])
        return tree[0] if isinstance(tree, tuple) and len(tree) == 3 else value[0]

    def _leaf_claims(self, keys: list[bytes], seen: list[Any], signer: str,
                     own_contrast: Callable[[], bool] | None = None) -> list[bytes]:
        """The content keys of the earlier peer trees a tree from ``signer`` claims (:meth:`_apply_claims`): each
        tree more than half of whose distinct leaves are among this tree's leaves (``keys``, their memory values
        ``seen``) and that another key holds now -- a copy of this tree's content verified before it (a subset, a
        split, a copy that added leaves) -- and each tree this tree lies wholly inside when ``own_contrast()``
        (our verifier's scores of this tree's own texts have reward contrast; called only then, None = never):
        an author's original claims a copy that was verified first and padded with as many junk leaves as it
        copied (an outside attack kept 5 units of 5 that way). One claim per earlier tree, however many leaves it shares, so regrouped copies cannot move
        or dispute one tree more than once; two honest trees sharing one leaf of two claim nothing, and a tree
        without contrast (a guessed bare answer inside an honest two-leaf tree: an outside attack on an earlier
        "exactly half" rule) claims only by the majority rule."""
        count: dict[bytes, int] = {}
        size: dict[bytes, int] = {}
        for x, v in zip(keys, seen):
            if isinstance(v, tuple) and len(v) == 4:
                tk, n = v[2], int(v[3])
            elif isinstance(v, tuple) and len(v) == 3:  # the leaf is a one-leaf tree of its own
                tk, n = x, 1
            else:
                continue
            count[tk] = count.get(tk, 0) + 1
            size[tk] = n
        out = []
        contrast: bool | None = None  # scored once, only when this tree lies wholly inside an earlier one
        for tk, c in count.items():
            tree = self._seen_content.get(tk)
            if not (isinstance(tree, tuple) and len(tree) == 3 and tree[0] is not None and tree[0] != signer):
                continue
            if 2 * c > size[tk]:
                out.append(tk)
            elif c == len(keys) and own_contrast is not None:
                if contrast is None:
                    contrast = bool(own_contrast())
                if contrast:
                    out.append(tk)
        return out

    def take_authorship_changes(self) -> list[tuple[str, str | None]]:
        """The authorship changes since the last call, oldest first, and forget them: ``(loser, winner)`` peer
        ids, one per tree, where ``loser`` held a tree's content and ``winner`` committed to it earlier (its
        manifest was read first), or ``winner`` is None when both committed at the same time (disputed: no one
        keeps it). The swarm client takes one earned tree from the loser and gives one to the winner."""
        out, self._authorship_changes = self._authorship_changes, []
        return out



def verify_many(verifier: Verifier, items: Sequence[tuple[bytes, wire.Manifest | None, str | None]]
                ) -> tuple[list[PeerTree], list[Rejection]]:
    """Verify several bundles, collecting accepted trees and rejections (one bad bundle never stops the rest)."""
    trees: list[PeerTree] = []
    rejections: list[Rejection] = []
    for data, manifest, sender in items:
        try:
            trees.extend(verifier.verify_bundle(data, manifest, sender))
        except Rejection as r:
            rejections.append(r)
    return trees, rejections
