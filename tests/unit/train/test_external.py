"""Source-specific processing of external rollouts (train/external.py, train/batch.py, train/off_policy.py,
rollout/advantages.py): hand-computed values."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.config import ExternalConfig
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import TaskRef
from swarmnode.rollout.advantages import ADV_EPS, joint_task_stats
from swarmnode.train.batch import compose_batch, external_cap, external_samples, trained_groups_by_peer
from swarmnode.train.external import process_external, select_external, tree_sample_tokens
from swarmnode.train.off_policy import effective_off_policy_mode, external_token_loss, off_policy_token_weights
from swarmnode.train.samples import Sample

OUR_MODEL = "our-model"
OUR_TOK = "our-tok"


def task(i: int) -> TaskRef:
    return TaskRef("rg:chain_sum", "0123456789abcdef", 0, i)


def ext(
    rewards,
    peer="A",
    task_index=0,
    lengths=None,
    model_id=OUR_MODEL,
    tokenizer_id=OUR_TOK,
    version=0,
    same_tokenizer=True,
    with_logprobs=True,
) -> PeerTree:
    lengths = lengths or [2] * len(rewards)
    comps = [[10 + k for k in range(n)] for n in lengths]
    lps = [[-0.1 * (k + 1) for k in range(n)] for n in lengths] if with_logprobs else None
    tree = RolloutTree.from_group(task(task_index), [1, 2, 3], comps, logprobs=lps)
    for lid, r in zip(tree.leaves(), rewards):
        tree.nodes[lid].reward = float(r)
    return PeerTree(tree, peer, model_id=model_id, tokenizer_id=tokenizer_id, policy_version=version,
                    same_tokenizer=same_tokenizer)


def advs(samples, source=None):
    return [s.advantages[0] for s in samples if source is None or s.source == source]


# ------------------------------------------------------------------------------------------ normalization
def test_per_source_normalization_hand_values():
    a = ext([1, 0, 0, 0], peer="A")  # mean 0.25, unbiased std = sqrt(0.75/3) = 0.5
    b = ext([1, 1, 0], peer="B")  # mean 2/3, unbiased std = sqrt((2/9+4/9)/2) = sqrt(1/3)
    samples, m = external_samples([a, b], "per_source", our_model_id=OUR_MODEL, our_tokenizer_id=OUR_TOK)
    assert advs(samples, "external:A") == pytest.approx([0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001])
    sb = math.sqrt(1 / 3) + 1e-4
    assert advs(samples, "external:B") == pytest.approx([(1 / 3) / sb, (1 / 3) / sb, (-2 / 3) / sb])
    # the convention is torch.std's default (unbiased), as TRL
    assert torch.tensor([1.0, 0, 0, 0]).std().item() == pytest.approx(0.5)
    assert {s.group_id for s in samples} == {f"{task(0).key()}|external:A", f"{task(0).key()}|external:B"}
    assert all(len(s.advantages) == 2 and s.advantages[0] == s.advantages[1] for s in samples)
    assert m["external/samples"] == 7 and m["external/leaves_in"] == 7


def test_joint_normalization_pools_with_local_leaves():
    a = ext([1, 0, 0, 0], peer="A")
    b = ext([1, 1, 0], peer="B")
    local = {task(0).key(): [0.0, 0.0, 0.0, 0.0]}
    # pool: 3 ones and 8 zeros; mean 3/11, unbiased var = (3*(8/11)^2 + 8*(3/11)^2)/10 = 264/1210
    mean, std = 3 / 11, math.sqrt(264 / 1210)
    samples, _ = external_samples([a, b], "joint", local_rewards_by_task=local)
    hi, lo = (1 - mean) / (std + ADV_EPS), (0 - mean) / (std + ADV_EPS)
    assert hi == pytest.approx(1.55666, abs=1e-5) and lo == pytest.approx(-0.58375, abs=1e-5)
    assert advs(samples) == pytest.approx([hi, lo, lo, lo, hi, hi, lo])
    assert {s.group_id for s in samples} == {f"{task(0).key()}|joint"}
    assert joint_task_stats([a, b], local)[task(0).key()] == pytest.approx((mean, std, 11))
    # TaskRef keys work too; without local rewards the pool is the external leaves of the task
    s2, _ = external_samples([a, b], "joint", local_rewards_by_task={task(0): [0.0] * 4})
    assert advs(s2) == pytest.approx(advs(samples))
    s3, _ = external_samples([a, b], "joint")
    m7, sd7 = 3 / 7, torch.tensor([1.0, 0, 0, 0, 1, 1, 0]).std().item()
    assert advs(s3)[0] == pytest.approx((1 - m7) / (sd7 + ADV_EPS))


def test_same_peer_same_task_trees_pool_into_one_group():
    samples, _ = external_samples([ext([1, 0], peer="A"), ext([0, 0], peer="A")])
    # group [1,0,0,0]: same values as the 4-leaf group above
    assert advs(samples) == pytest.approx([1.49970, -0.49990, -0.49990, -0.49990], abs=1e-4)


def test_scale_rewards_batch_and_none():
    a, b = ext([1, 0, 0, 0], peer="A"), ext([1, 1, 0], peer="B")
    batch_std = torch.tensor([1.0, 0, 0, 0, 1, 1, 0]).std().item()
    s, _ = external_samples([a, b], scale_rewards="batch")
    assert advs(s)[0] == pytest.approx(0.75 / (batch_std + ADV_EPS))
    assert advs(s)[4] == pytest.approx((1 / 3) / (batch_std + ADV_EPS))
    s, _ = external_samples([a, b], scale_rewards="none")
    assert advs(s) == pytest.approx([0.75, -0.25, -0.25, -0.25, 1 / 3, 1 / 3, -2 / 3])


# ------------------------------------------------------------------------------------------ length control
def test_length_drop_renormalizes_the_rest():
    e = ext([1, 0, 0, 1], lengths=[2, 5, 3, 4])
    samples, m = external_samples([e], max_len=3, length_policy="drop", our_model_id=OUR_MODEL, our_tokenizer_id=OUR_TOK)
    # leaves of length 5 and 4 dropped; [1, 0]: mean .5, unbiased std sqrt(.5)
    sd = math.sqrt(0.5) + ADV_EPS
    assert [len(s.completion_ids) for s in samples] == [2, 3]
    assert advs(samples) == pytest.approx([0.5 / sd, -0.5 / sd])
    assert m["external/dropped_overlong"] == 2 and m["external/truncated"] == 0


def test_length_truncate_keeps_first_tokens():
    e = ext([1, 0, 0, 1], lengths=[2, 5, 3, 4])
    samples, m = external_samples([e], max_len=3, length_policy="truncate", our_model_id=OUR_MODEL, our_tokenizer_id=OUR_TOK)
    assert [s.completion_ids for s in samples] == [[10, 11], [10, 11, 12], [10, 11, 12], [10, 11, 12]]
    assert [s.loss_mask for s in samples] == [[1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]]
    assert [s.truncated for s in samples] == [False, True, False, True]
    assert samples[1].behaviour_logprobs == pytest.approx([-0.1, -0.2, -0.3])
    sd = math.sqrt(1 / 3) + ADV_EPS  # all four leaves stay: [1,0,0,1]
    assert advs(samples) == pytest.approx([0.5 / sd, -0.5 / sd, -0.5 / sd, 0.5 / sd])
    assert m["external/truncated"] == 2 and m["external/dropped_overlong"] == 0


def test_group_left_without_variance_after_drop_yields_nothing():
    e = ext([1, 0, 1], lengths=[2, 9, 2])
    samples, m = external_samples([e], max_len=4)
    assert samples == [] and m["external/dropped_zero_variance_groups"] == 1


# ------------------------------------------------------------------------------------------ ids and tags
def test_sample_tags_and_behaviour_logprobs_only_for_our_model_and_tokenizer():
    same = ext([1, 0], peer="A", version=7)
    other_model = ext([1, 0], peer="B", model_id="qwen-0.5b")
    other_tok = ext([1, 0], peer="C", tokenizer_id="other-tok", same_tokenizer=False)
    samples, m = external_samples(
        [same, other_model, other_tok], off_policy="tis", our_model_id=OUR_MODEL, our_tokenizer_id=OUR_TOK
    )
    by = {s.source: s for s in samples}
    assert set(by) == {"external:A", "external:B", "external:C"}
    assert by["external:A"].behaviour_logprobs == pytest.approx([-0.1, -0.2])
    assert by["external:A"].policy_version == 7 and by["external:A"].model_id == OUR_MODEL
    assert by["external:B"].behaviour_logprobs is None and by["external:B"].model_id == "qwen-0.5b"
    assert by["external:C"].behaviour_logprobs is None
    assert m["external/samples_with_behaviour_logprobs"] == 2
    assert m["external/tis_fallback_samples"] == 4
    assert all(not s.is_local for s in samples)


def test_unknown_ids_never_match():
    e = ext([1, 0], model_id="", tokenizer_id="")
    samples, _ = external_samples([e], our_model_id="", our_tokenizer_id="")
    assert all(s.behaviour_logprobs is None for s in samples)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="normalization"):
        external_samples([], normalization="pooled")
    with pytest.raises(ValueError, match="max_len"):
        external_samples([], max_len=0)
    with pytest.raises(TypeError, match="PeerTree"):
        external_samples(["x"])
    with pytest.raises(ValueError, match="selection"):
        select_external([], 4, "best", 0.5)
    with pytest.raises(ValueError, match="max_peer_share"):
        select_external([], 4, "random", 0.0)
    with pytest.raises(ValueError, match="peer_id"):
        ext([1, 0], peer="")
    bad = ext([1, 0])
    bad.tree.nodes[1].reward = None
    with pytest.raises(ValueError, match="re-scored"):
        select_external([bad], 4, "random", 0.5, 0)


# ------------------------------------------------------------------------------------------ off-policy
def _logp(vals):
    return torch.log(torch.tensor(vals, dtype=torch.float64)).requires_grad_(True)


def test_none_mode_is_ratio_one():
    logp = _logp([[0.5, 0.01]])
    adv = torch.tensor([2.0], dtype=torch.float64)
    mask = torch.ones(1, 2)
    loss = external_token_loss(logp, None, adv, mask, "none")
    assert loss.detach().tolist()[0] == pytest.approx([-2.0, -2.0])
    loss.sum().backward()
    assert logp.grad.tolist()[0] == pytest.approx([-2.0, -2.0])
    w, clip = off_policy_token_weights(logp.detach(), None, "none")
    assert w.tolist() == [[1.0, 1.0]] and clip is True


def test_luffy_value_and_gradient_match_closed_form():
    gamma = 0.1
    logp = _logp([[0.5, 0.01, 0.9]])
    adv = torch.tensor([[2.0, 2.0, -1.0]], dtype=torch.float64)
    loss = external_token_loss(logp, None, adv, torch.ones(1, 3), "luffy", gamma=gamma)
    # f(p) = p/(p+γ): 0.5/0.6, 0.01/0.11, 0.9/1.0 ; d f(e^logp)/d logp = γp/(p+γ)^2
    assert loss.detach().tolist()[0] == pytest.approx([-2 * 0.5 / 0.6, -2 * 0.01 / 0.11, 0.9])
    loss.sum().backward()
    closed = [-2 * 0.1 * 0.5 / 0.36, -2 * 0.1 * 0.01 / 0.0121, 1 * 0.1 * 0.9 / 1.0]
    assert logp.grad.tolist()[0] == pytest.approx(closed)
    assert closed[:2] == pytest.approx([-0.277778, -0.165289], abs=1e-6)
    w, clip = off_policy_token_weights(logp.detach(), None, "luffy", gamma=gamma)
    assert clip is False
    assert w.tolist()[0] == pytest.approx([0.1 * 0.5 / 0.36, 0.1 * 0.01 / 0.0121, 0.09])


def test_tis_weight_is_capped_ratio_and_detached():
    logp = _logp([[0.5, 0.5, 0.2]])
    mu = torch.log(torch.tensor([[0.4, 0.1, 0.2]], dtype=torch.float64))
    adv = torch.tensor([3.0], dtype=torch.float64)
    loss = external_token_loss(logp, mu, adv, torch.ones(1, 3), "tis", cap=2.0)
    # π/μ = 1.25, 5 -> capped to 2, 1
    assert loss.detach().tolist()[0] == pytest.approx([-3.75, -6.0, -3.0])
    loss.sum().backward()
    assert logp.grad.tolist()[0] == pytest.approx([-3.75, -6.0, -3.0])  # w detached: grad = -A·w
    w, clip = off_policy_token_weights(logp.detach(), mu, "tis", cap=2.0)
    assert w.tolist()[0] == pytest.approx([1.25, 2.0, 1.0]) and clip is True and not w.requires_grad


def test_tis_falls_back_without_behaviour_logprobs_and_for_foreign_models():
    logp = _logp([[0.5, 0.25]])
    adv = torch.tensor([1.0], dtype=torch.float64)
    stats: dict = {}
    w, clip = off_policy_token_weights(logp.detach(), None, "tis", stats=stats)
    assert w.tolist() == [[1.0, 1.0]] and clip is True and stats["tis_fallback"] == 1
    a = external_token_loss(logp, None, adv, torch.ones(1, 2), "tis")
    b = external_token_loss(logp, None, adv, torch.ones(1, 2), "none")
    assert torch.equal(a, b)
    kw = dict(our_model_id=OUR_MODEL, our_tokenizer_id=OUR_TOK, has_behaviour_logprobs=True)
    assert effective_off_policy_mode("tis", model_id=OUR_MODEL, tokenizer_id=OUR_TOK, **kw) == "tis"
    assert effective_off_policy_mode("tis", model_id="other", tokenizer_id=OUR_TOK, **kw) == "none"
    assert effective_off_policy_mode("tis", model_id=OUR_MODEL, tokenizer_id="other", **kw) == "none"
    assert effective_off_policy_mode("luffy", model_id="other", tokenizer_id="other", **kw) == "luffy"
    kw["has_behaviour_logprobs"] = False
    assert effective_off_policy_mode("tis", model_id=OUR_MODEL, tokenizer_id=OUR_TOK, **kw) == "none"


@pytest.mark.parametrize("mode", ["none", "luffy", "tis"])
def test_weights_hook_gradient_equals_exact_loss_gradient(mode):
    """The trainer's -A·w·exp(logp - logp.detach()) with our weights has the exact loss's gradient."""
    g = torch.Generator().manual_seed(0)
    logp0 = torch.log(torch.rand(3, 4, generator=g, dtype=torch.float64) * 0.98 + 0.01)
    mu = logp0 + torch.randn(3, 4, generator=g, dtype=torch.float64)
    adv = torch.randn(3, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    x = logp0.clone().requires_grad_(True)
    external_token_loss(x, mu, adv, mask, mode).sum().backward()
    y = logp0.clone().requires_grad_(True)
    w, _ = off_policy_token_weights(y, mu, mode)
    surrogate = -adv[:, None] * w * torch.exp(y - y.detach()) * mask
    surrogate.sum().backward()
    assert torch.allclose(x.grad, y.grad)
    assert torch.all(x.grad[mask == 0] == 0)


def test_masked_positions_are_zero_even_with_inf_padding():
    logp = torch.tensor([[math.log(0.5), -math.inf]], dtype=torch.float64, requires_grad=True)
    mu = torch.tensor([[math.log(0.5), 0.0]], dtype=torch.float64)
    for mode in ("none", "luffy", "tis"):
        logp.grad = None
        loss = external_token_loss(logp, mu, torch.tensor([1.0], dtype=torch.float64), torch.tensor([[1, 0]]), mode)
        loss.sum().backward()
        assert loss[0, 1].item() == 0.0 and torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0


def test_off_policy_shape_errors():
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        external_token_loss(torch.zeros(3), None, torch.zeros(3), torch.ones(3), "none")
    with pytest.raises(ValueError, match="advantages"):
        external_token_loss(torch.zeros(2, 3), None, torch.zeros(3), torch.ones(2, 3), "none")
    with pytest.raises(ValueError, match="gamma"):
        off_policy_token_weights(torch.zeros(1, 1), None, "luffy", gamma=0.0)
    with pytest.raises(ValueError, match="off_policy"):
        off_policy_token_weights(torch.zeros(1, 1), None, "ppo")


# ------------------------------------------------------------------------------------------ selection
def test_zero_variance_groups_dropped_first():
    cands = [ext([1, 1, 1], peer="A"), ext([0, 0], peer="B"), ext([1], peer="C"), ext([1, 0], peer="D")]
    stats: dict = {}
    out = select_external(cands, 10, "random", 1.0, 0, stats=stats)
    assert [c.peer_id for c in out] == ["D"]
    assert stats["select/dropped_zero_variance"] == 3 and stats["select/selected"] == 1
    assert select_external(cands[:3], 10, "contrast", 1.0, 0) == []


def test_contrast_ranks_within_a_peer_ties_random():
    lo1 = ext([1, 0, 0, 0], peer="A", task_index=1)  # var 0.25
    lo2 = ext([1, 1, 1, 0], peer="A", task_index=2)  # var 0.25
    hi = ext([1, 0], peer="A", task_index=3)  # var 0.5
    mid = ext([1, 0, 0], peer="A", task_index=4)  # var 1/3
    firsts_of_tie = set()
    for seed in range(20):
        out = select_external([lo1, lo2, hi, mid], 3, "contrast", 1.0, seed)
        assert out[0] is hi and out[1] is mid and out[2] in (lo1, lo2)
        firsts_of_tie.add(out[2].tree.task.index)
    assert firsts_of_tie == {1, 2}


def test_contrast_does_not_put_two_leaf_trees_first_across_peers():
    """Outside attack: four fresh keys sending 2-leaf [1, 0] trees took every slot under global contrast."""
    honest = [ext([1, 0, 0, 1, 0, 0, 0, 0], peer=f"H{p}", task_index=10 * p + i) for p in range(4) for i in range(2)]
    sybils = [ext([1, 0], peer=f"S{p}", task_index=100 + 10 * p + i) for p in range(4) for i in range(3)]
    honest_slots = 0
    firsts = set()
    for seed in range(200):
        stats: dict = {}
        out = select_external(sybils + honest, 4, "contrast", 0.5, seed, stats=stats)
        assert len(out) == 4 and stats["select/peers"] == 4  # one tree per peer: round-robin over publishers
        honest_slots += sum(1 for c in out if c.peer_id.startswith("H"))
        firsts.add(out[0].peer_id)
    # 4 honest of 8 publishers: about half of the slots (binomial, 800 slots: 400 +- 3 sigma = 42)
    assert 330 <= honest_slots <= 470, honest_slots
    assert len(firsts) == 8  # every publisher is first in some step


def test_round_robin_and_per_peer_cap_bound_one_publisher():
    many = [ext([1, 0], peer="A", task_index=i) for i in range(20)]
    few = [ext([1, 0, 0], peer="B", task_index=100)]
    stats: dict = {}
    out = select_external(many + few, 6, "contrast", 0.5, 3, stats=stats)
    assert sum(1 for c in out if c.peer_id == "A") == 3 and sum(1 for c in out if c.peer_id == "B") == 1
    assert stats["select/dropped_peer_cap"] == 17 and stats["select/selected"] == 4


def test_token_budget_costs_trees_by_expanded_samples():
    # 255 leaves sharing one 1000-token segment, each with its own 1-token tail: 255 samples of 1001 tokens
    t = RolloutTree(task=task(7), prompt_ids=[1, 2, 3])
    shared = t.add_child(0, list(range(10, 1010)), logprobs=[-0.1] * 1000)
    for k in range(255):
        leaf = t.add_child(shared, [5 + (k % 3)], logprobs=[-0.1])
        t.nodes[leaf].reward = float(k % 2)
    big = PeerTree(t, "X", model_id=OUR_MODEL, tokenizer_id=OUR_TOK, same_tokenizer=True)
    assert tree_sample_tokens(big) == 255 * (3 + 1001)
    assert tree_sample_tokens(big, max_len=32, length_policy="drop") == 0
    assert tree_sample_tokens(big, max_len=32, length_policy="truncate") == 255 * 35
    assert tree_sample_tokens(big, max_len=32, length_policy="truncate", max_prompt_len=2) == 255 * 34
    small = ext([1, 0], peer="Y", task_index=8)  # 2 leaves x (3 + 2)
    stats: dict = {}
    out = select_external([big, small], 4, "contrast", 1.0, 0, stats=stats, max_tokens=1000)
    assert out == [small] and stats["select/dropped_token_budget"] == 1 and stats["select/tokens"] == 10
    out = select_external([big, small], 4, "contrast", 1.0, 0, max_tokens=10**6)
    assert set(map(id, out)) == {id(big), id(small)}
    # process_external: with our L = 32 and the drop policy nothing of the big tree is decoded
    cfg = ExternalConfig(num_external=4, max_peer_share=1.0)
    samples, m = process_external([big, small], cfg, current_version=0, our_model_id=OUR_MODEL,
                                  our_tokenizer_id=OUR_TOK, rng=0, max_completion_length=32)
    assert m["external/max_completion_length"] == 32 and m["external/dropped_overlong"] == 255
    assert {s.source for s in samples} == {"external:Y"}
    cfg = ExternalConfig(num_external=4, max_peer_share=1.0, external_length_policy="truncate",
                         max_external_tokens_per_step=255 * 35 + 10)
    samples, m = process_external([big, small], cfg, current_version=0, our_model_id=OUR_MODEL,
                                  our_tokenizer_id=OUR_TOK, rng=0, max_completion_length=32)
    assert max(len(s.completion_ids) for s in samples) == 32 and m["select/tokens"] == 255 * 35 + 10
    assert sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples) == 255 * 35 + 10


def test_random_is_uniform_over_nonzero_variance_groups():
    cands = [ext([1, 0], peer=p) for p in "ABCD"] + [ext([1, 1], peer="Z")]
    rng = random.Random(123)
    counts = {p: 0 for p in "ABCDZ"}
    for _ in range(400):
        counts[select_external(cands, 1, "random", 1.0, rng)[0].peer_id] += 1
    assert counts["Z"] == 0
    assert all(60 <= counts[p] <= 140 for p in "ABCD"), counts


def test_per_peer_cap():
    cands = [ext([1, 0], peer="A", task_index=i) for i in range(5)] + [ext([1, 0], peer="B")]
    stats: dict = {}
    out = select_external(cands, 4, "random", 0.5, 1, stats=stats)
    assert sorted(c.peer_id for c in out) == ["A", "A", "B"]
    assert stats["select/peer_cap"] == 2 and stats["select/dropped_peer_cap"] == 3
    # ceil with float tolerance: 0.3 * 10 = 3.0000000000000004 -> 3, and the cap is at least 1
    out = select_external([ext([1, 0], peer="A", task_index=i) for i in range(6)], 10, "random", 0.3, 0)
    assert len(out) == 3
    assert len(select_external(cands, 4, "contrast", 0.1, 0, stats=stats)) == 2 and stats["select/peer_cap"] == 1


def test_stale_groups_dropped_only_for_our_model():
    fresh = ext([1, 0], peer="A", version=12)  # age 8 == max_staleness: kept
    stale = ext([1, 0], peer="B", version=11)  # age 9: dropped
    foreign = ext([1, 0], peer="C", version=0, model_id="another-model")  # not comparable: kept
    stats: dict = {}
    out = select_external(
        [fresh, stale, foreign], 8, "random", 1.0, 0,
        current_version=20, max_staleness=8, our_model_id=OUR_MODEL, stats=stats,
    )
    assert sorted(c.peer_id for c in out) == ["A", "C"] and stats["select/dropped_stale"] == 1
    # zero variance is counted before staleness
    select_external([ext([1, 1], version=0)], 8, "random", 1.0, 0, current_version=20, max_staleness=8,
                    our_model_id=OUR_MODEL, stats=stats)
    assert stats["select/dropped_zero_variance"] == 1 and stats["select/dropped_stale"] == 0


def test_staleness_is_measured_by_the_receiver_not_the_signed_version():
    """Outside attack: a claimed policy version of 2**63 - 1 must not keep a tree fresh forever.

    The receiver's arrival time (PeerTree.received_at) bounds the age whatever the version claims."""
    liar = ext([1, 0], peer="A", version=2**63 - 1)
    liar.received_at = 1_000.0  # arrived 700 s before `now`
    recent = ext([1, 0], peer="B", version=15)
    recent.received_at = 1_650.0  # 50 s ago
    unknown = ext([1, 0], peer="C", version=15)  # received_at 0: built outside the swarm layer, not judged
    stats: dict = {}
    out = select_external([liar, recent, unknown], 8, "random", 1.0, 0, current_version=20, max_staleness=8,
                          our_model_id=OUR_MODEL, stats=stats, max_age_seconds=600.0, now=1_700.0)
    assert sorted(c.peer_id for c in out) == ["B", "C"] and stats["select/dropped_stale"] == 1
    # the signed version alone would have kept the liar (it claims to be far ahead of us)
    out = select_external([liar], 8, "random", 1.0, 0, current_version=20, max_staleness=8,
                          our_model_id=OUR_MODEL, max_age_seconds=None, now=1_700.0)
    assert [c.peer_id for c in out] == ["A"]
    with pytest.raises(ValueError, match="max_age_seconds"):
        select_external([recent], 8, "random", 1.0, 0, max_age_seconds=0)


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(st.tuples(st.sampled_from("ABCD"), st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=1, max_size=4)),
                    max_size=12),
    num_external=st.integers(0, 8),
    share=st.floats(0.05, 1.0),
    selection=st.sampled_from(["random", "contrast"]),
    seed=st.integers(0, 1000),
)
def test_selection_properties(groups, num_external, share, selection, seed):
    cands = [ext(r, peer=p, task_index=i) for i, (p, r) in enumerate(groups)]
    out = select_external(cands, num_external, selection, share, seed)
    cap = max(1, math.ceil(share * num_external - 1e-9))
    assert len(out) <= num_external
    assert all(sum(1 for c in out if c.peer_id == p) <= cap for p in "ABCD")
    assert all(len(set(c.rewards())) > 1 for c in out)


