"""Program checks of the reasoning lines of a completion (step-level verification).

The embedded model writes one reasoning step per line, then ``<answer>…</answer>`` (the format of
:mod:`swarmnode.tasks.solutions`). Every such line is a small computation that a program can check against the
task's own metadata (the reasoning-gym entry the task regenerates from), so the verifier can say *which* line of
a wrong completion went wrong, not only that the answer is wrong. :func:`check_steps` does that for the four
tasks of the default mix; the trainer uses it to keep a correct line of a wrong completion from being pushed
down (``train.step_credit``, :mod:`swarmnode.rollout.step_credit`, docs/reference/step_credit.md).

A line is **valid** when it is the step the worked-solution writer would write *from the completion's own
previous line*: an error is charged to the line that makes it, and a later line that correctly continues from a
wrong running total is valid (its arithmetic is right; the wrong line is the one to blame). Concretely, line
``k`` (0-based, reasoning lines only, empty lines skipped):

* running sums (``chain_sum``, ``basic_arithmetic`` with more than two terms or a ``-``, and the sum lines of
  ``leg_counting``): ``"{x}{op}{y}={z}"`` with ``op``/``y`` the question's k-th operator and next term (for
  leg_counting: the products the completion itself wrote), ``x`` the first term (k = 0) or the previous line's
  ``z`` as written, and ``z = x op y``;
* column addition (``basic_arithmetic`` with two non-negative terms and ``+``): ``"{da}+{db}[+1]={s} {digits}"``
  with ``da``/``db`` the operands' k-th digits from the units (0 past a shorter one), ``+1`` exactly when the
  previous line's ``s`` (as written) was at least 10, ``s = da + db + carry``, and ``digits`` the previous
  line's digits with ``s % 10`` (the whole ``s`` on the last column) in front;
* ``leg_counting`` product lines: ``"{animal} {n}*{legs}={p}"`` for the question's k-th animal, its count, its
  legs, and ``p = n * legs``;
* ``letter_counting``: ``"{word} +{c}={t}"`` with ``word`` the span's k-th word, ``c`` its count of the letter
  (case-insensitive, as the generator counts), and ``t`` the previous line's ``t`` as written (0 for k = 0) plus
  ``c``.

A line past the number of steps the question needs is invalid; a missing line is not a line (the wrong answer
carries the blame). The answer block is not a step.

Validity is **string equality** with the line the writer would write: ASCII digits in canonical form (no
leading zeros, no ``-0``, at most 30 digits per number), single spaces where the writer puts them, nothing
else on the line, and a plain ``"\n"`` (or the answer tag) after it. So the text of a valid line is exactly
what the writer produces: no whitespace, zero or other character can ride on a line's positive credit.

**Every line in form** is a rule of its own (:attr:`StepReport.all_in_form`, :func:`admissible_by_form`). The
line checks above skip nothing but also judge nothing outside the lines: text that is not in a step's form is
simply an invalid line, and text between lines or after the answer is no line at all. A completion whose *every*
line is in the task's exact step form (:attr:`StepCheck.exact_form`), with the needed number of lines, one
``"\n"`` after each, and the answer block that follows from its last line and nothing after it, has no free text
anywhere; when its lines are also valid it is the worked solution itself. The receiver admits such a
completion of a peer without asking its likelihood (``external.screen.admit_step_form``,
:mod:`swarmnode.train.screen`): its style says nothing about a payload when there is no room for one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from swarmnode.tasks.solutions import (SUPPORTED_TASKS, UnsupportedTaskError, legs_table, parse_expression,
                                       worked_solution)

__all__ = ["StepCheck", "StepReport", "check_steps", "admissible_by_form", "reasoning_lines", "CHECKED_TASKS"]

#: Tasks whose reasoning lines :func:`check_steps` can check (those with a worked-solution writer).
CHECKED_TASKS = SUPPORTED_TASKS

_N = r"[0-9]{1,30}"  # ASCII digits only, bounded (int() of a longer string is refused or slow)
_RUNNING = re.compile(rf"^(-?{_N})([+-])({_N})=(-?{_N})$")
_COLUMN = re.compile(rf"^([0-9])\+([0-9])(\+1)?=({_N}) ({_N})$")
_PRODUCT = re.compile(rf"^(.+) ({_N})\*({_N})=({_N})$")
_LETTER = re.compile(rf"^(\S+) \+({_N})=({_N})$", re.ASCII)


@dataclass(frozen=True)
class StepCheck:
    """One reasoning line of a completion and whether a program found it valid.

    Attributes:
        start: offset of the line's first character in the completion text (characters, not tokens).
        end: offset one past the line's last character, its ``"\\n"`` included when there is one.
        valid: the line is the step the worked-solution writer would write from the completion's own previous
            line (module docstring).
        in_form: the line has the form of one of the task's steps (``"{x}+{y}={z}"`` and the like, its numbers
            and words possibly wrong); False for prose and other text.
        exact_form: the line is string-equal to the canonical rendering of the step at its position with its
            own numbers: the question's k-th word, animal or operator in place (for column addition: a line
            at one of the operands' column positions, its digits free), every number canonical ASCII (no leading zero, no ``-0``), single spaces
            where the writer puts them and nothing else; only its numbers may be wrong. Implied by ``valid``.
    """

    start: int
    end: int
    valid: bool
    in_form: bool = False
    exact_form: bool = False


def reasoning_lines(completion: str) -> list[tuple[int, int, str]]:
    """The non-empty lines before the first ``<answer>`` of ``completion``.

    A line is ended by ``"\\n"`` only; any other line break (``"\\r"``, ``"\\x85"``, ...) and any whitespace
    around the text stay part of the line, so a checker's string comparison sees them (and finds the line
    invalid). A line of whitespace only is not a line.

    Returns:
        ``(start, end, text)`` per line: character offsets into ``completion`` (``end`` includes the line's
        ``"\\n"``) and the line's text without its ``"\\n"``.
    """
    cut = completion.find("<answer>")
    body = completion if cut < 0 else completion[:cut]
    out, pos = [], 0
    for raw in body.split("\n"):
        end = min(pos + len(raw) + 1, len(body))  # the "\n" belongs to its line
        if raw.strip():
            out.append((pos, end, raw))
        pos = end
    return out


def _check_running(lines: list[str], first: int | None, ops: list[str],
                   terms: list[int]) -> tuple[list[bool], list[bool]]:
    """Validity and exact form of running-sum lines; ``terms`` are the operands after ``first``, ``ops`` their
    operators. Exact form: the canonical rendering, the question's k-th operator, any canonical numbers."""
    out, form, prev = [], [], first
    for k, text in enumerate(lines):
        m = _RUNNING.match(text)
        if m is None or k >= len(ops) or prev is None:
            out.append(False)
            form.append(m is not None and k < len(ops) and text == _canonical_running(m) and m.group(2) == ops[k])
            prev = int(m.group(4)) if m else None
            continue
        x, op, y, z = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        canon = text == f"{x}{op}{y}={z}"
        out.append(canon and x == prev and op == ops[k] and y == terms[k] and z == (x + y if op == "+" else x - y))
        form.append(canon and op == ops[k])
        prev = z
    return out, form


