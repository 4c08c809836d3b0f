"""Rescue (swarmnode/train/rescue.py, the heartbeat key ``rescue``, the SwarmClient side): the pending book, the
merged group's advantages, the helper's refusals and bounds, the wire round trip and rejections.

The end-to-end scenario over real loopback hivemind is in tests/e2e/test_rescue_e2e.py."""

from __future__ import annotations

import hashlib
import time

import pytest

from swarmnode.config import RescueConfig, RunConfig, SwarmConfig
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.step_credit import StepCredit
from swarmnode.rollout.tree import RolloutTree
from swarmnode.swarm import wire
from swarmnode.swarm.gossip import RescueRequest, SwarmClient, _flat_subtree
from swarmnode.swarm.identity import Identity
from swarmnode.tasks import ReasoningGymSource, TaskMix
from swarmnode.tasks.base import TaskRef
from swarmnode.tasks.partition import is_heldout_question
from swarmnode.testing.adversary import BYTE_TOKENIZER_ID, byte_tokenize
from swarmnode.train.rescue import (
    RESCUE_GROUP_SUFFIX,
    RescueBook,
    RescueHelper,
    is_all_wrong,
    merge_rescue,
)

SWARM = "test-rescue"
CHAIN2 = {"min_terms": 2, "max_terms": 2}
REF = TaskRef("rg:chain_sum", "0123456789abcdef", 0, 7)


def _own(ref: TaskRef = REF, n: int = 4, version: int = 3) -> RolloutTree:
    t = RolloutTree.from_group(ref, [1, 2, 3], [[10 + i, 11] for i in range(n)], texts=[f"wrong {i}" for i in range(n)],
                               logprobs=[[-0.5, -0.25]] * n, policy_version=version)
    for lid in t.leaves():
        t.nodes[lid].reward = 0.0
    t.update_stats()
    return t


def _peer(peer: str, texts: list[str], ref: TaskRef = REF, **kw) -> PeerTree:
    t = RolloutTree.from_group(ref, [9, 9], [[20 + i, 21, 22] for i in range(len(texts))], texts=texts,
                               logprobs=[[-1.0, -1.0, -1.0]] * len(texts))
    for lid, x in zip(t.leaves(), texts):
        t.nodes[lid].reward = 1.0 if x.startswith("right") else 0.0
    t.model_id, t.tokenizer_id = kw.pop("model_id", "m"), kw.pop("tokenizer_id", "tok")
    return PeerTree(t, peer, model_id=t.model_id, tokenizer_id=t.tokenizer_id, policy_version=1, same_tokenizer=True,
                    **kw)


def _score(text: str) -> tuple[bool, float]:
    ok = text.startswith("right")
    return ok, 1.0 if ok else 0.0


# ============================================================================ the book
def test_all_wrong_needs_two_leaves_and_no_exact_correct_one():
    assert is_all_wrong([0.0, 0.0]) and is_all_wrong([0.5, 0.99])
    assert not is_all_wrong([0.0]) and not is_all_wrong([]) and not is_all_wrong([0.0, 1.0])


def test_the_book_holds_newest_first_expires_and_is_bounded():
    book = RescueBook(max_age_steps=2, capacity=3)
    refs = [TaskRef("rg:chain_sum", "d", 0, i) for i in range(5)]
    book.add(_own(refs[0]), 0)
    book.add(_own(refs[1]), 1)
    assert book.refs(4) == [refs[1], refs[0]] and book.refs(1) == [refs[1]]
    assert book.expire(1) == 0 and book.expire(2) == 1 and refs[0].key() not in book
    for i in (2, 3, 4):
        book.add(_own(refs[i]), 2)
    assert len(book) == 3 and refs[1].key() not in book  # the oldest pushed out by the capacity ...
    assert book.expire(2) == 1  # ... and reported as expired
    got = book.take(refs[3].key())
    assert got is not None and got.step == 2 and got.ref == refs[3] and book.take(refs[3].key()) is None
    with pytest.raises(ValueError):
        RescueBook(0, 4)


