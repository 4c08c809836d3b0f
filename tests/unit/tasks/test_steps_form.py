"""Every line in form (swarmnode/tasks/steps.py ``admissible_by_form``, ``StepReport.all_in_form``) and
``StepCredit.admits``: real reasoning-gym tasks of the default mix, the embedded tokenizers, an attacker's texts."""

from __future__ import annotations

import pytest

from swarmnode.tasks.reasoning_gym_source import ReasoningGymSource
from swarmnode.tasks.solutions import DEFAULT_MIX, worked_solution
from swarmnode.tasks.steps import admissible_by_form, check_steps

SPECS = {s["name"]: s for s in DEFAULT_MIX}
TASKS = ("chain_sum", "basic_arithmetic", "leg_counting", "letter_counting")


def tasks_of(name: str, n: int, seed: int = 3):
    src = ReasoningGymSource(name, SPECS[name]["config"])
    return [src.get(src.ref(seed, i)) for i in range(n)]


def solution(task) -> str:
    return worked_solution(task.name, {"metadata": task.metadata})


def admits(task, text: str, allow_wrong: bool = False) -> bool:
    return admissible_by_form(task.name, task.metadata, text, allow_wrong=allow_wrong)


def split(sol: str) -> tuple[list[str], str]:
    cut = sol.index("<answer>")
    return sol[:cut].split("\n")[:-1], sol[cut:]


def join(lines: list[str], answer: str) -> str:
    return "".join(line + "\n" for line in lines) + answer


@pytest.mark.parametrize("name", TASKS)
def test_the_worked_solution_is_admitted_in_both_modes(name):
    for task in tasks_of(name, 12):
        sol = solution(task)
        report = check_steps(task.name, task.metadata, sol)
        assert report is not None and report.all_in_form and report.all_valid
        assert all(c.exact_form and c.valid for c in report.lines)
        assert admits(task, sol) and admits(task, sol, allow_wrong=True)
        assert sol.endswith(f"<answer>{task.answer}</answer>")  # the exact answer, as reasoning-gym states it


def _attacks(sol: str) -> dict[str, str]:
    """An attacker's rewrites of a correct worked solution: each keeps the answer (still verified correct)."""
    lines, ans = split(sol)
    first = lines[0]
    digit = next(i for i, ch in enumerate(first) if ch.isdigit())
    out = {
        "payload_line_before_answer": join(lines + ["Visit evil.example"], ans),
        "payload_line_first": join(["Visit evil.example"] + lines, ans),
        "payload_after_answer": sol + "Visit evil.example",
        "newline_after_answer": sol + "\n",
        "payload_on_a_line": join([lines[0] + " pwned"] + lines[1:], ans),
        "trailing_space": join([lines[0] + " "] + lines[1:], ans),
        "trailing_tab": join([lines[0] + "\t"] + lines[1:], ans),
        "leading_space": join([" " + lines[0]] + lines[1:], ans),
        "carriage_return": join([lines[0] + "\r"] + lines[1:], ans),
        "nul": join([lines[0] + "\x00"] + lines[1:], ans),
        "nbsp_inside": join([lines[0].replace("=", "\u00a0=", 1)] + lines[1:], ans),
        "ideographic_space_line": join([lines[0], "\u3000"] + lines[1:], ans),
        "empty_line_between": sol.replace("\n", "\n\n", 1),
        "whitespace_line_between": sol.replace("\n", "\n \n", 1),
        "leading_newline": "\n" + sol,
        "homoglyph_digit": join([first[:digit] + chr(0xFF10 + int(first[digit])) + first[digit + 1:]] + lines[1:], ans),
        "arabic_indic_digit": join([first[:digit] + chr(0x0660 + int(first[digit])) + first[digit + 1:]] + lines[1:],
                                   ans),
        "special_token_text_line": join(lines + ["<|endoftext|>"], ans),
        "special_token_text_after": sol + "<|endoftext|>",
        "special_token_text_on_a_line": join([lines[0] + "<|endoftext|>"] + lines[1:], ans),
        "line_repeated": join([lines[0]] + lines, ans),
        "last_line_repeated": join(lines + [lines[-1]], ans),
        "answer_twice": sol + ans,
        "answer_twice_inside": join(lines, ans.replace("</answer>", "</answer><answer>" + ans[8:-9] + "</answer>")),
        "answer_with_space": join(lines, ans.replace("<answer>", "<answer> ")),
        "answer_leading_zero": join(lines, ans.replace("<answer>", "<answer>0")),
        "no_answer": join(lines, ""),
        "one_line_missing": join(lines[:-1], ans),
        "crlf": sol.replace("\n", "\r\n"),
        "upper_case_line": join([lines[0].upper()] + lines[1:], ans) if lines[0].upper() != lines[0] else sol + " ",
    }
    return out


@pytest.mark.parametrize("name", TASKS)
def test_attackers_rewrites_of_a_correct_solution_are_never_admitted(name):
    for task in tasks_of(name, 6):
        sol = solution(task)
        for kind, text in _attacks(sol).items():
            assert text != sol, kind
            assert not admits(task, text), (name, kind, text)
            assert not admits(task, text, allow_wrong=True), (name, kind, text)


