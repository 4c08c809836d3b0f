"""The classes a hostile peer delivers over a real swarm, and how the manifest and bytes of each are built.

:data:`NETWORK_CASES` lists every class :class:`~swarmnode.testing.adversary.peer.HostilePeer` publishes, with the
stage where an honest node stops it and the reason it is counted under; :data:`TRANSPORT_CASES` names the two that
the transport tests own. :class:`CaseBuilder` turns a class name into what the peer announces and serves: a
*truthful* manifest for bytes that decode (the receiver then rejects them for the same reason before fetching,
whenever the flaw shows in the manifest: swarm id, time, tasks, size), a *cover* manifest (a fresh, in-swarm
manifest naming the bytes' digest and size) for bytes that do not, and a manifest of ours for another publisher's
genuine bytes (docs/reference/design.md §6-§7).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from swarmnode.swarm import wire
from swarmnode.swarm.identity import Identity
from swarmnode.tasks.mix import TaskMix
from swarmnode.testing.adversary.factory import HostileFactory
from swarmnode.testing.adversary.raw import unpack as _unpack

__all__ = ["CaseBuilder", "NETWORK_CASES", "NetworkCase", "TRANSPORT_CASES"]

TRANSPORT_CASES: dict[str, str] = {
    "silent_stream": "a peer that accepts a bundle stream and never answers: the fetch must time out "
                     "(swarm.net.fetch_timeout) and the next source be tried (tests/integration/test_transport.py)",
    "foreign_subkey": "a DHT record written under another publisher's owner-marked subkey: the record "
                      "validator refuses it (tests/integration/test_dht.py); the verifier-level counterpart is the "
                      "owner_mismatch case here",
}
"""Hostile classes handled below the verifier, by name; the transport tests own them."""



@dataclass(frozen=True)
class NetworkCase:
    """One hostile class as :class:`~swarmnode.testing.adversary.peer.HostilePeer` delivers it over a real swarm,
    and what an honest node must do.

    Attributes:
        name: the class (a key of :data:`NETWORK_CASES`).
        stage: where an honest :class:`~swarmnode.swarm.gossip.SwarmClient` stops it -- ``"record"`` (decoding
            the DHT record), ``"manifest"`` (``Verifier.verify_manifest``: the bundle bytes are never fetched),
            ``"bundle"`` (fetched over the p2p stream, ``Verifier.verify_bundle`` in ``gather``), ``"transport"``
            (the fetch itself fails: counted as ``fetch/<reason>`` in ``SwarmClient.snapshot()["counts"]``, charged
            to no one) or ``"dht"`` (every honest DHT peer's record validator refuses it; nothing reaches gossip).
        reason: the ``Rejection.reason`` (the fetch reason for the transport stage; ``None`` for the dht stage).
        charged: the id of the hostile peer an honest PeerBook charges: ``"signer"`` (its ``sn1…`` peer id),
            ``"sender"`` (its transport id ``p2p:<libp2p PeerID>``) or ``None`` (not charged).
        hard: whether the rejection is a strike towards a ban.
        description: what the peer sends.
    """

    name: str
    stage: str
    reason: str | None
    charged: str | None
    hard: bool
    description: str


NETWORK_CASES: dict[str, NetworkCase] = {c.name: c for c in (
    # the DHT record itself
    NetworkCase("record_garbage", "record", "malformed", "signer", True,
                "a DHT record under its own subkey that is not msgpack"),
    NetworkCase("foreign_subkey", "dht", None, None, False,
                "a manifest record stored under a victim's owner-marked subkey, signed with its own key"),
    # manifests in its own record: rejected before any byte of the bundle is fetched
    NetworkCase("owner_mismatch", "manifest", "owner_mismatch", "signer", True,
                "a manifest signed by another key (the factory's victim) inside its own record"),
    NetworkCase("manifest_forged_signature", "manifest", "bad_signature", "signer", True,
                "a manifest with a zero signature"),
    NetworkCase("manifest_truncated", "manifest", "malformed", "signer", True, "the first half of a manifest"),
    NetworkCase("foreign_task", "manifest", "foreign_task", "signer", True, "a bundle of a task outside the mix"),
    NetworkCase("heldout_task", "manifest", "foreign_task", "signer", True, "a bundle of a held-out task"),
    NetworkCase("wrong_swarm", "manifest", "wrong_swarm", "signer", False, "a bundle for another swarm id"),
    NetworkCase("stale", "manifest", "stale", None, False, "a bundle created an hour before the freshness window"),
    NetworkCase("future", "manifest", "future", "signer", False, "a bundle created an hour in the future"),
    NetworkCase("oversized", "manifest", "too_large", "signer", False,
                "a signed bundle over the receivers' swarm.trust.max_bundle_bytes (only when that cap is below the "
                "protocol's 4 MiB; otherwise see overclaim)"),
    NetworkCase("flood", "manifest", "duplicate", None, False,
                "many manifests announcing the exact bytes of a bundle that a victim already accepted"),
    # bundles served over the p2p stream (the manifest tells the truth, or covers bytes that do not decode)
    NetworkCase("forged_signature", "bundle", "bad_signature", "sender", True, "one bit of the signature flipped"),
    NetworkCase("impersonation", "bundle", "bad_signature", "sender", True, "a victim's key, its own signature"),
    NetworkCase("key_mismatch", "bundle", "key_mismatch", "signer", True, "body publisher = victim, signed by itself"),
    NetworkCase("reward_mismatch", "bundle", "reward_mismatch", "signer", True, "a wrong answer claimed as reward 1"),
    NetworkCase("format_bonus_split", "bundle", "reward_mismatch", "signer", True, "inconsistent format bonuses"),
    NetworkCase("prompt_mismatch", "bundle", "prompt_mismatch", "signer", False, "a prompt without the question"),
    NetworkCase("text_mismatch", "bundle", "text_mismatch", "signer", False,
                "correct-answer text over the token ids of a wrong answer (receivers that detokenize)"),
    NetworkCase("token_out_of_vocab", "bundle", "vocab", "signer", True, "token ids beyond the receivers' vocabulary"),
    NetworkCase("wire_vocab", "bundle", "vocab", "signer", True, "a token id beyond its own declared vocabulary"),
    NetworkCase("truncated", "bundle", "malformed", "sender", False, "the first half of a bundle envelope"),
    NetworkCase("garbage_c1", "bundle", "malformed", "sender", False, "the reserved msgpack byte 0xc1 and noise"),
    NetworkCase("garbage_ext", "bundle", "malformed", "sender", False, "a msgpack ext value"),
    NetworkCase("deep_nesting", "bundle", "too_large", "sender", False, "50 000 nested one-element arrays"),
    NetworkCase("huge_count", "bundle", "too_large", "sender", False, "an array header announcing 2^32 - 1 items"),
    NetworkCase("signed_deep_nesting", "bundle", "too_large", "signer", True, "a signed body of nested arrays"),
    NetworkCase("signed_huge_count", "bundle", "too_large", "signer", True,
                "a signed body announcing 2^32 - 1 entries"),
    NetworkCase("tree_shape", "bundle", "tree_shape", "signer", True, "an inner node with a finish reason"),
    NetworkCase("non_canonical_body", "bundle", "non_canonical", "signer", True, "a signed body, keys out of order"),
    NetworkCase("manifest_mismatch", "bundle", "manifest_mismatch", "signer", True,
                "a bundle whose own manifest lies about it (policy version)"),
    NetworkCase("wrap", "bundle", "manifest_mismatch", "signer", True,
                "another key's genuine signed bundle announced in its own manifest (charged to the announcer, "
                "never to the bundle's signer)"),
    NetworkCase("replay", "bundle", "replay", None, False,
                "the trees of a bundle that a victim already accepted (or published), re-signed under its own key "
                "(dropped; charged, soft, only when they are the victim's own rollouts: between two peers nobody can "
                "tell who was first)"),
    # the stream itself
    NetworkCase("silent", "transport", "timeout", None, False, "accepts the bundle stream and never answers"),
    NetworkCase("overclaim", "transport", "too_large", None, False, "declares a 1 GiB body on the stream"),
    NetworkCase("short_stream", "transport", "truncated", None, False,
                "declares the body's size, sends 10 bytes, closes"),
    NetworkCase("lie", "transport", "digest_mismatch", None, False, "serves other bytes than the announced digest"),
)}
"""Every class :class:`~swarmnode.testing.adversary.peer.HostilePeer` delivers over a real swarm, with its stage and
expected reason (in the order the peer publishes them)."""

#: classes whose bytes decode: announced in a truthful manifest of ours
TRUTHFUL_CASES = frozenset({"forged_signature", "reward_mismatch", "format_bonus_split", "prompt_mismatch",
                            "text_mismatch", "token_out_of_vocab", "foreign_task", "heldout_task", "wrong_swarm",
                            "stale", "future", "oversized"})
#: classes whose bytes do not decode, or are not ours to announce: announced in a cover manifest
COVERED_CASES = frozenset({"impersonation", "key_mismatch", "truncated", "garbage_c1", "garbage_ext", "deep_nesting",
                           "huge_count", "signed_deep_nesting", "signed_huge_count", "tree_shape",
                           "non_canonical_body", "wire_vocab"})
#: classes that misbehave on the bundle stream, and the stream handler's mode for each
STREAM_MODES = {"silent": "hang", "overclaim": "overclaim", "short_stream": "short", "lie": "lie"}
#: classes that are whole DHT records, not manifests in a wave
RECORD_CASES = ("record_garbage", "foreign_subkey")
#: classes that need a bundle a victim already accepted: published last
HARVESTED_CASES = ("replay", "flood")


class CaseBuilder:
    """The manifest envelopes and bytes of one :data:`NETWORK_CASES` class, as one publisher announces them.

    Args:
        identity: the publisher's signing key (it signs every manifest).
        swarm_id: the swarm id its manifests carry.
        tasks: the swarm's task mix (a cover manifest names one of its training tasks).
        factory: the :class:`~swarmnode.testing.adversary.factory.HostileFactory` that builds the bytes.
        vocab_size: the honest nodes' vocabulary size (for ``token_out_of_vocab``).
        flood_copies: manifests per ``flood``.
        proven: returns the victim-accepted bundles found so far, oldest first (the material of ``replay`` and
            ``flood``; an empty list while there is none).
    """

    def __init__(self, identity: Identity, swarm_id: str, tasks: TaskMix, factory: HostileFactory, *,
                 vocab_size: int, flood_copies: int, proven: Callable[[], list[bytes]]) -> None:
        self.identity = identity
        self.public_key = identity.public_key_bytes
        self.swarm_id = swarm_id
        self.tasks = tasks
        self.factory = factory
        self.vocab_size = int(vocab_size)
        self.flood_copies = int(flood_copies)
        self.proven = proven

    def sign_manifest(self, m: wire.Manifest) -> bytes:
        """The manifest envelope of ``m``, signed with our key."""
        return wire.encode_manifest(m, self.identity)

    def truthful(self, data: bytes) -> bytes | None:
        """Our manifest of a hostile bundle whose body decodes (None when it does not, or is not ours)."""
        if len(data) > wire.MAX_ENVELOPE_BYTES:
            return None
        try:
            b = wire.decode_body(wire.KIND_BUNDLE, _unpack(data)["body"])
            return self.sign_manifest(wire.manifest_for_bundle(data, b))  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - not decodable, or not ours to announce
            return None

    def cover(self, data: bytes) -> bytes:
        """A fresh, in-swarm manifest of ours announcing ``data``'s digest and size (for bytes that do not decode)."""
        ref = self.tasks.refs_for_step(0, 1)[0]
        m = wire.Manifest(swarm_id=self.swarm_id, publisher_key=self.public_key,
                          bundle_digest=wire.envelope_digest(data), bundle_size=len(data), tasks=[ref],
                          created_at=time.time(), policy_version=0, num_trees=1, num_leaves=2)
        return self.sign_manifest(m)

    def announce_other(self, data: bytes, **changes: Any) -> bytes:
        """Our manifest for genuine signed bytes of another publisher (optionally with fields changed)."""
        b = wire.decode_bundle(data)
        m = replace(wire.manifest_for_bundle(data, b), publisher_key=self.public_key, **changes)
        return self.sign_manifest(m)

    def _hostile_bytes(self, name: str) -> bytes:
        """The factory's bytes of class ``name``."""
        f = self.factory
        if name.startswith("garbage_"):
            return next(hi.data for hi in f.garbage() if hi.name == name)
        if name == "token_out_of_vocab":
            return f.token_out_of_vocab(self.vocab_size).data
        return getattr(f, name)().data

    def build(self, name: str) -> list[tuple[bytes, bytes | None, str | None]]:
        """``[(manifest envelope, bytes to serve or None, stream mode or None)]`` for one class (empty: cannot now)."""
        f = self.factory
        if name in TRUTHFUL_CASES:
            data = self._hostile_bytes(name)
            menv = self.truthful(data)
            return [] if menv is None else [(menv, data, None)]
        if name in COVERED_CASES:
            data = self._hostile_bytes(name)
            return [(self.cover(data), data, None)]
        if name in STREAM_MODES:
            data = f.reward_mismatch().data
            menv = self.truthful(data)
            return [] if menv is None else [(menv, data, STREAM_MODES[name])]
        if name == "owner_mismatch":
            b, env = f.bundle(f.honest_trees(1), identity=f.victim)
            return [(f.manifest(env, b, identity=f.victim)[1], None, None)]
        if name in ("manifest_forged_signature", "manifest_truncated"):
            return [(next(hi.data for hi in f.manifest_cases() if hi.name == name), None, None)]
        if name == "manifest_mismatch":
            data = f.reward_mismatch().data
            b = wire.decode_bundle(data)
            m = replace(wire.manifest_for_bundle(data, b), policy_version=b.policy_version + 1)
            return [(self.sign_manifest(m), data, None)]
        if name == "wrap":
            _, data = f.bundle(f.honest_trees(1), identity=f.victim)
            return [(self.announce_other(data), data, None)]
        proven = self.proven()
        if not proven:
            return []
        src = proven[-1]
        if name == "flood":
            now = time.time()
            return [(self.announce_other(src, created_at=now - 0.001 * k), src, None)
                    for k in range(self.flood_copies)]
        if name == "replay":
            b = wire.decode_bundle(src)
            trees = wire.trees_from_bundle(b)
            for t, wt in zip(trees, b.trees):
                for j in t.leaves():
                    t.nodes[j].reward = wt.nodes[j].claimed_reward
            _, data = f.bundle(trees, tokenizer_id=b.tokenizer_id, vocab_size=b.vocab_size)
            menv = self.truthful(data)
            return [] if menv is None else [(menv, data, None)]
        raise ValueError(f"{name!r} is not published in waves")
