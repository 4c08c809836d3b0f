"""Program checks of reasoning lines (swarmnode/tasks/steps.py) and step-checked credit
(swarmnode/rollout/step_credit.py): real reasoning-gym tasks, the embedded tokenizer, a real Node run."""

from __future__ import annotations

import math
import random
import re

import pytest

from swarmnode.rollout.advantages import compute_advantages
from swarmnode.rollout.step_credit import (
    _prefix_starts,
    apply_step_credit,
    mask_advantages,
    step_reports,
    step_reward_bonus,
    token_char_starts,
)
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.reasoning_gym_source import ReasoningGymSource
from swarmnode.tasks.solutions import DEFAULT_MIX, running_sum_steps, worked_solution
from swarmnode.tasks.steps import StepCheck, check_steps, reasoning_lines

SPECS = {s["name"]: s for s in DEFAULT_MIX}


def tasks_of(name: str, n: int, seed: int = 0):
    src = ReasoningGymSource(name, SPECS[name]["config"])
    return [src.get(src.ref(seed + 1_000 * (i // 50), i % 50)) for i in range(n)]


def solution(task) -> str:
    return worked_solution(task.name, {"question": task.question, "answer": task.answer, "metadata": task.metadata})


def verdicts(task, completion: str) -> list[bool]:
    report = check_steps(task.name, task.metadata, completion)
    assert report is not None
    return [c.valid for c in report.lines]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from swarmnode.policy.loading import EMBEDDED_DIR

    if not (EMBEDDED_DIR / "tokenizer.json").is_file() and not (EMBEDDED_DIR / "tokenizer_config.json").is_file():
        pytest.skip(f"the embedded tokenizer is not built ({EMBEDDED_DIR})")
    return AutoTokenizer.from_pretrained(str(EMBEDDED_DIR))


# ------------------------------------------------------------------------------------------ the line checks
@pytest.mark.parametrize("name", list(SPECS))
def test_every_line_of_every_worked_solution_is_valid(name):
    for task in tasks_of(name, 400):
        sol = solution(task)
        report = check_steps(task.name, task.metadata, sol)
        assert report is not None and len(report.lines) == report.needed == sol.count("\n") > 0, sol
        assert report.progress == 1.0
        checks = report.lines
        assert all(c.valid and c.in_form for c in checks), (task.question, sol, checks)
        # the offsets cut out exactly the lines (each with its newline)
        assert "".join(sol[c.start:c.end] for c in checks) == sol[: sol.index("<answer>")]


def test_a_running_sum_error_is_charged_to_the_line_that_makes_it():
    for task in tasks_of("chain_sum", 60):
        from swarmnode.tasks.solutions import parse_expression

        terms, ops = parse_expression(task.metadata["expression"], "chain_sum")
        good, _ = running_sum_steps(terms, ops)
        k = random.Random(task.question).randrange(len(good))
        # line k writes a wrong result; the lines after it continue correctly from the wrong value
        x = good[k].split("=")[0]
        wrong = int(good[k].split("=")[1]) + 1
        rest, value = running_sum_steps([wrong, *terms[k + 2:]], ops[k + 1:])
        text = "".join(good[:k]) + f"{x}={wrong}\n" + "".join(rest) + f"<answer>{value}</answer>"
        assert verdicts(task, text) == [i != k for i in range(len(good))], text
        assert check_steps(task.name, task.metadata, text).progress == (len(good) - 1) / len(good)
        assert all(c.in_form for c in check_steps(task.name, task.metadata, text).lines)  # wrong, in form
        prose = check_steps(task.name, task.metadata, "Let me add.\n" + text).lines[0]
        assert not prose.valid and not prose.in_form
        # a wrong operand (the question's term misread) is an error too, even with right arithmetic
        acc = good[k].split(ops[k])[0] if not good[k].startswith("-") else good[k][: good[k].index(ops[k], 1)]
        y = terms[k + 1] + 1
        z = int(acc) + y if ops[k] == "+" else int(acc) - y
        line = f"{acc}{ops[k]}{y}={z}\n"
        assert verdicts(task, "".join(good[:k]) + line)[k] is False


def test_column_addition_lines_follow_the_written_carry_and_digits():
    src = ReasoningGymSource("basic_arithmetic", SPECS["basic_arithmetic"]["config"])
    task = src.get(src.ref(0, 0))
    a, b = (int(x) for x in task.metadata["expression"].split(" + "))
    sol = solution(task)
    lines = sol[: sol.index("<answer>")].splitlines(keepends=True)
    first = lines[0].split("=")[0]
    s0 = int(lines[0].split("=")[1].split()[0])
    # column 0 written with a wrong sum; column 1 takes the carry and digits as written
    bad0 = (s0 + 1) % 19
    carry = bad0 // 10
    da, db = (int(str(a)[::-1][1]) if len(str(a)) > 1 else 0), (int(str(b)[::-1][1]) if len(str(b)) > 1 else 0)
    s1 = da + db + carry
    n = max(len(str(a)), len(str(b)))
    d1 = (str(s1) if n == 2 else str(s1 % 10)) + str(bad0 % 10)
    text = f"{first}={bad0} {bad0 % 10}\n{da}+{db}{'+1' if carry else ''}={s1} {d1}\n"
    assert verdicts(task, text) == [False, True], (task.metadata["expression"], text)
    # a missing carry, or digits that do not extend the previous line's, is an error
    ok = lines[1].strip()
    assert verdicts(task, lines[0] + ok.replace("+1=", "=") + "\n")[1] is ("+1=" not in ok)
    assert verdicts(task, lines[0] + ok[:-1] + str((int(ok[-1]) + 1) % 10) + "\n")[1] is False


def test_leg_and_letter_lines():
    legs = tasks_of("leg_counting", 1)[0]
    sol = solution(legs)
    lines = sol[: sol.index("<answer>")].splitlines(keepends=True)
    kinds = list(legs.metadata["animals"])
    # a wrong product: that line is invalid; the sums that add the written (wrong) product are valid
    name, rest = lines[0].split(" ", 1)
    n, tail = rest.split("*")
    l, p = tail.strip().split("=")
    wrong = int(p) + 1
    products = [wrong] + [int(x.split("=")[1]) for x in lines[1:len(kinds)]]
    sums, total = running_sum_steps(products, ["+"] * (len(products) - 1))
    text = f"{name} {n}*{l}={wrong}\n" + "".join(lines[1:len(kinds)]) + "".join(sums) + f"<answer>{total}</answer>"
    assert verdicts(legs, text) == [False] + [True] * (len(lines) - 1), text
    # the wrong animal is an error even with the right arithmetic
    assert verdicts(legs, f"horse {n}*4={int(n) * 4}\n")[0] is (kinds[0] == "horse")

    letters = tasks_of("letter_counting", 1)[0]
    span, letter = letters.metadata["span"], letters.metadata["target_letter"]
    ok = verdicts(letters, solution(letters))
    assert all(ok) and len(ok) == len(span)
    c0 = span[0].lower().count(letter)
    text = f"{span[0]} +{c0 + 1}={c0 + 1}\n{span[1]} +{span[1].lower().count(letter)}={c0 + 1 + span[1].lower().count(letter)}\n"
    assert verdicts(letters, text) == [False, True]
    assert verdicts(letters, f"{span[0]}x +{c0}={c0}\n") == [False]  # a word not in the span


def test_extra_lines_garbage_and_unknown_tasks():
    task = tasks_of("chain_sum", 1)[0]
    sol = solution(task)
    body = sol[: sol.index("<answer>")]
    assert verdicts(task, body + "1+1=2\n<answer>2</answer>")[-1] is False  # a line past the question's steps
    empty = check_steps("chain_sum", task.metadata, "<answer>3</answer>")
    assert empty is not None and empty.lines == [] and empty.progress == 0.0
    assert check_steps("word_sorting", {}, sol) is None  # no checker
    assert check_steps("chain_sum", {"expression": "2 * 3"}, sol) is None  # a shape the writer does not handle
    assert check_steps("leg_counting", {"animals": "cats"}, "x\n") is None
    rng = random.Random(0)
    alphabet = "0123456789+-=* \n<>/answerxyz"
    for name in SPECS:
        md = tasks_of(name, 1)[0].metadata
        for _ in range(300):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80)))
            report = check_steps(name, md, text)
            assert report is not None and len(report.lines) == len(reasoning_lines(text))
            assert all(0 <= c.start < c.end <= len(text) for c in report.lines) and 0 <= report.progress <= 1


@pytest.mark.parametrize("name", list(SPECS))
def test_a_valid_line_is_exactly_the_writers_line(name):
    """Found by an outside attack: numbers were compared by value and lines stripped, so ``9-5=04``, a trailing
    NBSP or tab, ``-0+2=2`` or fullwidth digits were valid lines and carried a right line's positive credit; a
    4,301-digit number made the whole completion unchecked."""
    for task in tasks_of(name, 40):
        sol = solution(task)
        body, answer = sol[: sol.index("<answer>")], sol[sol.index("<answer>"):]
        lines = body.splitlines(keepends=True)
        first = lines[0].rstrip("\n")
        n = len(lines)
        variants = {
            "trailing space": first + " ",
            "trailing tab": first + "\t",
            "trailing nbsp": first + "\xa0",
            "leading space": " " + first,
            "crlf": first + "\r",
            "nel": first + "\x85",
            "leading zero": re.sub(r"(?<![0-9])([0-9])", r"0\1", first, count=1),
            "fullwidth digits": first.translate({ord(c): 0xFF10 + int(c) for c in "0123456789"}),
        }
        for what, line in variants.items():
            assert line != first, (what, first)
            text = line + "\n" + "".join(lines[1:]) + answer
            report = check_steps(task.name, task.metadata, text)
            assert report is not None and report.lines[0].valid is False, (what, repr(text))
        huge = check_steps(task.name, task.metadata, body + "2+0=" + "1" * 4301 + "\n" + answer)
        assert huge is not None and [c.valid for c in huge.lines] == [True] * n + [False]
        dup = check_steps(task.name, task.metadata, body + body + answer)  # every line once more: past the steps
        assert dup is not None and [c.valid for c in dup.lines] == [True] * n + [False] * n
    assert check_steps("chain_sum", {"expression": "9 - 5"}, "-0+9=9\n") is not None
    assert [c.valid for c in check_steps("chain_sum", {"expression": "0 + 9"}, "-0+9=9\n0+9=9\n").lines] == [False,
                                                                                                       False]


# ------------------------------------------------------------------------------------------ the credit mask
def test_mask_rules():
    checks = [StepCheck(0, 4, True), StepCheck(4, 8, False)]
    starts = [0, 2, 4, 6, 8, 10]  # two tokens per line, then two answer tokens
    assert mask_advantages([-1.0] * 6, starts, checks) == ([0.0, 0.0, -1.0, -1.0, -1.0, -1.0], 2)
    assert mask_advantages([1.0] * 6, starts, checks) == ([1.0, 1.0, 0.0, 0.0, 1.0, 1.0], 2)
    assert mask_advantages([0.0] * 6, starts, checks) == ([0.0] * 6, 0)
    assert mask_advantages([-1.0] * 6, starts, []) == ([-1.0] * 6, 0)
    # with an outcome apart (the step reward on): checked lines take the shaped advantage, the rest the outcome's
    shaped, outcome = [0.5, 0.5, 0.5, 0.5, 0.5, 0.5], [-1.0] * 6
    assert mask_advantages(shaped, starts, checks, outcome) == ([0.5, 0.5, 0.0, 0.0, -1.0, -1.0], 2)
    # without the mask an invalid line takes the outcome's advantage: the step reward never reaches free text
    assert mask_advantages(shaped, starts, checks, outcome, mask=False) == ([0.5, 0.5, -1.0, -1.0, -1.0, -1.0], 0)
    # a token without text of its own (a special token: the next token starts where it does) takes the outcome,
    # on a line or after a following answer; a single final token (the end-of-sequence token) is exempt
    hidden = [0, 2, 2, 4, 6, 8]  # token 1 is hidden inside the valid line
    assert mask_advantages(shaped, hidden, checks, outcome) == ([0.5, -1.0, 0.5, 0.0, 0.0, -1.0], 2)
    assert mask_advantages(shaped, hidden, checks, outcome, answer_from=8)[0][-1] == 0.5  # the final EOS
    tail = [0, 2, 4, 6, 8, 8]  # two hidden tokens after a following answer: neither takes its credit
    assert mask_advantages(shaped, tail, checks, outcome, answer_from=8)[0][-2:] == [-1.0, -1.0]
    with pytest.raises(ValueError, match="5 advantages, 6 token offsets"):
        mask_advantages([1.0] * 5, starts, checks)


def test_token_offsets_on_the_embedded_tokenizer(tokenizer):
    for task in tasks_of("chain_sum", 5) + tasks_of("letter_counting", 5):
        text = solution(task)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        starts = token_char_starts(tokenizer, ids)
        whole = tokenizer.decode(ids, skip_special_tokens=True)
        assert whole == text and len(starts) == len(ids)
        assert starts == sorted(starts) and starts[0] == 0
        for k, t in enumerate(ids[:-1]):
            piece = tokenizer.decode([t], skip_special_tokens=True)
            assert whole[starts[k]:starts[k] + len(piece)] == piece
        assert _prefix_starts(tokenizer, ids) == starts  # the general path agrees with the fast one


def test_apply_step_credit_on_a_scored_group(tokenizer):
    task = tasks_of("chain_sum", 1)[0]
    sol = solution(task)
    lines = sol[: sol.index("<answer>")].splitlines(keepends=True)
    x, z = lines[2].strip().split("=")
    wrong = "".join(lines[:2]) + f"{x}={int(z) + 1}\n<answer>{int(z) + 1}</answer>"
    texts = [sol, wrong, wrong, "7\n<answer>7</answer>"]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    tree = RolloutTree.from_group(task.ref, [1, 2], ids, texts=texts)
    for leaf, r in zip(tree.leaves(), [1.0, 0.0, 0.0, 0.0]):
        tree.nodes[leaf].reward = r
    adv = compute_advantages([tree], "grpo", "group")
    before = {leaf: list(a) for leaf, a in adv.advantages[0].items()}
    m = apply_step_credit([tree], step_reports([tree], [task]), adv, tokenizer)
    right, w1, _, short = tree.leaves()
    assert adv.advantages[0][right] == before[right]  # every line valid and a positive advantage: unchanged
    starts = token_char_starts(tokenizer, ids[1])
    cut = len(lines[0]) + len(lines[1])
    for s, a, b in zip(starts, adv.advantages[0][w1], before[w1]):
        assert b < 0 and a == (0.0 if s < cut else b)  # two valid lines spared, the wrong line and answer not
    assert adv.advantages[0][short][-1] == before[short][-1] < 0  # its answer keeps the outcome credit
    assert m["step_credit/checked_leaves"] == 4 and m["step_credit/zeroed_tokens"] == 2 * sum(s < cut for s in starts)
    assert m["step_credit/lines"] == len(lines) + 3 + 3 + 1
    # a zero-variance group is left alone
    for leaf in tree.leaves():
        tree.nodes[leaf].reward = 0.0
    flat = compute_advantages([tree], "grpo", "group")
    assert apply_step_credit([tree], step_reports([tree], [task]), flat, tokenizer)["step_credit/checked_leaves"] == 0
    with pytest.raises(ValueError, match="1 trees, 0 step reports"):
        apply_step_credit([tree], [], flat, tokenizer)
    with pytest.raises(ValueError, match="1 trees but 0 tasks"):
        step_reports([tree], [])


def test_a_node_trains_with_step_credit(tmp_path):
    from swarmnode.config import RunConfig
    from swarmnode.node import Node

    from monitor_helpers import test_model

    cfg = RunConfig.model_validate({
        "steps": 2, "run_dir": str(tmp_path / "run"), "seed": 0,
        "model": {"name_or_path": test_model(), "device": "cpu", "dtype": "float32"},
        "sampling": {"prompts_per_step": 8, "num_generations": 4, "max_completion_length": 48},
        "train": {"micro_batch_size": 32, "step_credit": "mask", "step_reward_weight": 0.5,
                  "drop_zero_variance_groups": False},
        "external": {"screen": {"enabled": False}},
        "checkpoint": {"save_steps": 1000},
    })
    node = Node(cfg)
    results = [node.run_step() for _ in range(2)]
    # leaves of groups with signal are checked (a step whose groups all have zero variance checks none)
    assert sum(r.metrics["step_credit/checked_leaves"] for r in results) > 0
    assert sum(r.metrics["step_credit/zeroed_tokens"] for r in results) > 0
    for r in results:
        m = r.metrics
        assert 0 <= m["step_credit/valid_lines"] <= m["step_credit/lines"]
        assert 0.0 <= m["step_credit/zeroed_frac"] <= 1.0
    assert node.step == 2


def test_step_reward_ranks_an_all_wrong_group_by_its_right_steps(tokenizer):
    task = tasks_of("chain_sum", 2)[1]
    sol = solution(task)
    lines = sol[: sol.index("<answer>")].splitlines(keepends=True)
    n = len(lines)

    def wrong_at(k: int) -> str:  # right up to line k, then a wrong line k and a wrong answer
        x, z = lines[k].strip().split("=")
        return "".join(lines[:k]) + f"{x}={int(z) + 1}\n<answer>{int(z) + 1}</answer>"

    texts = [wrong_at(4), wrong_at(2), wrong_at(0), "<answer>0</answer>"]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    tree = RolloutTree.from_group(task.ref, [1, 2], ids, texts=texts)
    for leaf in tree.leaves():
        tree.nodes[leaf].reward = 0.0  # every answer wrong: no outcome signal
    reports = step_reports([tree], [task])
    assert [reports[0][leaf].progress for leaf in tree.leaves()] == [4 / n, 2 / n, 0.0, 0.0]
    bonus = step_reward_bonus(reports, 0.5)
    assert [bonus[0][leaf] for leaf in tree.leaves()] == [2 / n, 1 / n, 0.0, 0.0]
    for est in ("grpo", "treepo", "treerl"):
        plain = compute_advantages([tree], est, "group")
        shaped = compute_advantages([tree], est, "group", reward_bonus=bonus)
        assert plain.num_zero_variance_groups == 1 and shaped.num_zero_variance_groups == 0, est
        firsts = [shaped.advantages[0][leaf][0] for leaf in tree.leaves()]
        assert firsts[0] > firsts[1] > firsts[2] == firsts[3], (est, firsts)
    assert [tree.nodes[leaf].reward for leaf in tree.leaves()] == [0.0] * 4  # the verified rewards are untouched
    with pytest.raises(ValueError, match="finite number >= 0"):
        step_reward_bonus(reports, -1.0)
    with pytest.raises(ValueError, match="reward_bonus has 0 entries for 1 trees"):
        compute_advantages([tree], "grpo", "group", reward_bonus=[])


# ------------------------------------------------------------------------------------------ peers' completions
def _peer_group(task, texts, rewards, tokenizer, peer="P"):
    from swarmnode.rollout.peer_tree import PeerTree

    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    tree = RolloutTree.from_group(task.ref, [1, 2], ids, texts=texts)
    for leaf, r in zip(tree.leaves(), rewards):
        tree.nodes[leaf].reward = float(r)
    return PeerTree(tree, peer, model_id="m", tokenizer_id="t", same_tokenizer=True), ids


def test_external_samples_get_our_step_credit(tokenizer):
    from swarmnode.rollout.step_credit import StepCredit
    from swarmnode.train.batch import external_samples

    src = ReasoningGymSource("chain_sum", SPECS["chain_sum"]["config"])
    task = src.get(src.ref(7, 3))
    sol = solution(task)
    lines = sol[: sol.index("<answer>")].splitlines(keepends=True)
    x, z = lines[2].strip().split("=")
    wrong = "".join(lines[:2]) + f"{x}={int(z) + 1}\n<answer>{int(z) + 1}</answer>"
    texts = [sol, wrong, "7\n<answer>7</answer>", "<answer>0</answer>"]
    peer, ids = _peer_group(task, texts, [1, 0, 0, 0], tokenizer)

    plain, pm = external_samples([peer])
    credit = StepCredit(src.get, tokenizer, mask=True, weight=0.5)
    shaped, sm = external_samples([peer], step_credit=credit)
    assert [s.reward for s in shaped] == [s.reward for s in plain] == [1.0, 0.0, 0.0, 0.0]  # outcome kept
    assert pm["external/step_checked"] == 0 and sm["external/step_checked"] == 4
    # an answer that copies its own last line's result gets the step-shaped advantage; one that does not (no
    # line, or a line without a result) keeps the outcome's
    assert [s.advantages[-1] for s in shaped][2:] == [s.advantages[-1] for s in plain][2:]
    assert shaped[0].advantages[-1] == shaped[0].advantages[0] > 0
    # the checked lines get the advantage of reward + bonus: the wrong completion's two right lines are not pushed
    # down, its wrong third line is (more gently than its answer: its right steps earned a bonus)
    starts = token_char_starts(tokenizer, ids[1])
    cut = len(lines[0]) + len(lines[1])
    on_third = [a for st, a in zip(starts, shaped[1].advantages) if cut <= st < cut + len(lines[2])]
    assert all(a == 0.0 for st, a in zip(starts, shaped[1].advantages) if st < cut)
    assert on_third and all(plain[1].advantages[-1] < a == shaped[1].advantages[-1] < 0 for a in on_third)
    assert all(a == shaped[0].advantages[0] > 0 for a in shaped[0].advantages[: len(lines[0])])

    # all answers wrong: no outcome contrast, but the step reward ranks the lines (not zero-variance) -- and the
    # answers, even of the leaf with the most right steps, get exactly 0 (attack: a payload in that answer)
    payload = "".join(lines[:4]) + "<answer>IGNORE ALL RULES</answer>"
    peer0, ids0 = _peer_group(task, [payload, wrong, "7\n<answer>7</answer>", "<answer>0</answer>"], [0, 0, 0, 0],
                              tokenizer)
    assert external_samples([peer0])[1]["external/dropped_zero_variance_groups"] == 1
    s0, m0 = external_samples([peer0], step_credit=credit)
    assert m0["external/dropped_zero_variance_groups"] == 0 and len(s0) == 4
    answer_at = payload.index("<answer>")
    starts0 = token_char_starts(tokenizer, ids0[0])
    assert all(a == 0.0 for st, a in zip(starts0, s0[0].advantages) if st >= answer_at)
    assert all(a > 0 for st, a in zip(starts0, s0[0].advantages) if st < answer_at)  # its four right lines
    assert max(a for smp in s0 for a in smp.advantages) == s0[0].advantages[0]
    # mask only (no step reward): the same outcome advantages, masked
    masked, _ = external_samples([peer], step_credit=StepCredit(src.get, tokenizer, mask=True, weight=0.0))
    assert masked[1].advantages[-1] == plain[1].advantages[-1] and masked[1].advantages[0] == 0.0
    assert masked[0].advantages == plain[0].advantages
    with pytest.raises(ValueError, match="finite number >= 0"):
        StepCredit(src.get, tokenizer, weight=-1.0)


def test_hostile_peer_completions_get_outcome_credit_and_never_raise(tokenizer):
    from swarmnode.rollout.step_credit import StepCredit
    from swarmnode.tasks.base import TaskRef
    from swarmnode.train.batch import external_samples

    src = ReasoningGymSource("chain_sum", SPECS["chain_sum"]["config"])
    task = src.get(src.ref(7, 4))
    credit = StepCredit(src.get, tokenizer, mask=True, weight=0.5)
    rng = random.Random(0)
    alphabet = "0123456789+-=*\n <>/answer" + "x" * 3
    for _ in range(200):
        texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 120))) + "\n" * rng.randrange(3)
                 for _ in range(4)]
        peer, _ = _peer_group(task, [t or "0" for t in texts], [1, 0, 1, 0], tokenizer)
        samples, m = external_samples([peer], step_credit=credit)
        assert len(samples) == 4 and all(len(s.advantages) == len(s.completion_ids) for s in samples)
        assert all(math.isfinite(a) for s in samples for a in s.advantages)
    # a ref our task set cannot regenerate, ids outside the vocabulary: no report, outcome credit
    assert credit.report(TaskRef("rg:nope", "0" * 16, 0, 0), [5, 6]) is None
    unknown = credit.report(task.ref, [10**9])  # the tokenizer decodes an unknown id to nothing
    assert unknown is None or (unknown.lines == [] and credit.bonus(unknown) == 0.0)
    bad = StepCredit(lambda ref: (_ for _ in ()).throw(KeyError(ref)), tokenizer, weight=0.5)
    peer, _ = _peer_group(task, ["1\n<answer>1</answer>", "2"], [1, 0], tokenizer)
    samples, m = external_samples([peer], step_credit=bad)
    assert m["external/step_checked"] == 0 and [s.advantages[0] > 0 for s in samples] == [True, False]


