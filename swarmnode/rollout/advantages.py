"""Advantage estimators over rollout trees (docs/reference/design.md §5, docs/reference/references.md §1 and §2.2).

Every estimator takes a list of :class:`~swarmnode.rollout.tree.RolloutTree` and returns, per tree, a
per-token advantage list for each leaf: the leaf's completion is the concatenation of the segments on its
path, and token ``t`` gets the advantage of the (leaf, segment) that produced it
(:meth:`RolloutTree.token_segments`). Outcome-level estimators (``grpo``, ``mc_grpo``, ``treepo``,
``tree_grpo``) give every token of a leaf the same value; ``treerl`` gives each segment its own value.

Groups
------
A **prompt group** is every leaf of every tree whose group key is equal; the key defaults to
``tree.task.key()`` (the TaskRef), so several trees sampled for the same task form one group. Callers that
must normalize sources separately (ERILS / SAPO per-source processing, docs/reference/design.md §5) either call
:func:`compute_advantages` once per source or pass ``group_key`` (e.g. ``lambda t: t.task.key() + "|peer"``).

A group whose leaf rewards have zero variance (population/unbiased std below ``1e-8``, TRL's
``torch.isclose(std, 0)``; or a single leaf) carries no signal: all its advantages are exactly 0, it is
counted and listed in :attr:`AdvantageResult.zero_variance_groups` so the caller can drop it (DAPO
dynamic sampling), and it is excluded from batch-level statistics that the estimator normalizes with
(``treepo`` whitening), but not from TRL's ``scale_rewards="batch"`` std (TRL includes every reward).

Standard deviations are **unbiased** (Bessel-corrected, ``n-1``), as ``torch.Tensor.std`` used by TRL
(``rewards.view(-1, G).std(dim=1)``) and by verl / Tree-GRPO.

Estimators and ``scale_rewards``
--------------------------------
``scale_rewards`` picks the scope of the scale divisor: ``"group"`` (each prompt group's own statistic),
``"batch"`` (one statistic over every reward in the call), ``"none"`` (no division).

* ``grpo`` (DeepSeekMath GRPO; TRL ``GRPOTrainer._generate_and_score_completions``): all leaves of a prompt
  group are one flat group; ``A = r - mean_group(r)``, then ``/ (std_group + 1e-4)`` (group) or
  ``/ (std_batch + 1e-4)`` (batch, std over all rewards of the call) or nothing (none). Exactly TRL.
* ``mc_grpo`` (MC-GRPO, arXiv 2601.22582, ``grpo_trainer_math.py``): ``A = (r - median) / (MAD + 1e-3)``
  with ``median`` the lower median (``torch.median``) and ``MAD = median(|r - median|)``. The leaf at the
  median position (stable sort by reward, position ``(n-1)//2``) gets advantage 0 and is returned in
  :attr:`AdvantageResult.dropped` (loss mask 0). **Bound:** with binary rewards MAD is often 0 and
  ``1/1e-3 = 1000`` would blow up the step, so when ``MAD == 0`` the scale falls back to the GRPO scale
  ``std + 1e-4`` (for binary rewards this gives ``|A| <= sqrt(n)``), and every advantage is clamped to
  ``[-MC_GRPO_MAX_ABS_ADVANTAGE, +MC_GRPO_MAX_ABS_ADVANTAGE]`` (10). ``batch`` uses the MAD (fallback std)
  of all rewards of the call; ``none`` gives ``r - median``.
* ``treepo`` (TreePO, arXiv 2508.17445; verl ``compute_tree_reinforce_plus_plus_baseline_outcome_advantage``,
  ``average`` mode): ``G_0`` is the prompt group; ``G_j(i)`` (j >= 1) are the leaves under the j-th
  segment of leaf i's path (leaves that share their first j segments with i). ``Â_ij = r_i - mean_{G_j(i)} r``;
  ``j = 0`` always counts, ``j >= 1`` only when ``|G_j(i)| > 1``. ``A_i = mean_j Â_ij``. Then whitening as
  in verl's ``masked_whiten`` (token-weighted: every completion token of a leaf counts, mean and unbiased
  variance, ``(A - mean) / sqrt(var + 1e-8)``): over all tokens of the call (``batch``, the published
  setting), over each prompt group's tokens (``group``), or not at all (``none``).
* ``tree_grpo`` (Tree-GRPO, arXiv 2509.21240, ``ray_trainer_ts.py``): ``A_i = z_prompt(r_i) + z_tree(r_i)``,
  each ``(r - mean) / (std + 1e-6)``. ``z_prompt`` is over all leaves of the prompt group. **Tree level:**
  when several RolloutTrees share a group key, each RolloutTree is one "tree" (Tree-GRPO's m trees per
  prompt); when a prompt group has a single RolloutTree, its "trees" are the subtrees under each root child
  (each root child is one initial chain plus its expansions). A tree with one leaf has ``z_tree = 0``
  (no intra-tree contrast), so on independent group sampling ``tree_grpo`` equals ``grpo`` with eps 1e-6.
  ``batch`` divides both centred terms by the batch std; ``none`` only centres.
* ``treerl`` (TreeRL / EPTree, arXiv 2506.11902, paper formula — not the code's leave-one-out variant,
  see docs/reference/references.md §1.2): ``V(s)`` = mean reward of the leaves under node s; a segment s with parent p gets
  ``((V(s) - V(root)) + (V(s) - V(p))) / sqrt(|L(s)|)`` applied to all its tokens. ``V(root)`` is the mean
  of the whole prompt group; when several RolloutTrees share a prompt, a first-level segment's parent is
  its own tree's root, whose value is that tree's leaf mean. ``group`` / ``batch`` divide every value by
  ``std + 1e-4`` of the group's / call's rewards (the formula is linear in rewards, so this is reward
  scaling); ``none`` is the paper formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import TaskRef

ESTIMATORS = ("grpo", "mc_grpo", "treepo", "tree_grpo", "treerl")
SCALE_REWARDS = ("group", "batch", "none")

GRPO_EPS = 1e-4  # TRL: advantages / (std_rewards + 1e-4)
MC_GRPO_EPS = 1e-3  # MC-GRPO: / (MAD + 1e-3)
MC_GRPO_MAX_ABS_ADVANTAGE = 10.0  # our bound on |A| for mc_grpo (MAD can be ~0 with non-binary rewards)
TREE_GRPO_EPS = 1e-6  # Tree-GRPO / verl grpo: / (std + 1e-6)
WHITEN_EPS = 1e-8  # verl masked_whiten: * rsqrt(var + 1e-8)
ZERO_STD_ATOL = 1e-8  # torch.isclose(std, 0) default atol
STD_FLOOR = 0.1
"""Default floor on the reward spread a group is divided by (config ``train.advantage_std_floor``).

