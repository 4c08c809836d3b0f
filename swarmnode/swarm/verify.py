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
 1    input is bytes; ``len <= swarm.max_bundle_bytes``          ``malformed``, ``too_large`` (soft)
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

Hard rejections are strikes towards a ban (``swarm.ban_after``); soft ones lower the reputation only.

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
vocabulary: ``max_completion_tokens`` per leaf (``swarm.max_external_completion_length``, the node's
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
seen leaves; an outside attack earned standing with copies whose one leaf was duplicated). Keys of accepted trees (and of our own published trees,
:meth:`Verifier.note_published`) are kept until ``seen_capacity`` evicts them, oldest first (or for
``replay_window_s`` when ``swarm.replay_window_seconds`` is set): a copy re-signed with a fresh time can be
trained at any age, so no time window covers every tree that could still be trained (an outside attack
replayed trees right after a 6 h window). A copy is dropped without charging anyone (the real author must
never pay for a copier who raced ahead) except a copy of **our own** rollouts, which proves the signer copied
(soft ``replay``). Authorship goes to the earliest commitment: a copy from a key whose manifest we read before
the holder's takes the content's standing over, a tie disputes it (``committed_at`` of
:meth:`Verifier.verify_bundle`, protocol/SPEC.md §5.1). Leaves marked ``pruned`` are never scored nor
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
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Collection, Sequence

from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.tree import RolloutTree
from swarmnode.swarm import wire
from swarmnode.swarm.identity import peer_id_from_public_key
from swarmnode.swarm.peers import UNATTRIBUTED, LogLimiter, PeerBook
from swarmnode.config import SwarmConfig
from swarmnode.tasks.base import Scorer, Task, TaskRef
from swarmnode.tasks.partition import normalize_question

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

REWARD_TOL = 1e-6
"""Absolute tolerance between a claimed reward and our re-score (grail's reward stage: abs 1e-6)."""

REASONS: dict[str, str] = {
    # wire reasons (protocol/SPEC.md §6)
    "too_large": "beyond a byte, count or length limit (ours or the protocol's)",
    "malformed": "not exactly one msgpack value (truncated, trailing bytes, bad UTF-8, ext, not bytes)",
    "non_canonical": "valid msgpack but not the canonical encoding",
    "schema": "wrong type, missing or unknown key, integer out of range, unknown enum value",
    "bad_version": "protocol version not supported, or body version != envelope version",
    "bad_kind": "not the message kind asked for",
    "bad_signature": "the Ed25519 signature does not verify",
    "key_mismatch": "the body's publisher key is not the envelope signer's",
    "vocab": "a token id >= the declared vocabulary size, or >= ours when the tokenizer id is ours",
    "tree_shape": "root rules, parent order, leaf/inner fields, depth or leaf caps",
    "numeric": "NaN/inf, a positive log-prob, a reward or time outside its range",
    "manifest_mismatch": "fetched bytes or decoded contents differ from the manifest that announced them",
    # verifier reasons
    "owner_mismatch": "the manifest's signer is not the owner of the DHT record that holds it",
    "wrong_swarm": "the message is for another swarm id",
    "not_allowed": "the signer is not in this private swarm's allowlist",
    "stale": "created more than freshness_seconds (+ clock skew) ago",
    "future": "created more than max_clock_skew seconds in the future",
    "duplicate": "the exact bytes were seen before",
    "replay": "a tree whose normalized content (TaskRef + completion texts) was seen before (re-published or copied)",
    "missing_reward": "a leaf that is not pruned carries no claimed reward",
    "pruned_only": "every tree holds only leaves marked pruned (nothing to score or train)",
    "too_long": "a completion longer than max_external_completion_length tokens (our vocabulary), or a sender "
                "prompt over 4 x max_prompt_length tokens / 16 x max_prompt_length characters",
    "too_many_tokens": "the bundle expands into more than max_bundle_tokens tokens of samples",
    "special_token": "a completion's ids hold a special token other than one final EOS",
    "not_roundtrip": "same-tokenizer ids that our tokenizer does not produce for their own text",
    "foreign_task": "a TaskRef outside this swarm's training task set (unknown source, held-out, bad seed)",
    "prompt_mismatch": "the regenerated question is not in the prompt",
    "reward_mismatch": "a claimed reward differs from our re-score",
    "tokenizer_mismatch": "another tokenizer and no re-tokenizer configured",
    "text_mismatch": "a leaf's text is not the detokenized token ids",
    "retokenize_failed": "re-tokenizing the text into our vocabulary failed",
    "verify_timeout": "re-scoring ran past the per-bundle time budget",
    "rate_limited": "the peer exceeded its rate limit (dropped before decoding)",
    "banned": "the peer is banned (dropped before decoding)",
    "internal": "a bug in the verifier (never the peer's fault)",
}
"""Every reason code a :class:`Rejection` can carry, with its meaning."""

HARD_REASONS = frozenset({
    "bad_signature", "key_mismatch", "vocab", "tree_shape", "numeric", "manifest_mismatch", "owner_mismatch",
    "foreign_task", "reward_mismatch",
})
"""Reasons that are always hard (strikes towards a ban). ``schema``, ``malformed``, ``non_canonical``,
``too_large`` and ``bad_version`` are hard when found inside a signed body (or a manifest inside its owner's
signed DHT record) and soft in an unsigned envelope (``too_large`` from our own byte caps is always soft)."""

SOFT_REASONS = frozenset({
    "wrong_swarm", "not_allowed", "stale", "future", "duplicate", "replay", "prompt_mismatch", "text_mismatch",
    "verify_timeout", "bad_kind", "missing_reward", "pruned_only", "too_long", "too_many_tokens", "special_token",
})
"""Reasons that are always soft (lower the reputation, never ban)."""

UNCHARGED_REASONS = frozenset({"rate_limited", "banned", "tokenizer_mismatch", "retokenize_failed", "internal",
                               "not_roundtrip", "special_token"})
"""Reasons never charged to a peer (counted by the verifier only): the PeerBook already counted the refusal,
or it is our configuration / our bug, or (``not_roundtrip``, ``special_token``) honest samplers do it too: a
model may sample a special token such as ``<|user|>`` inside a completion, or a token sequence that its
tokenizer would have merged (``"<answer>"`` letter by letter; such a tree is re-encoded, and ``not_roundtrip``
remains only when the re-encoded ids decode to another text or break a token cap); such trees are dropped,
which is all an attacker could be denied. ``replay`` is uncharged except for copies of our own rollouts."""