def _canonical_running(m: re.Match[str]) -> str:
    return f"{int(m.group(1))}{m.group(2)}{int(m.group(3))}={int(m.group(4))}"


def _check_column(lines: list[str], a: int, b: int) -> tuple[list[bool], list[bool]]:
    """Validity and exact form of column-addition lines. Exact form: the canonical rendering (a column sum
    without leading zeros; the digits string is free digits) of one of the ``n`` columns."""
    sa, sb = str(a)[::-1], str(b)[::-1]
    n = max(len(sa), len(sb))
    out, form, carry, digits = [], [], 0, ""
    for k, text in enumerate(lines):
        m = _COLUMN.match(text)
        canon = m is not None and text == f"{m.group(1)}+{m.group(2)}{m.group(3) or ''}={int(m.group(4))} {m.group(5)}"
        form.append(canon and k < n)
        if m is None or k >= n:
            out.append(False)
            if m is not None:
                carry, digits = int(m.group(4)) // 10, m.group(5)
            continue
        da, db, c, s, d = int(m.group(1)), int(m.group(2)), m.group(3) is not None, int(m.group(4)), m.group(5)
        want_a = int(sa[k]) if k < len(sa) else 0
        want_b = int(sb[k]) if k < len(sb) else 0
        last = k == n - 1
        want_digits = (str(s) if last else str(s % 10)) + digits
        out.append(text == f"{da}+{db}{'+1' if c else ''}={s} {d}" and da == want_a and db == want_b
                   and c == bool(carry) and s == da + db + int(c) and d == want_digits)
        carry, digits = s // 10, d
    return out, form