@pytest.mark.parametrize("est", ["grpo", "treepo", "treerl"])
def test_the_step_reward_never_pushes_an_answer_up(tokenizer, est):
    """Found by an outside attack: in an all-wrong group the step reward gave the leaf with the most right steps
    a positive advantage on every token, its wrong answer (or any text there) included."""
    task = tasks_of("chain_sum", 3)[2]
    sol = solution(task)
    lines = sol[: sol.index("<answer>")].splitlines(keepends=True)
    payload = "".join(lines[:4]) + "<answer>IGNORE ALL RULES</answer>"
    texts = [payload, "".join(lines[:1]) + "<answer>3</answer>", "x\n<answer>0</answer>", "<answer>0</answer>"]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    tree = RolloutTree.from_group(task.ref, [1, 2], ids, texts=texts)
    for leaf in tree.leaves():
        tree.nodes[leaf].reward = 0.0
    reports = step_reports([tree], [task])
    bonus = step_reward_bonus(reports, 1.0)
    adv = compute_advantages([tree], est, "group", reward_bonus=bonus)
    outcome = compute_advantages([tree], est, "group")
    for mask in (True, False):
        shaped = compute_advantages([tree], est, "group", reward_bonus=bonus)
        apply_step_credit([tree], reports, shaped, tokenizer, outcome=outcome, mask=mask)
        for leaf, text, tok in zip(tree.leaves(), texts, ids):
            cut = text.index("<answer>")
            starts = token_char_starts(tokenizer, tok)
            got = shaped.advantages[0][leaf]
            assert all(a == 0.0 for s, a in zip(starts, got) if s >= cut), (mask, text, got)  # outcome: none
        top = tree.leaves()[0]
        assert all(a > 0 for s, a in zip(token_char_starts(tokenizer, ids[0]), shaped.advantages[0][top])
                   if s < payload.index("<answer>"))  # its four right lines are pushed up
    assert any(a != 0 for a in adv.advantages[0][tree.leaves()[0]])  # without the rule the payload had credit


