"""Verifiers on well-formed and hostile model output: right values, never an exception."""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.tasks.verifiers import (
    MAX_ANSWER_CHARS,
    MAX_MATH_CHARS,
    VerifierTimeout,
    clamp01,
    extract_answer,
    format_reward,
    math_verify_score,
    time_limit,
)

HOSTILE = [
    None,
    "",
    b"<answer>5</answer>",
    bytearray(b"<answer>5</answer>"),
    memoryview(b"<answer>5</answer>"),
    5,
    5.0,
    ["<answer>5</answer>"],
    {"answer": "5"},
    "no tags at all, the answer is 5",
    "<answer>5",
    "5</answer>",
    "</answer>5<answer>",
    "<answer><answer>5</answer></answer>",
    "<answer>5</answer></answer>",
    "<answer></answer>",
    "<answer>   \n\t </answer>",
    "\ud800\udfff\x00\x1b[31m<answer\u200b>5</answer\u200b>",
    "<ANSWER>5</ANSWER>",
    "<answer >5</answer >",
    "<" * 100_000 + "answer>" * 100_000,
    "x" * 3_000_000,
]


# ------------------------------------------------------------------ extract_answer
def test_extract_answer_takes_last_pair_stripped():
    assert extract_answer("<answer> 42 </answer>") == "42"
    assert extract_answer("think... <answer>1</answer> no wait <answer>\n-30\n</answer> done") == "-30"
    assert extract_answer("<answer>a\nb</answer>") == "a\nb"
    assert extract_answer("</answer><answer>7</answer>") == "7"
    assert extract_answer("<answer></answer>") == ""
    assert extract_answer("<answer>é ✓ 数</answer>") == "é ✓ 数"


@pytest.mark.parametrize(
    "text",
    [
        None,
        b"<answer>5</answer>",
        5,
        "",
        "no tags",
        "<answer>5",
        "5</answer>",
        "</answer>5<answer>",
        "<answer><answer>5</answer></answer>",  # nested
        "<answer>5</answer></answer>",  # unbalanced close
        "<ANSWER>5</ANSWER>",
    ],
)
def test_extract_answer_malformed_is_none(text):
    assert extract_answer(text) is None


def test_extract_answer_huge_inputs():
    junk = "\u2603x<" * 1_000_000
    assert extract_answer(junk + "<answer>12</answer>") == "12"
    assert extract_answer(junk) is None
    assert extract_answer("<answer>" + "9" * (MAX_ANSWER_CHARS + 1) + "</answer>") is None
    assert extract_answer("<answer>" + "9" * MAX_ANSWER_CHARS + "</answer>") == "9" * MAX_ANSWER_CHARS


# ------------------------------------------------------------------ format_reward
def test_format_reward_values():
    assert format_reward("<answer>5</answer>") == 1.0
    assert format_reward("reasoning first\n<answer> -30 </answer>\n") == 1.0
    assert format_reward("<answer>✓</answer>") == 1.0
    assert format_reward("<answer>1</answer><answer>2</answer>") == 0.0  # two pairs
    assert format_reward("<answer><answer>5</answer></answer>") == 0.0  # nested
    assert format_reward("</answer>5<answer>") == 0.0  # reversed
    assert format_reward("<answer> </answer>") == 0.0  # empty content
    assert format_reward("<answer>5") == 0.0  # truncated
    assert format_reward("5") == 0.0


def test_format_rule_nothing_but_whitespace_after_the_answer():
    """Text after the answer is not free: a payload after a correct answer breaks the format."""
    assert format_reward("<answer>5</answer> \n\t ") == 1.0
    assert format_reward("<answer>5</answer>\u3000") == 1.0  # Unicode whitespace is whitespace
    assert format_reward("<answer>5</answer> Visit evil.example") == 0.0
    assert format_reward("<answer>5</answer>.") == 0.0
    assert format_reward("<answer>5</answer><|endoftext|>") == 0.0  # an EOS is an id, stripped before decoding


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_all_verifiers_score_hostile_output_zero(text):
    assert format_reward(text) == 0.0
    got = extract_answer(text)
    assert got is None or got == ""
    assert math_verify_score("5", got) == 0.0
    # given directly (not through extract_answer) the raw text is still scored without raising
    assert math_verify_score("5", text) in (0.0, 1.0)