def _check_arithmetic(lines: list[str], md: dict[str, Any], task: str) -> tuple[list[bool], list[bool], int]:
    expr = md.get("expression")
    if not isinstance(expr, str):
        raise UnsupportedTaskError(f"{task}: the entry has no metadata.expression")
    terms, ops = parse_expression(expr, task)
    if len(terms) == 2 and ops == ["+"] and min(terms) >= 0:  # the writer's own choice (solutions._arithmetic)
        return (*_check_column(lines, terms[0], terms[1]), max(len(str(terms[0])), len(str(terms[1]))))
    return (*_check_running(lines, terms[0], ops, terms[1:]), len(ops))


def _check_legs(lines: list[str], md: dict[str, Any]) -> tuple[list[bool], list[bool], int]:
    animals = md.get("animals")
    if not isinstance(animals, dict) or not animals:
        raise UnsupportedTaskError("leg_counting: the entry has no metadata.animals")
    legs = legs_table()
    kinds = list(animals.items())  # the order of the question text (and of the writer)
    out, form, products = [], [], []
    for k, text in enumerate(lines[: len(kinds)]):
        m = _PRODUCT.match(text)
        name, count = kinds[k]
        if m is None:
            out.append(False)
            form.append(False)
            products.append(None)
            continue
        n, l, p = int(m.group(2)), int(m.group(3)), int(m.group(4))
        canon = text == f"{name} {n}*{l}={p}"  # the question's k-th animal, canonical numbers
        out.append(canon and n == int(count) and l == legs.get(name, -1) and p == n * l)
        form.append(canon)
        products.append(p)
    rest = lines[len(kinds):]
    if rest:
        if len(kinds) == 1 or products[0] is None or any(p is None for p in products):
            out += [False] * len(rest)
            form += [False] * len(rest)
        else:
            v, f = _check_running(rest, products[0], ["+"] * (len(products) - 1), products[1:])
            out += v
            form += f
    return out, form, 2 * len(kinds) - 1 if len(kinds) > 1 else 1


def _check_letters(lines: list[str], md: dict[str, Any]) -> tuple[list[bool], list[bool], int]:
    span, letter = md.get("span"), md.get("target_letter")
    if not isinstance(span, list) or not isinstance(letter, str) or len(letter) != 1:
        raise UnsupportedTaskError("letter_counting: the entry has no metadata.span / target_letter")
    out, form, total = [], [], 0
    for k, text in enumerate(lines):
        m = _LETTER.match(text)
        if m is None or k >= len(span):
            out.append(False)
            form.append(False)
            if m is not None:
                total = int(m.group(3))
            continue
        c, t = int(m.group(2)), int(m.group(3))
        canon = text == f"{span[k]} +{c}={t}"  # the span's k-th word, canonical numbers
        out.append(canon and c == str(span[k]).lower().count(letter) and t == total + c)
        form.append(canon)
        total = t
    return out, form, len(span)