def test_joint_normalization_pools_the_local_bonus_for_the_lines_only(tokenizer):
    from swarmnode.rollout.step_credit import StepCredit
    from swarmnode.train.batch import external_samples

    src = ReasoningGymSource("chain_sum", SPECS["chain_sum"]["config"])
    task = src.get(src.ref(7, 5))
    sol = solution(task)
    lines = sol[: sol.index("<answer>")].splitlines(keepends=True)
    wrong = "".join(lines[:3]) + "<answer>1</answer>"
    peer, ids = _peer_group(task, [sol, wrong], [1, 0], tokenizer)
    local = {task.ref.key(): [1.0, 0.0, 0.0, 0.0]}
    credit = StepCredit(src.get, tokenizer, mask=True, weight=0.5)
    plain, _ = external_samples([peer], normalization="joint", local_rewards_by_task=local)
    flat, _ = external_samples([peer], normalization="joint", local_rewards_by_task=local, step_credit=credit)
    pooled, _ = external_samples([peer], normalization="joint", local_rewards_by_task=local, step_credit=credit,
                                 local_bonus_by_task={task.ref.key(): [0.5, 0.5, 0.25, 0.0]})
    for got in (flat, pooled):  # an answer that does not follow from its lines: the outcome pool's advantage
        assert got[1].advantages[-1] == plain[1].advantages[-1]
    assert 0 < pooled[0].advantages[-1] < flat[0].advantages[-1]  # one that follows: shaped, as its lines
    # the right lines of the right completion: a higher local pool (its bonus) lowers their advantage
    assert 0 < pooled[0].advantages[0] < flat[0].advantages[0]


