"""Admission by step form in front of the likelihood screen (``external.screen.admit_step_form``): external samples
built by ``external_samples`` with our StepCredit, screened by ``LikelihoodScreen`` on the embedded model."""

from __future__ import annotations

import math

import pytest
import torch

from swarmnode.config import ExternalConfig, ModelConfig
from swarmnode.policy.loading import load_policy
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.step_credit import StepCredit, special_token_ids
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.reasoning_gym_source import ReasoningGymSource
from swarmnode.tasks.solutions import DEFAULT_MIX, worked_solution
from swarmnode.train.batch import external_samples
from swarmnode.train.external import process_external
from swarmnode.train.samples import Sample
from swarmnode.train.screen import LikelihoodScreen

SPECS = {s["name"]: s for s in DEFAULT_MIX}


@pytest.fixture(scope="module")
def policy():
    return load_policy(ModelConfig(name_or_path="embedded", device="cpu", dtype="float32"))


@pytest.fixture(scope="module")
def src():
    return ReasoningGymSource("chain_sum", SPECS["chain_sum"]["config"])


@pytest.fixture(scope="module")
def warm_screen(policy, src):
    """A screen whose reference holds 40 of our own sampled completions of a chain_sum prompt."""
    tok = policy.tokenizer
    task = src.get(src.ref(5, 0))
    prompt = tok(policy.prompt(task.question), add_special_tokens=False)["input_ids"]
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(40):
        cur, lps = torch.tensor([prompt]), []
        for _ in range(24):
            with torch.no_grad():
                lp = torch.log_softmax(policy.model(cur).logits[0, -1].float(), -1)
            t = int(torch.multinomial(lp.exp(), 1, generator=g))
            lps.append(float(lp[t]))
            cur = torch.cat([cur, torch.tensor([[t]])], 1)
            if t == tok.eos_token_id:
                break
        rows.append(lps)

    def make() -> LikelihoodScreen:
        sc = LikelihoodScreen(window=4, min_history=32, temperature=1.0)
        sc.observe(rows)
        return sc
    return make


def _spelled(tok, text: str) -> list[int]:
    """``text`` in our vocabulary with the answer tags spelled character by character: the same text (so the same
    decode) in a style our policy never writes -- what another family's re-tokenized text looks like to it."""
    out: list[int] = []
    for part in text.replace("<answer>", "\0<answer>\0").replace("</answer>", "\0</answer>\0").split("\0"):
        if part in ("<answer>", "</answer>"):
            out += [tok.convert_tokens_to_ids(c) for c in part]
        elif part:
            out += tok(part, add_special_tokens=False)["input_ids"]
    assert tok.decode(out, skip_special_tokens=False) == text
    return out


def _group(task, prompt, rows, rewards, peer):
    tree = RolloutTree.from_group(task.ref, prompt, rows)
    for leaf, r in zip(tree.leaves(), rewards):
        tree.nodes[leaf].reward = float(r)
    return PeerTree(tree, peer, model_id="m", tokenizer_id="t", same_tokenizer=True)


def _question(policy, src, k: int):
    """chain_sum question ``k`` of the test stream: (tokenizer, EOS id, task, prompt ids, worked solution, the offset
    just past its first line)."""
    tok = policy.tokenizer
    task = src.get(src.ref(5, k))
    prompt = tok(policy.prompt(task.question), add_special_tokens=False)["input_ids"]
    sol = worked_solution(task.name, {"metadata": task.metadata})
    return tok, tok.eos_token_id, task, prompt, sol, sol.index("\n") + 1


def _wrong_in_form(sol: str) -> str:
    cut = sol.index("<answer>")
    lines = sol[:cut].split("\n")[:-1]
    head, res = lines[-1].rsplit("=", 1)
    return "".join(ln + "\n" for ln in lines[:-1]) + f"{head}={int(res) + 1}\n<answer>{int(res) + 1}</answer>"