# ------------------------------------------------------------------------------------------ batch
def sample(source, adv, reward=0.0, group="g", n=2):
    return Sample([1], [5] * n, [adv] * n, source=source, reward=reward, group_id=group)


def test_compose_batch_hand_values():
    local = [sample("local", a, r, "t0") for a, r in [(1.0, 1.0), (-1.0, 0.0), (1.0, 1.0), (-1.0, 0.0)]]
    ext_ = (
        [sample("external:A", a, r, "g1") for a, r in [(1.5, 1.0), (-0.5, 0.0), (-1.0, 0.0)]]
        + [sample("external:B", a, r, "g2") for a, r in [(0.2, 1.0), (-2.0, 0.0), (0.3, 1.0)]]
        + [sample("external:B", 0.0, 1.0, "g3") for _ in range(2)]
    )
    batch, m = compose_batch(local, ext_, 0.5)
    # cap: k <= 0.5 (4 + k) -> 4; g3 zero-advantage dropped; g1 whole (3); one single from g2, largest |A|
    assert batch[:4] == local
    assert [(s.source, s.advantages[0]) for s in batch[4:]] == [
        ("external:A", 1.5), ("external:A", -0.5), ("external:A", -1.0), ("external:B", -2.0)
    ]
    assert m["batch/external_cap"] == 4 and m["batch/external_share"] == 0.5
    assert m["batch/dropped_zero_advantage"] == 2 and m["batch/dropped_cap"] == 2 and m["batch/partial_groups"] == 1
    assert m["external:A/accepted"] == 3 and m["external:A/used"] == 3
    assert m["external:A/reward_mean"] == pytest.approx(1 / 3)
    assert m["external:A/adv_mean"] == pytest.approx(0.0)
    assert m["external:A/adv_std"] == pytest.approx(math.sqrt((1.5**2 + 0.5**2 + 1.0**2) / 3))
    assert m["external:A/tokens"] == 6
    assert m["external:B/accepted"] == 5 and m["external:B/used"] == 1 and m["external:B/tokens"] == 2
    assert m["external:B/zero_std_group_frac"] == pytest.approx(0.5)  # g3 all 1.0; g2 mixed
    assert m["local/used"] == 4 and m["local/reward_mean"] == 0.5


