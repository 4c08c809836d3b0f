"""Tests of swarmnode.rollout.sampler: tree/chain rollouts, budget, pruning, fallback and branching rules.

Real parts only (tiny random Llama, a hand-wired bigram Llama, a BPE tokenizer trained here); every leaf is
re-checked against one plain forward over prompt + completion.
"""

from __future__ import annotations

import math

import pytest
import torch

from swarmnode.config import SamplingConfig, TreeConfig
from swarmnode.policy.decode import DecodeEngine
from swarmnode.rollout.sampler import (
    PromptSpec,
    SampledTrees,
    lookahead_alternative,
    near_duplicate,
    sample_rollouts,
    split_copies,
    step_fork_points,
    surprisal_fork_points,
    treepo_total_copies,
)
from swarmnode.rollout.tree import FINISH_REASONS
from swarmnode.tasks.base import TaskRef
from test_decode import CORPUS, bigram_llama, full_logits, tiny_llama, tiny_tokenizer


def _specs(tok, texts):
    return [PromptSpec(TaskRef("rg:test", "d", 0, i), tok(t).input_ids, t, "test") for i, t in enumerate(texts)]


def _cfg(mode="tree", branching="uniform", **kw) -> SamplingConfig:
    tree_kw = {k: kw.pop(k) for k in list(kw) if k in TreeConfig.model_fields}
    return SamplingConfig(tree=TreeConfig(mode=mode, branching=branching, **tree_kw), **kw)


def assert_consistent(model, tok, trees: SampledTrees, cfg: SamplingConfig, version: int) -> None:
    """Every structural invariant of the sampler's output, plus exactness against a full forward."""
    w = cfg.num_generations
    for ti, tree in enumerate(trees):
        st = trees.stats.prompts[ti]
        leaves = tree.leaves()
        reasons = [tree.nodes[lf].finish_reason for lf in leaves]
        assert all(r in FINISH_REASONS for r in reasons)
        assert len(leaves) == st.leaves + st.pruned  # no leaf lost, pruned ones counted
        assert sum(r != "pruned" for r in reasons) == st.leaves <= w
        assert st.generated_tokens == tree.generated_tokens()
        if cfg.tree.token_budget is not None:
            assert st.generated_tokens <= cfg.tree.token_budget
        for n in tree.nodes[1:]:
            assert n.policy_version == version
            assert len(n.token_ids) >= 1 and len(n.logprobs) == len(n.token_ids)
            if n.children:
                assert n.finish_reason is None
        pl = len(tree.prompt_ids)
        for lf in leaves:
            comp = tree.completion_ids(lf)
            assert 1 <= len(comp) <= cfg.max_completion_length
            assert tree.completion_text(lf) == tok.decode(comp, skip_special_tokens=True)
            lsm = torch.log_softmax(full_logits(model, tree.prompt_ids + comp) / cfg.temperature, -1)
            ref = [lsm[pl + j - 1, t].item() for j, t in enumerate(comp)]
            got = tree.completion_logprobs(lf)
            assert max(abs(a - b) for a, b in zip(ref, got)) < 1e-4


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_llama(len(tok), seed=1)


# ------------------------------------------------------------------------------------------ end to end
@pytest.mark.parametrize(
    "mode,branching",
    [("chain", "uniform"), ("tree", "uniform"), ("tree", "surprisal"), ("tree", "lookahead")],
)
def test_rollouts_are_exact_and_consistent(tok, model, mode, branching):
    cfg = _cfg(mode, branching, num_generations=6, max_completion_length=16, segment_length=4, temperature=0.9,
               lookahead_tau_abs=0.02, lookahead_tau_rel=0.5)
    specs = _specs(tok, [CORPUS[0], "Hi", CORPUS[2]])
    trees = sample_rollouts(DecodeEngine(model, tok), tok, specs, cfg, policy_version=7,
                            generator=torch.Generator().manual_seed(0))
    assert isinstance(trees, SampledTrees) and len(trees) == 3
    assert [t.task.index for t in trees] == [0, 1, 2]
    assert trees.stats.prefill_tokens == sum(len(s.prompt_ids) for s in specs)  # each prompt prefilled once
    assert_consistent(model, tok, trees, cfg, 7)
    if mode == "chain":
        for t in trees:
            assert len(t.nodes[0].children) == 6 and all(t.nodes[c].is_leaf for c in t.nodes[0].children)
    if branching == "uniform":
        # random weights: EOS has ~1/300 chance per token, so every prompt reaches its 6 leaves
        assert [len(t.leaves()) for t in trees] == [6, 6, 6]


