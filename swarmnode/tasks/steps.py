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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from swarmnode.tasks.solutions import SUPPORTED_TASKS, UnsupportedTaskError, legs_table, parse_expression

__all__ = ["StepCheck", "StepReport", "check_steps", "reasoning_lines", "CHECKED_TASKS"]

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
    """

    start: int
    end: int
    valid: bool
    in_form: bool = False


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


def _check_running(lines: list[str], first: int | None, ops: list[str], terms: list[int]) -> list[bool]:
    """Validity of running-sum lines; ``terms`` are the operands after ``first``, ``ops`` their operators."""
    out, prev = [], first
    for k, text in enumerate(lines):
        m = _RUNNING.match(text)
        if m is None or k >= len(ops) or prev is None:
            out.append(False)
            prev = int(m.group(4)) if m else None
            continue
        x, op, y, z = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        out.append(text == f"{x}{op}{y}={z}" and x == prev and op == ops[k] and y == terms[k]
                   and z == (x + y if op == "+" else x - y))
        prev = z
    return out


def _check_column(lines: list[str], a: int, b: int) -> list[bool]:
    sa, sb = str(a)[::-1], str(b)[::-1]
    n = max(len(sa), len(sb))
    out, carry, digits = [], 0, ""
    for k, text in enumerate(lines):
        m = _COLUMN.match(text)
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
    return out


def _check_arithmetic(lines: list[str], md: dict[str, Any], task: str) -> tuple[list[bool], int]:
    expr = md.get("expression")
    if not isinstance(expr, str):
        raise UnsupportedTaskError(f"{task}: the entry has no metadata.expression")
    terms, ops = parse_expression(expr, task)
    if len(terms) == 2 and ops == ["+"] and min(terms) >= 0:  # the writer's own choice (solutions._arithmetic)
        return _check_column(lines, terms[0], terms[1]), max(len(str(terms[0])), len(str(terms[1])))
    return _check_running(lines, terms[0], ops, terms[1:]), len(ops)


def _check_legs(lines: list[str], md: dict[str, Any]) -> tuple[list[bool], int]:
    animals = md.get("animals")
    if not isinstance(animals, dict) or not animals:
        raise UnsupportedTaskError("leg_counting: the entry has no metadata.animals")
    legs = legs_table()
    kinds = list(animals.items())  # the order of the question text (and of the writer)
    out, products = [], []
    for k, text in enumerate(lines[: len(kinds)]):
        m = _PRODUCT.match(text)
        name, count = kinds[k]
        if m is None:
            out.append(False)
            products.append(None)
            continue
        n, l, p = int(m.group(2)), int(m.group(3)), int(m.group(4))
        out.append(text == f"{name} {n}*{l}={p}" and n == int(count) and l == legs.get(name, -1) and p == n * l)
        products.append(p)
    rest = lines[len(kinds):]
    if rest:
        if len(kinds) == 1 or products[0] is None or any(p is None for p in products):
            out += [False] * len(rest)
        else:
            out += _check_running(rest, products[0], ["+"] * (len(products) - 1), products[1:])
    return out, 2 * len(kinds) - 1 if len(kinds) > 1 else 1


def _check_letters(lines: list[str], md: dict[str, Any]) -> tuple[list[bool], int]:
    span, letter = md.get("span"), md.get("target_letter")
    if not isinstance(span, list) or not isinstance(letter, str) or len(letter) != 1:
        raise UnsupportedTaskError("letter_counting: the entry has no metadata.span / target_letter")
    out, total = [], 0
    for k, text in enumerate(lines):
        m = _LETTER.match(text)
        if m is None or k >= len(span):
            out.append(False)
            if m is not None:
                total = int(m.group(3))
            continue
        c, t = int(m.group(2)), int(m.group(3))
        out.append(text == f"{span[k]} +{c}={t}" and c == str(span[k]).lower().count(letter) and t == total + c)
        total = t
    return out, len(span)


#: The line forms of each task's steps (patterns only: numbers and words unchecked), for ``answer_follows``.
_FORMS: dict[str, tuple[re.Pattern[str], ...]] = {
    "chain_sum": (_RUNNING,),
    "basic_arithmetic": (_COLUMN, _RUNNING),
    "leg_counting": (_PRODUCT, _RUNNING),
    "letter_counting": (_LETTER,),
}

_CHECKERS: dict[str, Callable[[list[str], dict[str, Any]], tuple[list[bool], int]]] = {
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
    """

    lines: list[StepCheck]
    needed: int
    answer_start: int = -1
    answer_follows: bool = False

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
        valid, needed = checker([t for _, _, t in lines], dict(metadata or {}))
    except (UnsupportedTaskError, TypeError, ValueError, KeyError):
        return None
    cut = completion.find("<answer>")
    in_form = bool(lines) and any(form.match(lines[-1][2]) for form in _FORMS[task])
    result = _written_result(lines[-1][2]) if in_form else None
    follows = result is not None and cut >= 0 and completion[cut:] == f"<answer>{result}</answer>"
    forms = _FORMS[task]
    checks = [StepCheck(s, e, v, any(f.match(t) for f in forms)) for (s, e, t), v in zip(lines, valid)]
    return StepReport(checks, max(int(needed), 1), cut, follows)


_RESULT = re.compile(r"^-?(0|[1-9][0-9]{0,29})$")


def _written_result(line: str) -> str | None:
    """The result a reasoning line wrote (after its last ``=``, after the space of a column line) when it is a
    canonical ASCII integer, else ``None`` (never equal to an answer then)."""
    r = line.rsplit("=", 1)[-1].rsplit(" ", 1)[-1]
    return r if "=" in line and _RESULT.match(r) else None