def test_admission_bypasses_the_screen_for_form_only_and_payloads_are_rejected_either_way(policy, src, warm_screen):
    tok = policy.tokenizer
    eos = tok.eos_token_id
    task = src.get(src.ref(5, 1))
    prompt = tok(policy.prompt(task.question), add_special_tokens=False)["input_ids"]
    sol = worked_solution(task.name, {"metadata": task.metadata})
    foreign = _spelled(tok, sol) + [eos]  # correct, every line in form, a foreign style
    wrong = _spelled(tok, _wrong_in_form(sol)) + [eos]  # wrong, every line in form, the same style
    payload = tok("zq#pwned!\n" + sol, add_special_tokens=False)["input_ids"] + [eos]  # correct, a payload line
    plain_wrong = tok(_wrong_in_form(sol), add_special_tokens=False)["input_ids"] + [eos]
    groups = [_group(task, prompt, [foreign, wrong], [1, 0], "f"),
              _group(task, prompt, [payload, plain_wrong], [1, 0], "p")]
    credit = StepCredit(src.get, tok, mask=True, weight=0.5)

    results = {}
    for mode in ("off", "correct", "in_form"):
        samples, m = external_samples(groups, step_credit=credit, admit_step_form=mode)
        res = warm_screen().screen(policy.model, samples)
        results[mode] = (samples, m, res)
        assert res.metrics["screen/warmup"] == 0
        assert res.metrics["screen/admitted_by_form"] == m["external/admitted_by_form"] == sum(
            s.admitted_by_form for s in samples)
        assert res.metrics["screen/rejected"] == sum(res.rejected_by_peer.values())
        # a payload line is never admitted by form and the screen rejects it; its group goes whole
        assert not samples[2].admitted_by_form and res.rejected_by_peer.get("p", 0) >= 1
        assert not [s for s in res.kept if s.source == "external:p"]

    off, correct, in_form = (results[k] for k in ("off", "correct", "in_form"))
    # admission off: the foreign-style correct completion is judged by its likelihood and rejected (charged)
    assert not any(s.admitted_by_form for s in off[0])
    assert off[2].rejected_by_peer.get("f", 0) >= 1 and off[2].stats[0][0] < off[2].metrics["screen/threshold_mean"]
    # correct: it is admitted (not scored, not rejected, not charged) ...
    assert [s.admitted_by_form for s in correct[0]] == [True, False, False, False]
    assert correct[2].metrics["screen/admitted_by_form"] == 1
    # ... but its wrong sibling in the same foreign style is screened, rejected, and takes the group with it
    assert correct[2].rejected_by_peer.get("f") == 1 and not [s for s in correct[2].kept if s.source == "external:f"]
    assert correct[2].metrics["screen/group_dropped"] >= 1
    # in_form: both of the foreign peer's completions are in form: admitted, the group trains whole, no charge
    # (the payload peer's wrong leaf is in form too: admitted, yet dropped with its group, whose payload was rejected)
    assert [s.admitted_by_form for s in in_form[0]] == [True, True, False, True]
    assert "f" not in in_form[2].rejected_by_peer and in_form[2].metrics["screen/group_dropped"] >= 1
    assert [s for s in in_form[2].kept if s.source == "external:f"] == in_form[0][:2]
    # the wrong completion skipped the screen, so it pushes nothing down (a hostile peer could make every line of
    # an in-form leaf invalid and push our right steps down) and nothing of it is pushed up: it teaches nothing,
    # but keeps its group whole; screened, its wrong last line and answer would be pushed down
    assert min(in_form[0][1].advantages) == 0.0 == max(in_form[0][1].advantages)
    assert min(off[0][1].advantages) < 0


def test_in_form_falls_back_to_correct_without_the_mask(policy, src):
    tok = policy.tokenizer
    task = src.get(src.ref(5, 2))
    sol = worked_solution(task.name, {"metadata": task.metadata})
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in (sol, _wrong_in_form(sol))]
    group = _group(task, [1, 2], rows, [1, 0], "f")
    samples, m = external_samples([group], step_credit=StepCredit(src.get, tok, mask=False, weight=0.5),
                                  admit_step_form="in_form")
    assert [s.admitted_by_form for s in samples] == [True, False] and m["external/admitted_by_form"] == 1
    # without our step checks (no StepCredit) nothing is admitted: every sample is screened as before
    samples, m = external_samples([group], admit_step_form="in_form")
    assert not any(s.admitted_by_form for s in samples) and m["external/admitted_by_form"] == 0
    with pytest.raises(ValueError, match="admit_step_form"):
        external_samples([group], admit_step_form="yes")  # type: ignore[arg-type]