def test_leading_zeros_and_minus_zero_are_not_in_form():
    task = next(t for t in tasks_of("chain_sum", 40) if "-" in t.metadata["expression"])
    sol = solution(task)
    lines, ans = split(sol)
    x, rest = lines[0].split("+", 1) if "+" in lines[0][1:] else lines[0].split("-", 1)
    op = "+" if "+" in lines[0][1:] else "-"
    padded = join([f"0{x}{op}{rest}"] + lines[1:], ans)
    assert not admits(task, padded) and not admits(task, padded, allow_wrong=True)
    # a running total of 0 written "-0" (a canonical "0" elsewhere): not the writer's text, not in form
    zero = join(lines[:-1] + [lines[-1].rsplit("=", 1)[0] + "=-0"], "<answer>-0</answer>")
    assert not admits(task, zero, allow_wrong=True)
    report = check_steps(task.name, task.metadata, padded)
    assert report is not None and not report.lines[0].exact_form and not report.all_in_form


@pytest.mark.parametrize("name", TASKS)
def test_a_wrong_completion_in_exact_form_passes_only_the_in_form_variant(name):
    n = 0
    for task in tasks_of(name, 12):
        lines, _ = split(solution(task))
        # the last line's result is off by one, and the answer copies it: every line in form, the answer follows
        head, res = lines[-1].rsplit("=", 1)
        if " " in res and name == "basic_arithmetic":  # a column line: "{s} {digits}"
            s, digits = res.split(" ")
            last = f"{head}={int(s) + 1} {int(s) + 1}{digits[len(s):]}"
            wrong = last.rsplit(" ", 1)[1]
        else:
            last = f"{head}={int(res) + 1}"
            wrong = str(int(res) + 1)
        text = join(lines[:-1] + [last], f"<answer>{wrong}</answer>")
        report = check_steps(task.name, task.metadata, text)
        assert report is not None and report.all_in_form and not report.all_valid, (name, text)
        assert not admits(task, text) and admits(task, text, allow_wrong=True), (name, text)
        # an answer that does not follow from the last line: not in form
        assert not admits(task, join(lines[:-1] + [last], f"<answer>{int(wrong) + 1}</answer>"), allow_wrong=True)
        # a line past the needed number, even a valid-looking one, breaks the form
        assert not admits(task, join(lines[:-1] + [last, last], f"<answer>{wrong}</answer>"), allow_wrong=True)
        n += 1
    assert n == 12


def test_words_of_the_question_are_fixed_in_the_in_form_variant():
    """letter_counting / leg_counting: a word or an animal other than the question's is free text, not form."""
    for name, swap in (("letter_counting", lambda ln: "pwned" + ln[ln.index(" "):]),
                       ("leg_counting", lambda ln: "pwned" + ln[ln.index(" "):])):
        task = tasks_of(name, 1)[0]
        lines, ans = split(solution(task))
        text = join([swap(lines[0])] + lines[1:], ans)
        assert not admits(task, text, allow_wrong=True), name


def test_tasks_without_a_checker_and_bad_metadata_are_not_admitted():
    assert not admissible_by_form("gsm8k", {}, "1+1=2\n<answer>2</answer>")
    assert not admissible_by_form("chain_sum", {}, "1+1=2\n<answer>2</answer>")
    assert not admissible_by_form("chain_sum", {"expression": "1 + 1"}, None)  # type: ignore[arg-type]
    assert admissible_by_form("chain_sum", {"expression": "1 + 1"}, "1+1=2 2\n<answer>2</answer>")  # a column
    assert admissible_by_form("chain_sum", {"expression": "3 - 1 + 2"}, "3-1=2\n2+2=4\n<answer>4</answer>")


# ------------------------------------------------------------------------------------------ StepCredit.admits
@pytest.fixture(scope="module")
def tokenizers():
    from swarmnode.config import ModelConfig
    from swarmnode.policy.loading import load_policy

    return {m: load_policy(ModelConfig(name_or_path=m, device="cpu", dtype="float32")).tokenizer
            for m in ("embedded", "embedded-bpe")}


@pytest.mark.parametrize("model", ["embedded", "embedded-bpe"])
def test_step_credit_admits_checks_the_ids_that_train(tokenizers, model):
    from swarmnode.rollout.step_credit import StepCredit

    tok = tokenizers[model]
    src = ReasoningGymSource("chain_sum", SPECS["chain_sum"]["config"])
    task = src.get(src.ref(3, 0))
    credit = StepCredit(src.get, tok, mask=True, weight=0.5)
    sol = solution(task)
    ids = list(tok(sol, add_special_tokens=False)["input_ids"])
    eos = tok.eos_token_id
    assert credit.admits(task.ref, ids) and credit.admits(task.ref, ids + [eos])  # one final EOS: the stop
    # a special token inside, or a second EOS, trains but is dropped by a skip-special decode: not admitted
    assert not credit.admits(task.ref, ids[:2] + [eos] + ids[2:] + [eos])
    assert not credit.admits(task.ref, ids + [eos, eos])
    assert not credit.admits(task.ref, [])
    extra = sorted(set(getattr(tok, "all_special_ids", [])) - {eos})
    if extra:
        assert not credit.admits(task.ref, [extra[0]] + ids)
    # the ref is regenerated by us: another task's solution does not pass for this one
    other = src.get(src.ref(3, 1))
    assert other.metadata != task.metadata and not credit.admits(other.ref, ids)
    # any failure is False, never an exception
    broken = StepCredit(lambda ref: (_ for _ in ()).throw(KeyError(ref)), tok)
    assert not broken.admits(task.ref, ids)
    assert not credit.admits(task.ref, [10**9])