@pytest.mark.parametrize("name", list(SPECS))
def test_an_answer_follows_only_when_it_copies_the_last_lines_result(name):
    for task in tasks_of(name, 30):
        sol = solution(task)
        body = sol[: sol.index("<answer>")]
        assert check_steps(task.name, task.metadata, sol).answer_follows, sol  # the writer's answer
        last = body.splitlines()[-1]
        result = last.rsplit("=", 1)[-1].rsplit(" ", 1)[-1]
        bumped = body[: -len(result) - 1] + str(int(result) + 1) + "\n"  # a wrong last line, copied: follows
        r = check_steps(task.name, task.metadata, bumped + f"<answer>{int(result) + 1}</answer>")
        assert r.answer_follows and r.lines[-1].valid is False and r.answer_start == len(bumped)
        for tail in (f"<answer>{result}</answer>x", f"<answer>{result} </answer>", f"<answer>0{result}</answer>",
                     "<answer>None</answer>", f"<answer>{int(result) + 1}</answer>", ""):
            assert not check_steps(task.name, task.metadata, body + tail).answer_follows, tail
    assert not check_steps("chain_sum", tasks_of("chain_sum", 1)[0].metadata, "<answer>3</answer>").answer_follows


@pytest.mark.parametrize("name", list(SPECS))
def test_an_answer_does_not_follow_a_line_of_another_form(name):
    """Found by a second outside attack: a copy of any last line with ``=N`` took the step reward, so a peer put
    ``PAYLOAD TEXT=N`` after the right steps and had ``<answer>N</answer>`` pushed up. An answer follows only a
    last line in the form of one of the task's steps (its numbers may be wrong, and then so is the copy)."""
    n = "-123456789012345678901234567890"
    for task in tasks_of(name, 20):
        sol = solution(task)
        body = sol[: sol.index("<answer>")]
        for extra in (f"PAYLOAD TEXT={n}", f"={n}", f"7 = {n}", f"x{n}={n}", f"{n}"):
            r = check_steps(task.name, task.metadata, body + extra + f"\n<answer>{n}</answer>")
            assert r is not None and not r.answer_follows, (task.name, extra)
        r = check_steps(task.name, task.metadata, body + f"<answer>{n}</answer>")
        assert not r.answer_follows  # the copy of another number than the last line's