_ENVELOPE_HARD = frozenset({"bad_signature"})
_RECORD_HARD = frozenset({"bad_signature", "malformed", "schema", "non_canonical", "key_mismatch"})
_BODY_SOFT = frozenset({"bad_kind"})


class Rejection(Exception):
    """A message was rejected; the only exception :class:`Verifier` methods raise.

    Attributes:
        reason: one of :data:`REASONS`.
        detail: human-readable explanation (what was expected, what came).
        peer: the peer id the rejection was charged to (or would have been, for uncharged reasons).
        hard: True for provable misbehaviour (a strike towards a ban).
        charged: True when it was recorded in the PeerBook.
    """

    def __init__(self, reason: str, detail: str, peer: str, hard: bool, charged: bool = True) -> None:
        super().__init__(reason, detail, peer, hard)
        self.reason = reason
        self.detail = detail
        self.peer = peer
        self.hard = bool(hard)
        self.charged = bool(charged)

    def __str__(self) -> str:
        return f"{self.reason} ({'hard' if self.hard else 'soft'}, peer {self.peer}): {self.detail}"


class _TTLSet:
    """A bounded set with expiry: at most ``capacity`` keys, each forgotten ``ttl`` seconds after insertion."""

    def __init__(self, capacity: int, ttl: float, clock: Callable[[], float]) -> None:
        self.capacity = max(1, int(capacity))
        self.ttl = float(ttl)
        self.clock = clock
        self._d: OrderedDict[Any, tuple[float, Any]] = OrderedDict()

    def _expire(self, now: float) -> None:
        while self._d:
            k, (t, _) = next(iter(self._d.items()))
            if now - t <= self.ttl and len(self._d) <= self.capacity:
                break
            del self._d[k]

    def get(self, key: Any, default: Any = None) -> Any:
        now = self.clock()
        self._expire(now)
        item = self._d.get(key)
        if item is None or now - item[0] > self.ttl:
            return default
        return item[1]

    def __contains__(self, key: Any) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def add(self, key: Any, value: Any = True) -> None:
        now = self.clock()
        self._d.pop(key, None)
        self._d[key] = (now, value)
        self._expire(now)

    def __len__(self) -> int:
        return len(self._d)

    def discard(self, key: Any) -> None:
        self._d.pop(key, None)

    def clear(self) -> None:
        self._d.clear()


_MISSING = object()


class _ReplayMemory:
    """The content keys of trees seen (ours, and accepted peers'), in two bounded parts of ``capacity`` keys each.

    Keys of our own trees and of trees from established signers live in the *protected* part; keys of trees from
    young signers (free keys) live in the *young* part, so that a flood of bundles from fresh keys evicts only other
    young keys' memory, never ours or an established peer's (outside attack: 64 free keys with one 1,024-leaf bundle
    each emptied the one shared memory, after which an honest tree re-signed by another key was fresh again). A key
    already remembered keeps its part when its value changes (authorship moves); a young key's entry that an
    established signer's tree also holds moves to the protected part.
    """

    def __init__(self, capacity: int, ttl: float, clock: Callable[[], float]) -> None:
        self.protected = _TTLSet(capacity, ttl, clock)
        self.young = _TTLSet(capacity, ttl, clock)

    def get(self, key: Any, default: Any = None) -> Any:
        v = self.protected.get(key, _MISSING)
        return v if v is not _MISSING else self.young.get(key, default)

    def add(self, key: Any, value: Any, young: bool | None = False) -> None:
        """Remember ``key``; ``young``: True for a young signer's tree, False for ours or an established
        signer's, None to keep the part the key is already in (the protected one for a new key)."""
        if young is None:
            young = key not in self.protected and key in self.young
        if young and key not in self.protected:
            self.young.add(key, value)
        else:
            self.young.discard(key)  # the key now lives in the protected part
            self.protected.add(key, value)

    def __len__(self) -> int:
        return len(self.protected) + len(self.young)

    def clear(self) -> None:
        self.protected.clear()
        self.young.clear()
_U32 = "I" if array("I").itemsize == 4 else "L"  # a 4-byte unsigned typecode (token ids are < 2^32)


def tree_digest(wt: wire.WireTree) -> bytes:
    """SHA-256 of a tree's exact content: TaskRef, prompt ids and text, and every node's parent, ids and text.

    Replay detection no longer uses it (a trailing space or another prompt changed it): see :func:`content_key`.

    Policy versions, log-probs, finish reasons and claimed rewards are left out, so re-publishing the
    same rollouts with other metadata (or another key) gives the same digest. Local use only (the byte
    layout is not part of the protocol).
    """
    h = hashlib.sha256()
    h.update(repr(wt.task.to_list()).encode("utf-8", "surrogatepass"))
    h.update(len(wt.prompt_ids).to_bytes(4, "little"))
    h.update(array(_U32, wt.prompt_ids).tobytes())
    h.update(wt.prompt_text.encode("utf-8", "surrogatepass"))
    for n in wt.nodes:
        h.update(b"\x00N")
        h.update((-1 if n.parent is None else n.parent).to_bytes(4, "little", signed=True))
        h.update(len(n.token_ids).to_bytes(4, "little"))
        h.update(array(_U32, n.token_ids).tobytes())
        h.update(len(n.text).to_bytes(4, "little"))
        h.update(n.text.encode("utf-8", "surrogatepass"))
    return h.digest()


def _ids_ok(ids: Any, vocab: int) -> bool:
    return isinstance(ids, list) and all(type(t) is int and 0 <= t < vocab for t in ids)


