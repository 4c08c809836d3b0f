"""Pruned subtrees: what a node publishes of each rollout tree (docs/reference/design.md §1 step 4; issue "The swarm").

A receiver learns from *contrast* -- leaves of one prompt whose rewards differ -- not from bulk (SAPO
drops zero-advantage rollouts before sharing them; TreePO/LATR prune near-duplicate branches). Each
scored tree is therefore cut down before it goes on the wire by :func:`prune_tree` with a
:class:`PruneRule`:

1. **eligible leaves**: scored leaves (``reward`` set), minus leaves the sampler already cut as
   near-duplicates of a sibling (``finish_reason == "pruned"``, LATR's lookahead filter) unless the rule
   keeps them;
2. **no contrast, no publication**: if the eligible rewards have zero variance
   (``max - min <= ZERO_VARIANCE_ATOL``) the tree is not published at all (its GRPO advantages are all 0);
3. **non-zero advantage**: a leaf is kept only if ``|r_i - mean(r)| > min_abs_advantage`` with the mean
   over the eligible leaves (GRPO's group baseline; with binary rewards and variance every leaf passes);
4. **near-duplicates**: of several kept leaves with the same completion text (or, with ``similarity``
   set, a text whose ``difflib`` ratio to an already kept leaf of the same reward is >= ``similarity``)
   only the first in node order survives;
5. **cap**: at most ``max_leaves`` leaves, taken alternately from the highest and the lowest advantages
   (ties in node order), so the published group keeps both sides of the contrast;
6. **subtree**: the published tree holds the root, the kept leaves and every ancestor of a kept leaf, in
   the original node order (parents stay before children); inner nodes carry no finish reason, every
   kept leaf keeps its own -- exactly what the wire format requires (protocol/SPEC.md §5.1). If fewer than
   two distinct rewards survive, nothing is published.

Rewards on the published leaves are the publisher's verified rewards (the wire calls them *claims*; every
receiver re-scores them). Nothing here touches the network or bytes.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Iterable

from swarmnode.rollout.tree import RolloutTree

__all__ = ["ZERO_VARIANCE_ATOL", "PruneRule", "PruneStats", "prune_tree", "prune_trees", "subtree_with_leaves"]

ZERO_VARIANCE_ATOL = 1e-8
"""Eligible rewards whose ``max - min`` is at most this have zero variance (same threshold as the advantage
estimators and ``train.external``)."""


@dataclass(frozen=True)
class PruneRule:
    """How a tree is pruned before publication (see the module docstring for the order of the steps).

    Attributes:
        max_leaves: most leaves published per tree (int >= 2: a contrast needs two).
        min_abs_advantage: a leaf is kept when ``|r - mean| > min_abs_advantage`` (float >= 0).
        similarity: ``None`` drops exact duplicates only (same completion text); a float in (0, 1] also drops a
            leaf whose ``difflib.SequenceMatcher`` ratio to a kept leaf *with the same reward* is >= it.
        keep_sampler_pruned: keep leaves the sampler cut as near-duplicates (``finish_reason == "pruned"``).

    Raises:
        ValueError: a field outside its range.
    """

    max_leaves: int = 8
    min_abs_advantage: float = 1e-6
    similarity: float | None = None
    keep_sampler_pruned: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_leaves, bool) or not isinstance(self.max_leaves, int) or self.max_leaves < 2:
            raise ValueError(f"PruneRule.max_leaves must be an int >= 2 (a contrast needs two leaves), "
                             f"got {self.max_leaves!r}")
        if not (isinstance(self.min_abs_advantage, (int, float)) and math.isfinite(self.min_abs_advantage)
                and self.min_abs_advantage >= 0):
            raise ValueError(f"PruneRule.min_abs_advantage must be a finite number >= 0, "
                             f"got {self.min_abs_advantage!r}")
        if self.similarity is not None and not (isinstance(self.similarity, (int, float)) and 0 < self.similarity <= 1):
            raise ValueError(f"PruneRule.similarity must be None or in (0, 1], got {self.similarity!r}")


@dataclass
class PruneStats:
    """Counters over the trees given to :func:`prune_trees` (all ints).

    Attributes:
        trees_in / trees_out: trees offered / published.
        zero_variance_trees: trees not published because their eligible rewards are all equal (or because
            fewer than two distinct rewards survived pruning).
        leaves_in / leaves_out: leaves offered / published.
        dropped_unscored: leaves without a reward.
        dropped_sampler_pruned: leaves the sampler had cut as near-duplicates.
        dropped_zero_advantage: leaves at the group mean.
        dropped_duplicate: near-duplicate (or identical) completions.
        dropped_cap: leaves beyond ``max_leaves``.
    """

    trees_in: int = 0
    trees_out: int = 0
    zero_variance_trees: int = 0
    leaves_in: int = 0
    leaves_out: int = 0
    dropped_unscored: int = 0
    dropped_sampler_pruned: int = 0
    dropped_zero_advantage: int = 0
    dropped_duplicate: int = 0
    dropped_cap: int = 0

    def as_metrics(self, prefix: str = "swarm/prune/") -> dict[str, int]:
        """The counters as a flat metrics dict (``{prefix}{name}: int``)."""
        return {f"{prefix}{k}": v for k, v in self.__dict__.items() if isinstance(v, int)}


def subtree_with_leaves(tree: RolloutTree, leaves: Iterable[int]) -> RolloutTree:
    """``tree.subtree(leaves)``: the root, the given leaves and their ancestors (see :meth:`RolloutTree.subtree`).

    Raises:
        ValueError: an id is not a leaf of ``tree`` (or is the root).
    """
    return tree.subtree(leaves)


def _similar(a: str, b: str, threshold: float) -> bool:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() >= threshold


def prune_tree(tree: RolloutTree, rule: PruneRule | None = None, stats: PruneStats | None = None) -> RolloutTree | None:
    """The publishable subtree of a scored tree, or ``None`` when it carries no contrast.

    Args:
        tree: a scored rollout tree (leaf ``reward`` set by the node's verifier).
        rule: the :class:`PruneRule` (default ``PruneRule()``).
        stats: counters to update (optional).

    Returns:
        A new :class:`RolloutTree` (the input is not modified) with 2..``rule.max_leaves`` leaves and at least
        two distinct rewards, or ``None``.
    """
    rule = rule or PruneRule()
    st = stats if stats is not None else PruneStats()
    st.trees_in += 1
    all_leaves = tree.leaves()
    st.leaves_in += len(all_leaves)
    eligible: list[int] = []
    for lid in all_leaves:
        n = tree.nodes[lid]
        if n.reward is None or not math.isfinite(float(n.reward)) or n.finish_reason is None:
            st.dropped_unscored += 1
        elif n.finish_reason == "pruned" and not rule.keep_sampler_pruned:
            st.dropped_sampler_pruned += 1
        else:
            eligible.append(lid)
    rewards = {lid: float(tree.nodes[lid].reward) for lid in eligible}  # type: ignore[arg-type]
    if len(eligible) < 2 or max(rewards.values()) - min(rewards.values()) <= ZERO_VARIANCE_ATOL:
        st.zero_variance_trees += 1
        return None
    mean = sum(rewards.values()) / len(rewards)
    adv = {lid: r - mean for lid, r in rewards.items()}
    kept = [lid for lid in eligible if abs(adv[lid]) > rule.min_abs_advantage]
    st.dropped_zero_advantage += len(eligible) - len(kept)
    # near-duplicates: the first leaf (node order) of identical / similar completions survives
    texts = {lid: tree.completion_text(lid) for lid in kept}
    unique: list[int] = []
    seen_text: set[str] = set()
    for lid in kept:
        t = texts[lid]
        dup = t in seen_text
        if not dup and rule.similarity is not None:
            dup = any(rewards[k] == rewards[lid] and _similar(texts[k], t, rule.similarity) for k in unique)
        if dup:
            st.dropped_duplicate += 1
            continue
        seen_text.add(t)
        unique.append(lid)
    # cap: alternate the highest and the lowest advantages so both sides of the contrast survive
    if len(unique) > rule.max_leaves:
        pos = sorted((lid for lid in unique if adv[lid] > 0), key=lambda lid: (-adv[lid], lid))
        neg = sorted((lid for lid in unique if adv[lid] < 0), key=lambda lid: (adv[lid], lid))
        chosen: list[int] = []
        while len(chosen) < rule.max_leaves and (pos or neg):
            for side in (pos, neg):
                if side and len(chosen) < rule.max_leaves:
                    chosen.append(side.pop(0))
        st.dropped_cap += len(unique) - len(chosen)
        unique = sorted(chosen)
    if len({rewards[lid] for lid in unique}) < 2:
        st.zero_variance_trees += 1
        return None
    out = subtree_with_leaves(tree, unique)
    st.trees_out += 1
    st.leaves_out += len(unique)
    return out


def prune_trees(trees: Iterable[RolloutTree], rule: PruneRule | None = None) -> tuple[list[RolloutTree], PruneStats]:
    """:func:`prune_tree` over several trees; returns the published trees (input order) and the counters."""
    st = PruneStats()
    out = [p for p in (prune_tree(t, rule, st) for t in trees) if p is not None]
    return out, st