def test_trained_groups_by_peer_counts_only_trained_groups_with_contrast():
    local = [sample("local", a, r, "t0") for a, r in [(1.0, 1.0), (-1.0, 0.0), (1.0, 1.0), (-1.0, 0.0)]]
    ext_ = (
        [sample("external:A", a, r, "g1") for a, r in [(1.5, 1.0), (-0.5, 0.0), (-1.0, 0.0)]]
        + [sample("external:B", a, r, "g2") for a, r in [(0.2, 1.0), (-2.0, 0.0), (0.3, 1.0)]]
        + [sample("external:B", 0.0, 1.0, "g3") for _ in range(2)]  # no contrast
        + [sample("external:C", a, r, "g4") for a, r in [(1.0, 1.0), (-1.0, 0.0)]]  # cut by the share cap
        + [sample("external:D", 0.7, 1.0, "joint")]  # one sample of D in a pooled group: no contrast of its own
    )
    batch, _ = compose_batch(local, ext_, 0.5)  # cap 4, first fit: g1 whole, then D's single sample
    assert [s.group_id for s in batch[4:]] == ["g1"] * 3 + ["joint"]
    assert trained_groups_by_peer(ext_, batch) == {"A": 1}  # D's lone sample has no contrast of its own
    # a partial group counts by the contrast of everything the peer offered in it
    assert trained_groups_by_peer(ext_, local + [ext_[3], ext_[9]]) == {"B": 1, "C": 1}
    assert trained_groups_by_peer(ext_, local + [ext_[6], ext_[10]]) == {}
    assert trained_groups_by_peer(ext_, local) == {}


