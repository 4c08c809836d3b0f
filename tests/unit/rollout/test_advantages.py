"""Advantage estimators vs hand-computed values (every estimator, every scale_rewards)."""

from __future__ import annotations

import math

import pytest
import torch

from swarmnode.rollout.advantages import AdvantageResult, compute_advantages
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import TaskRef
from swarmnode.train.batch import samples_from_trees


def ref(i: int) -> TaskRef:
    return TaskRef("rg:test", "0123456789abcdef", 0, i)


def group_tree(i: int, rewards: list[float], lengths: list[int] | None = None, prompt=(1, 2, 3)) -> RolloutTree:
    lengths = lengths or [2] * len(rewards)
    comps = [[10 + k] * n for k, n in enumerate(lengths)]
    t = RolloutTree.from_group(ref(i), list(prompt), comps)
    for lid, r in zip(t.leaves(), rewards):
        t.nodes[lid].reward = r
    return t


def branching_tree(i: int = 0) -> tuple[RolloutTree, dict[str, int]]:
    """root -> a [1,2] -> {a1 [3]: r=1, a2 [4,5]: r=0};  root -> b [6] -> {b1 [7]: r=1, b2 [8]: r=1}."""
    t = RolloutTree(task=ref(i), prompt_ids=[1, 2, 3])
    a = t.add_child(0, [1, 2])
    a1 = t.add_child(a, [3], finish_reason="eos")
    a2 = t.add_child(a, [4, 5], finish_reason="eos")
    b = t.add_child(0, [6])
    b1 = t.add_child(b, [7], finish_reason="eos")
    b2 = t.add_child(b, [8], finish_reason="eos")
    for lid, r in ((a1, 1.0), (a2, 0.0), (b1, 1.0), (b2, 1.0)):
        t.nodes[lid].reward = r
    return t, dict(a=a, a1=a1, a2=a2, b=b, b1=b1, b2=b2)


def leaf_values(res: AdvantageResult, ti: int, tree: RolloutTree) -> list[float]:
    out = []
    for lid in tree.leaves():
        toks = res.advantages[ti][lid]
        assert len(toks) == len(tree.completion_ids(lid))
        assert all(x == toks[0] for x in toks)
        out.append(toks[0])
    return out


SQRT_1_3 = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]


# ------------------------------------------------------------------------------------------ grpo
def grpo_batch():
    return [
        group_tree(0, [1, 0, 0, 1], lengths=[2, 3, 1, 2]),
        group_tree(1, [1, 1, 1]),  # zero variance
        group_tree(2, [0.0, 0.5, 1.0]),
    ]


def test_grpo_group_scale():
    trees = grpo_batch()
    res = compute_advantages(trees, "grpo", "group")
    a = 0.5 / (SQRT_1_3 + 1e-4)  # mean .5, unbiased std sqrt(1/3)
    assert leaf_values(res, 0, trees[0]) == pytest.approx([a, -a, -a, a], abs=1e-12)
    assert leaf_values(res, 1, trees[1]) == [0.0, 0.0, 0.0]
    c = 0.5 / (0.5 + 1e-4)  # mean .5, unbiased std of [0,.5,1] = .5
    assert leaf_values(res, 2, trees[2]) == pytest.approx([-c, 0.0, c], abs=1e-12)
    assert res.num_groups == 3 and res.num_zero_variance_groups == 1
    assert res.zero_variance_groups == {ref(1).key()}
    assert res.is_zero_variance(1) and not res.is_zero_variance(0)
    assert res.num_leaves == 10
    assert res.reward_mean == pytest.approx(0.65)
    assert res.reward_std == pytest.approx(math.sqrt(0.225))  # sum sq dev 2.025 / 9
    # per-token lengths follow the leaves
    assert [len(res.advantages[0][lid]) for lid in trees[0].leaves()] == [2, 3, 1, 2]
    assert res.stats()["adv/frac_zero_variance_groups"] == pytest.approx(1 / 3)