Without it ``(r - mean) / (std + 1e-4)`` turns any tiny reward difference into a full-size advantage:
rewards ``[0.02, 0]`` give ``±0.707`` and ``[0.02, 0, 0, 0]`` give ``+1.5``, as strong as a correct answer
(a farmable partial-credit score, found by an outside attack). With the floor, the divisor is
``max(std, floor) + eps``. For binary rewards the smallest non-zero unbiased std of a group of G leaves is
``sqrt(1/G)`` (one success), so a floor of 0.1 never binds for G < 100 and binary training is unchanged."""


@dataclass
class AdvantageResult:
    """Per-token advantages for every leaf of every tree, plus group statistics.

    Attributes:
        estimator: the estimator name used.
        scale_rewards: the ``scale_rewards`` mode used.
        advantages: one dict per input tree (same order): leaf node id -> per-token advantage list
            (float, length = number of completion tokens of that leaf, ``len(tree.completion_ids(leaf))``).
        dropped: one set per input tree: leaf ids that must not enter the loss (MC-GRPO's median sample).
            Their advantages are 0.
        group_keys: the group key of each input tree.
        zero_variance_groups: keys of prompt groups whose rewards have zero variance (all advantages 0).
        num_groups: number of prompt groups that had at least one leaf.
        num_leaves: number of scored leaves.
        reward_mean / reward_std: mean and unbiased std of all leaf rewards of the call.
        advantage_mean / advantage_std: mean and unbiased std over the completion tokens of leaves that carry
            signal (not dropped, not in a zero-variance group); 0.0 when there are none.
    """

    estimator: str
    scale_rewards: str
    advantages: list[dict[int, list[float]]]
    dropped: list[set[int]]
    group_keys: list[str]
    zero_variance_groups: set[str] = field(default_factory=set)
    num_groups: int = 0
    num_leaves: int = 0
    reward_mean: float = 0.0
    reward_std: float = 0.0
    advantage_mean: float = 0.0
    advantage_std: float = 0.0

    @property
    def num_zero_variance_groups(self) -> int:
        """How many prompt groups had zero reward variance."""
        return len(self.zero_variance_groups)

    def is_zero_variance(self, tree_index: int) -> bool:
        """True if tree ``tree_index`` belongs to a zero-variance group (carries no signal)."""
        return self.group_keys[tree_index] in self.zero_variance_groups

    def stats(self) -> dict[str, float]:
        """Flat metrics for logging (``adv/...`` keys)."""
        return {
            "adv/num_groups": float(self.num_groups),
            "adv/num_zero_variance_groups": float(self.num_zero_variance_groups),
            "adv/frac_zero_variance_groups": (
                self.num_zero_variance_groups / self.num_groups if self.num_groups else 0.0
            ),
            "adv/num_leaves": float(self.num_leaves),
            "adv/num_dropped": float(sum(len(d) for d in self.dropped)),
            "adv/reward_mean": self.reward_mean,
            "adv/reward_std": self.reward_std,
            "adv/advantage_mean": self.advantage_mean,
            "adv/advantage_std": self.advantage_std,
        }


# ------------------------------------------------------------------------------------------ helpers
def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _std(xs: Sequence[float]) -> float:
    """Unbiased standard deviation (``torch.std`` default); 0.0 for fewer than two values."""
    n = len(xs)
    if n < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


def scaled_divisor(scale_rewards: str, group_std: float, batch_std: float, eps: float, floor: float) -> float:
    """The divisor ``scale_rewards`` asks for: :func:`scale_divisor` of the group's std (``"group"``), of the
    batch's (``"batch"``), or 1.0 (``"none"``, TRL's names)."""
    if scale_rewards == "group":
        return scale_divisor(group_std, eps, floor)
    if scale_rewards == "batch":
        return scale_divisor(batch_std, eps, floor)
    return 1.0


def scale_divisor(spread: float, eps: float, floor: float = 0.0) -> float:
    """The divisor of a normalized advantage: ``max(spread, floor) + eps``.

    The one place where every estimator (``grpo``, ``mc_grpo``, ``tree_grpo``, ``treerl``, ``treepo``
    whitening) and the per-source normalization of external groups (:func:`normalize_groups`) turn a reward
    spread (std, MAD) into a divisor, so the floor (``train.advantage_std_floor``, :data:`STD_FLOOR`) holds
    for local and external samples alike.

    Args:
        spread: the group's (or batch's) std or MAD, in reward units (>= 0).
        eps: the estimator's additive epsilon (``GRPO_EPS``, ``MC_GRPO_EPS``, ...).
        floor: the smallest spread divided by (>= 0; 0 disables the floor).

    Raises:
        ValueError: ``floor`` is negative or not finite.
    """
    if not (isinstance(floor, (int, float)) and math.isfinite(floor) and floor >= 0):
        raise ValueError(f"advantage std floor (train.advantage_std_floor) must be a finite float >= 0, got {floor!r}")
    return max(float(spread), float(floor)) + eps


def _lower_median(xs: Sequence[float]) -> float:
    """``torch.median`` semantics: the lower of the two middle values for an even count."""
    s = sorted(xs)
    return s[(len(s) - 1) // 2]


def _mad(xs: Sequence[float]) -> float:
    med = _lower_median(xs)
    return _lower_median([abs(x - med) for x in xs])


@dataclass
class _Leaf:
    tree: int  # index into the input list
    leaf: int  # node id
    reward: float
    n_tokens: int


@dataclass
class _Group:
    key: str
    trees: list[int]
    leaves: list[_Leaf]

    @property
    def rewards(self) -> list[float]:
        return [lf.reward for lf in self.leaves]


def _collect(
    trees: Sequence[RolloutTree], group_key: Callable[[RolloutTree], str],
    reward_bonus: Sequence[Mapping[int, float]] | None = None,
) -> tuple[list[_Group], list[str]]:
    groups: dict[str, _Group] = {}
    keys: list[str] = []
    for ti, tree in enumerate(trees):
        if not isinstance(tree, RolloutTree):
            raise TypeError(f"trees[{ti}] is a {type(tree).__name__}, expected a RolloutTree")
        key = group_key(tree)
        if not isinstance(key, str):
            raise TypeError(f"group_key must return a str, got {type(key).__name__} for trees[{ti}]")
        keys.append(key)
        g = groups.setdefault(key, _Group(key=key, trees=[], leaves=[]))
        g.trees.append(ti)
        for lid in tree.leaves():
            r = tree.nodes[lid].reward
            if r is None:
                raise ValueError(
                    f"leaf {lid} of trees[{ti}] (task {tree.task.key()}) has no reward; "
                    "score every leaf with the task verifier before computing advantages"
                )
            r = float(r) + (float(reward_bonus[ti].get(lid, 0.0)) if reward_bonus is not None else 0.0)
            if not math.isfinite(r):
                raise ValueError(f"leaf {lid} of trees[{ti}] (task {tree.task.key()}) has a non-finite reward {r}")
            g.leaves.append(_Leaf(ti, lid, r, len(tree.completion_ids(lid))))
    return [g for g in groups.values()], keys


def _is_zero_variance(rewards: Sequence[float]) -> bool:
    return len(rewards) < 2 or _std(rewards) <= ZERO_STD_ATOL


def _whiten(values: list[float], weights: list[int], floor: float = 0.0) -> list[float]:
    """verl ``masked_whiten``: token-weighted mean and unbiased variance, ``(x - mean) / sqrt(var + 1e-8)``.

    With ``floor > 0`` the variance is first raised to ``floor**2`` (the std floor of :func:`scale_divisor`)."""
    n = sum(weights)
    if n == 0:
        return list(values)
    mean = sum(v * w for v, w in zip(values, weights)) / n
    if n < 2:
        return [v - mean for v in values]
    var = sum(w * (v - mean) ** 2 for v, w in zip(values, weights)) / (n - 1)
    inv = 1.0 / math.sqrt(max(var, float(floor) ** 2) + WHITEN_EPS)
    return [(v - mean) * inv for v in values]


# ------------------------------------------------------------------------------------------ estimators
def _leaf_level(
    estimator: str,
    scale_rewards: str,
    groups: list[_Group],
    trees: Sequence[RolloutTree],
    zero: set[str],
    dropped: list[set[int]],
    floor: float = 0.0,
) -> dict[tuple[int, int], float]:
    """Per-leaf scalar advantages for the outcome-level estimators."""
    out: dict[tuple[int, int], float] = {}
    all_rewards = [lf.reward for g in groups for lf in g.leaves]
    batch_std = _std(all_rewards)

    if estimator == "grpo":
        for g in groups:
            rs = g.rewards
            m = _mean(rs)
            scale = scaled_divisor(scale_rewards, _std(rs), batch_std, GRPO_EPS, floor)
            for lf in g.leaves:
                out[(lf.tree, lf.leaf)] = 0.0 if g.key in zero else (lf.reward - m) / scale
        return out

    if estimator == "mc_grpo":
        if all_rewards:
            batch_mad = _mad(all_rewards)
            batch_scale = (scale_divisor(batch_mad, MC_GRPO_EPS, floor) if batch_mad > 0
                           else scale_divisor(batch_std, GRPO_EPS, floor))
        else:
            batch_scale = 1.0
        cap = MC_GRPO_MAX_ABS_ADVANTAGE
        for g in groups:
            rs = g.rewards
            order = sorted(range(len(rs)), key=lambda k: rs[k])  # stable: ties keep leaf order
            med_pos = order[(len(rs) - 1) // 2]
            med = rs[med_pos]
            if len(rs) >= 2:
                lf = g.leaves[med_pos]
                dropped[lf.tree].add(lf.leaf)
            if scale_rewards == "group":
                mad = _mad(rs)
                scale = scale_divisor(mad, MC_GRPO_EPS, floor) if mad > 0 else scale_divisor(_std(rs), GRPO_EPS, floor)
            elif scale_rewards == "batch":
                scale = batch_scale
            else:
                scale = 1.0
            for k, lf in enumerate(g.leaves):
                if g.key in zero or k == med_pos:
                    a = 0.0
                else:
                    a = max(-cap, min(cap, (lf.reward - med) / scale))
                out[(lf.tree, lf.leaf)] = a
        return out

    if estimator == "treepo":
        raw: dict[tuple[int, int], float] = {}
        reward_of = {(lf.tree, lf.leaf): lf.reward for g in groups for lf in g.leaves}
        for g in groups:
            m0 = _mean(g.rewards)
            for lf in g.leaves:
                tree = trees[lf.tree]
                terms = [lf.reward - m0]
                for nid in tree.path(lf.leaf)[:-1]:  # j = 1 .. k-1 (the leaf itself is a singleton)
                    sub = tree.leaves_under(nid)
                    if len(sub) > 1:
                        terms.append(lf.reward - _mean([reward_of[(lf.tree, s)] for s in sub]))
                raw[(lf.tree, lf.leaf)] = 0.0 if g.key in zero else _mean(terms)
        live = [g for g in groups if g.key not in zero]
        if scale_rewards == "none":
            return raw
        scopes = [live] if scale_rewards == "batch" else [[g] for g in live]
        out = {k: 0.0 for k in raw}
        for scope in scopes:
            ids = [(lf.tree, lf.leaf) for g in scope for lf in g.leaves]
            w = [lf.n_tokens for g in scope for lf in g.leaves]
            for k, v in zip(ids, _whiten([raw[k] for k in ids], w, floor)):
                out[k] = v
        return out

    if estimator == "tree_grpo":
        for g in groups:
            rs = g.rewards
            s_prompt = scaled_divisor(scale_rewards, _std(rs), batch_std, TREE_GRPO_EPS, floor)
            m_prompt = _mean(rs)
            # tree level: each RolloutTree when several share the key, else the subtrees under root children
            tree_of: dict[tuple[int, int], tuple[int, int]] = {}
            if len(g.trees) > 1:
                for lf in g.leaves:
                    tree_of[(lf.tree, lf.leaf)] = (lf.tree, 0)
            else:
                for lf in g.leaves:
                    tree_of[(lf.tree, lf.leaf)] = (lf.tree, trees[lf.tree].path(lf.leaf)[0])
            members: dict[tuple[int, int], list[float]] = {}
            for lf in g.leaves:
                members.setdefault(tree_of[(lf.tree, lf.leaf)], []).append(lf.reward)
            for lf in g.leaves:
                if g.key in zero:
                    out[(lf.tree, lf.leaf)] = 0.0
                    continue
                trs = members[tree_of[(lf.tree, lf.leaf)]]
                if len(trs) < 2:
                    z_tree = 0.0
                else:
                    s_tree = scaled_divisor(scale_rewards, _std(trs), batch_std, TREE_GRPO_EPS, floor)
                    z_tree = (lf.reward - _mean(trs)) / s_tree
                out[(lf.tree, lf.leaf)] = (lf.reward - m_prompt) / s_prompt + z_tree
        return out

    raise AssertionError(estimator)  # pragma: no cover


def _treerl_segment_values(
    scale_rewards: str, groups: list[_Group], trees: Sequence[RolloutTree], zero: set[str], floor: float = 0.0
) -> dict[int, dict[int, float]]:
    """TreeRL per-segment values: tree index -> node id -> value."""
    all_rewards = [lf.reward for g in groups for lf in g.leaves]
    batch_std = _std(all_rewards)
    leaf_reward = {(lf.tree, lf.leaf): lf.reward for g in groups for lf in g.leaves}
    values: dict[int, dict[int, float]] = {}
    for g in groups:
        rs = g.rewards
        v_root = _mean(rs)
        scale = scaled_divisor(scale_rewards, _std(rs), batch_std, GRPO_EPS, floor)
        for ti in g.trees:
            tree = trees[ti]
            # V(s) and |L(s)| from the leaf rewards (independent of TreeNode.update_stats having run)
            rsum = [0.0] * len(tree.nodes)
            cnt = [0] * len(tree.nodes)
            for lid in tree.leaves():
                r = leaf_reward[(ti, lid)]
                cur: int | None = lid
                while cur is not None:
                    rsum[cur] += r
                    cnt[cur] += 1
                    cur = tree.nodes[cur].parent
            vals: dict[int, float] = {}
            for node in tree.nodes[1:]:
                s = node.node_id
                if g.key in zero or cnt[s] == 0:
                    vals[s] = 0.0
                    continue
                v_s = rsum[s] / cnt[s]
                p = node.parent
                v_p = rsum[p] / cnt[p] if cnt[p] else v_root
                vals[s] = ((v_s - v_root) + (v_s - v_p)) / math.sqrt(cnt[s]) / scale
            values[ti] = vals
    return values


def compute_advantages(
    trees: Sequence[RolloutTree],
    estimator: str,
    scale_rewards: str = "group",
    group_key: Callable[[RolloutTree], str] | None = None,
    std_floor: float = STD_FLOOR,
    reward_bonus: Sequence[Mapping[int, float]] | None = None,
) -> AdvantageResult:
    """Turn scored rollout trees into per-token advantages.

    Args:
        trees: rollout trees whose leaves all carry a verified ``reward`` (float). Trees with the same
            group key (default: same TaskRef) form one prompt group. A tree without leaves contributes nothing.
        estimator: one of ``ESTIMATORS``: ``"grpo"``, ``"mc_grpo"``, ``"treepo"``, ``"tree_grpo"``, ``"treerl"``
            (formulas and sources in the module docstring).
        scale_rewards: ``"group"``, ``"batch"`` or ``"none"``: the scope of the scale divisor (module docstring).
        group_key: maps a tree to its group key; default ``tree.task.key()``.
        std_floor: the smallest reward spread (std or MAD) an advantage is divided by (config
            ``train.advantage_std_floor``; :data:`STD_FLOOR`; 0 = TRL's formula exactly). See :func:`scale_divisor`.
        reward_bonus: optional, one mapping per tree (same order): leaf id -> a number added to that leaf's
            reward for this computation only (a process reward, ``train.step_reward_weight``); the leaves'
            stored rewards are not changed. Missing leaves add 0. Groups, zero variance and the reward
            statistics all use the sum.

    Returns:
        :class:`AdvantageResult` with per-tree ``{leaf id: [advantage per completion token]}``, the dropped
        leaves, the zero-variance groups and summary statistics.

    Raises:
        ValueError: unknown ``estimator`` / ``scale_rewards``; a leaf without a reward or with a non-finite one;
            a negative ``std_floor``.
        TypeError: an element of ``trees`` is not a RolloutTree.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; expected one of {', '.join(ESTIMATORS)}")
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}; expected one of {', '.join(SCALE_REWARDS)}")
    scale_divisor(0.0, 0.0, std_floor)  # validates the floor
    keyf = group_key or (lambda t: t.task.key())
    if reward_bonus is not None and len(reward_bonus) != len(trees):
        raise ValueError(f"reward_bonus has {len(reward_bonus)} entries for {len(trees)} trees")
    groups, keys = _collect(trees, keyf, reward_bonus)
    groups = [g for g in groups if g.leaves]
    zero = {g.key for g in groups if _is_zero_variance(g.rewards)}
    dropped: list[set[int]] = [set() for _ in trees]
    advantages: list[dict[int, list[float]]] = [{} for _ in trees]

    if estimator == "treerl":
        seg = _treerl_segment_values(scale_rewards, groups, trees, zero, std_floor)
        for g in groups:
            for lf in g.leaves:
                vals = seg[lf.tree]
                advantages[lf.tree][lf.leaf] = [vals[s] for s in trees[lf.tree].token_segments(lf.leaf)]
    else:
        leaf_adv = _leaf_level(estimator, scale_rewards, groups, trees, zero, dropped, std_floor)
        for g in groups:
            for lf in g.leaves:
                advantages[lf.tree][lf.leaf] = [leaf_adv[(lf.tree, lf.leaf)]] * lf.n_tokens

    all_rewards = [lf.reward for g in groups for lf in g.leaves]
    tok = [
        a
        for g in groups
        if g.key not in zero
        for lf in g.leaves
        if lf.leaf not in dropped[lf.tree]
        for a in advantages[lf.tree][lf.leaf]
    ]
    return AdvantageResult(
        estimator=estimator,
        scale_rewards=scale_rewards,
        advantages=advantages,
        dropped=dropped,
        group_keys=keys,
        zero_variance_groups=zero,
        num_groups=len(groups),
        num_leaves=len(all_rewards),
        reward_mean=_mean(all_rewards),
        reward_std=_std(all_rewards),
        advantage_mean=_mean(tok),
        advantage_std=_std(tok),
    )