def test_process_external_reads_the_config_key(policy, src):
    tok = policy.tokenizer
    task = src.get(src.ref(5, 3))
    sol = worked_solution(task.name, {"metadata": task.metadata})
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in (sol, _wrong_in_form(sol))]
    credit = StepCredit(src.get, tok, mask=True, weight=0.5)
    got = {}
    for mode in ("off", "correct", "in_form"):
        cfg = ExternalConfig.model_validate({"screen": {"admit_step_form": mode}})
        samples, m = process_external([_group(task, [1, 2], rows, [1, 0], "f")], cfg, current_version=0,
                                      our_model_id="m", our_tokenizer_id="t", rng=0, step_credit=credit)
        got[mode] = [s.admitted_by_form for s in samples]
    assert got == {"off": [False, False], "correct": [True, False], "in_form": [True, True]}
    assert ExternalConfig().screen.admit_step_form == "correct"
    with pytest.raises(ValueError, match="admit_step_form"):
        ExternalConfig.model_validate({"screen": {"admit_step_form": True}})


def test_warmup_keeps_admitted_groups_whole_only(policy):
    """In warm-up the screen judges nothing: an all-admitted group needs no judge and trains; an admitted sample
    whose group has a held member does not train alone (its advantage was normalized against the held one)."""
    sc = LikelihoodScreen(min_history=32)
    a1 = Sample([1, 2], [3, 4], [1.0, 1.0], source="external:x", group_id="g1", admitted_by_form=True)
    a2 = Sample([1, 2], [3, 5], [-1.0, -1.0], source="external:x", group_id="g1", admitted_by_form=True)
    b1 = Sample([1, 2], [3, 4], [1.0, 1.0], source="external:x", group_id="g2", admitted_by_form=True)
    b2 = Sample([1, 2], [3, 6], [-1.0, -1.0], source="external:x", group_id="g2")
    res = sc.screen(policy.model, [a1, a2, b1, b2])
    assert res.kept == [a1, a2] and res.rejected_by_peer == {}
    assert res.metrics["screen/warmup"] == 1 and res.metrics["screen/warmup_held"] == 1
    assert res.metrics["screen/admitted_by_form"] == 3 and res.metrics["screen/group_dropped"] == 1
    assert all(math.isnan(x) for x in res.stats[0]) and not math.isnan(res.stats[3][0])  # admitted: not scored


