"""Hostile bytes as one peer of a swarm: :class:`HostileFactory` builds honest bundles and, from them, one
:class:`HostileInput` per attack class (the table of :mod:`swarmnode.testing.adversary`), each with the reason an
honest :class:`~swarmnode.swarm.verify.Verifier` must reject it with (docs/reference/design.md §6).

Token ids use a byte-level tokenizer by default (:func:`byte_tokenize`: UTF-8 bytes, vocabulary 256), a real,
reversible tokenizer whose ids are easy to check by hand.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from swarmnode.rollout.tree import RolloutTree
from swarmnode.swarm import wire
from swarmnode.swarm.identity import Identity
from swarmnode.tasks.base import TaskRef
from swarmnode.tasks.mix import TaskMix
from swarmnode.testing.adversary.raw import pack as _pack
from swarmnode.testing.adversary.raw import unpack as _unpack

__all__ = ["BYTE_TOKENIZER_ID", "BYTE_VOCAB_SIZE", "HostileFactory", "HostileInput", "byte_detokenize",
           "byte_tokenize"]

BYTE_TOKENIZER_ID = "bytes-utf8"
"""Tokenizer id of :func:`byte_tokenize`."""
BYTE_VOCAB_SIZE = 256
"""Vocabulary size of :func:`byte_tokenize`."""


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
        name: the attack class (see the table of :mod:`swarmnode.testing.adversary`).
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
        re-scoring 0.0 (none when ``correct_leaves == n_leaves``: a poisoned rescue answer, whose asker brings the
        wrong leaves). The payload therefore carries all of the group's positive advantage: a receiver that
        trains on it is taught to write the payload. Every leaf ends with ``eos_id`` (when given), like an
        honest sampler's completion; the prompt is :meth:`prompt_for` (receivers train under their own prompt).

        Args:
            ref: a training TaskRef of the swarm's mix (its task needs a worked-solution writer).
            payload: the string to plant (e.g. ``"pwned!"``).
            n_leaves / correct_leaves: group size and how many leaves carry the payload (1 <= correct <= n).
            eos_id: token id appended to every leaf (the receiver's EOS).

        Raises:
            ValueError: bad leaf counts. UnsupportedTaskError: the task has no worked-solution writer.
        """
        from swarmnode.tasks.solutions import answer_block, worked_solution

        if not 1 <= correct_leaves <= n_leaves:
            raise ValueError(f"need 1 <= correct_leaves <= n_leaves, got {correct_leaves} of {n_leaves}")
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