def test_tree_shares_prefixes_and_decodes_fewer_tokens_than_chain(tok, model):
    specs = _specs(tok, [CORPUS[0], CORPUS[1]])
    common = dict(num_generations=8, max_completion_length=16, segment_length=4, max_depth=8)
    chain = sample_rollouts(DecodeEngine(model, tok), tok, specs, _cfg("chain", **common), 0,
                            torch.Generator().manual_seed(0))
    tree = sample_rollouts(DecodeEngine(model, tok), tok, specs, _cfg("tree", **common), 0, torch.Generator().manual_seed(0))
    assert [len(t.leaves()) for t in tree] == [len(t.leaves()) for t in chain] == [8, 8]
    if all(tree[i].nodes[lf].finish_reason == "length" for i in range(2) for lf in tree[i].leaves()):
        # b=2 from the root: 2, 4, 8, 8 paths x 4 tokens = 88 per prompt vs 8 x 16 = 128 for chain
        assert [t.generated_tokens() for t in tree] == [88, 88]
    assert tree.stats.generated_tokens < chain.stats.generated_tokens


@pytest.mark.parametrize("branching", ["uniform", "surprisal", "lookahead"])
def test_token_budget_is_never_exceeded(tok, model, branching):
    cfg = _cfg("tree", branching, num_generations=8, max_completion_length=16, segment_length=4, token_budget=30,
               lookahead_tau_abs=0.02, lookahead_tau_rel=0.5)
    trees = sample_rollouts(DecodeEngine(model, tok), tok, _specs(tok, [CORPUS[0], "Hi"]), cfg, 0, torch.Generator().manual_seed(3))
    for t, st in zip(trees, trees.stats.prompts):
        assert t.generated_tokens() == st.generated_tokens <= 30
        assert st.generated_tokens >= 20  # the budget is used, not wasted
    assert_consistent(model, tok, trees, cfg, 0)


def test_chain_budget_admits_only_samples_that_fit(tok, model):
    cfg = _cfg("chain", num_generations=8, max_completion_length=16, token_budget=40)
    trees = sample_rollouts(DecodeEngine(model, tok), tok, _specs(tok, ["Hi"]), cfg, 0, torch.Generator().manual_seed(0))
    assert len(trees[0].leaves()) == 2 and trees[0].generated_tokens() <= 40  # 40 // 16 = 2 samples


def test_same_generator_state_gives_identical_trees(tok, model):
    cfg = _cfg("tree", "surprisal", num_generations=4, max_completion_length=12, segment_length=4)
    specs = _specs(tok, [CORPUS[1]])
    a = sample_rollouts(DecodeEngine(model, tok), tok, specs, cfg, 0, torch.Generator().manual_seed(11))
    b = sample_rollouts(DecodeEngine(model, tok), tok, specs, cfg, 0, torch.Generator().manual_seed(11))
    sig = lambda trees: [(n.parent, n.token_ids, n.finish_reason) for n in trees[0].nodes]  # noqa: E731
    assert sig(a) == sig(b)


def test_long_prompts_are_left_truncated(tok, model):
    ids = tok(CORPUS[0] + CORPUS[2]).input_ids
    cfg = _cfg("chain", num_generations=2, max_completion_length=4, max_prompt_length=8)
    trees = sample_rollouts(DecodeEngine(model, tok), tok, [PromptSpec(TaskRef("rg:t", "d", 0, 0), ids)], cfg, 0, None)
    assert trees[0].prompt_ids == ids[-8:]


