"""Cross-node tree expansion: continue a peer's promising prefix with our own policy (docs/guide/swarm.md).

A peer's tree tells us where its policy's outcomes split: a prefix shared by right and wrong leaves (by OUR
re-scores) -- an inner node of a tree, or the first steps a flat chain group's leaves have in common, cut at
a step end before the answer -- is a *fork*, the step that decides. We take that prefix (the peer's tokens,
re-verified) as context and sample ``num_generations`` continuations from
it with our own policy under **our own prompt** for the TaskRef. The new leaves share one prefix and differ
from the fork on, so their group has contrast exactly at the step that matters.

What is trained (the simplest sound choice, docs/guide/swarm.md "Cross-node tree expansion"):

* the peer's prefix is **context only**: it becomes part of the prompt of the new samples, so no loss, no
  ratio and no behaviour log-prob of another policy is ever involved;
* the tokens after the fork are ours: sampled by our policy at our current version, with our behaviour
  log-probs; they train as on-policy (``local``) samples;
* every new leaf is scored by our verifier on the whole completion the model produced for the task -- the
  prefix's text followed by our continuation, decoded from the ids;
* only trees that passed the verification pipeline (``PeerTree.verified``, every check of docs/reference/design.md §6,
  leaves re-scored by us) and came from an established key (``PeerTree.established``) are expanded, at most
  one fork per peer per step, ties in a salted random order (:func:`select_forks`), only for tasks our training
  stream can produce; expanded trees are never published (their prompt carries another node's tokens).

Entry points: :func:`find_forks` (one tree), :func:`select_forks` (this step's candidates),
:func:`fork_prompt` and :func:`expand_forks` (sample and score through callables the node hands in, so this
module stays free of ``policy/``).
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from swarmnode.config import SamplingConfig
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.sampler import PromptSpec
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import TaskRef

__all__ = ["Fork", "Expansion", "find_forks", "select_forks", "fork_prompt", "continuation_config", "expand_forks"]

#: Most branch points of one tree examined (the longest shared prefixes first); bounds the work a large tree costs.
MAX_CANDIDATES = 32
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"


@dataclass(frozen=True)
class Fork:
    """A promising prefix of a re-verified peer tree.

    Attributes:
        peer: the :class:`PeerTree` it comes from (``verified`` is True).
        node_id: the inner node the prefix ends at (not the root, not a leaf), or ``None`` for a fork inside
            segments (where leaves' token sequences diverge, :func:`find_forks` with ``decode``).
        prefix_ids: token ids root -> node (the peer's, in our vocabulary), ``len >= 1``.
        prefix_text: their text (the verified segment texts).
        leaves: leaves under the node in the peer tree (>= 2).
        mean_reward / reward_var: mean and population variance of those leaves' rewards (our re-scores);
            ``reward_var > 0`` (mixed outcomes).
    """

    peer: PeerTree
    node_id: int | None
    prefix_ids: tuple[int, ...]
    prefix_text: str
    leaves: int
    mean_reward: float
    reward_var: float

    @property
    def task(self) -> TaskRef:
        """The TaskRef of the peer tree."""
        return self.peer.tree.task


@dataclass
class Expansion:
    """One fork continued by our policy.

    Attributes:
        fork: the :class:`Fork`.
        tree: our tree: ``prompt_ids`` = our prompt + the peer's prefix (context), every node below the root is
            ours (our token ids, our behaviour log-probs, our policy version); leaves carry our verifier's
            reward of ``fork.prefix_text + continuation``.
        correct: per leaf (leaf order), our verifier's correctness (0/1).
    """

    fork: Fork
    tree: RolloutTree
    correct: list[float]


def _stats(rewards: Sequence[Any]) -> tuple[float, float] | None:
    """(mean, population variance) of finite rewards, or None (fewer than 2, a non-finite one, or no variance)."""
    if len(rewards) < 2 or any(r is None or not math.isfinite(float(r)) for r in rewards):
        return None
    rs = [float(r) for r in rewards]
    mean = sum(rs) / len(rs)
    var = sum((r - mean) ** 2 for r in rs) / len(rs)
    return (mean, var) if var > 0 else None


def _node_forks(peer: PeerTree, max_prefix_tokens: int | None) -> list[Fork]:
    """Forks at the tree's own inner nodes (segment boundaries; tree-mode trees)."""
    tree = peer.tree
    out: list[Fork] = []
    for node in tree.nodes[1:]:
        if node.is_leaf or not node.children:
            continue
        st = _stats([tree.nodes[lid].reward for lid in tree.leaves_under(node.node_id)])
        if st is None:
            continue
        path = tree.path(node.node_id)
        ids = tuple(int(t) for nid in path for t in tree.nodes[nid].token_ids)
        text = "".join(tree.nodes[nid].text for nid in path)
        if not ids or ANSWER_CLOSE in text or ANSWER_OPEN in text:
            continue
        if max_prefix_tokens is not None and len(ids) > max_prefix_tokens:
            continue
        out.append(Fork(peer, node.node_id, ids, text, len(tree.leaves_under(node.node_id)), st[0], st[1]))
    return out


def _shared_prefix_forks(peer: PeerTree, max_prefix_tokens: int | None, decode: Callable[[list[int]], str],
                         step_delimiters: Sequence[str]) -> list[Fork]:
    """Forks where leaves' token sequences diverge (any tree, chain groups included), each cut back to the
    last step end (``step_delimiters``) before the answer tag began: TreeRL's "each step is a node"."""
    tree = peer.tree
    leaves = tree.leaves()
    seqs = [tuple(tree.completion_ids(lid)) for lid in leaves]
    rewards = [tree.nodes[lid].reward for lid in leaves]
    order = sorted(range(len(seqs)), key=lambda i: seqs[i])
    cap = max_prefix_tokens if max_prefix_tokens is not None else max((len(x) for x in seqs), default=0)
    cands: set[tuple[int, ...]] = set()
    for a, b in zip(order, order[1:]):  # the branch points of the leaves' token trie
        sa, sb = seqs[a], seqs[b]
        n = 0
        while n < min(len(sa), len(sb), cap) and sa[n] == sb[n]:
            n += 1
        if n:
            cands.add(sa[:n])
    delims = tuple(step_delimiters)
    ends: dict[int, bool] = {}  # token id -> its text ends a step (the sampler's `step` rule), decoded once

    def ends_step(t: int) -> bool:
        hit = ends.get(t)
        if hit is None:
            text = decode([t])
            hit = ends[t] = bool(text) and text.endswith(delims)
        return hit

    cut: dict[tuple[int, ...], str] = {}
    for c in sorted(cands, key=len, reverse=True)[:MAX_CANDIDATES]:
        for n in range(len(c), 0, -1):  # the longest prefix that ends a step, before the answer began
            if not ends_step(c[n - 1]):
                continue
            text = decode(list(c[:n]))
            if ANSWER_OPEN in text or ANSWER_CLOSE in text or not text.endswith(delims):
                continue
            cut[c[:n]] = text
            break
    out: list[Fork] = []
    for ids, text in cut.items():
        under = [i for i, sq in enumerate(seqs) if len(sq) > len(ids) and sq[:len(ids)] == ids]
        if any(sq[:len(ids)] == ids and len(sq) <= len(ids) for sq in seqs):
            continue  # a leaf ends inside the prefix (its final token would be in our prompt)
        st = _stats([rewards[i] for i in under])
        if st is not None:
            out.append(Fork(peer, None, ids, text, len(under), st[0], st[1]))
    return out


def find_forks(peer: PeerTree, *, max_prefix_tokens: int | None = None,
               decode: Callable[[list[int]], str] | None = None,
               step_delimiters: Sequence[str] = ("\n",)) -> list[Fork]:
    """The forks of one peer tree: prefixes whose leaves have different rewards (our re-scores).

    Args:
        peer: a :class:`PeerTree`; an unverified one (``peer.verified`` False) has no forks.
        max_prefix_tokens: longest prefix allowed (tokens); ``None`` = no limit.
        decode: token ids -> text with our tokenizer. Given: forks are where the leaves' token sequences diverge
            (so flat chain groups have forks too), each cut back to its last step end (a text ending with one
            of ``step_delimiters``, ``sampling.tree.step_delimiters``) before the answer tag; the prefix text is
            ``decode(prefix)``. ``None``: forks are the tree's inner nodes (segment boundaries) only, with the
            verified segment texts.
        step_delimiters: see ``decode``.

    Returns:
        Forks, best first: highest reward variance of the leaves under the prefix, then the longer prefix (the
        later the fork, the more specific the step), then the prefix ids. A prefix holding an answer tag, or one
        a leaf ends inside, is no fork. Never raises on a malformed tree (it has no forks).
    """
    if not isinstance(peer, PeerTree) or not peer.verified:
        return []
    try:
        if decode is None:
            out = _node_forks(peer, max_prefix_tokens)
        else:
            out = _shared_prefix_forks(peer, max_prefix_tokens, decode, step_delimiters)
    except (IndexError, ValueError, TypeError):
        return []
    out.sort(key=lambda f: (-f.reward_var, -len(f.prefix_ids), f.prefix_ids))
    return out


def select_forks(
    candidates: Iterable[PeerTree],
    max_forks: int,
    *,
    max_prefix_tokens: int | None = None,
    accept_task: Callable[[TaskRef], bool] | None = None,
    exclude_peers: Iterable[str] = (),
    decode: Callable[[list[int]], str] | None = None,
    step_delimiters: Sequence[str] = ("\n",),
    established_only: bool = True,
    salt: bytes | None = None,
) -> list[Fork]:
    """This step's forks: at most one per peer, the best ones across peers, at most ``max_forks``.

    A peer chooses its own trees' rewards and prefixes, so nothing it controls may win a tie: a tree with one
    right and one wrong leaf already has the largest reward variance of binary rewards, and a longest-prefix
    tie-break let one key take every expansion slot with a prefix text of its choosing (outside-attack
    finding). So forks are spread over peers (one per peer id, however many trees it sent), ranked by reward
    variance, ties in a salted random order; and by default only trees admitted from established keys
    (``PeerTree.established``) are continued.

    Args:
        candidates: this step's peer trees (``SwarmHook.gather``); unverified ones are skipped.
        max_forks: how many (int >= 0).
        max_prefix_tokens / decode / step_delimiters: as :func:`find_forks`.
        accept_task: a predicate on the TaskRef (the node passes ``TaskMix.contains``: a task our training
            stream can produce, never a held-out one); ``None`` accepts all.
        exclude_peers: peer ids whose trees are not expanded (e.g. those the likelihood screen rejected).
        established_only: skip trees whose ``established`` flag is False (young keys; the swarm layer sets the
            flag at admission, ``swarm.trust.established_after``).
        salt: bytes salting the tie order (``None``: fresh random bytes per call; tests pass a fixed salt).

    Returns:
        Forks, highest reward variance first, ties in the salted order; deterministic for the same candidates
        and salt.
    """
    skip = set(exclude_peers)
    key = os.urandom(16) if salt is None else bytes(salt)[:64]

    def rank(f: Fork) -> tuple[float, bytes]:
        tag = f"{f.peer.peer_id}\x00{f.peer.digest}\x00{','.join(map(str, f.prefix_ids))}".encode("utf-8", "replace")
        return (-f.reward_var, hashlib.blake2b(tag, key=key, digest_size=16).digest())

    per_peer: dict[str, tuple[tuple[float, bytes], Fork]] = {}  # peer id -> (rank, its best fork)
    for pt in candidates:
        if not isinstance(pt, PeerTree) or not pt.verified or pt.peer_id in skip:
            continue
        if established_only and not pt.established:
            continue
        if accept_task is not None and not accept_task(pt.tree.task):
            continue
        forks = find_forks(pt, max_prefix_tokens=max_prefix_tokens, decode=decode, step_delimiters=step_delimiters)
        if forks:
            r = rank(forks[0])
            if pt.peer_id not in per_peer or r < per_peer[pt.peer_id][0]:
                per_peer[pt.peer_id] = (r, forks[0])
    return [f for _, f in sorted(per_peer.values(), key=lambda x: x[0])][: max(0, int(max_forks))]


def fork_prompt(fork: Fork, our_prompt: PromptSpec) -> PromptSpec:
    """The prompt our policy continues: OUR prompt for the fork's task followed by the peer's prefix.

    Args:
        fork: the fork.
        our_prompt: our own :class:`PromptSpec` for ``fork.task`` (built by the node from the regenerated task;
            never the sender's prompt).

    Raises:
        ValueError: ``our_prompt`` is for another task.
    """
    if our_prompt.task != fork.task:
        raise ValueError(f"our prompt is for {our_prompt.task.key()}, the fork for {fork.task.key()}")
    return PromptSpec(task=fork.task, prompt_ids=list(our_prompt.prompt_ids) + list(fork.prefix_ids),
                      prompt_text=our_prompt.prompt_text + fork.prefix_text, task_name=our_prompt.task_name)


def continuation_config(sampling: SamplingConfig, fork: Fork, prompt_len: int, num_generations: int) -> SamplingConfig:
    """The sampling config of a fork's continuations: independent samples (``tree.mode chain``),
    ``num_generations`` of them, at most ``max_completion_length - len(prefix)`` new tokens (so prefix plus
    continuation stay within our completion length) and a prompt length that keeps our whole prompt plus the
    prefix (no left truncation of the question)."""
    tree = sampling.tree.model_copy(update={"mode": "chain"})
    return sampling.model_copy(update={
        "num_generations": int(num_generations),
        "max_completion_length": max(1, sampling.max_completion_length - len(fork.prefix_ids)),
        "max_prompt_length": max(sampling.max_prompt_length, int(prompt_len)),
        "tree": tree,
    })


def expand_forks(
    forks: Sequence[Fork],
    *,
    our_prompt: Callable[[TaskRef], PromptSpec],
    sample: Callable[[list[PromptSpec], SamplingConfig], list[RolloutTree]],
    score: Callable[[TaskRef, str], dict[str, float]],
    decode: Callable[[list[int]], str],
    sampling: SamplingConfig,
    num_generations: int,
    min_continuation_tokens: int = 8,
) -> list[Expansion]:
    """Continue each fork with our policy and score the new leaves with our verifier.

    Args:
        forks: from :func:`select_forks`.
        our_prompt: TaskRef -> our own :class:`PromptSpec` for it.
        sample: ``(prompts, sampling_cfg) -> trees`` with our policy (the node's ``generate_rollouts``); one
            tree per prompt, every node below the root sampled by our policy with our behaviour log-probs.
        score: ``(TaskRef, completion text) -> {"reward", "correct", ...}`` -- our verifier
            (``TaskMix.score_detail`` of the regenerated task).
        decode: token ids -> text with our tokenizer (what a completion's ids say is what is scored).
        sampling: our ``sampling`` config (:func:`continuation_config` derives the fork's).
        num_generations: continuations per fork (>= 2).
        min_continuation_tokens: forks leaving fewer new tokens than this are skipped.

    Returns:
        One :class:`Expansion` per fork that produced at least one leaf; trees have ``update_stats`` done.

    Raises:
        whatever ``sample`` raises (the node treats failures of peer-derived input as droppable).
    """
    out: list[Expansion] = []
    for fork in forks:
        if sampling.max_completion_length - len(fork.prefix_ids) < max(1, int(min_continuation_tokens)):
            continue
        spec = fork_prompt(fork, our_prompt(fork.task))
        cfg = continuation_config(sampling, fork, len(spec.prompt_ids), num_generations)
        trees = sample([spec], cfg)
        if not trees:
            continue
        tree = trees[0].without_pruned() if hasattr(trees[0], "without_pruned") else trees[0]
        correct: list[float] = []
        for lid in tree.leaves():
            text = decode(list(fork.prefix_ids) + tree.completion_ids(lid))
            d = score(fork.task, text)
            tree.nodes[lid].reward = float(d["reward"])
            correct.append(float(d.get("correct", 0.0)))
        if not correct:
            continue
        tree.update_stats()
        out.append(Expansion(fork, tree, correct))
    return out