def test_compose_batch_rejects_mixed_sources_and_bad_share():
    with pytest.raises(ValueError, match="external"):
        compose_batch([sample("external:A", 1.0)], [], 0.5)
    with pytest.raises(ValueError, match="local"):
        compose_batch([], [sample("local", 1.0)], 0.5)
    with pytest.raises(ValueError, match="max_external_share"):
        compose_batch([], [], 1.5)


def test_external_cap_values():
    assert external_cap(4, 0.5) == 4
    assert external_cap(6, 0.25) == 2
    assert external_cap(0, 0.9) == 0
    assert external_cap(5, 0.0) == 0
    assert external_cap(3, 1.0) == -1


@settings(max_examples=100, deadline=None)
@given(
    n_local=st.integers(0, 12),
    ext_groups=st.lists(st.tuples(st.integers(1, 5), st.booleans()), max_size=8),
    share=st.floats(0.0, 1.0),
)
def test_batch_never_exceeds_external_cap(n_local, ext_groups, share):
    local = [sample("local", 1.0) for _ in range(n_local)]
    external = []
    for gi, (size, zero) in enumerate(ext_groups):
        external += [sample(f"external:P{gi % 3}", 0.0 if zero else (k + 1) * 0.1, group=f"g{gi}") for k in range(size)]
    batch, m = compose_batch(local, external, share)
    n_ext = sum(1 for s in batch if not s.is_local)
    assert n_ext <= share * len(batch) + 1e-9
    assert sum(1 for s in batch if s.is_local) == n_local
    assert all(any(a != 0 for a in s.advantages) for s in batch if not s.is_local)
    nonzero = sum(size for size, zero in ext_groups if not zero)
    cap = external_cap(n_local, share)
    assert n_ext == (nonzero if cap < 0 else min(cap, nonzero))  # room is always used