def test_grpo_batch_scale():
    trees = grpo_batch()
    res = compute_advantages(trees, "grpo", "batch")
    s = math.sqrt(0.225) + 1e-4  # unbiased std of all 10 rewards (hand: mean .65, sum sq dev 2.025)
    assert leaf_values(res, 0, trees[0]) == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s], abs=1e-12)
    assert leaf_values(res, 1, trees[1]) == [0.0, 0.0, 0.0]
    assert leaf_values(res, 2, trees[2]) == pytest.approx([-0.5 / s, 0.0, 0.5 / s], abs=1e-12)


def test_grpo_no_scale():
    trees = grpo_batch()
    res = compute_advantages(trees, "grpo", "none")
    assert leaf_values(res, 0, trees[0]) == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert leaf_values(res, 2, trees[2]) == pytest.approx([-0.5, 0.0, 0.5])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_matches_trl_formula(scale):
    """Equal-size groups: identical to TRL's tensor code (view(-1, G), torch.std, + 1e-4)."""
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 3, (5, 6), generator=g).double() / 2
    trees = [group_tree(i, rewards[i].tolist()) for i in range(5)]
    res = compute_advantages(trees, "grpo", scale)
    r = rewards.view(-1)
    G = 6
    adv = r - r.view(-1, G).mean(1).repeat_interleave(G)
    std = r.view(-1, G).std(1).repeat_interleave(G) if scale != "batch" else r.std().expand_as(r)
    if scale != "none":
        adv = adv / (std + 1e-4)
    ours = torch.tensor([x for i, t in enumerate(trees) for x in leaf_values(res, i, t)], dtype=torch.float64)
    assert torch.allclose(ours, adv, atol=1e-12)


def test_trees_sharing_a_task_form_one_group():
    t1 = group_tree(0, [1, 0])
    t2 = group_tree(0, [0, 0])  # same TaskRef
    res = compute_advantages([t1, t2], "grpo", "none")
    assert res.num_groups == 1
    assert leaf_values(res, 0, t1) == pytest.approx([0.75, -0.25])
    assert leaf_values(res, 1, t2) == pytest.approx([-0.25, -0.25])
    # a custom group key separates them (per-source normalization)
    res2 = compute_advantages([t1, t2], "grpo", "none", group_key=lambda t: t.task.key() + str(id(t)))
    assert res2.num_groups == 2 and res2.num_zero_variance_groups == 1
    assert leaf_values(res2, 0, t1) == pytest.approx([0.5, -0.5])


def test_single_leaf_group_is_zero_variance():
    t = group_tree(0, [1.0])
    res = compute_advantages([t], "grpo", "group")
    assert res.num_zero_variance_groups == 1
    assert leaf_values(res, 0, t) == [0.0]


# ------------------------------------------------------------------------------------------ mc_grpo
def test_mc_grpo_group_mad():
    t = group_tree(0, [0.2, 0.9, 0.5, 0.4, 0.7])
    res = compute_advantages([t], "mc_grpo", "group")
    # sorted .2 .4 .5 .7 .9 -> median .5 (leaf #2); |r-.5| = .3 .4 0 .1 .2 -> MAD .2; scale .201
    s = 0.2 + 1e-3
    assert leaf_values(res, 0, t) == pytest.approx([-0.3 / s, 0.4 / s, 0.0, -0.1 / s, 0.2 / s], abs=1e-12)
    assert res.dropped[0] == {t.leaves()[2]}


def test_mc_grpo_binary_mad_zero_falls_back_to_std():
    t = group_tree(0, [0, 0, 0, 1, 1])
    res = compute_advantages([t], "mc_grpo", "group")
    # median 0 (sorted position 2 = leaf #2), MAD = median(0,0,0,1,1) = 0 -> scale = unbiased std + 1e-4
    s = math.sqrt(0.3) + 1e-4  # mean .4, sum sq dev 1.2, /4
    assert leaf_values(res, 0, t) == pytest.approx([0, 0, 0, 1 / s, 1 / s], abs=1e-12)
    assert res.dropped[0] == {t.leaves()[2]}
    assert max(abs(v) for v in leaf_values(res, 0, t)) < 2  # bounded, not 1/1e-3


