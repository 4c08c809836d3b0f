"""The checks of a peer's bundle, in the order of the trust table: bytes, envelope, signature, body (steps 0 to 5),
then the trees inside it (step 6: tasks, tokens, prompts, replays, re-scoring).

:class:`BundleChecks` holds :meth:`~swarmnode.swarm.verify.Verifier.verify_bundle`'s work
(:mod:`swarmnode.swarm.verify` lists the checks in order, with their reasons); the verifier inherits it. The
token checks are :class:`~swarmnode.swarm.tokens.TokenChecks`, the content keys of the ``replay`` check
:mod:`swarmnode.swarm.content`.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Callable

from swarmnode.rollout.advantages import ZERO_STD_ATOL
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.tree import RolloutTree
from swarmnode.swarm import wire
from swarmnode.swarm.content import content_key, leaf_keys_by_leaf
from swarmnode.swarm.identity import peer_id_from_public_key
from swarmnode.swarm.peers import UNATTRIBUTED, PeerBook
from swarmnode.swarm.rejection import BODY_SOFT, ENVELOPE_HARD, UNCHARGED_REASONS, Rejection
from swarmnode.swarm.replay import ReplayMemory, TTLSet
from swarmnode.swarm.tokens import TokenChecks, ids_ok
from swarmnode.tasks.base import Scorer, Task

__all__ = ["REWARD_TOL", "BundleChecks"]

REWARD_TOL = 1e-6
"""Absolute tolerance between a claimed reward and our re-score (grail's reward stage: abs 1e-6)."""


class BundleChecks(TokenChecks):
    """Bundle verification, as methods of :class:`~swarmnode.swarm.verify.Verifier`, which inherits it.

    A mixin: the attributes annotated here are the verifier's, set by its constructor (see its Args).
    """

    tasks: Scorer
    swarm_id: str
    our_tokenizer_id: str
    clock: Callable[[], float]
    max_bundle_bytes: int
    prompt_for: Callable[[Task], str] | None
    max_prompt_length: int
    max_completion_chars: int
    max_scored_chars: int
    max_seeds_per_source: int
    verify_budget_s: float
    timer: Callable[[], float]
    peers: PeerBook
    stats: dict[str, Any]
    _seen_bundles: TTLSet
    _seen_content: ReplayMemory
    _young_after: int
    _leaf_claims: Callable[..., list[bytes]]
    _leaf_holder: Callable[[Any], Any]
    _apply_claims: Callable[..., None]
    _allowed_key: Callable[[bytes], bool]
    _freshness: Callable[[float], tuple[str, str] | None]

    def _verify_bundle(self, data: Any, manifest: wire.Manifest | None, sender: str | None,
                       received_at: float | None = None, prepaid: bool = False,
                       committed_at: float | None = None) -> list[PeerTree]:
        """:meth:`Verifier.verify_bundle`'s checks (same arguments); raises
        :class:`~swarmnode.swarm.rejection.Rejection`."""
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
            raise self._reject(e.reason, e.detail, deliverer, e.reason in ENVELOPE_HARD)
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
            raise final(self._reject(e.reason, e.detail, signer, e.reason not in BODY_SOFT))
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
        """Step 6 for bundle ``b`` whose envelope ``env`` (SHA-256 ``digest``) verified and whose swarm id and
        freshness passed: the accepted trees with our prompt, our ids and our rewards (at least one), in bundle
        order, minus dropped trees (copies, special tokens, ids that do not round-trip).

        ``final`` marks a rejection as the bundle's verdict (its digest is remembered); ``received_at`` becomes
        :attr:`PeerTree.received_at`; ``committed_at`` as in :meth:`Verifier.verify_bundle`. Raises
        :class:`~swarmnode.swarm.rejection.Rejection` (through ``final``) for the whole bundle."""
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
        lkeys: dict[int, list[bytes]] = {}  # tree -> its distinct leaf keys
        key_of: dict[int, dict[int, bytes]] = {}  # tree -> {leaf index: its leaf key}
        for i, k in enumerate(ckeys):
            if k is not None:
                lkeys[i], key_of[i] = leaf_keys_by_leaf(b.trees[i].task, {j: texts[(i, j)] for j in live[i]})
        keep: list[int] = []
        copied: dict[int, set[int]] = {}  # kept tree -> its leaves held before (another key's, ours, its own earlier)
        claims: list[bytes] = []  # content keys of earlier trees whose authorship this bundle claims
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
                    whole = isinstance(seen, tuple) and len(seen) == 3  # a copy of a whole earlier tree
                    contrast = lambda i=i: self._own_contrast(tasks[i], [texts[(i, j)] for j in live[i]])  # noqa: E731
                    claims.extend([k] if whole else self._leaf_claims(lkeys[i], leaf_seen, signer, contrast))
                continue
            # A tree with some new leaves is accepted whole, its seen leaves included. Keeping only the new leaves
            # (tried after an outside attack: a copy with one junk leaf added trains the copied leaves again) broke
            # honest sharing wherever questions repeat: a small task set drawn for many steps gives identical short
            # leaves, and the stripped groups lost their contrast (the loopback swarm test stopped exchanging).
            # The seen leaves are marked instead: they train, but earn the signer no standing (its own earlier
            # leaves too: an outside attack re-sent its one real tree with a new junk leaf for 11 units).
            held = {x for x, v in zip(lkeys[i], leaf_seen) if v is not None}  # ours, a peer's, its own before
            claims.extend(self._leaf_claims(lkeys[i], leaf_seen, signer))
            copied[i] = {j for j, x in key_of[i].items() if x in held}
            in_bundle.update(lkeys[i])
            keep.append(i)
        if not keep:
            self._apply_claims(claims, signer, committed_at)
            # a copy of our own rollouts proves the signer copied; between two peers nobody can tell who was first,
            # so a cross-peer copy is dropped without charging anyone (the real author must never pay for it)
            raise final(self._reject("replay", f"all {len(b.trees)} trees were seen before "
                                     f"({own_echo} of them our own)", signer, False, charge=own_echo > 0))
        # re-score every kept live leaf (bounded by the time budget)
        t0 = self.timer()
        scores: dict[tuple[int, int], float] = {}
        fmt_claims: list[tuple[int, int, float, float, float]] = []  # (i, j, claim, exact, partial)
        n_scored = sum(len(live[i]) for i in keep)
        for i in keep:
            wt = b.trees[i]
            for j in live[i]:
                text = texts[(i, j)]
                d = self.tasks.rescore(tasks[i], text)
                exact, partial, fmt = float(d["correct"]), float(d["partial"]), float(d["format"])
                reward = self._reward(d)
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
        if fmt_claims and not one_format_weight(fmt_claims):
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
            copied_here = copied[i]
            if len(live[i]) != len(tree.leaves()):
                old_leaves = [j for j in tree.leaves() if j in live[i]]
                tree = tree.subtree(live[i])
                copied_here = {new for old, new in zip(old_leaves, tree.leaves()) if old in copied_here}  # same order
            tree.update_stats()
            out.append(PeerTree(tree=tree, peer_id=signer, publisher_key=bytes(env.public_key),
                                model_id=b.model_id, tokenizer_id=b.tokenizer_id, policy_version=b.policy_version,
                                same_tokenizer=same_tok and i not in canon, digest=digest.hex(),
                                received_at=float(received_at),
                                verified=True, copied_leaves=frozenset(copied_here)))
        # verdict: accepted (minus replays)
        self._seen_bundles.add(digest, "accepted")
        young_signer = self.peers.is_young(signer, self._young_after)
        for i in keep:
            own = [scores[(i, j)] for j in live[i] if j not in copied[i]]
            worth = int(len(own) >= 2 and max(own) - min(own) > ZERO_STD_ATOL)  # could it earn a unit?
            self._seen_content.add(ckeys[i], (signer, committed_at, worth), young=young_signer, owner=signer)
            for k in lkeys[i]:  # a leaf seen before keeps its value: the tree it first came in
                prev = self._seen_content.get(k)
                self._seen_content.add(k, prev if prev is not None else (signer, committed_at, ckeys[i], len(lkeys[i])),
                                       young=young_signer, owner=signer)
        self._apply_claims(claims, signer, committed_at)
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

    def _reward(self, detail: dict[str, Any]) -> float:
        """A leaf's reward from our verifier's ``rescore`` detail: ``correct + format_reward x format`` (the one
        formula of re-scoring and of :meth:`_own_contrast`; may be non-finite when the scorer misbehaves)."""
        return float(detail["correct"]) + float(self.tasks.format_reward or 0.0) * float(detail["format"])

    def _own_contrast(self, task: Task, leaf_texts: list[str]) -> bool:
        """Whether our verifier scores a claimant tree's own texts (every live leaf) with reward contrast: at least
        two leaves whose rewards (exact + format weight x format) differ by more than ``ZERO_STD_ATOL``. Scored on
        the claimant's texts, not remembered ones: a copier's case variant of a right leaf (same copy form, a
        reward of 0) came first and would otherwise stand for the author's right leaf (an outside attack)."""
        rewards = []
        for text in leaf_texts:
            r = self._reward(self.tasks.rescore(task, text))
            if not math.isfinite(r):
                return False
            rewards.append(r)
        return len(rewards) >= 2 and max(rewards) - min(rewards) > ZERO_STD_ATOL

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
        if not ids_ok(ids, self.our_vocab_size):
            raise final(self._reject("internal", "our prompt encodes to ids outside our vocabulary", signer, False,
                                     charge=False))
        return text, ids[-self.max_prompt_length:]


def one_format_weight(claims: list[tuple[int, int, float, float, float]]) -> bool:
    """True when one format weight ``w`` in [0, 1] explains every well-formatted leaf's claim as
    ``exact + w`` or ``partial + w`` (within ``2·REWARD_TOL``)."""
    _, _, c0, e0, p0 = claims[0]
    for w in {c0 - e0, c0 - p0}:
        if not (-REWARD_TOL <= w <= 1.0 + REWARD_TOL):
            continue
        if all(abs(c - e - w) <= 2 * REWARD_TOL or abs(c - p - w) <= 2 * REWARD_TOL for _, _, c, e, p in claims):
            return True
    return False