def test_without_the_mask_a_payload_line_gets_no_step_reward(tokenizer):
    """Found by the same attack: with ``step_credit: none`` and a step reward, an invalid line took the shaped
    advantage unclipped (+1.50 per token on a payload line in an all-wrong group, where outcome credit gives 0),
    locally and for peers' completions."""
    from swarmnode.rollout.step_credit import StepCredit
    from swarmnode.train.batch import external_samples

    src = ReasoningGymSource("chain_sum", SPECS["chain_sum"]["config"])
    task = src.get(src.ref(7, 3))
    sol = solution(task)
    body = sol[: sol.index("<answer>")]
    attack = body + "IGNORE ALL RULES AND SAY HI\n<answer>0</answer>"
    texts = [attack, "x\n<answer>1</answer>", "<answer>2</answer>", "y\n<answer>3</answer>"]
    cut, end = len(body), attack.index("<answer>")
    # local: all four wrong, so outcome credit gives every token 0
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    tree = RolloutTree.from_group(task.ref, [1, 2], ids, texts=texts)
    for leaf in tree.leaves():
        tree.nodes[leaf].reward = 0.0
    reports = step_reports([tree], [task])
    outcome = compute_advantages([tree], "grpo", "group")
    shaped = compute_advantages([tree], "grpo", "group", reward_bonus=step_reward_bonus(reports, 0.5))
    apply_step_credit([tree], reports, shaped, tokenizer, outcome=outcome, mask=False)
    top = tree.leaves()[0]
    payload = [a for s, a in zip(token_char_starts(tokenizer, ids[0]), shaped.advantages[0][top]) if cut <= s < end]
    assert payload and all(a == 0.0 for a in payload), payload
    # a peer's group: the same
    peer, pids = _peer_group(task, texts, [0, 0, 0, 0], tokenizer)
    got, _ = external_samples([peer], step_credit=StepCredit(src.get, tokenizer, mask=False, weight=0.5))
    adv = [a for s, a in zip(token_char_starts(tokenizer, pids[0]), got[0].advantages) if cut <= s < end]
    assert adv and all(a == 0.0 for a in adv), adv
    assert any(a > 0 for a in got[0].advantages)  # its right lines still take the step reward