def test_mc_grpo_even_group_lower_median_and_clamp():
    t = group_tree(0, [0, 1, 1, 0])
    res = compute_advantages([t], "mc_grpo", "group")
    # stable sort: leaves 0,3 (r=0), 1,2 (r=1); position (4-1)//2 = 1 -> leaf #3 dropped, median 0
    s = SQRT_1_3 + 1e-4  # MAD of [0,1,1,0] around 0 = lower median(0,0,1,1) = 0 -> std fallback
    assert leaf_values(res, 0, t) == pytest.approx([0, 1 / s, 1 / s, 0], abs=1e-12)
    assert res.dropped[0] == {t.leaves()[3]}
    # tiny positive MAD with an outlier: (1 - .02) / (.01 + .001) = 89 -> clamped at 10
    t2 = group_tree(1, [0.0, 0.01, 0.02, 0.03, 1.0])
    res2 = compute_advantages([t2], "mc_grpo", "group", std_floor=0.0)  # the clamp, without the floor
    vals = leaf_values(res2, 0, t2)
    assert vals[4] == 10.0
    assert vals[0] == pytest.approx(-0.02 / 0.011)
    # with the default floor (0.1) the MAD 0.01 is raised to 0.1: (1 - .02) / (.1 + .001), no clamp needed
    floored = leaf_values(compute_advantages([t2], "mc_grpo", "group"), 0, t2)
    assert floored[4] == pytest.approx(0.98 / 0.101)


def test_mc_grpo_batch_and_none():
    t1 = group_tree(0, [0.2, 0.9, 0.5, 0.4, 0.7])
    t2 = group_tree(1, [0.0, 1.0, 1.0])
    res = compute_advantages([t1, t2], "mc_grpo", "none")
    assert leaf_values(res, 0, t1) == pytest.approx([-0.3, 0.4, 0.0, -0.1, 0.2])
    # t2: sorted (0, 1, 1) -> position 1 = leaf #1 (r=1) dropped, median 1
    assert leaf_values(res, 1, t2) == pytest.approx([-1.0, 0.0, 0.0])
    assert res.dropped[1] == {t2.leaves()[1]}
    res_b = compute_advantages([t1, t2], "mc_grpo", "batch")
    # all rewards sorted: 0 .2 .4 .5 .7 .9 1 1 -> lower median .5; |r-.5|: .5 .3 .1 0 .2 .4 .5 .5
    # sorted 0 .1 .2 .3 .4 .5 .5 .5 -> lower median .3 -> scale .301
    s = 0.3 + 1e-3
    assert leaf_values(res_b, 0, t1) == pytest.approx([-0.3 / s, 0.4 / s, 0.0, -0.1 / s, 0.2 / s], abs=1e-12)
    assert leaf_values(res_b, 1, t2) == pytest.approx([-1 / s, 0.0, 0.0], abs=1e-12)


# ------------------------------------------------------------------------------------------ treepo
def test_treepo_ancestor_subgroups():
    t, n = branching_tree()
    res = compute_advantages([t], "treepo", "none")
    # G0 mean .75. a1: (.25 + (1-.5))/2 = .375; a2: (-.75 + (0-.5))/2 = -.625; b1, b2: (.25 + 0)/2 = .125
    raw = [0.375, -0.625, 0.125, 0.125]
    assert leaf_values(res, 0, t) == pytest.approx(raw)
    # batch whitening, token weighted: a1 has 3 tokens, a2 4, b1 2, b2 2 (11 tokens)
    w = [3, 4, 2, 2]
    mean = sum(x * k for x, k in zip(raw, w)) / 11  # = -0.875/11
    var = sum(k * (x - mean) ** 2 for x, k in zip(raw, w)) / 10
    want = [(x - mean) / math.sqrt(var + 1e-8) for x in raw]
    res_b = compute_advantages([t], "treepo", "batch")
    assert leaf_values(res_b, 0, t) == pytest.approx(want, abs=1e-12)
    assert mean == pytest.approx(-0.0795454545)
    # one prompt group -> group whitening is the same
    assert leaf_values(compute_advantages([t], "treepo", "group"), 0, t) == pytest.approx(want, abs=1e-12)