def test_bad_input_is_refused(tok, model):
    cfg = _cfg()
    with pytest.raises(ValueError, match="at least one"):
        sample_rollouts(DecodeEngine(model, tok), tok, [], cfg, 0)
    with pytest.raises(ValueError, match="expected PromptSpec"):
        sample_rollouts(DecodeEngine(model, tok), tok, [[1, 2, 3]], cfg, 0)
    with pytest.raises(ValueError, match="no prompt_ids"):
        sample_rollouts(DecodeEngine(model, tok), tok, [PromptSpec(TaskRef("rg:t", "d", 0, 0), [])], cfg, 0)


# ------------------------------------------------------------------------------------------ deterministic models
def _ids(tok, text: str) -> list[int]:
    return [tok.convert_tokens_to_ids(c) for c in text]


@pytest.fixture(scope="module")
def atok():
    return tiny_tokenizer(answer_tokens=True)


def test_near_duplicate_branches_are_pruned_and_counted(atok):
    """A deterministic model makes every branch a copy of its sibling: copies are pruned, kept as leaves."""
    chain = _ids(atok, "abcdefghijklmnopqrstuvwxyz")
    model = bigram_llama(len(atok), {chain[i]: [chain[i + 1]] for i in range(len(chain) - 1)})
    cfg = _cfg("tree", num_generations=4, max_completion_length=12, segment_length=4, prune_similarity=0.9)
    trees = sample_rollouts(DecodeEngine(model, atok), atok, [PromptSpec(TaskRef("rg:t", "d", 0, 0), [chain[0]])], cfg, 0,
                            torch.Generator().manual_seed(0))
    t, st = trees[0], trees.stats.prompts[0]
    assert st.pruned >= 3 and st.leaves >= 1
    pruned = [lf for lf in t.leaves() if t.nodes[lf].finish_reason == "pruned"]
    assert len(pruned) == st.pruned
    for lf in pruned:  # a pruned leaf is a prefix of the surviving text
        assert "bcdefghijklm".startswith(t.completion_text(lf))
    assert_consistent(model, atok, trees, cfg, 0)


def test_surprisal_forks_at_the_uncertain_token_and_never_inside_the_answer(atok):
    u = atok.convert_tokens_to_ids("U")
    left, right = _ids(atok, "pqrstuvwxyz"), _ids(atok, "ABCDEFGHIJK")
    s0, s1, s2 = _ids(atok, "abc")
    succ = {s0: [s1], s1: [s2], s2: [u], u: [left[0], right[0]]}  # the token after U has surprisal ln 2
    for seq in (left, right):
        succ.update({seq[i]: [seq[i + 1]] for i in range(len(seq) - 1)})
    model = bigram_llama(len(atok), succ)
    cfg = _cfg("tree", "surprisal", num_generations=4, max_completion_length=12, segment_length=8,
               prune_similarity=1.0)
    trees = sample_rollouts(DecodeEngine(model, atok), atok, [PromptSpec(TaskRef("rg:t", "d", 0, 0), [s0])], cfg, 0,
                            torch.Generator().manual_seed(0))
    t = trees[0]
    forks = [n for n in t.nodes[1:] if len(n.children) > 1]
    assert forks, "expected forks inside the first segment"
    for n in forks:
        assert n.token_ids[-1] == u  # split right before the high-surprisal token
        firsts = {t.nodes[c].token_ids[0] for c in n.children}
        assert firsts <= {left[0], right[0]}
    assert trees.stats.prompts[0].leaves == 4  # resampling the same token gives an exact copy: pruned, counted
    assert_consistent(model, atok, trees, cfg, 0)

    # same model, but the answer tag opens before U: no fork may sit at or after the tag
    open_ = atok.convert_tokens_to_ids("<answer>")
    succ2 = dict(succ)
    succ2[s1] = [open_]
    succ2[open_] = [u]
    model2 = bigram_llama(len(atok), succ2)
    trees2 = sample_rollouts(DecodeEngine(model2, atok), atok, [PromptSpec(TaskRef("rg:t", "d", 0, 0), [s0])], cfg, 0,
                             torch.Generator().manual_seed(0))
    t2 = trees2[0]
    # with the answer open, the uncertain token is off limits: no split before it (extra slots become uniform
    # copies at segment boundaries, which TreePO allows anywhere)
    for n in t2.nodes[1:]:
        if len(n.children) > 1:
            assert n.token_ids[-1] != u
    assert_consistent(model2, atok, trees2, cfg, 0)