class Verifier:
    """Layered verification of peers' manifests and bundles (see the module docstring for every step).

    Args:
        swarm_cfg: the ``swarm`` config (:class:`~swarmnode.config.SwarmConfig`): ``swarm_id``,
            ``allowlist`` (hex public keys or ``sn1…`` peer ids; empty = open swarm), ``freshness_seconds``,
            ``max_clock_skew``, ``max_bundle_bytes``, ``ban_after``, ``ban_seconds``, ``rate_limit_per_minute``,
            ``replay_window_seconds``, ``max_external_completion_length``, ``max_bundle_tokens``.
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
        max_completion_tokens: most tokens of one leaf's completion (in our vocabulary); default
            ``swarm.max_external_completion_length`` or, when that is ``None``, ``wire.MAX_COMPLETION_TOKENS``
            (the node passes ``sampling.max_completion_length`` then).
        max_bundle_tokens: most tokens of the bundle expanded into samples (our prompt + completion per leaf);
            default ``swarm.max_bundle_tokens``.
        replay_window_s: seconds the normalized content of accepted trees is remembered (default
            ``swarm.replay_window_seconds``, at least the freshness window; None there = until ``seen_capacity``
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
            max_completion_tokens = swarm_cfg.max_external_completion_length or wire.MAX_COMPLETION_TOKENS
        if max_bundle_tokens is None:
            max_bundle_tokens = swarm_cfg.max_bundle_tokens or 131072
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
        self.freshness = float(swarm_cfg.freshness_seconds)
        self.skew = float(swarm_cfg.max_clock_skew)
        self.max_bundle_bytes = min(int(swarm_cfg.max_bundle_bytes), wire.MAX_ENVELOPE_BYTES)
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
                ban_after=int(swarm_cfg.ban_after),
                ban_seconds=float(swarm_cfg.ban_seconds),
                rate_limit_per_minute=float(swarm_cfg.rate_limit_per_minute),
                clock=clock,
            )
        self.peers = peers
        ttl = self.freshness + 2.0 * self.skew
        self._seen_bundles = _TTLSet(seen_capacity, ttl, clock)     # envelope digest -> verdict reason
        window = replay_window_s if replay_window_s is not None else swarm_cfg.replay_window_seconds
        # no window: remembered until the capacity evicts it (a re-signed tree is fresh at any age)
        self.replay_window_s = math.inf if window is None else max(float(window), ttl)
        # content_key -> "own" | "peer" (leaf keys) | (holder peer id | None, commitment time | None) (tree keys)
        self._seen_content = _ReplayMemory(seen_capacity, self.replay_window_s, clock)
        self._young_after = int(swarm_cfg.established_after)  # standing that puts a signer's trees in protected memory
        self._authorship_changes: list[tuple[str, str | None]] = []
        self._seen_manifests = _TTLSet(seen_capacity, ttl, clock)   # manifest digest -> (verdict, bundle digest | peer)
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
            texts = ["".join(wt.nodes[k].text for k in _path(wt, j)) for j in wt.leaves()
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

    def _verify_manifest(self, data: Any, record_owner: Any, owner_id: str | None) -> wire.Manifest:
        deliverer = owner_id or UNATTRIBUTED
        if record_owner is not None and owner_id is None:
            raise self._reject("internal", "record_owner must be a 32-byte public key (caller bug)", None, False,
                               charge=False)
        if owner_id is not None and self.peers.is_banned(owner_id):
            raise self._reject("banned", "record owner is banned", owner_id, False, charge=False)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise self._reject("malformed", f"expected manifest bytes, got {type(data).__name__}", deliverer, False)
        data = bytes(data)
        if len(data) > wire.MAX_MANIFEST_BYTES:
            raise self._reject("too_large", f"manifest of {len(data)} bytes exceeds {wire.MAX_MANIFEST_BYTES}",
                               deliverer, False)
        mdigest = hashlib.sha256(data).digest()
        # Re-reads: the DHT returns the same records on every poll. A verdict is charged once; an accepted
        # manifest is re-verified (cheap, uncharged: only its bundle digest is cached, to bound memory) until
        # its bundle gets a verdict, after which it is an uncharged duplicate.
        cached = self._seen_manifests.get(mdigest)
        reread = cached is not None
        if reread:
            verdict, info = cached
            if verdict != "ok":
                raise self._reject(verdict, "manifest rejected before (cached verdict)", info, False, charge=False)
            if info in self._seen_bundles:
                raise self._reject("duplicate", "the announced bundle already got a verdict", deliverer, False,
                                   charge=False)

        def rej(reason: str, detail: str, peer: str | None, hard: bool) -> Rejection:
            r = self._reject(reason, detail, peer, hard, charge=not reread)
            if reason not in ("banned", "rate_limited", "internal"):
                self._seen_manifests.add(mdigest, (r.reason, r.peer))
            return r

        try:
            env = wire.open_envelope(data, expected_kind=wire.KIND_MANIFEST, max_bytes=wire.MAX_MANIFEST_BYTES)
        except wire.WireError as e:
            raise rej(e.reason, e.detail, deliverer, e.reason in (_RECORD_HARD if owner_id else _ENVELOPE_HARD))
        signer = env.peer_id
        if record_owner is not None and env.public_key != bytes(record_owner):
            raise rej("owner_mismatch", f"manifest signed by {signer} stored in the DHT record of {owner_id}",
                      owner_id, True)
        if self.peers.is_banned(signer):
            raise self._reject("banned", "signer is banned", signer, False, charge=False)
        context_peer = owner_id or signer
        if not self._allowed_key(env.public_key):
            raise rej("not_allowed", f"signer {signer} is not in the allowlist", context_peer, False)
        try:
            m = wire.decode_body(wire.KIND_MANIFEST, env.body, version=env.version, public_key=env.public_key)
        except wire.WireError as e:
            raise rej(e.reason, e.detail, signer, e.reason not in _BODY_SOFT)
        assert isinstance(m, wire.Manifest)
        if m.swarm_id != self.swarm_id:
            raise rej("wrong_swarm", f"manifest for swarm {m.swarm_id[:64]!r}, we are {self.swarm_id!r}",
                      context_peer, False)
        fresh = self._freshness(m.created_at)
        if fresh is not None:
            if fresh[0] == "stale":  # old records stay in the DHT until they expire: not the owner's fault
                r = self._reject("stale", "manifest " + fresh[1], context_peer, False, charge=False)
                self._seen_manifests.add(mdigest, ("stale", r.peer))
                raise r
            raise rej(fresh[0], "manifest " + fresh[1], context_peer, False)
        if m.bundle_size > self.max_bundle_bytes:
            raise rej("too_large", f"announced bundle of {m.bundle_size} bytes exceeds our cap "
                      f"{self.max_bundle_bytes}", signer, False)
        for i, ref in enumerate(m.tasks):
            if not self.tasks.contains(ref):
                raise rej("foreign_task", f"manifest.tasks[{i}] {ref.key()[:120]} is not in this swarm's training "
                          "task set", signer, True)
        self._seen_manifests.add(mdigest, ("ok", m.bundle_digest))
        if m.bundle_digest in self._seen_bundles:
            raise self._reject("duplicate", "the announced bundle already got a verdict", context_peer, False,
                               charge=False)
        if not reread:
            self.stats["manifests_accepted"] += 1
        return m

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
        :meth:`verify_bundle`)."""
        if not isinstance(seen, tuple) or committed_at is None:
            return
        holder, held_at = seen
        if holder is None or holder == signer or held_at is None:
            return
        if committed_at < held_at:
            self._authorship_changes.append((holder, signer))
            self._seen_content.add(key, (signer, committed_at), young=None)
        elif committed_at == held_at:
            self._authorship_changes.append((holder, None))
            self._seen_content.add(key, (None, held_at), young=None)
        if len(self._authorship_changes) > 4096:  # nobody took them: keep the newest
            del self._authorship_changes[:-4096]

    def take_authorship_changes(self) -> list[tuple[str, str | None]]:
        """The authorship changes since the last call, oldest first, and forget them: ``(loser, winner)`` peer
        ids, one per tree, where ``loser`` held a tree's content and ``winner`` committed to it earlier (its
        manifest was read first), or ``winner`` is None when both committed at the same time (disputed: no one
        keeps it). The swarm client takes one earned tree from the loser and gives one to the winner."""
        out, self._authorship_changes = self._authorship_changes, []
        return out

    def _verify_bundle(self, data: Any, manifest: wire.Manifest | None, sender: str | None,
                       received_at: float | None = None, prepaid: bool = False,
                       committed_at: float | None = None) -> list[PeerTree]:
        deliverer = sender or UNATTRIBUTED
        publisher_hint = None
        if manifest is not None:
            if not isinstance(manifest, wire.Manifest):
                raise self._reject("internal", f"manifest must be a wire.Manifest, got {type(manifest).__name__}",
                                   deliverer, False, charge=False)
            publisher_hint = peer_id_from_public_key(manifest.publisher_key)
        # ---- step 0: bans and rate limit, before any work on the bytes
        for p in {deliverer, publisher_hint} - {None, UNATTRIBUTED}:
            if self.peers.is_banned(p):
                raise self._reject("banned", "peer is banned", p, False, charge=False)
        gate = publisher_hint or deliverer
        if not (prepaid and publisher_hint is not None) and not self.peers.allow(gate):
            reason = "banned" if self.peers.is_banned(gate) else "rate_limited"
            raise self._reject(reason, "dropped before decoding", gate, False, charge=False)
        # ---- step 1: type and size cap, before decoding
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise self._reject("malformed", f"expected bundle bytes, got {type(data).__name__}", deliverer, False)
        data = bytes(data)
        if len(data) > self.max_bundle_bytes:
            raise self._reject("too_large", f"bundle of {len(data)} bytes exceeds our cap {self.max_bundle_bytes}",
                               deliverer, False)
        digest = hashlib.sha256(data).digest()
        if manifest is not None:
            try:
                wire.check_manifest(manifest, data)
            except wire.WireError as e:
                # the deliverer served exactly the bytes the digest names: any other mismatch (their size) is a
                # lie of the manifest's signer, never of the peer that relayed them
                liar = publisher_hint if digest == bytes(manifest.bundle_digest) else deliverer
                raise self._reject(e.reason, e.detail, liar, True) from None
        if digest in self._seen_bundles:
            raise self._reject("duplicate", f"bundle {digest.hex()[:16]}… was seen before", deliverer, False,
                               charge=manifest is None)
        # ---- steps 2-3: envelope and signature
        try:
            env = wire.open_envelope(data, expected_kind=wire.KIND_BUNDLE, max_bytes=self.max_bundle_bytes)
        except wire.WireError as e:
            raise self._reject(e.reason, e.detail, deliverer, e.reason in _ENVELOPE_HARD)
        signer = env.peer_id
        context_peer = sender or signer

        def final(r: Rejection) -> Rejection:  # a verdict on authenticated bytes: remember the digest
            self._seen_bundles.add(digest, r.reason)
            return r

        if self.peers.is_banned(signer):
            raise self._reject("banned", "signer is banned", signer, False, charge=False)
        if not self._allowed_key(env.public_key):
            raise final(self._reject("not_allowed", f"signer {signer} is not in the allowlist", context_peer, False))
        try:
            b = wire.decode_body(wire.KIND_BUNDLE, env.body, version=env.version, public_key=env.public_key)
        except wire.WireError as e:
            raise final(self._reject(e.reason, e.detail, signer, e.reason not in _BODY_SOFT))
        assert isinstance(b, wire.RolloutBundle)
        if manifest is not None:
            try:
                wire.check_manifest(manifest, data, b)
            except wire.WireError as e:
                if bytes(manifest.publisher_key) != bytes(env.public_key):
                    # genuine bytes of another signer announced by the manifest's publisher: the announcer lied
                    raise self._reject(e.reason, e.detail, publisher_hint, True) from None
                raise final(self._reject(e.reason, e.detail, signer, True))
        # ---- step 4: swarm id (protocol version and allowlist were checked above)
        if b.swarm_id != self.swarm_id:
            raise final(self._reject("wrong_swarm", f"bundle for swarm {b.swarm_id[:64]!r}, we are {self.swarm_id!r}",
                                     context_peer, False))
        # ---- step 5: freshness
        fresh = self._freshness(b.created_at)
        if fresh is not None:
            raise final(self._reject(fresh[0], "bundle " + fresh[1], context_peer, False))
        # ---- step 6: tasks, tokens, prompt, replays, re-scoring
        return self._check_content(b, env, digest, signer, final,
                                   self.clock() if received_at is None else float(received_at), committed_at)

    def _check_content(self, b: wire.RolloutBundle, env: wire.Envelope, digest: bytes, signer: str,
                       final: Callable[[Rejection], Rejection], received_at: float,
                       committed_at: float | None = None) -> list[PeerTree]:
        seeds: dict[tuple[str, str], set[int]] = {}
        for i, wt in enumerate(b.trees):
            ref = wt.task
            if not self.tasks.contains(ref):
                raise final(self._reject("foreign_task", f"trees[{i}].task {ref.key()[:120]} is not in this swarm's "
                                         "training task set", signer, True))
            s = seeds.setdefault((ref.source, ref.config_digest), set())
            s.add(ref.seed)
            if len(s) > self.max_seeds_per_source:
                raise final(self._reject("too_large", f"more than {self.max_seeds_per_source} dataset seeds of "
                                         f"{ref.source} in one bundle", signer, False))
        same_tok = b.tokenizer_id == self.our_tokenizer_id
        if same_tok:
            if b.vocab_size > self.our_vocab_size:
                for i, wt in enumerate(b.trees):
                    top = max(wt.prompt_ids, default=0)
                    for n in wt.nodes:
                        if n.token_ids:
                            top = max(top, max(n.token_ids))
                    if top >= self.our_vocab_size:
                        raise final(self._reject("vocab", f"trees[{i}]: token id {top} is not below our vocab size "
                                                 f"{self.our_vocab_size} (tokenizer {b.tokenizer_id[:64]!r})",
                                                 signer, True))
        elif self.retokenize is None:
            raise final(self._reject("tokenizer_mismatch", f"tokenizer {b.tokenizer_id[:64]!r} is not ours "
                                     f"({self.our_tokenizer_id!r}) and no re-tokenizer is configured", signer,
                                     False, charge=False))
        # live leaves (a leaf marked pruned is never scored nor trained); every live leaf carries a claim
        live: list[list[int]] = []
        for i, wt in enumerate(b.trees):
            lv = [j for j in wt.leaves() if wt.nodes[j].finish_reason != "pruned"]
            for j in lv:
                if wt.nodes[j].claimed_reward is None:
                    raise final(self._reject("missing_reward", f"trees[{i}].nodes[{j}]: a leaf that is not pruned "
                                             "carries no claimed reward", signer, False))
            live.append(lv)
        if not any(live):
            raise final(self._reject("pruned_only", f"all {len(b.trees)} trees hold only pruned leaves", signer,
                                     False))
        # leaf texts: bounded before any concatenation (the text the sender claims; re-tokenizing reads it)
        total_chars = 0
        for i, wt in enumerate(b.trees):
            chars = [0] * len(wt.nodes)
            for j in range(1, len(wt.nodes)):
                chars[j] = chars[wt.nodes[j].parent] + len(wt.nodes[j].text)  # type: ignore[index]
            for j in live[i]:
                if chars[j] > self.max_completion_chars:
                    raise final(self._reject("too_large", f"trees[{i}].nodes[{j}]: completion of {chars[j]} chars "
                                             f"exceeds {self.max_completion_chars}", signer, False))
                total_chars += chars[j]
        if total_chars > self.max_scored_chars:
            raise final(self._reject("too_large", f"{total_chars} completion chars to score exceed "
                                     f"{self.max_scored_chars}", signer, False))
        # the trees in OUR vocabulary (same tokenizer: the sender's ids; else re-tokenized segment by segment)
        rolled = wire.trees_from_bundle(b) if same_tok else [self._retokenized(wt, b, signer, final)
                                                             for wt in b.trees]
        # completion token caps (tokens, not characters), per leaf path, by prefix sums: no concatenation yet
        path_tokens: list[dict[int, int]] = []
        for i, tree in enumerate(rolled):
            ntok = [0] * len(tree.nodes)
            for j in range(1, len(tree.nodes)):
                ntok[j] = ntok[tree.nodes[j].parent] + len(tree.nodes[j].token_ids)  # type: ignore[index]
            pt = {}
            for j in live[i]:
                if ntok[j] > self.max_completion_tokens:
                    raise final(self._reject("too_long", f"trees[{i}].nodes[{j}]: completion of {ntok[j]} tokens "
                                             f"exceeds max_external_completion_length {self.max_completion_tokens}",
                                             signer, False))
                pt[j] = ntok[j]
            path_tokens.append(pt)
        # regenerate the tasks, check prompts, build OUR prompt for each TaskRef
        tasks = []
        prompts: list[tuple[str, list[int]]] = []
        for i, wt in enumerate(b.trees):
            try:
                task = self.tasks.get(wt.task)
            except (KeyError, ValueError) as e:
                raise final(self._reject("foreign_task", f"trees[{i}].task cannot be regenerated: {str(e)[:160]}",
                                         signer, True))
            q = str(task.question)
            # the sender's prompt is only checked, then replaced by ours: bound what checking it may cost
            if len(wt.prompt_ids) > 4 * self.max_prompt_length or len(wt.prompt_text) > 16 * self.max_prompt_length:
                raise final(self._reject("too_long", f"trees[{i}]: a sender prompt of {len(wt.prompt_ids)} tokens / "
                                         f"{len(wt.prompt_text)} characters (cap {4 * self.max_prompt_length} tokens, "
                                         f"{16 * self.max_prompt_length} characters)", signer, False))
            if q not in wt.prompt_text:
                raise final(self._reject("prompt_mismatch", f"trees[{i}]: the prompt text does not contain the "
                                         f"regenerated question of {wt.task.key()[:120]}", signer, False))
            if same_tok and self.detokenize is not None:
                try:
                    ptxt = self.detokenize(list(wt.prompt_ids))
                except Exception as e:  # noqa: BLE001
                    raise final(self._reject("text_mismatch", f"trees[{i}]: prompt ids do not detokenize: "
                                             f"{type(e).__name__}", signer, False))
                if not isinstance(ptxt, str) or q not in ptxt:
                    raise final(self._reject("prompt_mismatch", f"trees[{i}]: the prompt ids do not contain the "
                                             "regenerated question", signer, False))
            tasks.append(task)
            prompts.append(self._our_prompt(task, rolled[i], signer, final))
        # tokens of the bundle expanded into samples (our prompt + completion per live leaf), before expansion
        cost = sum(len(prompts[i][1]) * len(live[i]) + sum(path_tokens[i].values()) for i in range(len(rolled)))
        if cost > self.max_bundle_tokens:
            raise final(self._reject("too_many_tokens", f"the bundle expands into {cost} tokens of samples "
                                     f"(prompt + completion per leaf), over max_bundle_tokens {self.max_bundle_tokens}",
                                     signer, False))
        # the text each leaf's ids decode to: this is what we score (the ids are the truth)
        # A tree with a leaf whose ids hide special tokens is dropped (not trained), the rest of the bundle stands:
        # an honest sampler can emit one now and then (a sampled chat marker), so it must not cost an honest peer
        # its whole bundle. A same-tokenizer tree whose ids are not the canonical encoding of their own text (an
        # honest sampler's "<answer" + ">" where the tokenizer writes "<" + "answer>") is re-encoded: every
        # segment text through our encoder, as a foreign tree, so what trains is our encoding of the scored text.
        texts: dict[tuple[int, int], str] = {}
        bad_trees: dict[int, tuple[str, str]] = {}
        canon: dict[int, str] = {}  # tree -> why its ids are re-encoded (the first non-canonical leaf)
        for i, tree in enumerate(rolled):
            wt = b.trees[i]
            for j in live[i]:
                text, why = self._leaf_text(i, j, tree, wt, same_tok, signer, final)
                if why is not None and why[0] == "not_roundtrip":
                    canon.setdefault(i, why[1])  # every leaf is still decoded and compared with its text
                elif why is not None:
                    bad_trees[i] = why
                    canon.pop(i, None)
                    break
                texts[(i, j)] = text
        if canon:
            self._canonicalize(canon, rolled, b, live, texts, path_tokens, bad_trees, prompts, signer, final)
        if bad_trees and len(bad_trees) == sum(1 for lv in live if lv):
            reason, detail = next(iter(bad_trees.values()))
            raise final(self._reject(reason, detail + f" (every tree of the bundle: {len(bad_trees)})", signer,
                                     False, charge=reason != "not_roundtrip"))
        # replays and copies: normalized content (TaskRef + normalized leaf texts), remembered replay_window_seconds
        # and trees with no new leaf (a copy with leaves duplicated, dropped or regrouped: an outside attack)
        ckeys = [content_key(wt.task, [texts[(i, j)] for j in live[i]]) if live[i] and i not in bad_trees else None
                 for i, wt in enumerate(b.trees)]
        lkeys = {i: leaf_keys(b.trees[i].task, [texts[(i, j)] for j in live[i]]) for i, k in enumerate(ckeys)
                 if k is not None}
        keep: list[int] = []
        own_echo = 0
        copies = 0
        in_bundle: set[bytes] = set()
        for i, k in enumerate(ckeys):
            if k is None:
                continue
            seen = self._seen_content.get(k)
            leaf_seen = [self._seen_content.get(x, "peer" if x in in_bundle else None) for x in lkeys[i]]
            if seen is not None or k in ckeys[:i] or all(v is not None for v in leaf_seen):
                if seen == "own" or (seen is None and all(v == "own" for v in leaf_seen)):
                    own_echo += 1
                else:
                    copies += 1
                    self._claim_authorship(k, seen, signer, committed_at)
                continue
            in_bundle.update(lkeys[i])
            keep.append(i)
        if not keep:
            # a copy of our own rollouts proves the signer copied; between two peers nobody can tell who was first,
            # so a cross-peer copy is dropped without charging anyone (the real author must never pay for it)
            raise final(self._reject("replay", f"all {len(b.trees)} trees were seen before "
                                     f"({own_echo} of them our own)", signer, False, charge=own_echo > 0))
        # re-score every kept live leaf (bounded by the time budget)
        t0 = self.timer()
        scores: dict[tuple[int, int], float] = {}
        fmt_claims: list[tuple[int, int, float, float, float]] = []  # (i, j, claim, exact, partial)
        n_scored = sum(len(live[i]) for i in keep)
        wfmt = float(self.tasks.format_reward or 0.0)
        for i in keep:
            wt = b.trees[i]
            for j in live[i]:
                text = texts[(i, j)]
                d = self.tasks.rescore(tasks[i], text)
                exact, partial, fmt = float(d["correct"]), float(d["partial"]), float(d["format"])
                reward = exact + wfmt * fmt
                if not all(math.isfinite(x) for x in (exact, partial, fmt, reward)):
                    raise final(self._reject("internal", f"our scorer returned a non-finite value {d!r}", signer,
                                             False, charge=False))
                scores[(i, j)] = reward
                claim = float(wt.nodes[j].claimed_reward)  # type: ignore[arg-type]
                if fmt < 0.5:
                    if abs(claim - exact) > REWARD_TOL and abs(claim - partial) > REWARD_TOL:
                        raise final(self._reject("reward_mismatch", f"trees[{i}].nodes[{j}] ({wt.task.key()[:100]}): "
                                                 f"claimed {claim!r}, our re-score {exact!r}", signer, True))
                else:
                    if not any(-REWARD_TOL <= claim - c <= 1.0 + REWARD_TOL for c in (exact, partial)):
                        raise final(self._reject("reward_mismatch", f"trees[{i}].nodes[{j}] ({wt.task.key()[:100]}): "
                                                 f"claimed {claim!r}, our re-score {exact!r} + a format bonus in "
                                                 "[0, 1]", signer, True))
                    fmt_claims.append((i, j, claim, exact, partial))
                if self.timer() - t0 > self.verify_budget_s:
                    raise final(self._reject("verify_timeout", f"re-scoring took more than {self.verify_budget_s:g} "
                                             f"s ({len(scores)} of {n_scored} leaves)", signer, False))
        if fmt_claims and not _one_format_weight(fmt_claims):
            raise final(self._reject("reward_mismatch", "format bonus claimed inconsistently: no single weight in "
                                     f"[0, 1] explains the claims of the {len(fmt_claims)} well-formatted leaves",
                                     signer, True))
        # build the accepted trees: our ids, our prompt, our rewards, no pruned leaves
        out: list[PeerTree] = []
        for i in keep:
            tree = rolled[i]
            tree.task_name = tasks[i].name or ""
            tree.prompt_text, tree.prompt_ids = prompts[i]
            for j in live[i]:
                tree.nodes[j].reward = scores[(i, j)]
            if len(live[i]) != len(tree.leaves()):
                tree = tree.subtree(live[i])
            tree.update_stats()
            out.append(PeerTree(tree=tree, peer_id=signer, publisher_key=bytes(env.public_key),
                                model_id=b.model_id, tokenizer_id=b.tokenizer_id, policy_version=b.policy_version,
                                same_tokenizer=same_tok and i not in canon, digest=digest.hex(),
                                received_at=float(received_at),
                                verified=True))
        # verdict: accepted (minus replays)
        self._seen_bundles.add(digest, "accepted")
        young_signer = self.peers.is_young(signer, self._young_after)
        for i in keep:
            self._seen_content.add(ckeys[i], (signer, committed_at), young=young_signer)
            for k in lkeys[i]:
                self._seen_content.add(k, "peer", young=young_signer)
        n_pruned = sum(len(b.trees[i].leaves()) - len(live[i]) for i in range(len(b.trees)))
        if n_pruned:
            self.stats["leaves_pruned_dropped"] += n_pruned
        for _ in range(own_echo):
            self.peers.record_reject(signer, "replay", False, "a copy of our own rollouts")
        for reason, detail in bad_trees.values():
            self.stats["rejected"][reason] = self.stats["rejected"].get(reason, 0) + 1
            if reason not in UNCHARGED_REASONS:
                self.peers.record_reject(signer, reason, False, detail)
        dropped = own_echo + copies
        if dropped:
            self.stats["trees_replayed"] += dropped
            self.stats["rejected"]["replay"] = self.stats["rejected"].get("replay", 0) + dropped
        self.peers.record_accept(signer, len(out))
        self.stats["bundles_accepted"] += 1
        self.stats["trees_accepted"] += len(out)
        self.stats["leaves_accepted"] += n_scored
        if not same_tok:
            self.stats["retokenized_trees"] += len(out)
        else:
            self.stats["canonicalized_trees"] += sum(1 for i in keep if i in canon)
        return out

    def _our_prompt(self, task: Task, tree: RolloutTree, signer: str,
                    final: Callable[[Rejection], Rejection]) -> tuple[str, list[int]]:
        """``(text, ids)`` of OUR prompt for ``task`` (``prompt_for`` + ``encode``, left-truncated to
        ``max_prompt_length``); without ``prompt_for``, the question alone in our tokenization. The sender's
        prompt text and ids never reach a Sample."""
        try:
            text = self.prompt_for(task) if self.prompt_for is not None else str(task.question)
            ids = list(self.encode(text)) if self.encode is not None else None
        except Exception as e:  # noqa: BLE001 - our own prompt builder failed: our bug, not the peer's
            raise final(self._reject("internal", f"building our prompt failed: {type(e).__name__}: {str(e)[:120]}",
                                     signer, False, charge=False))
        if ids is None:  # no encoder (tests with a bare verifier): keep the ids of the tree we trust
            if self.prompt_for is None:
                return tree.prompt_text, list(tree.prompt_ids)
            raise final(self._reject("internal", "prompt_for is set but no encoder is configured", signer, False,
                                     charge=False))
        if not _ids_ok(ids, self.our_vocab_size):
            raise final(self._reject("internal", "our prompt encodes to ids outside our vocabulary", signer, False,
                                     charge=False))
        return text, ids[-self.max_prompt_length:]

    def _leaf_text(self, i: int, j: int, tree: RolloutTree, wt: wire.WireTree, same_tok: bool, signer: str,
                   final: Callable[[Rejection], Rejection]) -> tuple[str, tuple[str, str] | None]:
        """``(text, None)``: the completion text of leaf ``j`` of tree ``i`` as its ids (in our vocabulary)
        decode, special tokens included, without one final EOS; ``("", ("special_token", detail))`` when the ids
        hold another special token (the caller drops the tree); ``(text, ("not_roundtrip", detail))`` when the text
        matches but the ids are not what ``encode`` makes of it (the caller re-encodes the tree). Other failures
        (``text_mismatch`` first of all) raise the bundle's rejection."""
        ids = tree.completion_ids(j)
        if ids and ids[-1] in self.eos_ids:
            ids = ids[:-1]
        bad = next((t for t in ids if t in self.special_ids or t in self.eos_ids), None)
        if bad is not None:
            return "", ("special_token", f"trees[{i}].nodes[{j}]: the completion holds special token {bad} (only one "
                                         "final EOS is allowed)")
        if self.detokenize is None:
            return tree.completion_text(j), None  # no decoder configured: the ids are trusted to match the text
        try:
            dtext = self.detokenize(ids)
        except Exception as e:  # noqa: BLE001
            raise final(self._reject("text_mismatch", f"trees[{i}].nodes[{j}]: ids do not detokenize: "
                                     f"{type(e).__name__}", signer, False))
        if not isinstance(dtext, str):
            raise final(self._reject("internal", "detokenize returned a non-string", signer, False, charge=False))
        if same_tok:
            if dtext != "".join(wt.nodes[k].text for k in _path(wt, j)):
                raise final(self._reject("text_mismatch", f"trees[{i}].nodes[{j}]: the completion text is not the "
                                         "detokenized token ids", signer, False))
            if self.encode is not None:
                try:
                    back = list(self.encode(dtext))
                except Exception as e:  # noqa: BLE001
                    raise final(self._reject("internal", f"our encoder failed: {type(e).__name__}", signer, False,
                                             charge=False))
                if back != ids:
                    k = next((n for n, (x, y) in enumerate(zip(ids, back)) if x != y), min(len(ids), len(back)))
                    return dtext, ("not_roundtrip", f"trees[{i}].nodes[{j}]: the ids are not what our tokenizer makes of "
                                                 f"their own text (encode(decode(ids)) != ids; first difference at "
                                                 f"token {k}: {ids[k:k + 4]} vs {back[k:k + 4]})")
        return dtext, None

    def _retokenized(self, wt: wire.WireTree, b: wire.RolloutBundle, signer: str,
                     final: Callable[[Rejection], Rejection], encoder: Callable[[str], list[int]] | None = None,
                     keep_eos: bool = False) -> RolloutTree:
        """The tree in our vocabulary: every segment text re-tokenized (structure kept), log-probs dropped.

        Args:
            encoder: ``text -> ids`` (default ``retokenize``; a same-tokenizer tree is re-encoded with ``encode``).
            keep_eos: the sender's ids are in our vocabulary (same tokenizer): a segment whose ids end with one of
                ``eos_ids`` keeps that id after its re-encoded text (segment texts never hold the EOS).

        The prompt is not re-tokenized: the tree gets our own prompt for its TaskRef later."""
        encoder = encoder if encoder is not None else self.retokenize
        assert encoder is not None

        def tok(text: str, what: str) -> list[int]:
            try:
                ids = encoder(text)
            except Exception as e:  # noqa: BLE001
                raise final(self._reject("retokenize_failed", f"{what}: {type(e).__name__}: {str(e)[:120]}", signer,
                                         False, charge=False))
            ids = list(ids) if not isinstance(ids, list) else ids
            if not _ids_ok(ids, self.our_vocab_size):
                raise final(self._reject("retokenize_failed", f"{what}: re-tokenizer returned ids outside "
                                         f"[0, {self.our_vocab_size})", signer, False, charge=False))
            return ids

        tree = RolloutTree(task=wt.task, prompt_ids=[], prompt_text="", model_id=b.model_id,
                           tokenizer_id=b.tokenizer_id)
        tree.nodes[0].policy_version = wt.nodes[0].policy_version
        for k, n in enumerate(wt.nodes[1:], start=1):
            assert n.parent is not None
            ids = tok(n.text, f"nodes[{k}].text") if n.text else []
            if keep_eos and n.token_ids and n.token_ids[-1] in self.eos_ids:
                ids.append(int(n.token_ids[-1]))
            tree.add_child(n.parent, ids, text=n.text, logprobs=None, policy_version=n.policy_version,
                           finish_reason=n.finish_reason)
        return tree

    def _canonicalize(self, canon: dict[int, str], rolled: list[RolloutTree], b: wire.RolloutBundle,
                      live: list[list[int]], texts: dict[tuple[int, int], str], path_tokens: list[dict[int, int]],
                      bad_trees: dict[int, tuple[str, str]], prompts: list[tuple[str, list[int]]], signer: str,
                      final: Callable[[Rejection], Rejection]) -> None:
        """Re-encode the same-tokenizer trees ``canon`` (tree index -> detail) whose ids are not the canonical
        encoding of their text, in place: ``rolled[i]`` becomes the tree of :meth:`_retokenized` with ``encode``
        (structure kept, log-probs dropped, a final EOS kept), whose ids are then checked as any ids are.

        A re-encoded tree is dropped into ``bad_trees`` (uncharged, the rest of the bundle stands) when a leaf's
        new ids hold a special token (``special_token``: a text that spells a special token's string), do not
        decode to exactly the text already decoded from the sender's ids and compared with its text fields
        (``not_roundtrip``: e.g. a text the normalizer changes), or exceed ``max_completion_tokens``
        (``not_roundtrip``); and, largest growth first, while re-encoding pushes the bundle's sample tokens over
        ``max_bundle_tokens`` (``not_roundtrip``). ``path_tokens`` is recounted for every kept tree, so the caps
        hold for the ids that train."""
        grew: dict[int, int] = {}
        for i, detail in canon.items():
            wt = b.trees[i]
            tree = self._retokenized(wt, b, signer, final, encoder=self.encode, keep_eos=True)
            ntok = [0] * len(tree.nodes)
            for k in range(1, len(tree.nodes)):
                ntok[k] = ntok[tree.nodes[k].parent] + len(tree.nodes[k].token_ids)  # type: ignore[index]
            why: tuple[str, str] | None = None
            for j in live[i]:
                if ntok[j] > self.max_completion_tokens:
                    why = ("not_roundtrip", f"{detail}; re-encoded, trees[{i}].nodes[{j}] is {ntok[j]} tokens, over "
                                            f"max_external_completion_length {self.max_completion_tokens}")
                    break
                text, bad = self._leaf_text(i, j, tree, wt, False, signer, final)
                if bad is not None:
                    why = bad
                    break
                if text != texts[(i, j)]:
                    why = ("not_roundtrip", f"{detail}; re-encoded, trees[{i}].nodes[{j}] decodes to another text")
                    break
            if why is not None:
                bad_trees[i] = why
                continue
            rolled[i] = tree
            old = sum(path_tokens[i].values())
            path_tokens[i] = {j: ntok[j] for j in live[i]}
            grew[i] = sum(path_tokens[i].values()) - old
        cost = sum(len(prompts[i][1]) * len(live[i]) + sum(path_tokens[i].values())
                   for i in range(len(rolled)) if i not in bad_trees)
        for i in sorted(grew, key=lambda x: -grew[x]):
            if cost <= self.max_bundle_tokens:
                break
            cost -= len(prompts[i][1]) * len(live[i]) + sum(path_tokens[i].values())
            bad_trees[i] = ("not_roundtrip", f"{canon[i]}; re-encoded, the bundle's samples would exceed "
                                             f"max_bundle_tokens {self.max_bundle_tokens}")