def test_treepo_skips_singleton_subgroups_and_batch_vs_group():
    # root -> a [1] -> a1 [2] (r=1; G1 = {a1} singleton);  root -> b [3] -> {b1 [4] r=0, b2 [5] r=0}
    t = RolloutTree(task=ref(0), prompt_ids=[9])
    a = t.add_child(0, [1])
    a1 = t.add_child(a, [2])
    b = t.add_child(0, [3])
    b1 = t.add_child(b, [4])
    b2 = t.add_child(b, [5])
    for lid, r in ((a1, 1.0), (b1, 0.0), (b2, 0.0)):
        t.nodes[lid].reward = r
    res = compute_advantages([t], "treepo", "none")
    # G0 mean 1/3. a1: only j=0 -> 2/3. b1, b2: (-1/3 + 0)/2 = -1/6
    assert leaf_values(res, 0, t) == pytest.approx([2 / 3, -1 / 6, -1 / 6])
    # second prompt group, flat: G0 only
    t2 = group_tree(1, [1, 0], lengths=[1, 3])
    raw2 = [0.5, -0.5]
    res_g = compute_advantages([t, t2], "treepo", "group")
    res_b = compute_advantages([t, t2], "treepo", "batch")

    def whiten(vals, w):
        n = sum(w)
        m = sum(v * k for v, k in zip(vals, w)) / n
        var = sum(k * (v - m) ** 2 for v, k in zip(vals, w)) / (n - 1)
        return [(v - m) / math.sqrt(var + 1e-8) for v in vals]

    raw1, w1, w2 = [2 / 3, -1 / 6, -1 / 6], [2, 2, 2], [1, 3]
    assert leaf_values(res_g, 0, t) == pytest.approx(whiten(raw1, w1), abs=1e-12)
    assert leaf_values(res_g, 1, t2) == pytest.approx(whiten(raw2, w2), abs=1e-12)
    both = whiten(raw1 + raw2, w1 + w2)
    assert leaf_values(res_b, 0, t) == pytest.approx(both[:3], abs=1e-12)
    assert leaf_values(res_b, 1, t2) == pytest.approx(both[3:], abs=1e-12)


def test_treepo_zero_variance_group_excluded_from_whitening():
    t, _ = branching_tree(0)
    z = group_tree(1, [1, 1, 1])
    res = compute_advantages([t, z], "treepo", "batch")
    assert leaf_values(res, 1, z) == [0.0, 0.0, 0.0]
    alone = compute_advantages([t], "treepo", "batch")
    assert leaf_values(res, 0, t) == pytest.approx(leaf_values(alone, 0, t), abs=1e-12)


# ------------------------------------------------------------------------------------------ tree_grpo
def test_tree_grpo_subtrees_as_trees():
    t, n = branching_tree()
    res = compute_advantages([t], "tree_grpo", "group")
    # prompt: [1,0,1,1] mean .75, unbiased std .5. subtree a: [1,0] mean .5 std sqrt(.5); subtree b: [1,1] -> 0
    zp = lambda r: (r - 0.75) / (0.5 + 1e-6)
    za = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert leaf_values(res, 0, t) == pytest.approx([zp(1) + za, zp(0) - za, zp(1), zp(1)], abs=1e-12)
    res_n = compute_advantages([t], "tree_grpo", "none")
    assert leaf_values(res_n, 0, t) == pytest.approx([0.25 + 0.5, -0.75 - 0.5, 0.25, 0.25])