def test_lookahead_branches_on_the_near_tie_with_the_other_token(atok):
    u = atok.convert_tokens_to_ids("U")
    left, right = _ids(atok, "pqrstuvwxyz"), _ids(atok, "ABCDEFGHIJK")
    s0 = atok.convert_tokens_to_ids("a")
    gap = math.log(0.55 / 0.45)  # p1 = 0.55, p2 = 0.45 -> p2 > 0.1 and p1 - p2 = 0.1 < 0.3
    succ = {s0: [u], u: [left[0], (right[0], -gap)]}
    for seq in (left, right):
        succ.update({seq[i]: [seq[i + 1]] for i in range(len(seq) - 1)})
    model = bigram_llama(len(atok), succ)
    cfg = _cfg("tree", "lookahead", num_generations=4, max_completion_length=10, segment_length=8,
               branching_factor=1, lookahead_tau_abs=0.1, lookahead_tau_rel=0.3, prune_similarity=1.0)
    trees = sample_rollouts(DecodeEngine(model, atok), atok, [PromptSpec(TaskRef("rg:t", "d", 0, 0), [s0])], cfg, 0,
                            torch.Generator().manual_seed(0))
    t = trees[0]
    forks = [n for n in t.nodes[1:] if len(n.children) > 1]
    assert forks
    for n in forks:
        assert n.token_ids[-1] == u
        assert {t.nodes[c].token_ids[0] for c in n.children} == {left[0], right[0]}
    assert trees.stats.prompts[0].forks >= 1
    assert_consistent(model, atok, trees, cfg, 0)


def test_fallback_reforks_finished_leaves_without_reprefill(atok):
    s0, s1, s2 = _ids(atok, "abc")
    model = bigram_llama(len(atok), {s0: [s1], s1: [s2], s2: [atok.eos_token_id]})
    cfg = _cfg("tree", num_generations=6, max_completion_length=12, segment_length=4, branching_factor=2)
    trees = sample_rollouts(DecodeEngine(model, atok), atok, [PromptSpec(TaskRef("rg:t", "d", 0, 0), [s0])], cfg, 0,
                            torch.Generator().manual_seed(0))
    t, st = trees[0], trees.stats.prompts[0]
    assert st.leaves == 6 and st.fallbacks == 2  # 2 root copies finish at once, then 2 fallbacks of 2 copies
    assert all(t.nodes[lf].finish_reason == "eos" for lf in t.leaves())
    assert trees.stats.prefill_tokens == 1 and trees.stats.refeed_rows == 4  # cut at the root: re-feed 1 token
    assert_consistent(model, atok, trees, cfg, 0)


# ------------------------------------------------------------------------------------------ rule functions
def test_treepo_budget_transfer():
    # the tree doubles until the width is reached (b=2, w=8): 2 -> 4 -> 8 -> 8
    assert treepo_total_copies(8, 0, 0, 2, 2) == 4
    assert treepo_total_copies(8, 0, 0, 4, 2) == 8
    assert treepo_total_copies(8, 0, 0, 8, 2) == 8
    # 1 of 4 finished this step: 3 live; remaining 7 -> min(7, 2*1 + 2*3 = 8) = 7 (its slot goes to survivors)
    assert treepo_total_copies(8, 1, 1, 3, 2) == 7
    # width already used up by finished leaves: survivors still continue once each (the max(., live) floor)
    assert treepo_total_copies(8, 8, 0, 2, 2) == 2
    assert treepo_total_copies(8, 3, 0, 0, 2) == 0