def test_masked_admits_a_checked_tasks_completions_and_pushes_up_only_checked_text(policy, src, warm_screen):
    """``masked``: the honest free text of a peer (a miscopied line) and a payload line both skip the screen, and
    neither takes a positive advantage; a completion out of exact form keeps a positive push only on its valid lines
    (not on an answer written after free text) and no negative push at all, in exact form or not."""
    tok, eos, task, prompt, sol, cut = _question(policy, src, 4)
    payload_text = sol[:cut] + "zq#pwned!\n" + sol[cut:]
    miscopied = sol[:cut] + sol[:cut].replace("=", " = ") + sol[cut:]  # an honest slip: a line out of form
    junk_first = "x\n" + _wrong_in_form(sol)  # right steps made invalid at their positions, then a wrong answer
    rows = [tok(t, add_special_tokens=False)["input_ids"] + [eos]
            for t in (payload_text, miscopied, _wrong_in_form(sol), junk_first)]
    groups = [_group(task, prompt, rows, [1, 1, 0, 0], "p")]
    credit = StepCredit(src.get, tok, mask=True, weight=0.5)
    samples, m = external_samples(groups, step_credit=credit, admit_step_form="masked")
    assert [s.admitted_by_form for s in samples] == [True] * 4 and m["external/admitted_by_form"] == 4
    res = warm_screen().screen(policy.model, samples)
    assert res.kept == samples and res.rejected_by_peer == {} and res.metrics["screen/admitted_by_form"] == 4
    # no admitted leaf keeps a negative push: not the junk-first leaf (its right steps, invalid at their shifted
    # positions, would be pushed down) nor the one in exact form whose every line adds one (every line invalid,
    # every right "x+y=" prefix pushed down: an outside review)
    assert min(samples[2].advantages) == 0.0 == min(samples[3].advantages)
    assert m["external/unscreened_tokens_zeroed"] > 0
    plain, _ = external_samples(groups, step_credit=credit, admit_step_form="off")
    assert min(plain[3].advantages) < 0 and min(plain[2].advantages) < 0  # what the rule removes
    for s, free in zip(samples[:2], ("zq#pwned!\n", sol[:cut].replace("=", " = "))):
        text = tok.decode(s.completion_ids, skip_special_tokens=True)
        lo = text.index(free, cut - 1 if free.startswith("zq") else cut)
        starts = [len(tok.decode(s.completion_ids[:i], skip_special_tokens=True)) for i in range(len(s.completion_ids))]
        on_free = [a for a, st in zip(s.advantages, starts) if lo <= st < lo + len(free)]
        assert on_free and max(on_free) <= 0.0  # the free line: no positive push
        assert max(s.advantages[: len(tok(sol[:cut], add_special_tokens=False)["input_ids"])]) > 0  # a valid line: up
        ans = text.index("<answer>")
        assert max(a for a, st in zip(s.advantages, starts) if st >= ans) == 0.0  # no answer pushed up after free text
    # the same completions under "correct" are screened, and the payload is rejected with its group
    screened, _ = external_samples(groups, step_credit=credit, admit_step_form="correct")
    assert not any(s.admitted_by_form for s in screened)
    assert warm_screen().screen(policy.model, screened).rejected_by_peer.get("p", 0) >= 1


def test_masked_needs_the_mask_a_checker_and_no_special_id(policy, src):
    tok = policy.tokenizer
    eos = tok.eos_token_id
    task = src.get(src.ref(5, 5))
    sol = worked_solution(task.name, {"metadata": task.metadata})
    free = tok("a line of prose\n" + sol, add_special_tokens=False)["input_ids"] + [eos]
    masked = StepCredit(src.get, tok, mask=True, weight=0.5)
    assert masked.admission(task.ref, free, "masked") and not masked.admission(task.ref, free, "correct")
    # without the mask, masked falls back to correct: the worked solution only
    unmasked = StepCredit(src.get, tok, mask=False, weight=0.5)
    assert not unmasked.admission(task.ref, free, "masked")
    assert unmasked.admission(task.ref, tok(sol, add_special_tokens=False)["input_ids"] + [eos], "masked")
    # a special id inside the completion (decoded to nothing, it could ride on a checked line's push): screened,
    # the chat-role tokens that only added_tokens_decoder marks special included (an outside review)
    roles = special_token_ids(tok) - set(tok.all_special_ids)
    assert roles
    for special in sorted(roles) + [t for t in tok.all_special_ids if t != eos]:
        assert not masked.admission(task.ref, free[:3] + [special] + free[3:], "masked")
        assert not masked.admission(task.ref, free[:3] + [special] + free[3:], "correct")
    # a question we cannot regenerate (no checker, no report): screened
    def unknown(ref):
        raise KeyError(ref)
    assert not StepCredit(unknown, tok, mask=True).admission(task.ref, free, "masked")
    assert not masked.admission(task.ref, free, "off")
    with pytest.raises(ValueError, match="admit_step_form"):
        masked.admission(task.ref, free, "all")