# ------------------------------------------------------------------------------------------ per source
ADV_EPS = GRPO_EPS
"""Added to the (floored) std in ``A = (r - mean) / (max(std, floor) + ADV_EPS)`` for external groups."""


def _local_rewards_for(local_rewards_by_task: Mapping[Any, Sequence[float]] | None, task: TaskRef) -> list[float]:
    if not local_rewards_by_task:
        return []
    vals = local_rewards_by_task.get(task.key())
    if vals is None:
        vals = local_rewards_by_task.get(task)  # type: ignore[call-overload]
    if vals is None:
        return []
    out = [float(v) for v in vals]
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"local_rewards_by_task[{task.key()!r}] holds a non-finite reward")
    return out


def source_advantages(
    groups: Mapping[str, Sequence[float]],
    pools: Mapping[str, Sequence[float]] | None = None,
    scale_rewards: str = "group",
    std_floor: float = STD_FLOOR,
) -> dict[str, list[float]]:
    """Source-specific normalization of external groups (ERILS arXiv 2608.01717; SAPO arXiv 2509.08721).

    For each group key ``g`` with leaf rewards ``groups[g]``: ``A_i = (r_i - mean(P_g)) / d`` where ``P_g`` is
    ``pools[g]`` when given (``joint``: the group's rewards plus the local rewards of the task, LUFFY's
    advantage) and otherwise ``groups[g]`` itself (``per_source``). The divisor ``d`` is
    :func:`scale_divisor` of the unbiased std of ``P_g`` (``scale_rewards="group"``) or of every pool
    of the call together (``"batch"``, TRL's batch scaling), with ``ADV_EPS`` and the floor ``std_floor``
    (config ``train.advantage_std_floor``); ``"none"`` only centres. The same divisor as the local
    estimators, so a peer's 0.02 vs 0 is no stronger than ours.

    Args:
        groups: group key -> rewards (floats, finite) in leaf order.
        pools: optional group key -> the pool its statistics come from.
        scale_rewards: ``"group"``, ``"batch"`` or ``"none"``.
        std_floor: see :func:`scale_divisor`.

    Returns:
        group key -> advantages (one float per reward, same order).

    Raises:
        ValueError: unknown ``scale_rewards``, a non-finite reward, a negative floor.
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}; expected one of {', '.join(SCALE_REWARDS)}")
    scale_divisor(0.0, 0.0, std_floor)
    pool_of = {g: list(pools[g]) if pools is not None and g in pools else list(rs) for g, rs in groups.items()}
    for g, p in pool_of.items():
        if not all(math.isfinite(float(r)) for r in p) or not all(math.isfinite(float(r)) for r in groups[g]):
            raise ValueError(f"group {g!r} holds a non-finite reward")
    batch_std = _std([r for p in pool_of.values() for r in p])
    out: dict[str, list[float]] = {}
    for g, rs in groups.items():
        p = pool_of[g]
        mean = _mean(p)
        d = scaled_divisor(scale_rewards, _std(p), batch_std, ADV_EPS, std_floor)
        out[g] = [(float(r) - mean) / d for r in rs]
    return out


def joint_task_stats(
    selected: Sequence[PeerTree],
    local_rewards_by_task: Mapping[Any, Sequence[float]] | None,
) -> dict[str, tuple[float, float, int]]:
    """Pooled reward statistics per task for ``joint`` normalization (ablation only).

    For each task key present in ``selected``: the pool is every leaf reward of every selected external
    tree of that task (all peers) plus ``local_rewards_by_task[task]``. Use it to normalize the *local*
    leaves with the same statistics when running the joint ablation end to end.

    Returns:
        ``{task_key: (mean, unbiased std, pool size)}``.
    """
    pools: dict[str, list[float]] = {}
    tasks: dict[str, TaskRef] = {}
    for ext in selected:
        pools.setdefault(ext.task_key, []).extend(ext.rewards())
        tasks[ext.task_key] = ext.tree.task
    out = {}
    for key, pool in pools.items():
        full = pool + _local_rewards_for(local_rewards_by_task, tasks[key])
        out[key] = (_mean(full), _std(full), len(full))
    return out