# ------------------------------------------------------------------------------------------ one call
def test_process_external_with_swarm_config():
    cfg = ExternalConfig(num_external=3, max_peer_share=0.3, selection="contrast", max_external_completion_length=3,
                         external_length_policy="truncate", off_policy="tis")
    cands = [ext([1, 0, 0, 0], peer="A", task_index=1, lengths=[2, 2, 2, 6]), ext([1, 0], peer="A", task_index=2),
             ext([1, 0, 0], peer="B", task_index=3, model_id="foreign"), ext([1, 1], peer="C")]
    samples, m = process_external(cands, cfg, current_version=3, our_model_id=OUR_MODEL, our_tokenizer_id=OUR_TOK, rng=0)
    # peer cap ceil(0.9) = 1: A's [1,0] (var .5, A's best), and B's [1,0,0]; A's second group skipped
    assert sorted(s.source for s in samples) == ["external:A"] * 2 + ["external:B"] * 3
    assert {s.group_id for s in samples if s.source == "external:A"} == {f"{task(2).key()}|external:A"}
    assert m["select/dropped_zero_variance"] == 1 and m["select/dropped_peer_cap"] == 1
    assert m["external/tis_fallback_samples"] == 3


def test_external_normalization_has_the_std_floor():
    """Outside attack: a farmed 0.02 vs 0 must not become +0.86 (eps 1e-4 alone)."""
    farmed = ext([0.02, 0, 0, 0, 0, 0, 0, 0], peer="F")
    raw, _ = external_samples([farmed], "per_source", std_floor=0.0)
    assert advs(raw)[0] > 2.4  # as strong as one correct answer in eight without the floor
    floored, _ = external_samples([farmed], "per_source")
    assert advs(floored)[0] == pytest.approx((0.02 - 0.0025) / (0.1 + ADV_EPS))
    honest = ext([1, 0, 0, 0, 0, 0, 0, 0], peer="H")  # binary rewards: the floor does not bind
    a_raw, _ = external_samples([honest], "per_source", std_floor=0.0)
    a_fl, _ = external_samples([honest], "per_source")
    assert advs(a_fl) == pytest.approx(advs(a_raw))