def test_tree_grpo_several_trees_per_prompt_and_batch():
    t1 = group_tree(0, [1, 0])
    t2 = group_tree(0, [0, 0])
    other = group_tree(1, [1, 0, 0])
    res = compute_advantages([t1, t2, other], "tree_grpo", "group")
    # prompt group 0: [1,0,0,0] mean .25, std .5. tree t1: [1,0] std sqrt(.5); tree t2: [0,0] -> 0
    zp = lambda r: (r - 0.25) / (0.5 + 1e-6)
    zt = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert leaf_values(res, 0, t1) == pytest.approx([zp(1) + zt, zp(0) - zt], abs=1e-12)
    assert leaf_values(res, 1, t2) == pytest.approx([zp(0), zp(0)], abs=1e-12)
    # a single flat tree: its "trees" are single leaves (z_tree = 0) -> GRPO with eps 1e-6
    s = SQRT_1_3 + 1e-6  # [1,0,0]: mean 1/3, unbiased std sqrt(1/3)
    assert leaf_values(res, 2, other) == pytest.approx([(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s], abs=1e-12)
    res_b = compute_advantages([t1, t2, other], "tree_grpo", "batch")
    # all 7 rewards [1,0,0,0,1,0,0]: mean 2/7, sum sq dev = 2*(25/49) + 5*(4/49) = 70/49, /6
    sb = math.sqrt(70 / 49 / 6) + 1e-6
    assert leaf_values(res_b, 0, t1) == pytest.approx([0.75 / sb + 0.5 / sb, -0.25 / sb - 0.5 / sb], abs=1e-12)


# ------------------------------------------------------------------------------------------ treerl
def test_treerl_segment_values_per_token():
    t, n = branching_tree()
    res = compute_advantages([t], "treerl", "none")
    r2 = math.sqrt(2)
    va, vb = -0.5 / r2, 0.5 / r2  # ((.5-.75)+(.5-.75))/sqrt2, ((1-.75)+(1-.75))/sqrt2
    # leaves: ((r-.75) + (r-V(parent))) / 1
    assert res.advantages[0][n["a1"]] == pytest.approx([va, va, 0.25 + 0.5])
    assert res.advantages[0][n["a2"]] == pytest.approx([va, va, -0.75 - 0.5, -0.75 - 0.5])
    assert res.advantages[0][n["b1"]] == pytest.approx([vb, 0.25])
    assert res.advantages[0][n["b2"]] == pytest.approx([vb, 0.25])
    res_g = compute_advantages([t], "treerl", "group")
    s = 0.5 + 1e-4  # unbiased std of [1,0,1,1]
    assert res_g.advantages[0][n["a1"]] == pytest.approx([va / s, va / s, 0.75 / s])
    other = group_tree(1, [0, 0, 0, 1])
    res_b = compute_advantages([t, other], "treerl", "batch")
    sb = math.sqrt((8 * 0.25) / 7) + 1e-4  # 8 rewards, mean .5, all |dev| .5
    assert res_b.advantages[0][n["b1"]] == pytest.approx([vb / sb, 0.25 / sb])
    # flat tree: every leaf is a first-level segment: 2 (r - mean)
    assert res_b.advantages[1][other.leaves()[3]] == pytest.approx([1.5 / sb] * 2)


def test_treerl_several_trees_parent_is_tree_root():
    t1 = group_tree(0, [1, 0])
    t2 = group_tree(0, [0, 0])
    res = compute_advantages([t1, t2], "treerl", "none")
    # V(root of prompt) = .25; t1 root value .5, t2 root value 0
    assert leaf_values(res, 0, t1) == pytest.approx([(1 - 0.25) + (1 - 0.5), (0 - 0.25) + (0 - 0.5)])
    assert leaf_values(res, 1, t2) == pytest.approx([-0.25, -0.25])


@pytest.mark.parametrize("est", ["grpo", "mc_grpo", "treepo", "tree_grpo", "treerl"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_zero_variance_groups_all_zero(est, scale):
    t, _ = branching_tree(0)
    for lid in t.leaves():
        t.nodes[lid].reward = 0.5
    live = group_tree(1, [1, 0, 1])
    res = compute_advantages([t, live], est, scale)
    assert res.num_groups == 2 and res.num_zero_variance_groups == 1
    assert all(v == 0.0 for lid in t.leaves() for v in res.advantages[0][lid])
    assert any(v != 0.0 for lid in live.leaves() for v in res.advantages[1][lid])


# ------------------------------------------------------------------------------------------ errors
def test_errors():
    t = group_tree(0, [1, 0])
    with pytest.raises(ValueError, match="expected one of grpo"):
        compute_advantages([t], "ppo")
    with pytest.raises(ValueError, match="scale_rewards"):
        compute_advantages([t], "grpo", "token")
    t.nodes[t.leaves()[0]].reward = None
    with pytest.raises(ValueError, match="has no reward"):
        compute_advantages([t], "grpo")
    with pytest.raises(TypeError, match="RolloutTree"):
        compute_advantages(["nope"], "grpo")  # type: ignore[list-item]
    empty = RolloutTree(task=ref(5), prompt_ids=[1])
    res = compute_advantages([empty], "grpo")
    assert res.num_groups == 0 and res.advantages == [{}]


# ------------------------------------------------------------------------------------------ samples
def test_samples_from_trees():
    t, n = branching_tree(0)
    t.model_id = "m"
    for nid, lp in ((n["a"], [-0.1, -0.2]), (n["a1"], [-0.3]), (n["a2"], [-0.4, -0.5]), (n["b"], [-0.6])):
        t.nodes[nid].logprobs = lp
    t.nodes[n["a"]].policy_version = 3
    t.nodes[n["a1"]].policy_version = 4
    t.nodes[n["a2"]].finish_reason = "length"
    z = group_tree(1, [1, 1])
    res = compute_advantages([t, z], "treerl", "none")
    samples = samples_from_trees([t, z], res, source="external:peer")
    assert len(samples) == 4  # zero-variance group dropped
    s0 = samples[0]
    assert s0.prompt_ids == [1, 2, 3] and s0.completion_ids == [1, 2, 3]
    assert s0.advantages == res.advantages[0][n["a1"]]
    assert s0.behaviour_logprobs == [-0.1, -0.2, -0.3]
    assert s0.policy_version == 3 and s0.model_id == "m" and s0.reward == 1.0
    assert s0.group_id == ref(0).key() and s0.source == "external:peer" and s0.loss_mask == [1, 1, 1]
    assert samples[1].truncated and samples[1].loss_mask == [1, 1, 1, 1]
    assert samples[2].behaviour_logprobs is None  # b1's segment has no log-probs
    masked = samples_from_trees([t, z], res, mask_truncated=True, drop_zero_variance=False)
    assert len(masked) == 6 and masked[1].loss_mask == [0, 0, 0, 0]
    # MC-GRPO's median sample: skipped, or kept with a zero loss mask
    g = group_tree(2, [0.2, 0.9, 0.5])
    rm = compute_advantages([g], "mc_grpo")
    assert [s.reward for s in samples_from_trees([g], rm)] == [0.2, 0.9]
    kept = samples_from_trees([g], rm, include_dropped=True)
    assert [s.loss_mask for s in kept] == [[1, 1], [1, 1], [0, 0]]
    with pytest.raises(ValueError, match="same list"):
        samples_from_trees([t], res)


def test_std_floor_keeps_tiny_reward_differences_small():
    """Outside attack: rewards 0.02 vs 0 must not become an advantage as strong as a correct answer."""
    t = group_tree(0, [0.02, 0.0])
    raw = leaf_values(compute_advantages([t], "grpo", "group", std_floor=0.0), 0, t)
    assert raw[0] == pytest.approx(0.01 / (math.sqrt(2) * 0.01 + 1e-4))  # 0.70: TRL's formula blows it up
    t8 = group_tree(1, [0.02] + [0.0] * 7)
    raw8 = leaf_values(compute_advantages([t8], "grpo", "group", std_floor=0.0), 0, t8)
    assert raw8[0] > 2.4  # as strong as one correct answer in eight
    for est in ("grpo", "mc_grpo", "tree_grpo", "treerl", "treepo"):
        vals = leaf_values(compute_advantages([t8], est, "group"), 0, t8)
        assert max(abs(v) for v in vals) <= 0.4 + 1e-9, est  # <= 2 terms (tree_grpo, treerl) of 0.02 / 0.1
    floored = leaf_values(compute_advantages([t8], "grpo", "group"), 0, t8)
    assert floored[0] == pytest.approx((0.02 - 0.0025) / (0.1 + 1e-4))
    # binary rewards: a floor of 0.1 never binds for G < 100 (smallest std sqrt(1/G))
    tb = group_tree(2, [1.0] + [0.0] * 63)
    assert leaf_values(compute_advantages([tb], "grpo", "group"), 0, tb) == pytest.approx(
        leaf_values(compute_advantages([tb], "grpo", "group", std_floor=0.0), 0, tb)
    )
    with pytest.raises(ValueError, match="advantage_std_floor"):
        compute_advantages([t], "grpo", "group", std_floor=-1.0)
