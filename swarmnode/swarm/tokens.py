"""Our tokenizer's view of a peer's tree: special token ids, decoded leaf texts, re-tokenized and re-encoded trees.

The checks of the trust table's section "The ids are the truth" (:mod:`swarmnode.swarm.verify`, step 6:
``special_token``, ``text_mismatch``, ``not_roundtrip``, ``retokenize_failed``) live here, as the methods of
:class:`TokenChecks`, which :class:`~swarmnode.swarm.verify.Verifier` inherits.
"""

from __future__ import annotations

from typing import Any, Callable, Collection

from swarmnode.rollout.step_credit import special_token_ids
from swarmnode.rollout.tree import RolloutTree
from swarmnode.swarm import wire
from swarmnode.swarm.content import leaf_path
from swarmnode.swarm.rejection import Rejection

__all__ = ["TokenChecks", "ids_ok", "special_token_ids"]


def ids_ok(ids: Any, vocab: int) -> bool:
    """True when ``ids`` is a list of ints in ``[0, vocab)`` (bools and other types are not ids)."""
    return isinstance(ids, list) and all(type(t) is int and 0 <= t < vocab for t in ids)


class TokenChecks:
    """The token checks of step 6, as methods of :class:`~swarmnode.swarm.verify.Verifier` (see its Args).

    A mixin (the verifier inherits it through :class:`~swarmnode.swarm.bundle_checks.BundleChecks`); reads the
    verifier's ``our_vocab_size``, ``retokenize``, ``detokenize``, ``encode``, ``special_ids``,
    ``eos_ids`` and ``max_completion_tokens``/``max_bundle_tokens``; rejects through its ``_reject``.
    """

    our_vocab_size: int
    retokenize: Callable[[str], list[int]] | None
    detokenize: Callable[[list[int]], str] | None
    encode: Callable[[str], list[int]] | None
    special_ids: Collection[int]
    eos_ids: Collection[int]
    max_completion_tokens: int
    max_bundle_tokens: int
    _reject: Callable[..., Rejection]

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
            if dtext != "".join(wt.nodes[k].text for k in leaf_path(wt, j)):
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
            if not ids_ok(ids, self.our_vocab_size):
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