def _one_format_weight(claims: list[tuple[int, int, float, float, float]]) -> bool:
    """True when one format weight ``w`` in [0, 1] explains every well-formatted leaf's claim as
    ``exact + w`` or ``partial + w`` (within ``2·REWARD_TOL``)."""
    _, _, c0, e0, p0 = claims[0]
    for w in {c0 - e0, c0 - p0}:
        if not (-REWARD_TOL <= w <= 1.0 + REWARD_TOL):
            continue
        if all(abs(c - e - w) <= 2 * REWARD_TOL or abs(c - p - w) <= 2 * REWARD_TOL for _, _, c, e, p in claims):
            return True
    return False


def content_key(ref: TaskRef, leaf_texts: Sequence[str]) -> bytes:
    """SHA-256 naming a tree's normalized content: its TaskRef and the sorted set of normalized completion texts.

    Normalization is :func:`~swarmnode.tasks.partition.normalize_question` (NFKC, lower case, whitespace runs
    collapsed, ends stripped), and equal texts count once, so a copy with a trailing space, other line breaks,
    reordered or duplicated leaves, another key, another signature time or other metadata has the same key.
    ``content_key(ref, [text])`` names one leaf (:func:`leaf_keys`). Local use only (not part of the protocol).
    """
    h = hashlib.sha256()
    h.update(repr(ref.to_list()).encode("utf-8", "surrogatepass"))
    for t in sorted({normalize_question(x) for x in leaf_texts}):
        h.update(b"\x00L")
        h.update(len(t).to_bytes(4, "little"))
        h.update(t.encode("utf-8", "surrogatepass"))
    return h.digest()