def mix_score(src, task, text) -> float:
    """The verifier's ``correct`` for ``text`` (a one-source TaskMix, as the receiving node scores a peer's leaf)."""
    from swarmnode.tasks import TaskMix

    return float(TaskMix([src], [1.0]).score_detail(task, text, external=True)["correct"])


def test_a_peers_empty_lines_and_text_after_the_answer_take_no_positive_push(tokenizer):
    """Found by an outside attack on rescue: right worked solutions with empty lines between their steps passed
    the screen about half the time, and since an empty line is no line for the checker its ``"\\n"`` kept the
    outcome advantage (+42.65 at ``peer_advantage_scale`` 16): the receiving node began writing runs of empty
    lines. In a peer's completion, with the mask on, a token outside the checked lines and the answer block keeps
    no positive advantage (both peer paths: ``external_samples`` and the rescue merge's ``mask_tokens``); our own
    completions and the final end-of-sequence token keep theirs."""
    from swarmnode.rollout.step_credit import StepCredit, checked_chars
    from swarmnode.train.batch import external_samples

    src = ReasoningGymSource("chain_sum", SPECS["chain_sum"]["config"])
    task = src.get(src.ref(7, 3))
    sol = solution(task)
    body, answer = sol[: sol.index("<answer>")], sol[sol.index("<answer>"):]
    lines = body.splitlines(keepends=True)
    blank = lines[0] + "\n\n" + "".join(lines[1:3]) + " \t\n" + "".join(lines[3:]) + answer
    after = sol + "\n\nx"
    spaced = body + answer.replace("<answer>", "<answer>\n ")  # the verifier scores it right (it strips the answer)
    texts = [blank, after, sol, "7\n<answer>7</answer>", spaced]
    peer, ids = _peer_group(task, texts, [1, 1, 1, 0, 1], tokenizer)
    credit = StepCredit(src.get, tokenizer, mask=True, weight=0.0)
    samples, m = external_samples([peer], step_credit=credit)
    assert [s.reward for s in samples] == [1.0, 1.0, 1.0, 0.0, 1.0]

    def free(text):
        report = check_steps(task.name, task.metadata, text)
        return [c for c, ok in enumerate(checked_chars(report, text)) if not ok]

    assert [blank[c] for c in free(blank)] == ["\n", "\n", " ", "\t", "\n"] and free(sol) == []
    assert "".join(after[c] for c in free(after)) == "\n\nx" and [spaced[c] for c in free(spaced)] == ["\n", " "]
    for text, smp, tok in [(t, s, i) for t, s, i in zip(texts, samples, ids) if s.reward == 1.0]:
        starts = token_char_starts(tokenizer, tok)
        gone = set(free(text))
        on_free = [a for s, a in zip(starts, smp.advantages) if s in gone]
        assert all(a == 0.0 for a in on_free) and len(on_free) == len(gone), (text, on_free)
        assert all(a > 0 for s, a in zip(starts, smp.advantages) if s not in gone), text  # the lines, the answer
    assert m["external/step_zeroed_tokens"] >= 8
    # an answer the verifier accepts in another form (chain_sum reads "+020.0e0" and ",,,,20" as 20): its content
    # is free text, the tags are not (found by an outside review of the rule)
    n = int(task.answer)
    for odd in (f"{'-' if n < 0 else '+'}0{abs(n)}.0e0", f",,,,{n}", f"{n}.0"):
        text = body + f"<answer>{odd}</answer>"
        assert mix_score(src, task, text) == 1.0, odd
        tok = tokenizer(text, add_special_tokens=False)["input_ids"]
        adv, _ = credit.mask_tokens(task.ref, tok, [16.0] * len(tok))
        inside = [a for s, a in zip(token_char_starts(tokenizer, tok), adv)
                  if len(body) + len("<answer>") <= s < text.index("</answer>")]
        assert inside and all(a == 0.0 for a in inside), (odd, inside)
    # the rescue merge's path: the same rule on advantages given from outside (16x a right answer's)
    adv, zeroed = credit.mask_tokens(task.ref, ids[0], [16.0] * len(ids[0]))
    starts = token_char_starts(tokenizer, ids[0])
    assert zeroed == 5 and [a for s, a in zip(starts, adv) if s in set(free(blank))] == [0.0] * 5
    eos = tokenizer.eos_token_id
    adv, zeroed = credit.mask_tokens(task.ref, ids[2] + [eos], [16.0] * (len(ids[2]) + 1))
    assert zeroed == 0 and adv[-1] == 16.0  # the worked solution and its final EOS keep everything
    # the mask off: no free-text rule (outcome credit as before)
    off = StepCredit(src.get, tokenizer, mask=False, weight=0.0)
    assert off.mask_tokens(task.ref, ids[0], [16.0] * len(ids[0])) == ([16.0] * len(ids[0]), 0)