def test_split_copies():
    assert split_copies(8, 4) == [2, 2, 2, 2]
    assert split_copies(7, 3, None) == [3, 2, 2]
    out = split_copies(7, 3, torch.Generator().manual_seed(0))
    assert sorted(out) == [2, 2, 3] and sum(out) == 7
    with pytest.raises(ValueError):
        split_copies(2, 3)


def test_surprisal_fork_points_pick_top_n_eligible():
    surps = [[0.1, 2.0, 0.5], [3.0, 0.2, 2.0]]
    elig = [[True, True, True], [False, True, True]]  # segment 1's first token is a branch's first token
    assert surprisal_fork_points(surps, elig, 2) == [(0, 1), (1, 2)]  # 3.0 excluded; 2.0 tie -> earlier segment
    assert surprisal_fork_points(surps, elig, 10) == [(0, 1), (1, 2), (0, 2), (1, 1), (0, 0)]
    assert surprisal_fork_points(surps, [[False] * 3, [False] * 3], 3) == []
    with pytest.raises(ValueError):
        surprisal_fork_points([[1.0]], [[True, False]], 1)


def test_lookahead_alternative_rule():
    # p2 = 0.35 > 0.1 and p1 - p2 = 0.05 < 0.3: branch on the second-ranked token
    assert lookahead_alternative((4, 9), (0.4, 0.35), sampled=4, tau_abs=0.1, tau_rel=0.3) == 9
    # the path itself sampled the second-ranked token: the branch takes the first-ranked one
    assert lookahead_alternative((4, 9), (0.4, 0.35), sampled=9, tau_abs=0.1, tau_rel=0.3) == 4
    assert lookahead_alternative((4, 9), (0.4, 0.35), sampled=2, tau_abs=0.1, tau_rel=0.3) == 9
    # p2 too small, or gap too large: no branch
    assert lookahead_alternative((4, 9), (0.9, 0.05), sampled=4, tau_abs=0.1, tau_rel=0.3) is None
    assert lookahead_alternative((4, 9), (0.65, 0.3), sampled=4, tau_abs=0.1, tau_rel=0.3) is None
    # from hand-built logits: softmax([2, 1.8, 0]) -> p1 ~ 0.50, p2 ~ 0.41
    p = torch.softmax(torch.tensor([2.0, 1.8, 0.0]), -1)
    v, i = torch.topk(p, 2)
    assert lookahead_alternative(tuple(i.tolist()), tuple(v.tolist()), 0, 0.25, 0.15) == 1
    assert lookahead_alternative(tuple(i.tolist()), tuple(v.tolist()), 0, 0.45, 0.15) is None


def test_near_duplicate():
    assert near_duplicate("the answer is 42", "the answer is 42", 0.9)
    assert near_duplicate("the answer is 42", "the answer is 43", 0.9)  # ratio 0.9375
    assert not near_duplicate("the answer is 42", "so we add 7 to 5", 0.9)