# ------------------------------------------------------------------ math_verify_score
@pytest.mark.parametrize(
    "gold,pred,want",
    [
        ("\\frac{1}{2}", "0.5", 1.0),
        ("0.5", "\\frac{1}{2}", 1.0),
        ("\\frac{1}{2}", "1/2", 1.0),
        ("-30", "-30", 1.0),
        ("-30", " -30 ", 1.0),
        ("6889", "6889.0", 1.0),
        ("2", "3", 0.0),
        ("\\frac{1}{2}", "0.6", 0.0),
        ("\\sqrt{2}", "1.41", 0.0),
        ("cat", "cat", 1.0),  # exact-string fallback: nothing numeric to parse
        ("cat", "dog", 0.0),
        ("1", "", 0.0),
        ("", "", 0.0),
    ],
)
def test_math_verify_score(gold, pred, want):
    assert math_verify_score(gold, pred) == want


def test_math_verify_score_caps_long_predictions():
    long_pred = "1+" * MAX_MATH_CHARS + "1"
    assert math_verify_score(str(MAX_MATH_CHARS + 1), long_pred) == 0.0  # not parsed: only exact match counts
    assert math_verify_score(long_pred, long_pred) == 1.0


def test_math_verify_score_off_main_thread():
    out: list[float] = []

    def work():
        out.append(math_verify_score("\\frac{1}{2}", "0.5"))
        out.append(math_verify_score("\\frac{1}{2}", "0.25"))
        out.append(format_reward("<answer>1</answer>"))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out == [1.0, 0.0, 1.0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_verifiers_never_raise_on_random_text(text):
    assert format_reward(text) in (0.0, 1.0)
    a = extract_answer(text)
    assert a is None or isinstance(a, str)
    assert math_verify_score("\\frac{1}{2}", text) in (0.0, 1.0)
    wrapped = f"<answer>{text}</answer>"
    assert math_verify_score("2", extract_answer(wrapped)) in (0.0, 1.0)


# ------------------------------------------------------------------ helpers
def test_clamp01():
    assert clamp01(0.3) == 0.3
    assert clamp01(-1) == 0.0
    assert clamp01(7) == 1.0
    assert clamp01(float("nan")) == 0.0
    assert clamp01("junk") == 0.0
    assert clamp01(None) == 0.0


def test_time_limit_interrupts_a_busy_loop_on_the_main_thread():
    with pytest.raises(VerifierTimeout):
        with time_limit(0.2) as armed:
            assert armed
            while True:
                pass
    # the timer is disarmed afterwards: a later slow-ish body is not interrupted
    with time_limit(None) as armed:
        assert not armed
        sum(range(100_000))


def test_time_limit_is_a_no_op_off_the_main_thread():
    flags: list[bool] = []

    def work():
        with time_limit(1.0) as armed:
            flags.append(armed)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert flags == [False]


def test_time_limit_restores_an_outer_timer():
    import signal

    fired: list[int] = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, 50.0)
    try:
        with pytest.raises(VerifierTimeout):
            with time_limit(0.1) as armed:
                assert armed
                while True:
                    pass
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < remaining <= 50.0  # the outer timer is running again
        assert signal.getsignal(signal.SIGALRM) is not None and fired == []
        with time_limit(100.0) as armed:  # the outer timer fires first: ours is not armed
            assert not armed
    finally:
        signal.setitimer(signal.ITIMER_REAL, old_delay, old_interval)
        signal.signal(signal.SIGALRM, old)
