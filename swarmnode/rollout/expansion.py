"""Cross-node tree expansion: continue a peer's promising prefix with our own policy (docs/swarm.md).

A peer's tree tells us where its policy's outcomes split: an inner node whose subtree holds both right and
wrong leaves (by OUR re-scores) is a *fork* -- the step that decides. We take the prefix up to that node
(root -> node, the peer's tokens, re-verified) as context and sample ``num_generations`` continuations from
it with our own policy under **our own prompt** for the TaskRef. The new leaves share one prefix and differ
from the fork on, so their group has contrast exactly at the step that matters.

What is trained (the simplest sound choice, docs/swarm.md "Cross-node tree expansion"):

* the peer's prefix is **context only**: it becomes part of the prompt of the new samples, so no loss, no
  ratio and no behaviour log-prob of another policy is ever involved;
* the tokens after the fork are ours: sampled by our policy at our current version, with our behaviour
  log-probs; they train as on-policy (``local``) samples;
* every new leaf is scored by our verifier on the whole completion the model produced for the task -- the
  prefix's text followed by our continuation, decoded from the ids;
* only trees that passed the verification pipeline (``PeerTree.verified``, every check of docs/design.md §6,
  leaves re-scored by us) are expanded, only for tasks our training stream can produce, and expanded trees
  are never published (their prompt carries another node's tokens).

Entry points: :func:`find_forks` (one tree), :func:`select_forks` (this step's candidates),
:func:`fork_prompt` and :func:`expand_forks` (sample and score through callables the node hands in, so this
module stays free of ``policy/``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from swarmnode.config import SamplingConfig
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.sampler import PromptSpec
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import TaskRef

__all__ = ["Fork", "Expansion", "find_forks", "select_forks", "fork_prompt", "continuation_config", "expand_forks"]

ANSWER_CLOSE = "</answer>"


@dataclass(frozen=True)
class Fork:
    """A promising prefix of a re-verified peer tree.

    Attributes:
        peer: the :class:`PeerTree` it comes from (``verified`` is True).
        node_id: the inner node the prefix ends at (not the root, not a leaf).
        prefix_ids: token ids root -> node (the peer's, in our vocabulary), ``len >= 1``.
        prefix_text: their text (the verified segment texts).
        leaves: leaves under the node in the peer tree (>= 2).
        mean_reward / reward_var: mean and population variance of those leaves' rewards (our re-scores);
            ``reward_var > 0`` (mixed outcomes).
    """

    peer: PeerTree
    node_id: int
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


def find_forks(peer: PeerTree, *, max_prefix_tokens: int | None = None) -> list[Fork]:
    """The forks of one peer tree: inner nodes whose leaves have different rewards (our re-scores).

    Args:
        peer: a :class:`PeerTree`; an unverified one (``peer.verified`` False) has no forks.
        max_prefix_tokens: longest prefix allowed (tokens); ``None`` = no limit.

    Returns:
        Forks, best first: highest reward variance under the node, then the longer prefix (the later the
        fork, the more specific the step), then node id. A prefix whose text already holds a closed answer
        tag is no fork. Never raises on a malformed tree (it has no forks).
    """
    if not isinstance(peer, PeerTree) or not peer.verified:
        return []
    tree = peer.tree
    out: list[Fork] = []
    try:
        for node in tree.nodes[1:]:
            if node.is_leaf or not node.children:
                continue
            rewards = [tree.nodes[lid].reward for lid in tree.leaves_under(node.node_id)]
            if len(rewards) < 2 or any(r is None or not math.isfinite(float(r)) for r in rewards):
                continue
            rs = [float(r) for r in rewards]
            mean = sum(rs) / len(rs)
            var = sum((r - mean) ** 2 for r in rs) / len(rs)
            if var <= 0:
                continue
            path = tree.path(node.node_id)
            ids = tuple(int(t) for nid in path for t in tree.nodes[nid].token_ids)
            text = "".join(tree.nodes[nid].text for nid in path)
            if not ids or ANSWER_CLOSE in text:
                continue
            if max_prefix_tokens is not None and len(ids) > max_prefix_tokens:
                continue
            out.append(Fork(peer, node.node_id, ids, text, len(rs), mean, var))
    except (IndexError, ValueError, TypeError):
        return []
    out.sort(key=lambda f: (-f.reward_var, -len(f.prefix_ids), f.node_id))
    return out


def select_forks(
    candidates: Iterable[PeerTree],
    max_forks: int,
    *,
    max_prefix_tokens: int | None = None,
    accept_task: Callable[[TaskRef], bool] | None = None,
    exclude_peers: Iterable[str] = (),
) -> list[Fork]:
    """This step's forks: at most one per peer tree, the best ones across trees, at most ``max_forks``.

    Args:
        candidates: this step's peer trees (``SwarmHook.gather``); unverified ones are skipped.
        max_forks: how many (int >= 0).
        max_prefix_tokens: as :func:`find_forks`.
        accept_task: a predicate on the TaskRef (the node passes ``TaskMix.contains``: a task our training
            stream can produce, never a held-out one); ``None`` accepts all.
        exclude_peers: peer ids whose trees are not expanded (e.g. those the likelihood screen rejected).

    Returns:
        Forks ordered by reward variance, prefix length, then peer id, digest and node id (deterministic for
        the same candidates).
    """
    skip = set(exclude_peers)
    best: list[Fork] = []
    for pt in candidates:
        if not isinstance(pt, PeerTree) or not pt.verified or pt.peer_id in skip:
            continue
        if accept_task is not None and not accept_task(pt.tree.task):
            continue
        forks = find_forks(pt, max_prefix_tokens=max_prefix_tokens)
        if forks:
            best.append(forks[0])
    best.sort(key=lambda f: (-f.reward_var, -len(f.prefix_ids), f.peer.peer_id, f.peer.digest, f.node_id))
    return best[: max(0, int(max_forks))]


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