def test_pruned_leaves_are_dropped_before_scoring_and_training():
    """``without_pruned`` keeps every non-pruned leaf with its exact completion and drops pruned branches and
    the segments only they used; the node scores and trains on that tree (node.py step 3)."""
    from swarmnode.rollout.tree import RolloutTree
    from swarmnode.tasks.base import TaskRef

    t = RolloutTree(task=TaskRef(source="rg:x", config_digest="0" * 16, seed=1, index=0), prompt_ids=[1, 2])
    a = t.add_child(0, [5, 6], text="ab")
    b = t.add_child(a, [7], text="c", finish_reason="eos")            # leaf "abc"
    c = t.add_child(a, [8, 9], text="de")                              # inner node used only by a pruned leaf
    p1 = t.add_child(c, [10], text="f", finish_reason="pruned")
    p2 = t.add_child(0, [11], text="g", finish_reason="pruned")
    d = t.add_child(0, [12, 13], text="hi", finish_reason="answer")
    assert t.pruned_leaves() == [p1, p2]
    kept = t.without_pruned()
    assert kept.pruned_leaves() == []
    assert sorted(kept.completion_ids(i) for i in kept.leaves()) == sorted([[5, 6, 7], [12, 13]])
    assert len(kept.nodes) == 4  # root, a, b, d: c is gone with its only leaf
    assert [kept.nodes[i].finish_reason for i in kept.leaves()] == ["eos", "answer"]
    assert kept.nodes[kept.nodes[1].node_id].finish_reason is None  # inner nodes carry no finish reason
    un = RolloutTree(task=t.task, prompt_ids=[1])
    un.add_child(0, [3], finish_reason="eos")
    assert un.without_pruned() is un


def test_prune_near_duplicates_waits_for_min_tokens():
    """A branch is compared with its sibling only once it has ``min_tokens`` tokens of its own (LATR's r), once."""
    from types import SimpleNamespace as NS

    from swarmnode.rollout.sampler import prune_near_duplicates

    def path(completion, born_at, ref=None):
        return NS(completion=completion, born_at=born_at, ref=ref, finish_reason=None, pruned=False)

    dec = lambda ids: "".join(chr(97 + i) for i in ids)  # noqa: E731
    sib = path([1, 2, 3, 4, 5], 0)
    young = path([1, 2, 3, 4], 2, ref=sib)        # 2 own tokens, identical to the sibling's
    assert prune_near_duplicates([young], dec, 0.9, min_tokens=3) == 0 and young.ref is sib  # not yet compared
    young.completion.append(5)                    # 3 own tokens: now compared, and a duplicate
    assert prune_near_duplicates([young], dec, 0.9, min_tokens=3) == 1
    assert young.pruned and young.finish_reason == "pruned" and young.ref is None
    other = path([1, 2, 7, 8, 9], 2, ref=sib)     # diverges: compared once, kept, never compared again
    assert prune_near_duplicates([other], dec, 0.9, min_tokens=3) == 0
    assert not other.pruned and other.ref is None
    done = path([1, 2, 3], 2, ref=sib)
    done.finish_reason = "eos"                    # a finished branch is a result, never pruned
    assert prune_near_duplicates([done], dec, 0.9, min_tokens=1) == 0 and done.finish_reason == "eos"


# ------------------------------------------------------------------------------------------ step-boundary branching
def _step_model(atok):
    """Bigram model of "reasoning steps": a -> b -> NL, then every step is "pr" or "qs" (50/50) and a newline."""
    nl = atok.convert_tokens_to_ids("\u010a")  # byte-level BPE's token for "\n"
    assert atok.decode([nl]) == "\n"
    a, b, p, q, r, s_ = _ids(atok, "abpqrs")
    succ = {a: [b], b: [nl], nl: [p, q], p: [r], q: [s_], r: [nl], s_: [nl]}
    return bigram_llama(len(atok), succ), nl, (p, q)


def _assert_forks_after_step_ends(tree, ends_step, firsts=None):
    """Every node where paths fork ends with a step-ending token; ``firsts``: the tokens a branch may start with."""
    forks = [n for n in tree.nodes[1:] if len(n.children) > 1]
    for n in forks:
        assert ends_step(n.token_ids[-1]), f"fork after {n.text!r}, which does not end a step"
        if firsts is not None:
            assert {tree.nodes[c].token_ids[0] for c in n.children} <= set(firsts)
    return forks