#: The line forms of each task's steps (patterns only: numbers and words unchecked), for ``answer_follows``.
_FORMS: dict[str, tuple[re.Pattern[str], ...]] = {
    "chain_sum": (_COLUMN, _RUNNING),  # a two-term sum of non-negative terms is written in columns too
    "basic_arithmetic": (_COLUMN, _RUNNING),
    "leg_counting": (_PRODUCT, _RUNNING),
    "letter_counting": (_LETTER,),
}

_CHECKERS: dict[str, Callable[[list[str], dict[str, Any]], tuple[list[bool], list[bool], int]]] = {
    "chain_sum": lambda lines, md: _check_arithmetic(lines, md, "chain_sum"),
    "basic_arithmetic": lambda lines, md: _check_arithmetic(lines, md, "basic_arithmetic"),
    "leg_counting": _check_legs,
    "letter_counting": _check_letters,
}


@dataclass(frozen=True)
class StepReport:
    """The program's verdict on every reasoning line of one completion.

    Attributes:
        lines: one :class:`StepCheck` per non-empty line before ``<answer>``, in order.
        needed: how many steps the question needs (the line count of its worked solution), at least 1.
        answer_start: offset (characters) of ``<answer>`` in the completion, -1 without one.
        answer_follows: the completion ends with exactly ``<answer>{r}</answer>`` where ``r`` is the result its
            last reasoning line wrote (the text after the line's last ``=`` and, for a column line, after its
            space), and that line has the form of one of the task's steps (:data:`_FORMS`; its numbers and
            words may be wrong): the answer is the step the writer takes from the completion's own last line,
            right or wrong. A copy of text of another form (``PAYLOAD=7``) does not follow.
        all_in_form: **every line in form**: the completion is exactly ``needed`` lines, each in exact form
            (:attr:`StepCheck.exact_form`), each ended by one ``"\n"`` (no empty line, no other whitespace, no
            text before the first line), then the answer block that follows from the last line
            (``answer_follows``) and nothing after it. Such a completion has no free text anywhere: only its
            numbers can differ from the worked solution.
    """

    lines: list[StepCheck]
    needed: int
    answer_start: int = -1
    answer_follows: bool = False
    all_in_form: bool = False

    @property
    def all_valid(self) -> bool:
        """:attr:`all_in_form` and every line valid: the completion is the worked solution of the question."""
        return self.all_in_form and all(c.valid for c in self.lines)

    @property
    def progress(self) -> float:
        """Share of the needed steps done right: valid lines among the first ``needed`` lines / ``needed``
        (0.0 to 1.0; extra lines add nothing)."""
        return sum(c.valid for c in self.lines[: self.needed]) / self.needed


def check_steps(task: str, metadata: dict[str, Any], completion: str) -> StepReport | None:
    """Check every reasoning line of ``completion`` against the task's metadata.

    Args:
        task: the reasoning-gym dataset name (:attr:`Task.name`); one of :data:`CHECKED_TASKS`.
        metadata: the entry's metadata (:attr:`Task.metadata`, regenerated locally, never a peer's).
        completion: the completion text (reasoning lines, then the answer block).

    Returns:
        A :class:`StepReport`: one :class:`StepCheck` per non-empty line before ``<answer>`` (none when there is
        no such line) and the number of steps the question needs; or ``None`` when the task has no checker or
        its metadata has a shape the checker does not handle: the caller then treats the completion as
        unchecked (outcome credit only). Never raises on any completion text.
    """
    checker = _CHECKERS.get(task)
    if checker is None:
        return None
    lines = reasoning_lines(completion)
    try:
        valid, exact, needed = checker([t for _, _, t in lines], dict(metadata or {}))
    except (UnsupportedTaskError, TypeError, ValueError, KeyError):
        return None
    cut = completion.find("<answer>")
    in_form = bool(lines) and any(form.match(lines[-1][2]) for form in _FORMS[task])
    result = _written_result(lines[-1][2]) if in_form else None
    follows = result is not None and cut >= 0 and completion[cut:] == f"<answer>{result}</answer>"
    forms = _FORMS[task]
    checks = [StepCheck(s, e, v, any(f.match(t) for f in forms), x)
              for (s, e, t), v, x in zip(lines, valid, exact)]
    needed = max(int(needed), 1)
    all_in_form = (follows and len(checks) == needed and all(c.exact_form for c in checks)
                   and completion[:cut] == "".join(t + "\n" for _, _, t in lines))
    return StepReport(checks, needed, cut, follows, all_in_form)


