"""The verifier's verdicts: every reason code, which reasons are hard, soft or never charged, and :class:`Rejection`.

The trust table in :mod:`swarmnode.swarm.verify` says which check gives which reason; protocol/SPEC.md §6 lists the
wire reasons. Hard reasons are strikes towards a ban (``swarm.trust.ban_after``), soft ones lower the reputation only.
"""

from __future__ import annotations

__all__ = ["REASONS", "HARD_REASONS", "SOFT_REASONS", "UNCHARGED_REASONS", "ENVELOPE_HARD", "RECORD_HARD", "BODY_SOFT",
           "Rejection"]

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

#: wire reasons that are hard in an unsigned envelope (``ENVELOPE_HARD``), in a manifest inside its owner's signed
#: DHT record (``RECORD_HARD``), and soft even inside a signed body (``BODY_SOFT``): the trust table's attribution
ENVELOPE_HARD = frozenset({"bad_signature"})
RECORD_HARD = frozenset({"bad_signature", "malformed", "schema", "non_canonical", "key_mismatch"})
BODY_SOFT = frozenset({"bad_kind"})


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