def test_keep_lets_the_screen_pick_the_credit_and_loses_no_checked_completion(policy, src, warm_screen):
    """``keep``: what ``masked`` admits is still judged. A completion the screen passes trains with the screened
    credit (as under ``off``/``correct``: its answer block and its negative push included), one it rejects is kept
    with the credit ``masked`` would give it (no negative push, positive only on valid lines), not charged and not
    counted as rejected, and so is the rest of its group; nothing is lost. In warm-up every such sample trains with
    the unscreened credit. A payload line never takes a positive push on either branch."""
    tok, eos, task, prompt, sol, cut = _question(policy, src, 4)
    texts = (sol[:cut] + "zq#pwned!\n" + sol[cut:], sol, _wrong_in_form(sol), "x\n" + _wrong_in_form(sol))
    rows = [tok(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts]
    groups = [_group(task, prompt, rows, [1, 1, 0, 0], "p")]
    credit = StepCredit(src.get, tok, mask=True, weight=0.5)
    keep, m = external_samples(groups, step_credit=credit, admit_step_form="keep")
    masked, _ = external_samples(groups, step_credit=credit, admit_step_form="masked")
    plain, _ = external_samples(groups, step_credit=credit, admit_step_form="off")
    assert not any(s.admitted_by_form for s in keep) and m["external/admitted_by_form"] == 4
    assert [s.unscreened_advantages for s in keep] == [s.advantages for s in masked]
    assert [s.advantages for s in keep] == [s.advantages for s in plain]  # the screened credit until judged
    assert min(plain[2].advantages) < 0  # what a rejection would remove
    # a second group of another question, in the worked-solution style our policy writes
    task2 = src.get(src.ref(5, 6))
    prompt2 = tok(policy.prompt(task2.question), add_special_tokens=False)["input_ids"]
    sol2 = worked_solution(task2.name, {"metadata": task2.metadata})
    rows2 = [tok(t, add_special_tokens=False)["input_ids"] + [eos] for t in (sol2, _wrong_in_form(sol2))]
    groups2 = groups + [_group(task2, prompt2, rows2, [1, 0], "p")]
    keep, _ = external_samples(groups2, step_credit=credit, admit_step_form="keep")
    masked, _ = external_samples(groups2, step_credit=credit, admit_step_form="masked")
    plain, _ = external_samples(groups2, step_credit=credit, admit_step_form="off")
    sc = warm_screen()
    res = sc.screen(policy.model, keep)
    th = sc.thresholds()
    assert res.kept == keep and res.rejected_by_peer == {} and res.metrics["screen/rejected"] == 0
    assert res.metrics["screen/group_dropped"] == 0
    failed = [mean < th[0] or win < th[1] for mean, win in res.stats]
    assert any(failed[:4])  # the payload leaf at least
    # a group with a rejected member trains whole on the unscreened credit (its advantages were normalized with
    # the rejected members' rewards: an outside attack used rejected right-answer junk to enlarge the negative push
    # of likely wrong leaves beside it); a group whose members all pass keeps the screened credit
    for lo, hi in ((0, 4), (4, 6)):
        demoted = any(failed[lo:hi])
        for s, p, q in zip(keep[lo:hi], plain[lo:hi], masked[lo:hi]):
            assert s.advantages == (q.advantages if demoted else p.advantages)
    assert res.metrics["screen/kept_unscreened"] == 4 + 2 * any(failed[4:])
    payload = keep[0]
    text = tok.decode(payload.completion_ids, skip_special_tokens=True)
    lo = text.index("zq#pwned!")
    starts = [len(tok.decode(payload.completion_ids[:i], skip_special_tokens=True))
              for i in range(len(payload.completion_ids))]
    for adv in (payload.advantages, plain[0].advantages, masked[0].advantages):
        assert max(a for a, st in zip(adv, starts) if lo <= st < lo + len("zq#pwned!\n")) <= 0.0
    # warm-up: no reference yet, nothing judged: every keep sample trains with its unscreened credit
    cold, _ = external_samples(groups, step_credit=credit, admit_step_form="keep")
    res = LikelihoodScreen(window=4, min_history=32).screen(policy.model, cold)
    assert res.kept == cold and res.metrics["screen/warmup"] == 1 and res.metrics["screen/warmup_held"] == 0
    assert res.metrics["screen/kept_unscreened"] == 4 and [s.advantages for s in cold] == [s.advantages for s in masked[:4]]
    # without the mask keep falls back to correct: the worked solution is admitted unjudged, the rest screened
    unmasked = StepCredit(src.get, tok, mask=False, weight=0.5)
    fell, _ = external_samples(groups, step_credit=unmasked, admit_step_form="keep")
    assert [s.admitted_by_form for s in fell] == [False, True, False, False]
    assert all(s.unscreened_advantages is None for s in fell if not s.admitted_by_form)
    with pytest.raises(ValueError, match="unscreened_advantages"):
        Sample([1], [2, 3], [0.0, 0.0], unscreened_advantages=[0.0])


def test_admitted_credit_is_what_a_sample_carries_under_each_mode(policy, src):
    """The one helper both the batch builder and the rescue merge use: unjudged modes train on the unscreened
    credit and mark the sample admitted; ``keep`` keeps the screened credit and carries the unscreened one."""
    tok = policy.tokenizer
    task = src.get(src.ref(5, 4))
    sol = worked_solution(task.name, {"metadata": task.metadata})
    ids = tok("x\n" + _wrong_in_form(sol), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    credit = StepCredit(src.get, tok, mask=True, weight=0.5)
    report = credit.report(task.ref, ids)
    adv = [-1.0] * len(ids)
    unscreened, n = credit.unscreened_advantages(report, ids, adv)
    assert n == len(ids) and unscreened == [0.0] * len(ids)
    assert credit.admitted_credit(report, ids, adv, "masked") == (unscreened, None, True, n)
    assert credit.admitted_credit(report, ids, adv, "correct") == (unscreened, None, True, n)
    assert credit.admitted_credit(report, ids, adv, "keep") == (adv, unscreened, False, n)
    assert credit.keeps_on_rejection("keep") and not credit.keeps_on_rejection("masked")
    assert not StepCredit(src.get, tok, mask=False).keeps_on_rejection("keep")


def test_a_right_step_out_of_place_is_not_pushed_down_in_a_peer_s_wrong_leaf(policy, src):
    """Outside attack: the worked solution with its first step written twice and a wrong answer shifts every later
    right step off its position (invalid where it stands), looks like our own style to the screen, and its
    negative advantage pushed our right steps down, under ``correct`` as under ``keep``. A line whose text is a
    right step of the question anywhere keeps no negative push; the wrong answer still takes it."""
    tok, eos, task, prompt, sol, cut = _question(policy, src, 4)
    body, ans = sol[: sol.index("<answer>")], sol[sol.index("<answer>"):]
    wrong_ans = ans.replace(ans[len("<answer>"):ans.index("</answer>")], str(int(ans[len("<answer>"):ans.index("</answer>")]) + 1))
    dup = sol[:cut] + body + wrong_ans  # first step twice, a wrong answer
    rows = [tok(t, add_special_tokens=False)["input_ids"] + [eos] for t in (sol, dup)]
    credit = StepCredit(src.get, tok, mask=True, weight=0.5)
    report = credit.report(task.ref, rows[1])
    assert report is not None and not all(c.valid for c in report.lines)  # shifted: invalid where they stand
    assert credit.right_step_lines(task.ref, report, rows[1]) == [True] * len(report.lines)
    for mode in ("off", "correct", "keep"):
        samples, m = external_samples([_group(task, prompt, rows, [1, 0], "p")], step_credit=credit,
                                      admit_step_form=mode)
        wrong = samples[1]
        text = tok.decode(wrong.completion_ids, skip_special_tokens=True)
        starts = [len(tok.decode(wrong.completion_ids[:i], skip_special_tokens=True))
                  for i in range(len(wrong.completion_ids))]
        a0 = text.index("<answer>")
        on_lines = [a for a, st in zip(wrong.advantages, starts) if st < a0]
        on_answer = [a for a, st in zip(wrong.advantages, starts) if st >= a0]
        assert min(on_lines) == 0.0 and min(on_answer) < 0, mode  # the lines are spared, the answer is not
    # our protection needs the task: without it (no ref) the shifted lines are pushed down as before
    adv, _ = credit.token_advantages(-1.0, rows[1], report, -1.0)
    assert min(adv[: len(tok(sol[:cut] + body, add_special_tokens=False)["input_ids"])]) < 0
