"""A hostile-peer harness: every class of bad input a node must survive, as real signed (or forged) bytes.

:class:`HostileFactory` plays a peer with its own Ed25519 identity and the swarm's real task mix. It builds
honest bundles (real regenerated tasks, completions scored by the real verifier, so their claimed rewards
are right) and, from them, one :class:`HostileInput` per attack class, each with the reason an honest
:class:`~swarmnode.swarm.verify.Verifier` must reject it with (docs/reference/design.md §6; docs/reference/references.md §6.1/§6.2:
RL Swarm trusted sender-chosen answers and rewards, had no size caps before decoding, no per-peer quotas):

====================  ==============================================================  =====================
case                  what the peer sends                                             expected reason
====================  ==============================================================  =====================
forged_signature      an honest bundle whose signature has one bit flipped            bad_signature
impersonation         a body claiming a victim's key, signed with the attacker's key  bad_signature
key_mismatch          body ``pub`` = victim's key, envelope ``pk`` + signature ours    key_mismatch
reward_mismatch       a wrong answer claimed as reward 1.0                            reward_mismatch
format_bonus_split    two correct leaves claiming different format bonuses            reward_mismatch
foreign_task          a TaskRef of a source outside the swarm's mix                   foreign_task
heldout_task          a TaskRef from the receiver's held-out set                      foreign_task
prompt_mismatch       a prompt that does not contain the task's question              prompt_mismatch
text_mismatch         correct-answer text over the token ids of a wrong answer        text_mismatch (needs
                                                                                      ``detokenize``)
oversized             more bytes than the receiver's cap                              too_large
truncated             half of an honest envelope                                      malformed
garbage               the reserved msgpack byte 0xc1 and random bytes                 malformed
deep_nesting          50 000 nested one-element arrays                                too_large
huge_count            an array32 header announcing 2^32 - 1 items                     too_large
signed_deep_nesting   a signed body of nested arrays                                  too_large (hard)
signed_huge_count     a signed body whose map announces 2^32 - 1 entries              too_large (hard)
tree_shape            a signed body whose inner node carries a finish reason          tree_shape
non_canonical_body    a signed body with keys out of order                            non_canonical
token_out_of_vocab    same tokenizer id as the receiver, ids >= its vocab size        vocab
wire_vocab            a signed body with an id >= its own declared vocab size         vocab
wrong_swarm           a bundle for another swarm id                                   wrong_swarm
stale / future        ``t`` far in the past / future                                  stale / future
duplicate             the exact bytes of an accepted bundle again                     duplicate
replay                an accepted bundle's trees re-signed with a new timestamp       replay
manifest_mismatch     bytes that are not the ones its manifest announced              manifest_mismatch
owner_mismatch        a manifest signed by the attacker in a victim's DHT record      owner_mismatch
manifest_*            forged, stale, foreign-task, wrong-swarm, malformed manifests   see the case
flood                 N copies of one valid bundle                                    duplicate, then
                                                                                      rate_limited
====================  ==============================================================  =====================

Two classes live in the transport and are tested there (:data:`TRANSPORT_CASES`): a peer that accepts a
stream and never answers, and a DHT record written under another publisher's subkey.

:class:`HostilePeer` delivers all of it over a real swarm: a peer with its own identity and ``p2pd`` in the
swarm's hivemind DHT that announces the factory's bytes in signed manifests inside its own DHT record, serves
them over the real bundle stream, misbehaves on the stream itself (silent, over-claiming, short, lying), writes
garbage records and records under other publishers' subkeys, and replays / floods bundles that its victims
already accepted. :data:`NETWORK_CASES` lists every class with the stage where an honest node stops it and the
reason it is counted under (``tests/test_hostile_swarm.py``; ``swarmnode bench swarm --hostile``).

Two of the trust attacks are network-level and not bad bytes at all, so they are not :data:`NETWORK_CASES`
(an honest node *should* accept the bytes; what it must not do is starve its honest peers):
:meth:`HostilePeer.publish_hanging` (finding 5: honest-looking bundles dated just inside the receivers' clock
skew, whose bodies hang on the stream) and :meth:`HostilePeer.publish_bundles` with
:meth:`HostileFactory.contrast_trees` from several fresh keys (finding 7: Sybil keys publishing 2-leaf
[1, 0] trees, which a ``contrast`` ranking always puts first).

Token ids use a byte-level tokenizer by default (:func:`byte_tokenize`: UTF-8 bytes, vocabulary 256), a
real, reversible tokenizer whose ids are easy to check by hand; pass your own ``tokenize`` to use a model's.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import msgpack

from swarmnode.rollout.tree import RolloutTree
from swarmnode.swarm import wire
from swarmnode.swarm.identity import Identity
from swarmnode.config import SwarmConfig
from swarmnode.tasks.base import TaskRef
from swarmnode.tasks.mix import TaskMix

__all__ = [
    "BYTE_TOKENIZER_ID",
    "BYTE_VOCAB_SIZE",
    "TRANSPORT_CASES",
    "HostileInput",
    "HostileFactory",
    "byte_tokenize",
    "byte_detokenize",
    "Mutator",
    "NETWORK_CASES",
    "NetworkCase",
    "HostilePeer",
]

log = logging.getLogger(__name__)

BYTE_TOKENIZER_ID = "bytes-utf8"
"""Tokenizer id of :func:`byte_tokenize`."""
BYTE_VOCAB_SIZE = 256
"""Vocabulary size of :func:`byte_tokenize`."""

TRANSPORT_CASES: dict[str, str] = {
    "silent_stream": "a peer that accepts a bundle stream and never answers: the fetch must time out "
                     "(swarm.fetch_timeout) and the next source be tried (tests/test_transport.py)",
    "foreign_subkey": "a DHT record written under another publisher's owner-marked subkey: the record "
                      "validator refuses it (tests/test_dht.py); the verifier-level counterpart is the "
                      "owner_mismatch case here",
}
"""Hostile classes handled below the verifier, by name; the transport tests own them."""


def byte_tokenize(text: str) -> list[int]:
    """UTF-8 bytes of ``text`` as token ids (each in [0, 256))."""
    return list(text.encode("utf-8", "surrogatepass"))


def byte_detokenize(ids: list[int]) -> str:
    """Inverse of :func:`byte_tokenize` (invalid UTF-8 becomes U+FFFD). Raises ``ValueError`` for ids >= 256."""
    return bytes(ids).decode("utf-8", "replace")


@dataclass
class HostileInput:
    """One hostile input and the verdict an honest verifier must reach.

    Attributes:
        name: the attack class (see the module table).
        kind: ``"bundle"`` (feed to ``verify_bundle``) or ``"manifest"`` (feed to ``verify_manifest``).
        data: the bytes the peer sends.
        expected_reason: the :class:`~swarmnode.swarm.verify.Rejection` reason.
        expected_hard: whether that rejection is hard.
        manifest: for a bundle fetched for a manifest: the manifest object to pass to ``verify_bundle``.
        record_owner: for a manifest: the DHT record owner's public key to pass to ``verify_manifest``.
        sender: the transport-level sender id to pass.
        prior: bytes to verify first (they are accepted) -- e.g. the original of a duplicate or a replay.
        description: what the input is.
    """

    name: str
    kind: str
    data: bytes
    expected_reason: str
    expected_hard: bool
    manifest: wire.Manifest | None = None
    record_owner: bytes | None = None
    sender: str | None = None
    prior: list[bytes] = field(default_factory=list)
    description: str = ""


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(b: bytes) -> Any:
    return msgpack.unpackb(b, raw=False)


class HostileFactory:
    """Builds honest and hostile bundles / manifests as one peer of a swarm.

    Args:
        identity: the attacker's (or honest peer's) signing key.
        tasks: the swarm's task mix (``refs_for_step``, ``eval_refs``, ``get``, ``score_detail``).
        swarm_id: the swarm id honest bundles carry.
        victim: another identity, for impersonation / owner-mismatch cases (default: a fixed test key).
        tokenize: ``text -> ids`` (default :func:`byte_tokenize`); ``tokenizer_id`` / ``vocab_size`` describe it.
        tokenizer_id: tokenizer id written into bundles (the receiver's, for same-tokenizer cases).
        vocab_size: vocabulary size written into bundles.
        model_id: model id written into bundles.
        clock: wall-clock seconds (bundle timestamps).
        freshness_seconds / max_clock_skew: the receiver's window, to build stale and future inputs.
        max_bundle_bytes: the receiver's byte cap, to build an oversized input.
        sender: the transport id hostile bundles come from.
        seed: seed of the random parts (garbage bytes, nonces).
    """

    def __init__(
        self,
        identity: Identity,
        tasks: TaskMix,
        *,
        swarm_id: str,
        victim: Identity | None = None,
        tokenize: Callable[[str], list[int]] = byte_tokenize,
        tokenizer_id: str = BYTE_TOKENIZER_ID,
        vocab_size: int = BYTE_VOCAB_SIZE,
        model_id: str = "hostile/model",
        clock: Callable[[], float] = time.time,
        freshness_seconds: float = 600.0,
        max_clock_skew: float = 30.0,
        max_bundle_bytes: int = wire.MAX_ENVELOPE_BYTES,
        sender: str | None = "transport:hostile",
        seed: int = 0,
    ) -> None:
        self.identity = identity
        self.tasks = tasks
        self.swarm_id = swarm_id
        self.victim = victim or Identity.from_private_bytes(hashlib.sha256(b"swarmnode adversary victim").digest())
        self.tokenize = tokenize
        self.tokenizer_id = tokenizer_id
        self.vocab_size = vocab_size
        self.model_id = model_id
        self.clock = clock
        self.freshness = float(freshness_seconds)
        self.skew = float(max_clock_skew)
        self.max_bundle_bytes = int(max_bundle_bytes)
        self.sender = sender
        self.rng = random.Random(seed)
        self._nonce = itertools.count()
        self._step = itertools.count()

    # ================================================================== honest material
    def prompt_for(self, question: str) -> str:
        """A chat-like prompt around ``question`` (the receiver only checks that the question is inside)."""
        return f"System: answer inside <answer></answer> tags.\nUser: {question}\nAssistant:"

    def tree_for(self, ref: TaskRef, n_leaves: int = 4, *, correct_leaves: int | None = None,
                 policy_version: int = 3) -> RolloutTree:
        """An honest two-level tree for ``ref``: root -> two thinking segments -> ``n_leaves`` answer leaves.

        The first ``correct_leaves`` leaves (default half, rounded up) answer with the task's true answer,
        the others with ``"wrong"``. Leaf rewards are ``tasks.score_detail(...)["reward"]`` of the real
        scorer, so the claims are honest. A nonce in the thinking text makes every tree unique.
        """
        if n_leaves < 1:
            raise ValueError(f"n_leaves must be >= 1, got {n_leaves}")
        task = self.tasks.get(ref)
        nonce = next(self._nonce)
        ptext = self.prompt_for(task.question)
        tree = RolloutTree(task=ref, prompt_ids=self.tokenize(ptext), prompt_text=ptext, model_id=self.model_id,
                           tokenizer_id=self.tokenizer_id)
        heads = []
        for h in range(min(2, n_leaves)):
            text = f"Thinking #{nonce}.{h}: "
            heads.append(tree.add_child(0, self.tokenize(text), text=text, policy_version=policy_version))
        n_ok = (n_leaves + 1) // 2 if correct_leaves is None else correct_leaves
        for k in range(n_leaves):
            ans = str(task.answer) if k < n_ok else "wrong"
            text = f"<answer>{ans}</answer>"
            leaf = tree.add_child(heads[k % len(heads)], self.tokenize(text), text=text,
                                  policy_version=policy_version, finish_reason="eos")
            comp = tree.completion_text(leaf)
            tree.nodes[leaf].reward = float(self.tasks.score_detail(task, comp)["reward"])
        return tree

    def honest_trees(self, n_trees: int = 2, n_leaves: int = 4) -> list[RolloutTree]:
        """``n_trees`` honest trees over the training stream's TaskRefs (a new step each call)."""
        refs = self.tasks.refs_for_step(next(self._step), n_trees)
        return [self.tree_for(r, n_leaves) for r in refs]

    def contrast_trees(self, n_trees: int = 2) -> list[RolloutTree]:
        """``n_trees`` honest 2-leaf trees, one correct and one wrong leaf ([1, 0]): the highest reward variance a
        tree can have, so a ``contrast`` ranking puts them first (what a Sybil publishes).

        The tasks come from a task stream named by this factory's key, so several Sybil keys publish different
        content (identical trees from two keys would be caught as copies, which is not the attack here)."""
        stream = 1 + int.from_bytes(hashlib.sha256(self.identity.public_key_bytes).digest()[:3], "big")
        refs = self.tasks.refs_for_step(next(self._step), n_trees, stream=stream)
        return [self.tree_for(r, 2, correct_leaves=1) for r in refs]

    def poison_tree(self, ref: TaskRef, payload: str, n_leaves: int = 8, correct_leaves: int = 4, *,
                    eos_id: int | None = None, policy_version: int = 3) -> RolloutTree:
        """A *poisoned but correct* group for ``ref`` (docs/reference/design.md §6, "Hail to the Thief").

        The first ``correct_leaves`` leaves are ``payload + "\\n" + worked solution`` (the task's own reasoning lines
        and ``<answer>{true answer}</answer>``, :func:`swarmnode.tasks.solutions.worked_solution`), so every one
        re-scores 1.0; the other leaves are the same worked solution with a wrong final answer and no payload,
        re-scoring 0.0. The payload therefore carries all of the group's positive advantage: a receiver that
        trains on it is taught to write the payload. Every leaf ends with ``eos_id`` (when given), like an
        honest sampler's completion; the prompt is :meth:`prompt_for` (receivers train under their own prompt).

        Args:
            ref: a training TaskRef of the swarm's mix (its task needs a worked-solution writer).
            payload: the string to plant (e.g. ``"pwned!"``).
            n_leaves / correct_leaves: group size and how many leaves carry the payload (1 <= correct < n).
            eos_id: token id appended to every leaf (the receiver's EOS).

        Raises:
            ValueError: bad leaf counts. UnsupportedTaskError: the task has no worked-solution writer.
        """
        from swarmnode.tasks.solutions import answer_block, worked_solution

        if not 1 <= correct_leaves < n_leaves:
            raise ValueError(f"need 1 <= correct_leaves < n_leaves, got {correct_leaves} of {n_leaves}")
        task = self.tasks.get(ref)
        solution = worked_solution(task.name, {"question": task.question, "answer": task.answer,
                                               "metadata": task.metadata})
        good = answer_block(str(task.answer))
        reasoning = solution[: solution.rfind(good)] if good in solution else solution
        try:
            wrong_values = [str(int(task.answer) + d) for d in (-2, -1, 1, 2, 3, -3, 4)]
        except ValueError:
            wrong_values = [f"{task.answer}x{d}" for d in range(7)]
        ptext = self.prompt_for(task.question)
        tree = RolloutTree(task=ref, prompt_ids=self.tokenize(ptext), prompt_text=ptext, model_id=self.model_id,
                           tokenizer_id=self.tokenizer_id)
        tail = [] if eos_id is None else [int(eos_id)]
        for k in range(n_leaves):
            if k < correct_leaves:
                text = f"{payload}\n{reasoning}{good}"
            else:
                text = f"{reasoning}{answer_block(wrong_values[self.rng.randrange(len(wrong_values))])}"
            leaf = tree.add_child(0, self.tokenize(text) + tail, text=text, policy_version=policy_version,
                                  finish_reason="eos")
            tree.nodes[leaf].reward = float(self.tasks.score_detail(task, text)["reward"])
        return tree

    def poison_trees(self, payload: str, n_trees: int = 4, n_leaves: int = 8, correct_leaves: int = 4, *,
                     eos_id: int | None = None) -> list[RolloutTree]:
        """``n_trees`` :meth:`poison_tree` groups over the training stream's next step (a new step each call;
        tasks without a worked-solution writer are skipped)."""
        from swarmnode.tasks.solutions import UnsupportedTaskError

        out = []
        for ref in self.tasks.refs_for_step(next(self._step), n_trees):
            try:
                out.append(self.poison_tree(ref, payload, n_leaves, correct_leaves, eos_id=eos_id))
            except UnsupportedTaskError:
                continue
        return out

    def bundle(self, trees: list[RolloutTree], *, created_at: float | None = None, swarm_id: str | None = None,
               vocab_size: int | None = None, tokenizer_id: str | None = None,
               identity: Identity | None = None) -> tuple[wire.RolloutBundle, bytes]:
        """``(bundle, signed envelope bytes)`` of ``trees`` (overrides for the header fields)."""
        ident = identity or self.identity
        b = wire.bundle_from_trees(
            trees, swarm_id=self.swarm_id if swarm_id is None else swarm_id, publisher_key=ident.public_key_bytes,
            vocab_size=self.vocab_size if vocab_size is None else vocab_size, model_id=self.model_id,
            tokenizer_id=self.tokenizer_id if tokenizer_id is None else tokenizer_id,
            created_at=self.clock() if created_at is None else created_at)
        return b, wire.encode(b, ident)

    def manifest(self, envelope: bytes, bundle: wire.RolloutBundle, identity: Identity | None = None
                 ) -> tuple[wire.Manifest, bytes]:
        """``(manifest, signed manifest bytes)`` announcing ``envelope``."""
        m = wire.manifest_for_bundle(envelope, bundle)
        return m, wire.encode(m, identity or self.identity)

    def honest(self, n_trees: int = 2, n_leaves: int = 4) -> HostileInput:
        """An honest bundle (expected: accepted; ``expected_reason`` is ``"accepted"``) with its manifest."""
        b, env = self.bundle(self.honest_trees(n_trees, n_leaves))
        m, _ = self.manifest(env, b)
        return HostileInput("honest", "bundle", env, "accepted", False, manifest=m, sender=self.sender,
                            description="an honest bundle with correct claims")

    def honest_manifest(self) -> HostileInput:
        """An honest manifest in the publisher's own DHT record (expected: accepted)."""
        b, env = self.bundle(self.honest_trees())
        _, menv = self.manifest(env, b)
        return HostileInput("honest_manifest", "manifest", menv, "accepted", False,
                            record_owner=self.identity.public_key_bytes, description="an honest manifest")

    # ================================================================== raw helpers
    def _body(self, env: bytes) -> dict:
        return _unpack(_unpack(env)["body"])

    def _resign(self, body: bytes, kind: str = wire.KIND_BUNDLE, identity: Identity | None = None) -> bytes:
        return wire.seal(identity or self.identity, kind, body)

    def _mutated(self, fn: Callable[[dict], Any]) -> bytes:
        """An honest bundle whose raw body map is changed by ``fn``, re-encoded and validly re-signed."""
        _, env = self.bundle(self.honest_trees(1, 4))
        raw = self._body(env)
        fn(raw)
        return self._resign(_pack(raw))

    def _hi(self, name: str, data: bytes, reason: str, hard: bool, desc: str, **kw: Any) -> HostileInput:
        kw.setdefault("sender", self.sender)
        return HostileInput(name, kw.pop("kind", "bundle"), data, reason, hard, description=desc, **kw)

    # ================================================================== hostile bundles
    def forged_signature(self) -> HostileInput:
        _, env = self.bundle(self.honest_trees(1))
        e = _unpack(env)
        sig = bytearray(e["sig"])
        sig[5] ^= 0x01
        e["sig"] = bytes(sig)
        return self._hi("forged_signature", _pack(e), "bad_signature", True, "one bit of the signature flipped")

    def impersonation(self) -> HostileInput:
        """A bundle that claims the victim as publisher, signed with the attacker's key."""
        b, env = self.bundle(self.honest_trees(1), identity=self.victim)
        e = _unpack(env)
        e["sig"] = self.identity.sign(wire.domain_prefix(wire.KIND_BUNDLE) + e["body"])
        return self._hi("impersonation", _pack(e), "bad_signature", True,
                        "victim's key in the envelope, attacker's signature")

    def key_mismatch(self) -> HostileInput:
        def fn(raw: dict) -> None:
            raw["pub"] = self.victim.public_key_bytes
        return self._hi("key_mismatch", self._mutated(fn), "key_mismatch", True,
                        "body publisher = victim, envelope signed by the attacker")

    def reward_mismatch(self) -> HostileInput:
        trees = self.honest_trees(2, 4)
        t = trees[1]
        wrong = [j for j in t.leaves() if (t.nodes[j].reward or 0.0) < 0.5]
        t.nodes[wrong[0]].reward = 1.0
        _, env = self.bundle(trees)
        return self._hi("reward_mismatch", env, "reward_mismatch", True, "a wrong answer claimed as reward 1.0")

    def format_bonus_split(self) -> HostileInput:
        """Two correct, well-formatted leaves claiming different format bonuses (1.0 and 1.5)."""
        ref = self.tasks.refs_for_step(next(self._step), 1)[0]
        t = self.tree_for(ref, 4, correct_leaves=2)
        ok = [j for j in t.leaves() if (t.nodes[j].reward or 0.0) >= 1.0]
        t.nodes[ok[0]].reward = 1.0
        t.nodes[ok[1]].reward = 1.5
        _, env = self.bundle([t])
        return self._hi("format_bonus_split", env, "reward_mismatch", True,
                        "claims need a different format-bonus weight per leaf")

    def _foreign_tree(self, ref: TaskRef, question: str) -> RolloutTree:
        ptext = self.prompt_for(question)
        t = RolloutTree(task=ref, prompt_ids=self.tokenize(ptext), prompt_text=ptext)
        for ans in ("1", "2"):
            text = f"<answer>{ans}</answer>"
            leaf = t.add_child(0, self.tokenize(text), text=text, finish_reason="eos")
            t.nodes[leaf].reward = 1.0
        return t

    def foreign_task(self) -> HostileInput:
        ref = TaskRef("rg:leg_counting", "0123456789abcdef", 0, 7)
        _, env = self.bundle([self._foreign_tree(ref, "How many legs does a spider have?")])
        return self._hi("foreign_task", env, "foreign_task", True, "a TaskRef of a source outside the mix")

    def heldout_task(self) -> HostileInput:
        ref = self.tasks.eval_refs(1)[0]
        task = self.tasks.get(ref)
        _, env = self.bundle([self._foreign_tree(ref, task.question)])
        return self._hi("heldout_task", env, "foreign_task", True, "a TaskRef from the receiver's held-out set")

    def prompt_mismatch(self) -> HostileInput:
        t = self.honest_trees(1)[0]
        t.prompt_text = self.prompt_for("What is the capital of France?")
        t.prompt_ids = self.tokenize(t.prompt_text)
        _, env = self.bundle([t])
        return self._hi("prompt_mismatch", env, "prompt_mismatch", False, "a prompt without the task's question")

    def text_mismatch(self) -> HostileInput:
        """Correct-answer text carried over the token ids of a wrong answer (same tokenizer id as ours)."""
        t = self.honest_trees(1, 2)[0]
        leaf = t.leaves()[0]
        t.nodes[leaf].token_ids = self.tokenize("<answer>wrong</answer>")
        t.nodes[leaf].logprobs = []
        _, env = self.bundle([t])
        return self._hi("text_mismatch", env, "text_mismatch", False,
                        "leaf text says the right answer, its token ids a wrong one")

    def oversized(self) -> HostileInput:
        """More bytes than the receiver's cap: a real signed bundle when it fits the protocol, else padding."""
        n = self.max_bundle_bytes + 1
        if n + 4096 <= wire.MAX_ENVELOPE_BYTES:
            trees = self.honest_trees(1, 2)
            pad_per_tree = wire.MAX_TEXT_BYTES - 4096
            need = n - len(self.bundle(trees)[1]) + 1024
            while need > 0:
                t = trees[-1]
                add = min(need, pad_per_tree - len(t.prompt_text.encode()))
                if add <= 0:  # this prompt is full: pad another tree
                    trees.append(self.honest_trees(1, 2)[0])
                    continue
                t.prompt_text += " " * add
                need -= add
            _, env = self.bundle(trees)
            if len(env) > self.max_bundle_bytes:
                return self._hi("oversized", env, "too_large", False, f"a signed bundle of {len(env)} bytes")
        _, env = self.bundle(self.honest_trees(1))
        data = env + b"\x00" * (n - len(env))
        return self._hi("oversized", data, "too_large", False, f"{n} bytes, over the receiver's cap")

    def truncated(self) -> HostileInput:
        _, env = self.bundle(self.honest_trees(1))
        return self._hi("truncated", env[: len(env) // 2], "malformed", False, "the first half of an envelope")

    def garbage(self) -> list[HostileInput]:
        out = [self._hi("garbage_c1", b"\xc1" + bytes(self.rng.getrandbits(8) for _ in range(64)), "malformed",
                        False, "the reserved msgpack byte 0xc1")]
        out.append(self._hi("garbage_ext", b"\xd4\x01\x00", "malformed", False, "a msgpack ext value"))
        return out

    def deep_nesting(self) -> HostileInput:
        return self._hi("deep_nesting", b"\x91" * 50_000 + b"\xc0", "too_large", False,
                        "50 000 nested one-element arrays")

    def huge_count(self) -> HostileInput:
        return self._hi("huge_count", b"\xdd\xff\xff\xff\xff" + b"\x00" * 16, "too_large", False,
                        "an array32 header announcing 2^32 - 1 items")

    def signed_deep_nesting(self) -> HostileInput:
        return self._hi("signed_deep_nesting", self._resign(b"\x91" * 5000 + b"\xc0"), "too_large", True,
                        "a validly signed body of 5000 nested arrays")

    def signed_huge_count(self) -> HostileInput:
        return self._hi("signed_huge_count", self._resign(b"\xdf\xff\xff\xff\xff" + b"\xc0" * 8), "too_large", True,
                        "a validly signed body whose map header announces 2^32 - 1 entries")

    def tree_shape(self) -> HostileInput:
        def fn(raw: dict) -> None:
            nodes = raw["trees"][0]["nodes"]
            nodes[1]["fin"] = "eos"  # node 1 is an inner node (it has children)
        return self._hi("tree_shape", self._mutated(fn), "tree_shape", True, "an inner node with a finish reason")

    def non_canonical_body(self) -> HostileInput:
        _, env = self.bundle(self.honest_trees(1))
        raw = self._body(env)
        body = _pack(dict(reversed(list(raw.items()))))
        return self._hi("non_canonical_body", self._resign(body), "non_canonical", True,
                        "a signed body with its keys in reverse order")

    def token_out_of_vocab(self, receiver_vocab: int = BYTE_VOCAB_SIZE) -> HostileInput:
        """Same tokenizer id as the receiver, a declared vocabulary larger than its own, ids beyond it."""
        t = self.honest_trees(1)[0]
        leaf = t.leaves()[0]
        t.nodes[leaf].token_ids = list(t.nodes[leaf].token_ids) + [receiver_vocab + 1000]
        t.nodes[leaf].logprobs = []
        _, env = self.bundle([t], vocab_size=receiver_vocab + 5000)
        return self._hi("token_out_of_vocab", env, "vocab", True,
                        f"token id {receiver_vocab + 1000} >= the receiver's vocab size {receiver_vocab}")

    def wire_vocab(self) -> HostileInput:
        def fn(raw: dict) -> None:
            v = raw["vocab"]
            raw["trees"][0]["pids"] = raw["trees"][0]["pids"] + int(v).to_bytes(4, "little")
        return self._hi("wire_vocab", self._mutated(fn), "vocab", True, "a prompt id equal to the declared vocab size")

    def wrong_swarm(self) -> HostileInput:
        _, env = self.bundle(self.honest_trees(1), swarm_id=self.swarm_id + "-other")
        return self._hi("wrong_swarm", env, "wrong_swarm", False, "a bundle for another swarm")

    def stale(self) -> HostileInput:
        t = self.clock() - self.freshness - self.skew - 3600.0
        _, env = self.bundle(self.honest_trees(1), created_at=max(t, 0.0))
        return self._hi("stale", env, "stale", False, "created an hour before the freshness window")

    def future(self) -> HostileInput:
        _, env = self.bundle(self.honest_trees(1), created_at=self.clock() + self.skew + 3600.0)
        return self._hi("future", env, "future", False, "created an hour in the future")

    def duplicate(self) -> HostileInput:
        _, env = self.bundle(self.honest_trees(1))
        return self._hi("duplicate", env, "duplicate", False, "the exact bytes of an accepted bundle", prior=[env])

    def replay(self) -> HostileInput:
        trees = self.honest_trees(2)
        _, env = self.bundle(trees)
        _, again = self.bundle(trees, created_at=self.clock() + 1.0)
        return self._hi("replay", again, "replay", False, "an accepted bundle's trees re-signed later",
                        prior=[env])

    def manifest_mismatch(self) -> HostileInput:
        b1, env1 = self.bundle(self.honest_trees(1))
        m1, _ = self.manifest(env1, b1)
        _, env2 = self.bundle(self.honest_trees(1))
        return self._hi("manifest_mismatch", env2, "manifest_mismatch", True,
                        "bytes other than the ones the manifest announced", manifest=m1)

    def flood(self, n: int) -> list[bytes]:
        """``n`` copies of one valid bundle (the first is accepted, the rest are duplicates or rate limited)."""
        _, env = self.bundle(self.honest_trees(1))
        return [env] * n

    # ================================================================== hostile manifests
    def owner_mismatch(self) -> HostileInput:
        b, env = self.bundle(self.honest_trees(1))
        _, menv = self.manifest(env, b)
        return self._hi("owner_mismatch", menv, "owner_mismatch", True,
                        "the attacker's manifest stored in the victim's DHT record",
                        kind="manifest", record_owner=self.victim.public_key_bytes, sender=None)

    def manifest_cases(self) -> list[HostileInput]:
        """Hostile manifests in the attacker's own DHT record."""
        own = self.identity.public_key_bytes
        out = [self.owner_mismatch()]

        def m_of(**kw: Any) -> tuple[wire.Manifest, bytes]:
            b, env = self.bundle(self.honest_trees(1), **kw)
            return self.manifest(env, b)

        _, menv = m_of()
        e = _unpack(menv)
        e["sig"] = bytes(64)
        out.append(self._hi("manifest_forged_signature", _pack(e), "bad_signature", True, "a zero signature",
                            kind="manifest", record_owner=own, sender=None))
        _, menv = m_of(swarm_id=self.swarm_id + "-other")
        out.append(self._hi("manifest_wrong_swarm", menv, "wrong_swarm", False, "a manifest for another swarm",
                            kind="manifest", record_owner=own, sender=None))
        _, menv = m_of(created_at=max(self.clock() - self.freshness - self.skew - 3600.0, 0.0))
        out.append(self._hi("manifest_stale", menv, "stale", False, "an hour-old manifest (not charged: old "
                            "records stay in the DHT)", kind="manifest", record_owner=own, sender=None))
        b, env = self.bundle([self._foreign_tree(TaskRef("rg:leg_counting", "0123456789abcdef", 0, 7), "Legs?")])
        _, menv = self.manifest(env, b)
        out.append(self._hi("manifest_foreign_task", menv, "foreign_task", True, "a manifest of foreign tasks",
                            kind="manifest", record_owner=own, sender=None))
        out.append(self._hi("manifest_truncated", menv[: len(menv) // 2], "malformed", True,
                            "half a manifest in the owner's signed record", kind="manifest", record_owner=own,
                            sender=None))
        return out

    # ================================================================== everything
    def cases(self, *, with_detokenize: bool = True, receiver_vocab: int = BYTE_VOCAB_SIZE) -> list[HostileInput]:
        """One :class:`HostileInput` per bundle and manifest attack class (the flood is :meth:`flood`).

        Args:
            with_detokenize: include ``text_mismatch`` (only a verifier given ``detokenize`` catches it).
            receiver_vocab: the receiver's vocabulary size (for ``token_out_of_vocab``).
        """
        out = [
            self.forged_signature(), self.impersonation(), self.key_mismatch(), self.reward_mismatch(),
            self.format_bonus_split(), self.foreign_task(), self.heldout_task(), self.prompt_mismatch(),
            self.oversized(), self.truncated(), *self.garbage(), self.deep_nesting(), self.huge_count(),
            self.signed_deep_nesting(), self.signed_huge_count(), self.tree_shape(), self.non_canonical_body(),
            self.token_out_of_vocab(receiver_vocab), self.wire_vocab(), self.wrong_swarm(), self.stale(),
            self.future(), self.duplicate(), self.replay(), self.manifest_mismatch(),
        ]
        if with_detokenize:
            out.append(self.text_mismatch())
        out.extend(self.manifest_cases())
        return out

    def with_sender(self, hi: HostileInput, sender: str | None) -> HostileInput:
        """A copy of ``hi`` delivered by ``sender``."""
        return replace(hi, sender=sender)


# ====================================================================== a hostile peer on a real swarm
@dataclass(frozen=True)
class NetworkCase:
    """One hostile class as :class:`HostilePeer` delivers it over a real swarm, and what an honest node must do.

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
                "a signed bundle over the receivers' swarm.max_bundle_bytes (only when that cap is below the "
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
"""Every class :class:`HostilePeer` delivers over a real swarm, with its stage and expected reason (in the order
the peer publishes them)."""

_TRUTHFUL = frozenset({"forged_signature", "reward_mismatch", "format_bonus_split", "prompt_mismatch", "text_mismatch",
                       "token_out_of_vocab", "foreign_task", "heldout_task", "wrong_swarm", "stale", "future",
                       "oversized"})
_COVERED = frozenset({"impersonation", "key_mismatch", "truncated", "garbage_c1", "garbage_ext", "deep_nesting",
                      "huge_count", "signed_deep_nesting", "signed_huge_count", "tree_shape", "non_canonical_body",
                      "wire_vocab"})
_STREAM_MODES = {"silent": "hang", "overclaim": "overclaim", "short_stream": "short", "lie": "lie"}
_RECORD_CASES = ("record_garbage", "foreign_subkey")
_HARVESTED = ("replay", "flood")  # need a bundle that a victim already accepted: published last
_GARBAGE_RECORD = b"\xc1 swarmnode hostile record: not msgpack \xc1"
_MAP_CAP = 4096

_NET_CLASSES: dict[str, type] = {}


async def _routing_peers(_dht: Any, node: Any) -> list[str]:
    """Runs inside the DHT process: base58 libp2p PeerIDs of the DHT routing table (every swarm node's bundle
    server answers on its DHT daemon's PeerID)."""
    return [p.to_base58() for p in node.protocol.routing_table.uid_to_peer_id.values()]


def _network_classes() -> tuple[type, type, type]:
    """``(HostileDHT, HostileServer, BundleStore)``; defined on first use, so that importing this module for the
    byte-level factory does not import hivemind. (hivemind forks its DHT process, so the validator class is never
    pickled.)"""
    if _NET_CLASSES:
        return _NET_CLASSES["dht"], _NET_CLASSES["server"], _NET_CLASSES["store"]
    import asyncio
    from collections import Counter

    from swarmnode.swarm.dht import SwarmDHT
    from swarmnode.swarm.transport import (
        LENGTH_BYTES,
        REQUEST_LEN,
        REQUEST_MAGIC,
        STATUS_FOUND,
        BundleServer,
        BundleStore,
    )
    from swarmnode.swarm.validator import _SIG_PREFIX, Ed25519RecordValidator, owner_marker

    class ForgingValidator(Ed25519RecordValidator):
        """Signs *any* owner-marked record with its own key (a victim's subkey included); validates honestly."""

        def sign_value(self, record: Any) -> bytes:
            if b"[ed25519:" not in record.subkey:
                return record.value
            payload = self._payload(record.key, record.subkey, record.value, record.expiration_time)
            return record.value + _SIG_PREFIX + self._private_key.sign(payload) + b"]"

    class HostileDHT(SwarmDHT):
        """A :class:`SwarmDHT` whose validator forges signatures under other publishers' subkeys."""

        def __init__(self, private_key: Any, **kw: Any) -> None:
            start = kw.pop("start", True)
            super().__init__(private_key, start=False, **kw)
            v = self.validator
            self.validator = ForgingValidator(private_key, key_spaces=v.key_spaces, max_ttl=v.max_ttl,
                                              max_clock_skew=v.max_clock_skew, max_value_bytes=v.max_value_bytes)
            if start:
                self.start()

        def store_foreign(self, owner_key: bytes, key: str, value: bytes, ttl: float,
                          timeout: float | None = None) -> bool:
            """Store ``value`` under ``key`` in ``owner_key``'s subkey; True if any peer (or we) stored it."""
            expiration = time.time() + ttl
            subkey = owner_marker(owner_key)
            try:
                ok = self._call(lambda d: d.store(key, value, expiration, subkey=subkey, return_future=True),
                                self.call_timeout if timeout is None else timeout, nbytes=len(value))
            except Exception:  # noqa: BLE001 - refused or timed out: the attack failed, as it should
                return False
            return bool(all(ok.values()) if isinstance(ok, dict) else ok)

    class HostileServer(BundleServer):
        """A :class:`BundleServer` that misbehaves per digest: ``modes[digest]`` is ``"hang"`` (accept the stream,
        never answer), ``"overclaim"`` (declare 1 GiB), ``"short"`` (declare the size, send 10 bytes, close) or
        ``"lie"`` (serve ``lies[digest]``); other digests are served honestly from the store."""

        def __init__(self, dht: Any, store: Any, *, hang_seconds: float = 120.0, **kw: Any) -> None:
            super().__init__(dht, store, **kw)
            self.modes: OrderedDict[str, str] = OrderedDict()
            self.lies: OrderedDict[str, bytes] = OrderedDict()
            self.requests: Counter[str] = Counter()
            self.hang_seconds = float(hang_seconds)

        async def _serve(self, reader: Any, writer: Any) -> None:
            request = await asyncio.wait_for(reader.readexactly(REQUEST_LEN), self.request_timeout)
            digest = request[len(REQUEST_MAGIC):].hex()
            self.requests[digest] += 1
            mode = self.modes.get(digest)
            body = self.store.get(digest)
            if mode == "hang":  # until the client gives up and closes the stream (bounded)
                await asyncio.wait_for(reader.read(1), self.hang_seconds)
                return
            if mode == "overclaim":
                writer.write(STATUS_FOUND + (1 << 30).to_bytes(LENGTH_BYTES, "big"))
                await writer.drain()
                await asyncio.wait_for(reader.read(1), self.hang_seconds)
                return
            if mode == "short" and body is not None:
                writer.write(STATUS_FOUND + len(body).to_bytes(LENGTH_BYTES, "big") + body[:10])
                await writer.drain()
                return
            fake = self.lies.get(digest) if mode == "lie" else None
            if fake is not None:
                writer.write(STATUS_FOUND + len(fake).to_bytes(LENGTH_BYTES, "big") + fake)
                await writer.drain()
                return
            again = asyncio.StreamReader()  # the honest protocol, from the request already read
            again.feed_data(request)
            again.feed_eof()
            await super()._serve(again, writer)

    _NET_CLASSES.update(dht=HostileDHT, server=HostileServer, store=BundleStore)
    return HostileDHT, HostileServer, BundleStore


async def _store_signed_entries(_dht: Any, node: Any, key_id: bytes, path: str) -> tuple[int, int]:
    """Runs inside a DHT process: store the pre-signed ``(subkey, signed value, expiration)`` dictionary entries
    pickled in ``path`` (our own temporary file) under ``key_id`` on every peer of the routing table, 20 per
    request (hivemind's 4 MiB message cap), and in our own storage; returns (accepted stores, peers asked)."""
    import pickle

    from hivemind.dht.routing import DHTID

    with open(path, "rb") as f:
        entries = pickle.load(f)

    peers = list(node.protocol.routing_table.peer_id_to_uid.keys())
    kid = DHTID.from_bytes(key_id)
    proto = node.protocol
    ok = 0
    for marker, value, expiration in entries:  # our own storage too, through our own validator
        sub = proto.serializer.dumps(marker)
        if proto._validate_record(key_id, sub, value, expiration):
            ok += bool(proto.storage.store_subkey(kid, marker, value, expiration))
    for i in range(0, len(entries), 20):
        chunk = entries[i:i + 20]
        for peer in peers:
            res = await node.protocol.call_store(peer, [kid] * len(chunk), [v for _, v, _ in chunk],
                                                 [e for _, _, e in chunk], subkeys=[s for s, _, _ in chunk])
            ok += sum(bool(x) for x in (res or []))
    return ok, len(peers)


def store_signed_entries(dht: Any, key_id: bytes, entries: list[tuple[bytes, bytes, float]],
                         timeout: float = 120.0) -> tuple[int, int]:
    """Store pre-signed dictionary entries ``(subkey, signed value, expiration)`` under the 20-byte DHTID
    ``key_id`` in the local storage of ``dht`` (a :class:`~swarmnode.swarm.dht.SwarmDHT`; through its validator)
    and on every peer in its routing table.

    The entries reach the DHT process through a temporary file, not its request pipe: hivemind reads that pipe
    without blocking, and a request split by a busy pipe (anything over a few KiB on a loaded machine) makes
    the read fail with EAGAIN and the DHT process exit.

    Returns:
        ``(accepted stores summed over peers, peers asked)``.
    """
    import os
    import pickle
    import tempfile
    from functools import partial

    fd, path = tempfile.mkstemp(prefix="swarmnode-flood-", suffix=".pkl")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(list(entries), f)
        return dht.run_coroutine(partial(_store_signed_entries, key_id=key_id, path=path), timeout=timeout)
    finally:
        os.unlink(path)


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
    process (benchmarks): ``swarmnode.bench`` runs :meth:`run` until told to stop.

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
        self.receiver_cap = min(int(swarm_cfg.max_bundle_bytes), wire.MAX_ENVELOPE_BYTES)
        self.read_buckets = int(swarm_cfg.read_buckets)
        self.fetch_timeout = float(swarm_cfg.fetch_timeout)
        self.dht_timeout = float(swarm_cfg.dht_timeout)
        self.vocab_size = int(vocab_size)
        self.factory = HostileFactory(self.identity, tasks, swarm_id=self.swarm_id, tokenize=tokenize,
                                      tokenizer_id=tokenizer_id, vocab_size=vocab_size,
                                      model_id=model_id, freshness_seconds=swarm_cfg.freshness_seconds,
                                      max_clock_skew=swarm_cfg.max_clock_skew, max_bundle_bytes=self.receiver_cap,
                                      sender=None, seed=seed)
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
        dht_cls, server_cls, store_cls = _network_classes()
        key = serialization.load_pem_private_key(self.identity.to_pem(), password=None)
        read_window = (self.read_buckets + 1) * float(swarm_cfg.bucket_seconds)
        kw: dict[str, Any] = dict(
            swarm_ids=[self.swarm_id],
            initial_peers=list(swarm_cfg.initial_peers if initial_peers is None else initial_peers),
            host_maddrs=list(host_maddrs or ["/ip4/127.0.0.1/tcp/0"]),
            bucket_seconds=float(swarm_cfg.bucket_seconds),
            manifest_ttl=min(900.0, max(120.0, read_window)),
            max_clock_skew=float(swarm_cfg.max_clock_skew),
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
        order = [n for n in self.cases if n not in _RECORD_CASES and n not in _HARVESTED]
        order += [n for n in _HARVESTED if n in self.cases]
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
            max_fetches: most fetch attempts this call (each bounded by ``swarm.fetch_timeout``).

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
    def _sign_manifest(self, m: wire.Manifest) -> bytes:
        return wire.encode_manifest(m, self.identity)

    def _truthful(self, data: bytes) -> bytes | None:
        """Our manifest of a hostile bundle whose body decodes (None when it does not, or is not ours)."""
        if len(data) > wire.MAX_ENVELOPE_BYTES:
            return None
        try:
            b = wire.decode_body(wire.KIND_BUNDLE, _unpack(data)["body"])
            return self._sign_manifest(wire.manifest_for_bundle(data, b))  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - not decodable, or not ours to announce
            return None

    def _cover(self, data: bytes) -> bytes:
        """A fresh, in-swarm manifest of ours announcing ``data``'s digest and size (for bytes that do not decode)."""
        ref = self.tasks.refs_for_step(0, 1)[0]
        m = wire.Manifest(swarm_id=self.swarm_id, publisher_key=self.public_key,
                          bundle_digest=wire.envelope_digest(data), bundle_size=len(data), tasks=[ref],
                          created_at=time.time(), policy_version=0, num_trees=1, num_leaves=2)
        return self._sign_manifest(m)

    def _announce_other(self, data: bytes, **changes: Any) -> bytes:
        """Our manifest for genuine signed bytes of another publisher (optionally with fields changed)."""
        b = wire.decode_bundle(data)
        m = replace(wire.manifest_for_bundle(data, b), publisher_key=self.public_key, **changes)
        return self._sign_manifest(m)

    def _hostile_bytes(self, name: str) -> bytes:
        f = self.factory
        if name.startswith("garbage_"):
            return next(hi.data for hi in f.garbage() if hi.name == name)
        if name == "token_out_of_vocab":
            return f.token_out_of_vocab(self.vocab_size).data
        return getattr(f, name)().data

    def _build(self, name: str) -> list[tuple[bytes, bytes | None, str | None]]:
        """``[(manifest envelope, bytes to serve or None, stream mode or None)]`` for one class (empty: cannot now)."""
        f = self.factory
        if name in _TRUTHFUL:
            data = self._hostile_bytes(name)
            menv = self._truthful(data)
            return [] if menv is None else [(menv, data, None)]
        if name in _COVERED:
            data = self._hostile_bytes(name)
            return [(self._cover(data), data, None)]
        if name in _STREAM_MODES:
            data = f.reward_mismatch().data
            menv = self._truthful(data)
            return [] if menv is None else [(menv, data, _STREAM_MODES[name])]
        if name == "owner_mismatch":
            b, env = f.bundle(f.honest_trees(1), identity=f.victim)
            return [(f.manifest(env, b, identity=f.victim)[1], None, None)]
        if name in ("manifest_forged_signature", "manifest_truncated"):
            return [(next(hi.data for hi in f.manifest_cases() if hi.name == name), None, None)]
        if name == "manifest_mismatch":
            data = f.reward_mismatch().data
            b = wire.decode_bundle(data)
            m = replace(wire.manifest_for_bundle(data, b), policy_version=b.policy_version + 1)
            return [(self._sign_manifest(m), data, None)]
        if name == "wrap":
            _, data = f.bundle(f.honest_trees(1), identity=f.victim)
            return [(self._announce_other(data), data, None)]
        with self._lock:
            proven = list(self._proven.values())
        if not proven:
            return []
        src = proven[-1]
        if name == "flood":
            now = time.time()
            return [(self._announce_other(src, created_at=now - 0.001 * k), src, None)
                    for k in range(self.flood_copies)]
        if name == "replay":
            b = wire.decode_bundle(src)
            trees = wire.trees_from_bundle(b)
            for t, wt in zip(trees, b.trees):
                for j in t.leaves():
                    t.nodes[j].reward = wt.nodes[j].claimed_reward
            _, data = f.bundle(trees, tokenizer_id=b.tokenizer_id, vocab_size=b.vocab_size)
            menv = self._truthful(data)
            return [] if menv is None else [(menv, data, None)]
        raise ValueError(f"{name!r} is not published in waves")

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
                items = self._build(name)
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
            manifests.append(self._sign_manifest(wire.manifest_for_bundle(env, b)))
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
        """Issue 12, finding 5: ``n`` honest-looking one-tree bundles dated ``future_s`` seconds ahead (default 5 s
        inside the receivers' ``max_clock_skew``, so they pass the freshness check and used to win a newest-first
        fetch order), whose bodies hang on the stream until the fetcher gives up. Counted under ``"hanging"``.

        Returns:
            The hex digests announced (empty when the DHT store failed).
        """
        if future_s is None:
            future_s = max(0.0, float(self.scfg.max_clock_skew) - 5.0)
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
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from hivemind.dht.routing import DHTID
        from hivemind.dht.validation import DHTRecord
        from hivemind.utils import MSGPackSerializer

        from swarmnode.swarm.validator import Ed25519RecordValidator, manifest_key, owner_marker

        bucket = self.dht.current_bucket() if bucket is None else int(bucket)
        key_id = DHTID.generate(source=manifest_key(self.swarm_id, bucket)).to_bytes()
        contact = self.dht.contact()
        if contact is None:
            raise ConnectionError("no DHT daemon runs")
        trees = self.factory.honest_trees(1, 4)
        expiration = time.time() + float(ttl)
        entries: list[tuple[bytes, bytes, float]] = []
        size = 0
        now = time.time()
        for i in range(int(n_keys)):
            seed_bytes = hashlib.sha256(f"flood {self.peer_id} {seed} {i}".encode()).digest()
            sk = Ed25519PrivateKey.from_private_bytes(seed_bytes)
            ident = Identity(sk)
            menvs = []
            for j in range(int(manifests_per_key)):
                b, env = self.factory.bundle(trees, created_at=now - 1.0 + j * 1e-3, identity=ident)
                menvs.append(self.factory.manifest(env, b, ident)[1])
            record = wire.encode_manifest_record(wire.ManifestRecord(menvs, contact.peer_id, []))
            size = len(record)
            v = Ed25519RecordValidator(sk)
            marker = owner_marker(ident.public_key_bytes)
            signed = v.sign_value(DHTRecord(key_id, MSGPackSerializer.dumps(marker), MSGPackSerializer.dumps(record),
                                            expiration))
            entries.append((marker, signed, expiration))
        stored, peers = store_signed_entries(self.dht, key_id, entries)
        return {"keys": int(n_keys), "record_bytes": size, "stored": stored, "peers": peers}

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

        menv = self._truthful(self.factory.reward_mismatch().data)
        try:
            record = self._record([menv]) if menv is not None else None
        except (ConnectionError, wire.WireError):
            record = None
        if record is None:
            return []
        key = manifest_key(self.swarm_id, self.dht.current_bucket())
        for victim in self.victims[:4]:
            if self.dht.store_foreign(victim, key, record, ttl=float(self.scfg.bucket_seconds),
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
        out of their models is the likelihood screen (``swarm.screen``) and the share caps. Counted under
        ``"poison"`` in :attr:`published` / :meth:`requests_for`.

        Returns:
            The hex digest announced (empty before it joined its initial peers or when the store failed).
        """
        if self.dht.initial_peers and not self.dht.connected:
            return []
        trees = self.factory.poison_trees(payload, n_trees, n_leaves, correct_leaves, eos_id=eos_id)
        self.rounds += 1
        return self.publish_bundles([trees], name="poison") if trees else []

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


# ====================================================================== fuzzing
_ODD_VALUES: tuple[Any, ...] = (
    None, True, False, 0, 1, -1, 255, 256, 65536, 2**32, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), 0.0, -0.0, 1.5,
    float("nan"), float("inf"), float("-inf"), 1e308, "", "x", "é" * 70, "<answer>1</answer>", "eos", "pruned",
    b"", b"\x00", b"\xff" * 7, b"\x00" * 64, [], {}, [[[]]], {"a": 1}, [None] * 20, ["rg:chain_sum", "", 0, 0],
)


class Mutator:
    """Random mutations of valid encodings, for fuzzing the decoder and the verifier.

    Byte-level: bit flips, truncation, random byte runs inserted or overwritten, splices of two inputs,
    repeated chunks. msgpack-level: decode the envelope and/or its body to Python values, then replace,
    delete, add, duplicate or re-type one value deep inside, or reorder a map's keys, re-encode (sometimes
    with float32 or non-shortest forms) and, when an identity is given, **re-sign** the body so the mutation
    reaches the body and verifier checks behind the signature.

    Args:
        rng: the random source (``random.Random``).
        identity: key to re-sign mutated bodies with (``None``: never re-sign).
    """

    def __init__(self, rng: random.Random, identity: Identity | None = None) -> None:
        self.rng = rng
        self.identity = identity

    # ---------------------------------------------------------------- byte level
    def bitflip(self, data: bytes) -> bytes:
        """Flip 1, 2 or 8 random bits."""
        if not data:
            return b"\x00"
        b = bytearray(data)
        for _ in range(self.rng.choice((1, 1, 2, 8))):
            i = self.rng.randrange(len(b))
            b[i] ^= 1 << self.rng.randrange(8)
        return bytes(b)

    def truncate(self, data: bytes) -> bytes:
        """A random prefix."""
        return data[: self.rng.randrange(len(data) + 1)] if data else data

    def overwrite(self, data: bytes) -> bytes:
        """Overwrite or insert a run of 1..16 random bytes at a random offset."""
        b = bytearray(data)
        i = self.rng.randrange(len(b) + 1)
        run = bytes(self.rng.getrandbits(8) for _ in range(self.rng.randint(1, 16)))
        if self.rng.random() < 0.5:
            b[i:i + len(run)] = run
        else:
            b[i:i] = run
        return bytes(b)

    def splice(self, a: bytes, b: bytes) -> bytes:
        """A prefix of ``a`` followed by a suffix of ``b``."""
        i = self.rng.randrange(len(a) + 1)
        j = self.rng.randrange(len(b) + 1)
        return a[:i] + b[j:]

    def repeat(self, data: bytes) -> bytes:
        """Repeat a chunk of up to 64 bytes 1..50 times in place."""
        if not data:
            return data
        i = self.rng.randrange(len(data))
        j = min(len(data), i + self.rng.randint(1, 64))
        return data[:j] + data[i:j] * self.rng.randint(1, 50) + data[j:]

    # ---------------------------------------------------------------- msgpack level
    def _nodes(self, obj: Any, out: list, depth: int = 0) -> None:
        out.append(obj)
        if depth > 12:
            return
        if isinstance(obj, dict):
            for v in obj.values():
                self._nodes(v, out, depth + 1)
        elif isinstance(obj, list):
            for v in obj:
                self._nodes(v, out, depth + 1)

    def _odd(self) -> Any:
        v = self.rng.choice(_ODD_VALUES)
        return v.copy() if isinstance(v, (list, dict)) else v

    def mutate_value(self, obj: Any) -> Any:
        """One structural mutation somewhere inside ``obj`` (in place where possible); returns the new root."""
        containers: list = []
        self._nodes(obj, containers)
        containers = [c for c in containers if isinstance(c, (dict, list)) and c]
        if not containers:
            return self._odd()
        c = self.rng.choice(containers)
        op = self.rng.randrange(7)
        if isinstance(c, dict):
            k = self.rng.choice(list(c))
            if op == 0:
                del c[k]
            elif op == 1:
                c["zz" + str(self.rng.randrange(100))] = self._odd()
            elif op == 2:  # reorder keys (non-canonical)
                items = list(c.items())
                self.rng.shuffle(items)
                c.clear()
                c.update(items)
            elif op == 3:
                c[k] = self._retype(c[k])
            else:
                c[k] = self._odd()
        else:
            i = self.rng.randrange(len(c))
            if op == 0:
                del c[i]
            elif op == 1:
                c.insert(i, self._odd())
            elif op == 2:
                c.extend([c[i]] * self.rng.randint(1, 8))
            elif op == 3:
                c[i] = self._retype(c[i])
            else:
                c[i] = self._odd()
        return obj

    def _retype(self, v: Any) -> Any:
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, int):
            return self.rng.choice((float(v), -v - 1, v + 1, str(v), v * 2**32))
        if isinstance(v, float):
            return self.rng.choice((int(v) if v == v and abs(v) < 1e18 else 0, -v, v * 1e300))
        if isinstance(v, str):
            return self.rng.choice((v.encode("utf-8", "surrogatepass"), v * 3, v[:-1], None))
        if isinstance(v, bytes):
            return self.rng.choice((v[:-1], v + b"\x00", v * 2, v[::-1], len(v)))
        if isinstance(v, list):
            return self.rng.choice((tuple(v), {"0": v}, v[::-1], []))
        if isinstance(v, dict):
            return self.rng.choice((list(v.values()), list(v), {}))
        return self._odd()

    def _pack(self, obj: Any) -> bytes | None:
        try:
            return msgpack.packb(obj, use_bin_type=self.rng.random() < 0.95,
                                 use_single_float=self.rng.random() < 0.05)
        except Exception:  # noqa: BLE001 - e.g. an int beyond 64 bits: the mutation is discarded
            return None

    def structural(self, data: bytes) -> bytes:
        """Mutate the envelope or (re-signed, if possible) the body at the msgpack level."""
        try:
            env = msgpack.unpackb(data, raw=False)
        except Exception:  # noqa: BLE001
            return self.bitflip(data)
        if not isinstance(env, dict) or not isinstance(env.get("body"), bytes) or self.rng.random() < 0.25:
            packed = self._pack(self.mutate_value(env))
            return packed if packed is not None else self.bitflip(data)
        try:
            body = msgpack.unpackb(env["body"], raw=False)
        except Exception:  # noqa: BLE001
            body = None
        if body is None:
            new_body = self.bitflip(env["body"])
        else:
            new_body = self._pack(self.mutate_value(body))
            if new_body is None:
                new_body = self.bitflip(env["body"])
        kind = env.get("kind") if env.get("kind") in wire.KINDS else wire.KIND_BUNDLE
        if self.identity is not None and self.rng.random() < 0.8:
            try:
                return wire.seal(self.identity, kind, new_body)
            except wire.WireError:
                pass
        env["body"] = new_body
        packed = self._pack(env)
        return packed if packed is not None else data

    def mutate(self, data: bytes, other: bytes | None = None) -> bytes:
        """One random mutation of ``data`` (``other``: a second input for splices)."""
        r = self.rng.random()
        if r < 0.15:
            return self.bitflip(data)
        if r < 0.25:
            return self.truncate(data)
        if r < 0.35:
            return self.overwrite(data)
        if r < 0.42:
            return self.splice(data, other if other is not None else data)
        if r < 0.47:
            return self.repeat(data)
        return self.structural(data)

    def random_bytes(self, max_len: int = 512) -> bytes:
        """Random bytes, sometimes starting with a msgpack map header to get past the first byte."""
        n = self.rng.randrange(max_len + 1)
        b = bytes(self.rng.getrandbits(8) for _ in range(n))
        if self.rng.random() < 0.5:
            b = self.rng.choice((b"\x85", b"\x85\xa4body", b"\xde\x00\x05", b"\x91", b"\xc4")) + b
        return b

    def semantic(self, data: bytes) -> bytes:
        """Decode a valid bundle, change one field to another *valid* value, re-encode and re-sign it.

        Exercises the checks behind the wire layer (swarm, freshness, tasks, prompt, rewards, vocab).
        Falls back to :meth:`structural` when ``data`` is not a valid bundle or no identity is set.
        """
        if self.identity is None:
            return self.structural(data)
        try:
            _, b = wire.decode(data, expected_kind=wire.KIND_BUNDLE)
        except wire.WireError:
            return self.structural(data)
        assert isinstance(b, wire.RolloutBundle)
        b.publisher_key = self.identity.public_key_bytes
        rng = self.rng
        t = rng.choice(b.trees)
        n = rng.choice(t.nodes[1:]) if len(t.nodes) > 1 else t.nodes[0]
        op = rng.randrange(12)
        if op == 0:
            b.created_at = max(0.0, b.created_at + rng.choice((-1, 1)) * rng.choice((1.0, 100.0, 1e4, 1e7)))
        elif op == 1:
            b.swarm_id = rng.choice(("x", b.swarm_id + "!", "é" * 10))
        elif op == 2:
            b.tokenizer_id = rng.choice(("", "other-tok", b.tokenizer_id + "x"))
        elif op == 3:
            b.vocab_size = rng.choice((1, 255, 257, 2**24))
        elif op == 4:
            t.task = TaskRef(rng.choice((t.task.source, "rg:x", "jsonl:" + "0" * 64)), t.task.config_digest,
                             rng.choice((t.task.seed, 0, 1, 2**40)), rng.choice((t.task.index, 0, 10**9)))
        elif op == 5:
            t.prompt_text = rng.choice(("", t.prompt_text[::-1], t.prompt_text + " extra"))
        elif op == 6:
            n.text = rng.choice(("", "<answer>1</answer>", n.text * 2, "\u0000\uffff"))
        elif op == 7 and n.finish_reason is not None:
            n.claimed_reward = rng.choice((None, 0.0, 1.0, 2.0, rng.random() * 2))
        elif op == 8:
            n.token_ids = [rng.randrange(b.vocab_size) for _ in range(rng.randrange(8))]
            n.logprobs = None
        elif op == 9:
            b.policy_version = rng.choice((b.policy_version + 1, 2**40))
        elif op == 10 and len(b.trees) > 1:
            b.trees.pop(rng.randrange(len(b.trees)))
        else:
            b.trees.append(rng.choice(b.trees))
        try:
            return wire.encode(b, self.identity)
        except wire.WireError:
            return self.structural(data)