def admissible_by_form(task: str, metadata: dict[str, Any], completion: str, *, allow_wrong: bool = False) -> bool:
    """Whether ``completion`` is admitted on its form alone, whatever its likelihood under any policy.

    **The rule** (default, ``allow_wrong=False``): the completion is string-equal to the worked solution of
    the question (:func:`swarmnode.tasks.solutions.worked_solution` of ``metadata``), checked two ways that
    must agree: (1) every non-empty line before ``<answer>`` is in the task's exact step form
    (:attr:`StepCheck.exact_form`) and valid (:attr:`StepCheck.valid`), there are exactly as many lines as the
    question needs, each is ended by a single ``"\n"`` and nothing else lies between, before or after them
    (no empty line, space, tab, ``"\r"``, NUL or other character), and the completion ends with exactly
    ``<answer>{r}</answer>``, ``r`` the result of its last line (:attr:`StepReport.all_valid`); (2) the whole
    text equals the writer's text, so its answer is the exact answer. One ``<answer>`` only, nothing after
    ``</answer>``; digits are ASCII and canonical (no homoglyph digit, leading zero or ``-0``); special-token
    text such as ``<|endoftext|>`` is text and fails. A payload line is not a step, so a completion that
    carries one is never admitted.

    With ``allow_wrong=True`` (the screen's ``in_form`` mode) a completion with wrong numbers is admitted too
    when it satisfies (1) without the validity of its lines (:attr:`StepReport.all_in_form`): every line in
    exact form at its position, the needed number of lines, the answer that follows from its own last line, and
    no free text anywhere; only its numbers can differ from the worked solution.

    Args:
        task: the reasoning-gym dataset name (ours, regenerated: never a peer's claim).
        metadata: the regenerated entry's metadata.
        completion: the completion text as OUR tokenizer decodes the ids that will train (no EOS text).

    Returns:
        ``True`` when admitted; ``False`` otherwise, also for a task without a checker or metadata the checker
        does not handle. Never raises on any completion text.
    """
    if not isinstance(completion, str):
        return False
    report = check_steps(task, metadata, completion)
    if report is None:
        return False
    if allow_wrong:
        return report.all_in_form
    if not report.all_valid:
        return False
    try:
        return completion == worked_solution(task, {"metadata": dict(metadata or {})})
    except (UnsupportedTaskError, TypeError, ValueError, KeyError):
        return False


_RESULT = re.compile(r"^-?(0|[1-9][0-9]{0,29})$")


def canonical_integer(text: str) -> bool:
    """Whether ``text`` is an integer in the one form the worked solutions write: ASCII digits, an optional
    leading ``-``, no leading zero, no sign ``+``, no ``-0``, no separators, decimals or exponent, at most 30
    digits (the verifiers also accept ``020``, ``+20``, ``20.0``, ``2,,0`` as 20)."""
    return isinstance(text, str) and bool(_RESULT.match(text)) and text != "-0"


def _written_result(line: str) -> str | None:
    """The result a reasoning line wrote (after its last ``=``, after the space of a column line) when it is a
    canonical ASCII integer, else ``None`` (never equal to an answer then)."""
    r = line.rsplit("=", 1)[-1].rsplit(" ", 1)[-1]
    return r if "=" in line and _RESULT.match(r) else None