def test_answered_questions_are_announced_after_the_unanswered_ones():
    """A question whose merged answer the screen dropped stays pending (a clean answer may still come), but a
    helper that answered it refuses it as a repeat for a while: announced first, it crowded out fresh questions
    (a 600-step pair merged half as many groups as before)."""
    book = RescueBook(max_age_steps=4, capacity=8)
    refs = [TaskRef("rg:chain_sum", "d", 0, i) for i in range(6)]
    for i, r in enumerate(refs):
        book.add(_own(r), i // 2)
    book.mark_answered(refs[5].key())
    book.mark_answered(refs[4].key())
    book.mark_answered("not pending")  # ignored
    assert book.refs(4) == [refs[3], refs[2], refs[1], refs[0]]
    assert book.refs(6) == [refs[3], refs[2], refs[1], refs[0], refs[5], refs[4]]
    assert refs[5].key() in book and book.get(refs[5].key()).answered


# ============================================================================ merge
@pytest.mark.parametrize("estimator", ["grpo", "mc_grpo", "tree_grpo", "treepo", "treerl"])
def test_merge_gives_own_wrong_leaves_negative_and_peer_correct_ones_positive_advantages(estimator):
    book = RescueBook(4, 8)
    book.add(_own(), 3)
    entry = book.get(REF.key())
    peers = [_peer("p1", ["right a", "wrong x", "right b"]), _peer("p2", ["right c"])]
    g = merge_rescue(entry, peers, _score, max_merged=4, estimator=estimator, our_model_id="m",
                     our_tokenizer_id="tok")
    assert g is not None and g.key == REF.key() and g.peers == {"p1", "p2"}
    assert len(g.peer) == 3 and all(s.reward == 1.0 for s in g.peer)  # the wrong peer leaf is not merged
    assert g.rewards == [0.0] * 4 + [1.0] * 3
    assert all(a > 0 for s in g.peer for a in s.advantages)
    if estimator == "mc_grpo":  # the median (0 here) is the baseline: wrong leaves sit at it, one is dropped
        assert all(a <= 0 for s in g.own for a in s.advantages) and len(g.own) == 3
    else:
        assert all(a < 0 for s in g.own for a in s.advantages) and len(g.own) == 4
    assert {s.group_id for s in g.own + g.peer} == {REF.key() + RESCUE_GROUP_SUFFIX}
    own = g.own[0]
    assert own.is_local and own.behaviour_logprobs == [-0.5, -0.25] and own.policy_version == 3
    p = g.peer[0]
    assert p.source == "external:p1" and p.prompt_ids == [1, 2, 3]  # OUR prompt for the task
    assert p.behaviour_logprobs is not None and p.policy_version == 1


def test_the_peer_advantage_scale_multiplies_the_peer_leaves_only():
    book = RescueBook(4, 8)
    book.add(_own(), 3)
    entry = book.get(REF.key())
    peers = [_peer("p1", ["right a", "wrong x", "right b"])]
    kw = dict(max_merged=4, estimator="grpo", our_model_id="m", our_tokenizer_id="tok")
    plain = merge_rescue(entry, peers, _score, **kw)
    scaled = merge_rescue(entry, peers, _score, peer_advantage_scale=4.0, **kw)
    assert plain is not None and scaled is not None
    for a, b in zip(plain.peer, scaled.peer):
        assert a.advantages and b.advantages == pytest.approx([4.0 * x for x in a.advantages])
        assert all(x > 0 for x in b.advantages)
    assert [s.advantages for s in scaled.own] == [s.advantages for s in plain.own]  # the own leaves keep theirs
    assert scaled.rewards == plain.rewards  # rewards and the group are unchanged
    for bad in (0.5, 0.0, -1.0, 16.5, 1e300, float("inf"), float("nan"), True, "4"):
        with pytest.raises(ValueError, match="levers.rescue.peer_advantage_scale"):
            merge_rescue(entry, peers, _score, peer_advantage_scale=bad, **kw)
    cfg = RunConfig()
    assert cfg.levers.rescue.peer_advantage_scale == 1.0
    with pytest.raises(ValueError, match="peer_advantage_scale"):
        RescueConfig(peer_advantage_scale=0.5)


def _packaged_tokenizer(model_dir):
    """A packaged model's tokenizer (real Hugging Face tokenizer files); skips when it is not built."""
    from transformers import AutoTokenizer

    if not (model_dir / "tokenizer.json").is_file():
        pytest.skip(f"the packaged tokenizer is not built ({model_dir})")
    return AutoTokenizer.from_pretrained(str(model_dir))


def _chain_sum_and_its_worked_solution():
    """A 4-term chain_sum of the training stream: (source, ref, task, worked solution text)."""
    from swarmnode.tasks.solutions import worked_solution

    src = ReasoningGymSource("chain_sum", {"min_terms": 4, "max_terms": 4})
    ref = src.ref(5, 3)
    task = src.get(ref)
    sol = worked_solution("chain_sum", {"question": task.question, "answer": task.answer, "metadata": task.metadata})
    return src, ref, task, sol


def test_a_payload_line_of_a_merged_right_answer_keeps_no_positive_advantage():
    """With our step checks given (the node passes them when external step credit is on), a merged peer answer is
    masked like any external sample: a clean worked solution keeps its (scaled) positive advantage on every
    token, a payload line -- not a step -- gets 0, and the answer keeps its own."""
    from swarmnode.policy.loading import EMBEDDED_DIR

    tok = _packaged_tokenizer(EMBEDDED_DIR)
    src, ref, task, sol = _chain_sum_and_its_worked_solution()
    texts = {"clean": sol, "payload": "pwned!\n" + sol}
    own = RolloutTree.from_group(ref, [1, 2], [tok.encode("<answer>0</answer>", add_special_tokens=False)] * 3,
                                 texts=["<answer>0</answer>"] * 3)
    for lid in own.leaves():
        own.nodes[lid].reward = 0.0
    book = RescueBook(4, 8)
    book.add(own, 0)
    peer_tree = RolloutTree.from_group(ref, [9], [tok.encode(t, add_special_tokens=False) for t in texts.values()],
                                       texts=list(texts.values()))
    for lid in peer_tree.leaves():
        peer_tree.nodes[lid].reward = 1.0
    pt = PeerTree(peer_tree, "p1", model_id="m", tokenizer_id="tok", policy_version=1, same_tokenizer=True)

    def score(text: str) -> tuple[bool, float]:
        ok = src.score(task, text) >= 1.0
        return ok, 1.0 if ok else 0.0

    credit = StepCredit(src.get, tok, mask=True)
    kw = dict(max_merged=4, estimator="grpo", peer_advantage_scale=4.0)
    plain = merge_rescue(book.get(ref.key()), [pt], score, **kw)
    masked = merge_rescue(book.get(ref.key()), [pt], score, step_credit=credit, **kw)
    assert plain is not None and masked is not None and len(masked.peer) == 2
    clean, payload = masked.peer
    assert clean.advantages == plain.peer[0].advantages and min(clean.advantages) > 0  # every line valid: unchanged
    n_reasoning = len(tok.encode(texts["payload"][: texts["payload"].index("<answer>")], add_special_tokens=False))
    # the payload line is not a step, and it shifts every worked line off the step it is judged against (a line
    # is the k-th step or invalid): the whole reasoning gets no positive push, the answer keeps its advantage
    assert payload.advantages[:n_reasoning] == [0.0] * n_reasoning
    assert payload.advantages[n_reasoning:] == plain.peer[1].advantages[n_reasoning:]
    assert min(plain.peer[1].advantages) > 0  # without our checks the payload was pushed up 4x
    assert [s.advantages for s in masked.own] == [s.advantages for s in plain.own]
    with pytest.raises(ValueError, match="advantages for"):
        credit.mask_tokens(ref, [1, 2], [1.0])
    off = merge_rescue(book.get(ref.key()), [pt], score, step_credit=StepCredit(src.get, tok, mask=False), **kw)
    assert [s.advantages for s in off.peer] == [s.advantages for s in plain.peer]  # mask off: unchanged


def test_a_multi_byte_payload_line_is_masked_whole_with_a_byte_level_tokenizer():
    """With byte-level BPE every byte of a multi-byte character but the last decodes to nothing; such tokens of a
    peer's completion go with the character they start, so none of a payload line of emoji and CJK keeps a
    positive advantage (an outside review found 28 of its ~40 tokens positive, through rescue and the ordinary
    external path alike)."""
    from swarmnode.policy.loading import EMBEDDED_BPE_DIR

    tok = _packaged_tokenizer(EMBEDDED_BPE_DIR)
    src, ref, task, sol = _chain_sum_and_its_worked_solution()
    text = "\U0001f4a3\U0001f4a3\u4f60\u597d\u4e16\u754c\U0001f525 payload\n" + sol
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    n_reasoning = len(tok.encode(text[: text.index("<answer>")], add_special_tokens=False))
    credit = StepCredit(src.get, tok, mask=True)
    for adv, zeroed in (credit.mask_tokens(ref, ids, [6.0] * len(ids)),
                        credit.token_advantages(6.0, ids, credit.report(ref, ids))):
        assert n_reasoning < len(ids) and adv[:n_reasoning] == [0.0] * n_reasoning, adv[:n_reasoning]
        assert zeroed == n_reasoning and adv[n_reasoning:] == [6.0] * (len(ids) - n_reasoning)
    clean = tok.encode(sol, add_special_tokens=False)
    assert credit.mask_tokens(ref, clean, [6.0] * len(clean)) == ([6.0] * len(clean), 0)


def test_merge_caps_the_peer_leaves_takes_turns_and_drops_foreign_logprobs():
    book = RescueBook(4, 8)
    book.add(_own(), 0)
    many = _peer("p1", [f"right {i}" for i in range(6)], model_id="other", tokenizer_id="other-tok")
    other = _peer("p2", ["right z"])
    g = merge_rescue(book.get(REF.key()), [many, other], _score, max_merged=2, estimator="grpo",
                     our_model_id="m", our_tokenizer_id="tok")
    assert len(g.peer) == 2 and g.peers == {"p1", "p2"}  # one each per turn, not two of p1
    assert next(s for s in g.peer if s.source == "external:p1").behaviour_logprobs is None  # another model
    # too long for max_len: skipped; no correct leaf at all: nothing merged
    assert merge_rescue(book.get(REF.key()), [other], _score, max_merged=2, estimator="grpo", max_len=2) is None
    assert merge_rescue(book.get(REF.key()), [_peer("p3", ["wrong 1", "wrong 2"])], _score, max_merged=4,
                        estimator="grpo") is None
    assert merge_rescue(book.get(REF.key()), [_peer("p4", ["right"], ref=TaskRef("rg:x", "", 0, 1))], _score,
                        max_merged=4, estimator="grpo") is None  # another task's tree is never merged
    with pytest.raises(ValueError, match="max_merged"):
        merge_rescue(book.get(REF.key()), [other], _score, max_merged=0, estimator="grpo")


# ============================================================================ the helper
@pytest.fixture(scope="module")
def mix():
    return TaskMix([ReasoningGymSource("chain_sum", CHAIN2)], [1.0])


def _checks(mix, calls=None):
    def is_heldout(ref):
        if calls is not None:
            calls.append(ref)
        return is_heldout_question(mix.get(ref).question, mix.eval_fraction)

    return {"source_known": lambda r: mix.source_index(r) is not None, "is_heldout": is_heldout,
            "contains": mix.contains}


def test_the_helper_refuses_heldout_unknown_and_unearned_requests(mix):
    h = RescueHelper(RescueConfig(enabled=True, answer_prompts=8, max_answers_per_peer=8, min_standing=1,
                                  young_answers=0))
    train = mix.refs_for_step(0, 2)
    held = mix.eval_refs(1)
    assert is_heldout_question(mix.get(held[0]).question, mix.eval_fraction)
    unknown = TaskRef("rg:not_a_task", "ffff", 0, 1)
    reqs = [RescueRequest("asker", train[0], 2), RescueRequest("asker", unknown, 2),
            RescueRequest("asker", held[0], 2), RescueRequest("asker", train[1], 2),
            RescueRequest("fresh", train[1], 0), ("bad",), 3]
    chosen, c = h.select(reqs, 0, **_checks(mix))
    assert chosen == [("asker", train[0])]
    assert c["rescue/refused_heldout"] == 1 and c["rescue/refused_task"] == 1 and c["rescue/refused_standing"] == 1
    # an asker of a held-out question (no honest asker announces one) is skipped: its later refs, and its
    # requests for skip_steps steps
    assert c["rescue/refused_skipped"] == 1
    chosen, c = h.select(reqs[:1] + reqs[3:4], 1, **_checks(mix))
    assert chosen == [] and c["rescue/refused_skipped"] == 2
    # after the skip, the same (asker, ref) is still never answered twice within the TTL
    chosen, c = h.select(reqs[:1], 1 + 1 + h.cfg.skip_steps, **_checks(mix))
    assert chosen == [] and c["rescue/refused_repeat"] == 1


def test_a_question_is_answered_once_whoever_asks_it(mix):
    """Keys repeating another asker's questions cannot make the helper answer one question many times: our
    answers are public bundles, so every asker of the question gets them (an outside attack had 4 keys repeating
    one asker's 4 questions answered 16 times in 8 steps)."""
    h = RescueHelper(RescueConfig(enabled=True, answer_prompts=4, max_answers_per_peer=4, min_standing=1))
    refs = mix.refs_for_step(0, 4)
    answered = []
    for step in range(8):
        reqs = [RescueRequest(asker, ref, 1) for asker in ("honest", "s1", "s2", "s3", "s4") for ref in refs]
        chosen, c = h.select(reqs, step, **_checks(mix))
        answered += [ref for _, ref in chosen]
        if step == 0:  # one step: each question once, though five keys ask it
            assert sorted(r.index for r in answered) == sorted(r.index for r in refs)
            assert c["rescue/refused_repeat"] + c["rescue/refused_budget"] == 5 * 4 - 4
    assert len(answered) == len(refs)  # and not again within the TTL


def test_the_helper_bounds_per_asker_and_in_total_least_recently_served_first(mix):
    h = RescueHelper(RescueConfig(enabled=True, answer_prompts=2, max_answers_per_peer=1, min_standing=1),
                     answered_ttl_steps=100)
    refs = mix.refs_for_step(0, 12)
    reqs = [RescueRequest(p, r, 1) for p, rs in (("a", refs[0:4]), ("b", refs[4:8]), ("c", refs[8:12]))
            for r in rs]
    chosen, c = h.select(reqs, 0, **_checks(mix))
    assert len(chosen) == 2 and len({p for p, _ in chosen}) == 2  # one per asker, two in all
    assert c["rescue/refused_budget"] == 10
    first = {p for p, _ in chosen}
    chosen2, _ = h.select(reqs, 1, **_checks(mix))
    assert (set("abc") - first) <= {p for p, _ in chosen2}  # the asker not served yet goes first


def test_a_flood_of_askers_costs_bounded_work(mix):
    cfg = RescueConfig(enabled=True, answer_prompts=2, max_answers_per_peer=1, min_standing=1)
    h = RescueHelper(cfg)
    refs = mix.refs_for_step(0, 8)
    held = mix.eval_refs(8)
    # 1000 askers with standing, each asking for 8 held-out questions: only a bounded number is regenerated
    reqs = [RescueRequest(f"asker-{i}", held[j], 5) for i in range(1000) for j in range(8)]
    reqs += [RescueRequest("honest", refs[0], 5)]
    calls: list = []
    chosen, c = h.select(reqs, 0, **_checks(mix, calls))
    assert len(calls) <= cfg.answer_prompts * 8 and c["rescue/checks"] == len(calls)
    assert len(chosen) <= cfg.answer_prompts
    assert sum(v for k, v in c.items() if k.startswith("rescue/refused")) + len(chosen) == len(reqs)
    # 1000 askers without standing share the young slot: one question answered, at most 8 regenerations
    calls.clear()
    flood = [RescueRequest(f"fresh-{i}", held[i % 8], 0) for i in range(1000)]
    chosen, c = h.select(flood + [RescueRequest("fresh-honest", refs[1], 0)], 1, **_checks(mix, calls))
    assert len(chosen) <= cfg.young_answers and len(calls) <= cfg.young_answers * 8
    assert c["rescue/refused_standing"] >= 1000 - 8
    # and with young_answers 0 they cost no regeneration at all
    h0 = RescueHelper(RescueConfig(enabled=True, answer_prompts=2, max_answers_per_peer=1, min_standing=1,
                                   young_answers=0))
    calls.clear()
    chosen, c = h0.select([RescueRequest(f"fresh-{i}", refs[1], 0) for i in range(1000)], 1, **_checks(mix, calls))
    assert chosen == [] and calls == [] and c["rescue/refused_standing"] == 1000


@pytest.mark.parametrize("fresh_per_step", [1, 8, 32])
@pytest.mark.parametrize("heldout", [False, True])
def test_fresh_keys_minted_every_step_cannot_starve_a_waiting_young_asker(mix, fresh_per_step, heldout):
    """Outside attack on the young slots: with "never served first", one fresh key a step took the young slot every
    step (an honest young asker answered 1 of 24 steps; 8 fresh keys a step asking held-out questions: 0 of 24,
    nobody answered, 8 regenerations a step spent on refusals). An asker's place is now the step it was last
    served, or first asked; an asker of a held-out question is skipped."""
    h = RescueHelper(RescueConfig(enabled=True, answer_prompts=2, max_answers_per_peer=1, min_standing=1,
                                  young_answers=1))
    refs = mix.refs_for_step(0, 64)
    held = mix.eval_refs(64)
    answered, checks = 0, 0
    for step in range(24):
        honest = [RescueRequest("honest young", refs[(step + k) % 64], 0) for k in range(4)]
        flood = [RescueRequest(f"fresh {step} {i}", (held if heldout else refs)[(7 * step + i + 32) % 64], 0)
                 for i in range(fresh_per_step)]
        chosen, c = h.select(flood + honest, step, **_checks(mix))
        answered += any(p == "honest young" for p, _ in chosen)
        checks += c["rescue/checks"]
        assert sum(1 for p, _ in chosen if p != "honest young") <= 1  # the young slot, at most
        assert c["rescue/checks"] <= 2 * 8
    # the first step is a salted draw among keys that all arrived together; then the honest asker, served or
    # waiting since before any key minted later, goes first (a question already answered is a repeat: at most
    # 4 x 24 distinct questions asked, each answered once)
    assert answered >= 23 - (4 * 24 // 64), answered


def test_askers_without_standing_share_the_young_slots_after_those_with_standing(mix):
    """A weaker peer earns no standing with a stronger one (the stronger node rarely trains on its trees), yet
    its all-wrong questions are where the stronger node's answers help most: askers below min_standing get
    young_answers of the step's slots, after the askers with standing, least recently served first."""
    h = RescueHelper(RescueConfig(enabled=True, answer_prompts=3, max_answers_per_peer=3, min_standing=1,
                                  young_answers=2), answered_ttl_steps=100)
    refs = mix.refs_for_step(0, 12)
    reqs = ([RescueRequest("young-a", r, 0) for r in refs[0:3]] + [RescueRequest("young-b", r, 0) for r in refs[3:6]]
            + [RescueRequest("earned", r, 4) for r in refs[6:8]])
    chosen, c = h.select(reqs, 0, **_checks(mix))
    assert [p for p, _ in chosen[:2]] == ["earned", "earned"]  # standing first, its two questions
    assert len(chosen) == 3 and {p for p, _ in chosen[2:]} <= {"young-a", "young-b"}
    first_young = chosen[2][0]
    assert c["rescue/refused_standing"] + c["rescue/refused_budget"] == 8 - 3
    # next step: nobody with standing asks; two young slots, the young asker not yet served goes first
    chosen, c = h.select(reqs[:6], 1, **_checks(mix))
    assert len(chosen) == 2 and chosen[0][0] != first_young
    assert c["rescue/refused_standing"] >= 6 - 2 - 3  # the rest: refused for standing or already answered


def test_an_asker_whose_questions_we_never_solve_is_skipped_for_a_while(mix):
    h = RescueHelper(RescueConfig(enabled=True, answer_prompts=1, min_standing=0, skip_after_failures=2,
                                  skip_steps=3), answered_ttl_steps=1)
    refs = mix.refs_for_step(0, 10)
    for step in (0, 1):
        chosen, _ = h.select([("hard", refs[step])], step, **_checks(mix))
        assert chosen
        h.record({"hard": False}, step)
    chosen, c = h.select([("hard", refs[2])], 2, **_checks(mix))
    assert chosen == [] and c["rescue/refused_skipped"] == 1
    chosen, _ = h.select([("hard", refs[3])], 2 + 3, **_checks(mix))
    assert chosen  # the skip is over
    h.record({"hard": True}, 5)  # a success resets the streak
    h.record({"hard": False}, 6)
    assert h.select([("hard", refs[4])], 7, **_checks(mix))[0]
    # answering nothing: answer_prompts 0 refuses everything under the budget
    h0 = RescueHelper(RescueConfig(enabled=True, answer_prompts=0, min_standing=0))
    chosen, c = h0.select([("x", refs[5])], 0, **_checks(mix))
    assert chosen == [] and c["rescue/refused_budget"] == 1 and c["rescue/checks"] == 0


# ============================================================================ wire
def _ident(name: str) -> Identity:
    return Identity.from_private_bytes(hashlib.sha256(f"test_rescue {name}".encode()).digest())


def _beat(ident: Identity, rescue=None, rates=None, t=None) -> wire.Heartbeat:
    return wire.Heartbeat(swarm_id=SWARM, peer_id=ident.peer_id, model_id="m", step=1, reward_mean=None,
                          accuracy=None, samples_published=0, samples_accepted=0, samples_rejected=0,
                          created_at=time.time() if t is None else t, task_rates=rates, rescue=rescue)


def test_heartbeat_rescue_round_trips_beside_rates_and_keeps_old_bytes():
    a = _ident("a")
    refs = [TaskRef("rg:chain_sum", "0123456789abcdef", 0, i) for i in range(wire.MAX_RESCUE_REFS)]
    hb = _beat(a, rescue=refs, rates={"rg:chain_sum#0123456789abcdef": (8, 2)}, t=1.0e9)
    got = wire.decode_heartbeat(wire.encode_heartbeat(hb, a))
    assert got.rescue == refs and got.task_rates == hb.task_rates
    body = wire.decode(wire.encode_heartbeat(hb, a))[0].body
    import msgpack
    assert list(msgpack.unpackb(body)) == list(wire.heartbeat_keys(["rates", "rescue"]))
    # without the key the bytes are those of a plain heartbeat
    plain = _beat(a, t=1.0e9)
    assert wire.encode_heartbeat(_beat(a, rescue=[], t=1.0e9), a) == wire.encode_heartbeat(plain, a)
    assert wire.decode_heartbeat(wire.encode_heartbeat(plain, a)).rescue is None


@pytest.mark.parametrize("value, reason", [
    ([], "schema"),
    ([["rg:chain_sum", "d", 0, i] for i in range(wire.MAX_RESCUE_REFS + 1)], "too_large"),
    ([["rg:chain_sum", "d", 0, 1], ["rg:chain_sum", "d", 0, 1]], "schema"),
    ([["rg:chain_sum", "d", 0]], "schema"),
    ([["", "d", 0, 1]], "schema"),
    ("rg:chain_sum", "schema"),
    ([["rg:chain_sum", "d", -1, 1]], "schema"),
])
def test_bad_rescue_values_are_rejected_with_their_reason(value, reason):
    import msgpack

    a = _ident("a")
    raw = msgpack.unpackb(wire.decode(wire.encode_heartbeat(_beat(a, rescue=[REF]), a))[0].body)
    raw["rescue"] = value
    env = wire.seal(a, "heartbeat", msgpack.packb(raw, use_bin_type=True))
    with pytest.raises(wire.WireError) as e:
        wire.decode_heartbeat(env)
    assert e.value.reason == reason and "rescue" in str(e.value)
    with pytest.raises(wire.WireError):  # and a sender cannot write too many either
        wire.encode_heartbeat(_beat(a, rescue=[TaskRef("s", "", 0, i) for i in range(9)]), a)


# ============================================================================ the swarm client (no network)
def _client(mix, **rescue) -> SwarmClient:
    cfg = RunConfig(swarm=SwarmConfig(enabled=True, swarm_id=SWARM), levers={"rescue": {"enabled": True, **rescue}})
    return SwarmClient(cfg, _ident("client"), mix, 256, "m", BYTE_TOKENIZER_ID, byte_tokenize, None, start=False)


def _entry(ident: Identity, rescue, t=None) -> tuple[bytes, bytes]:
    return ident.public_key_bytes, wire.encode_heartbeat(_beat(ident, rescue=rescue, t=t), ident)


def test_the_client_announces_cleaned_refs_and_reads_peers_requests(mix):
    c = _client(mix, max_requests=2)
    refs = mix.refs_for_step(0, 4)
    c.announce_rescue([refs[0], "junk", refs[0], refs[1], refs[2]])  # type: ignore[list-item]
    assert c.rescue_refs() == refs[:2]
    c.announce_rescue(None)
    assert c.rescue_refs() == []
    asker, banned, fresh = _ident("asker"), _ident("banned"), _ident("fresh")
    c.peers.record_earned(asker.peer_id, 3)
    now = time.time()
    c.note_peer_rates([_entry(asker, refs[:2], now), _entry(fresh, [refs[3]], now), _entry(banned, [refs[2]], now),
                       _entry(c.identity, [refs[0]], now),  # ourselves
                       _entry(_ident("old"), [refs[0]], now - 10 * c.scfg.trust.freshness_seconds)])
    for _ in range(c.scfg.trust.ban_after):
        c.peers.record_reject(banned.peer_id, "bad_signature", True, "test")
    got = c.rescue_requests()
    assert {(p, r) for p, r in got} == {(asker.peer_id, refs[0]), (asker.peer_id, refs[1]), (fresh.peer_id, refs[3])}
    assert {r.peer_id: r.standing for r in got} == {asker.peer_id: 3, fresh.peer_id: 0}
    # a newer heartbeat without the key withdraws the requests; an older one changes nothing
    c.note_peer_rates([_entry(asker, None, now + 1), _entry(fresh, [refs[0]], now - 5)])
    assert {(p, r) for p, r in c.rescue_requests()} == {(fresh.peer_id, refs[3])}


def test_a_flood_of_fresh_askers_is_bounded_in_memory(mix):
    c = _client(mix)
    refs = mix.refs_for_step(0, 8)
    flood = [_ident(f"flood {i}") for i in range(200)]
    honest = _ident("honest asker")
    c.peers.record_earned(honest.peer_id, 1)
    now = time.time()
    c.note_peer_rates([_entry(k, refs, now) for k in flood] + [_entry(honest, refs[:1], now - 1)])
    got = c.rescue_requests()
    askers = {p for p, _ in got}
    assert honest.peer_id in askers and len(askers) <= 65 and len(got) <= 64 * 8 + 1


def test_rescue_answers_without_contrast_are_published_and_admitted_when_asked(mix):
    ref = mix.refs_for_step(0, 1)[0]
    t = RolloutTree.from_group(ref, [1, 2], [[3, 4], [3, 4], [5, 6]], texts=["a", "a", "b"])
    for lid in t.leaves():
        t.nodes[lid].reward = 1.0
    flat = _flat_subtree(t, 8)
    assert flat is not None and len(flat.leaves()) == 2  # duplicates dropped, no contrast needed
    assert len(_flat_subtree(t, 1).leaves()) == 1
    c = _client(mix)
    try:
        m = c.publish_rescue([t], 0, policy_version=0)
        assert m["rescue/published_trees"] == 1 and m["rescue/published_leaves"] == 2
        # a young key's tree without contrast is admitted when we asked for its question, dropped otherwise
        young = PeerTree(flat, "young-peer")
        assert c._admit([young])[0] == []
        c.announce_rescue([ref])
        assert c._admit([PeerTree(flat, "young-peer-2")])[0]
    finally:
        c.close()


def test_a_heartbeat_over_the_byte_limit_drops_rescue_refs_from_the_end():
    from swarmnode.swarm.gossip import _fitting_heartbeat

    a = _ident("big")
    refs = [TaskRef("rg:" + "x" * 250 + f"{i:03d}", "f" * 64, 2**62, 2**62) for i in range(wire.MAX_RESCUE_REFS)]
    rates = {f"{i:02d}" + "k" * 126: (wire.MAX_RATE_COUNT, 1) for i in range(wire.MAX_RATE_TASKS)}
    beat = _beat(a, rescue=list(refs), rates=rates)
    beat.model_id = "m" * wire.MAX_ID_BYTES
    with pytest.raises(wire.WireError) as e:
        wire.encode_heartbeat(beat, a)
    assert e.value.reason == "too_large"
    data = _fitting_heartbeat(beat, a)
    assert data is not None and len(data) <= wire.MAX_HEARTBEAT_BYTES
    got = wire.decode_heartbeat(data)
    assert got.task_rates == rates and got.rescue and got.rescue == refs[: len(got.rescue)] and len(got.rescue) < 8


def test_the_node_skips_rescue_with_a_swarm_hook_that_lacks_the_methods(mix):
    """A SwarmHook without announce_rescue / rescue_requests / publish_rescue (e.g. a wrapper written before them)
    runs without rescue; the real SwarmClient has them."""
    from types import SimpleNamespace

    from swarmnode.node import Node, RescueSwarm

    class OldHook:
        def publish(self, trees, step, policy_version):
            return {}

    on = RunConfig(swarm=SwarmConfig(enabled=True), levers={"rescue": {"enabled": True}})
    c = _client(mix)
    try:
        assert isinstance(c, RescueSwarm) and not isinstance(OldHook(), RescueSwarm)
        assert Node._rescue_swarm(SimpleNamespace(swarm=OldHook(), cfg=on)) is None
        assert Node._rescue_swarm(SimpleNamespace(swarm=c, cfg=on)) is c
        assert Node._rescue_swarm(SimpleNamespace(swarm=c, cfg=RunConfig())) is None  # rescue off
    finally:
        c.close()