def leaf_keys(ref: TaskRef, leaf_texts: Sequence[str]) -> list[bytes]:
    """One :func:`content_key` per distinct normalized leaf text of a tree (``content_key(ref, [text])``): a tree
    none of whose leaves is new (every key seen before) is a copy, however its leaves were regrouped."""
    return [content_key(ref, [t]) for t in sorted({normalize_question(x) for x in leaf_texts})]


def special_token_ids(tokenizer: Any) -> set[int]:
    """Every special token id of a Hugging Face tokenizer: ``all_special_ids`` plus each added token marked
    ``special`` (``added_tokens_decoder``; chat-role tokens such as ``<|user|>`` are often only there).

    Args:
        tokenizer: a ``transformers`` tokenizer (duck-typed; missing attributes count as none).

    Returns:
        The set of ids (ints). Never raises.
    """
    out: set[int] = set()
    try:
        out.update(int(t) for t in (getattr(tokenizer, "all_special_ids", None) or []))
    except Exception:  # noqa: BLE001
        pass
    try:
        for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            if getattr(tok, "special", False):
                out.add(int(i))
    except Exception:  # noqa: BLE001
        pass
    return out


def _path(wt: wire.WireTree, leaf: int) -> list[int]:
    """Node indices root-excluded down to ``leaf`` (parents are earlier: the walk ends in <= depth steps)."""
    out = []
    cur: int | None = leaf
    while cur is not None and cur != 0:
        out.append(cur)
        cur = wt.nodes[cur].parent
    return out[::-1]


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