@pytest.mark.parametrize("budget", [None, 40])
def test_step_branching_forks_right_after_step_ends(atok, budget):
    model, nl, firsts = _step_model(atok)
    cfg = _cfg("tree", "step", num_generations=6, max_completion_length=14, segment_length=5, token_budget=budget,
               prune_similarity=1.0)
    trees = sample_rollouts(DecodeEngine(model, atok), atok, [PromptSpec(TaskRef("rg:t", "d", 0, 0), [_ids(atok, "a")[0]])],
                            cfg, 0, torch.Generator().manual_seed(0))
    t, st = trees[0], trees.stats.prompts[0]
    forks = _assert_forks_after_step_ends(t, lambda tok: tok == nl, firsts)
    assert forks and st.forks >= 2
    # a fork inside a segment cuts the node right after the newline (a node shorter than the segment has children)
    assert any(len(n.token_ids) < 5 for n in forks)
    assert st.leaves == 6 if budget is None else st.generated_tokens <= budget
    assert_consistent(model, atok, trees, cfg, 0)  # exact log-probs, leaves <= w, budget never exceeded


def test_step_branching_never_forks_inside_the_answer(atok):
    """Newlines only after the answer tag opened: no fork may land there; the tree still reaches its width."""
    nl = atok.convert_tokens_to_ids("\u010a")
    a, b, p, q = _ids(atok, "abpq")
    open_ = atok.convert_tokens_to_ids("<answer>")
    model = bigram_llama(len(atok), {a: [b], b: [open_], open_: [p, q], p: [nl], q: [nl], nl: [p, q]})
    cfg = _cfg("tree", "step", num_generations=4, max_completion_length=10, segment_length=4, prune_similarity=1.0)
    trees = sample_rollouts(DecodeEngine(model, atok), atok, [PromptSpec(TaskRef("rg:t", "d", 0, 0), [a])], cfg, 0,
                            torch.Generator().manual_seed(1))
    t = trees[0]
    assert not [n for n in t.nodes[1:] if len(n.children) > 1]  # only the root (the prompt's end) forks
    assert trees.stats.prompts[0].leaves == 4 and trees.stats.prompts[0].fallbacks >= 1
    assert_consistent(model, atok, trees, cfg, 0)


def test_step_branching_on_the_embedded_model():
    """The shipped model and tokenizer, through the loading code users get: forks land right after step-ending
    tokens (delimiters chosen so that its short answers contain some), budget and width rules hold."""
    from swarmnode.config import ModelConfig
    from swarmnode.policy.loading import load_policy

    pol = load_policy(ModelConfig(name_or_path="embedded", device="cpu"))
    tok = pol.tokenizer
    delims = list("0123456789") + [" "]
    qs = ["What is 3 + 4?", "Calculate 12 - 5 + 7.", "What is 9 * 3?", "What is 48 + 37?"]
    specs = [PromptSpec(TaskRef("rg:t", "d", 0, i), tok(pol.prompt(q)).input_ids, pol.prompt(q), "t")
             for i, q in enumerate(qs)]
    # its answers are 1-4 tokens: one-token segments let the tree fork inside them (and fallbacks cut at node ends)
    cfg = _cfg("tree", "step", num_generations=6, max_completion_length=16, segment_length=1, max_depth=16,
               token_budget=48, step_delimiters=delims)
    trees = sample_rollouts(DecodeEngine(pol.model, tok), tok, specs, cfg, 0, torch.Generator().manual_seed(0))
    ends = lambda t: tok.decode([t], skip_special_tokens=True).endswith(tuple(delims))  # noqa: E731
    forks = [f for t in trees for f in _assert_forks_after_step_ends(t, ends)]
    assert forks, "expected forks after digits in the embedded model's answers"
    assert_consistent(pol.model, tok, trees, cfg, 0)


def test_step_fork_points_round_robin_latest_first():
    assert step_fork_points([[3, 7], [5], []], 4) == [(0, 7), (1, 5), (0, 3)]
    assert step_fork_points([[3, 7], [5]], 1) == [(0, 7)]
    assert step_fork_points([[], []], 2) == []
    assert step_fork_points([[2, 2, 9]], 5) == [(0, 9), (0, 2)]
