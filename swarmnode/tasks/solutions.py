"""Worked solutions written by a program, for the embedded model's task mix.

The embedded default model (``scripts/build_tiny_model.py``, docs/reference/embedded_model.md) is warm-started on
completions that reason in short steps and then answer: every reasoning step is one line ending in ``"\\n"``
(the tree sampler's step-boundary rule forks there), followed by ``<answer>…</answer>``. The steps are
computed here from the reasoning-gym entry (its question and metadata), never copied from its ``answer``
field: the answer written inside the tags is the result of the steps, so a test that re-scores every worked
solution with the task's own ``score_answer`` checks the steps' arithmetic too.

The RL default mix (:data:`DEFAULT_MIX`; the models are built on :data:`BUILD_MIX`, the same tasks over a
range of difficulties from the easiest up to this), one writer per task:

* ``chain_sum`` (10-14 one-digit terms, ``+``/``-``): running partial sums, one operation per line:
  ``"3+5=8\\n8-2=6\\n6+7=13\\n13-4=9\\n"``.
* ``basic_arithmetic`` (2 terms of 7-8 digits, ``+`` only): column addition from the units up; each line
  is one column (digit + digit + carry = column sum) and the answer digits written so far:
  ``"7+6=13 3\\n4+8+1=13 33\\n3+5+1=9 933\\n"``.
* ``leg_counting`` (3-4 kinds of animals, 1-12 of each): legs per kind, then running sums:
  ``"duck 7*2=14\\ncat 3*4=12\\n14+12=26\\n"``.
* ``letter_counting`` (spans of 5-7 words, no answer above 20%): every word with the letter's count in it and the running total:
  ``"hundred +1=1\\nthousand +1=2\\nnames +0=2\\n"``.

Question-space sizes (:func:`question_space_size`, from the generators' parameters in reasoning-gym 0.1.19):
see that function; every task of the default mix has at least 10^5 distinct questions.
"""

from __future__ import annotations

import math
import re
from typing import Any

#: The RL default task mix (``swarmnode run`` with no flags): reasoning-gym dataset name, config (keyword
#: arguments of the dataset's config dataclass), sampling weight and, for letter_counting, the answer balance
#: ``max_answer_share`` (swarmnode/tasks/balance.py: no answer is more than 20% of its questions; without it the
#: answer ``1`` is 47% of 5-7-word spans). It is the hard end of :data:`BUILD_MIX`. swarmnode/default.yaml lists
#: the same sources.
DEFAULT_MIX: list[dict[str, Any]] = [
    {"name": "chain_sum", "config": {"min_terms": 10, "max_terms": 14, "min_digits": 1, "max_digits": 1},
     "weight": 1.0},
    {"name": "basic_arithmetic",
     "config": {"min_terms": 2, "max_terms": 2, "min_digits": 7, "max_digits": 8, "operators": ["+"],
                "allow_parentheses": False, "allow_negation": False},
     "weight": 1.0},
    {"name": "leg_counting", "config": {"min_animals": 3, "max_animals": 4, "min_instances": 1, "max_instances": 12},
     "weight": 1.0},
    {"name": "letter_counting", "config": {"min_words": 5, "max_words": 7}, "weight": 1.0, "max_answer_share": 0.2},
]

#: The embedded models' supervised warm-start mix (scripts/build_tiny_model.py): every task over a *range* of
#: difficulties, from the easiest question the generator writes up to the hard end that :data:`DEFAULT_MIX`
#: trains with RL (chain sums of 2-14 terms, additions of 1-8 digits, 1-4 kinds of animals, spans of 1-7 words),
#: so that the model learns the procedure rather than one length. Each task is two sources: the easier part at
#: a lower weight and the RL default's range at weight 1.0. No answer balance here: the worked solutions teach
#: the procedure whatever the answer.
BUILD_MIX: list[dict[str, Any]] = [
    {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 9, "min_digits": 1, "max_digits": 1},
     "weight": 0.5},
    DEFAULT_MIX[0],
    {"name": "basic_arithmetic",
     "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 6, "operators": ["+"],
                "allow_parentheses": False, "allow_negation": False},
     "weight": 0.5},
    DEFAULT_MIX[1],
    {"name": "leg_counting", "config": {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 12},
     "weight": 0.5},
    DEFAULT_MIX[2],
    {"name": "letter_counting", "config": {"min_words": 1, "max_words": 4}, "weight": 0.4},
    {"name": "letter_counting", "config": {"min_words": 5, "max_words": 7}, "weight": 1.0},
]

#: The default generalization probes (``tasks.probes`` of swarmnode/default.yaml): every task of
#: :data:`DEFAULT_MIX` one step **easier** (below its range: 9 terms, 6 digits, 2 kinds of animals, 4 words) and
#: one step **harder** (above it: 15 terms, 9 digits, 5 kinds, 8 words), evaluated on held-out-partition
#: questions only and never trained on by RL. The easier probes lie inside :data:`BUILD_MIX`'s range (the
#: warm start saw other questions of that shape); the harder ones lie outside everything the models trained on.
DEFAULT_PROBES: list[dict[str, Any]] = [
    {"name": "chain_sum", "label": "easier_chain_sum",
     "config": {"min_terms": 9, "max_terms": 9, "min_digits": 1, "max_digits": 1}},
    {"name": "chain_sum", "label": "harder_chain_sum",
     "config": {"min_terms": 15, "max_terms": 15, "min_digits": 1, "max_digits": 1}},
    {"name": "basic_arithmetic", "label": "easier_basic_arithmetic",
     "config": {"min_terms": 2, "max_terms": 2, "min_digits": 6, "max_digits": 6, "operators": ["+"],
                "allow_parentheses": False, "allow_negation": False}},
    {"name": "basic_arithmetic", "label": "harder_basic_arithmetic",
     "config": {"min_terms": 2, "max_terms": 2, "min_digits": 9, "max_digits": 9, "operators": ["+"],
                "allow_parentheses": False, "allow_negation": False}},
    {"name": "leg_counting", "label": "easier_leg_counting",
     "config": {"min_animals": 2, "max_animals": 2, "min_instances": 1, "max_instances": 12}},
    {"name": "leg_counting", "label": "harder_leg_counting",
     "config": {"min_animals": 5, "max_animals": 5, "min_instances": 1, "max_instances": 12}},
    {"name": "letter_counting", "label": "easier_letter_counting", "config": {"min_words": 4, "max_words": 4},
     "max_answer_share": 0.2},
    {"name": "letter_counting", "label": "harder_letter_counting", "config": {"min_words": 8, "max_words": 8},
     "max_answer_share": 0.2},
]

#: Tasks :func:`worked_solution` can write.
SUPPORTED_TASKS = ("chain_sum", "basic_arithmetic", "leg_counting", "letter_counting")

_INT = re.compile(r"^-?\d+$")


class UnsupportedTaskError(ValueError):
    """:func:`worked_solution` has no writer for this task or this shape of question."""


def answer_block(answer: str) -> str:
    """``"<answer>{answer}</answer>"`` (no trailing newline; the completion ends there, then EOS)."""
    return f"<answer>{answer}</answer>"


# ------------------------------------------------------------------------------------------ writers
def parse_expression(expr: str, task: str) -> tuple[list[int], list[str]]:
    """Terms and operators of a space-separated ``"a + b - c"`` expression (reasoning-gym's simple format).

    Raises:
        UnsupportedTaskError: not of that form, or an operator other than ``+``/``-`` (``task`` names it)."""
    parts = expr.split()
    if len(parts) % 2 == 0 or not parts:
        raise UnsupportedTaskError(f"{task}: cannot parse expression {expr!r}")
    terms, ops = [], []
    for i, p in enumerate(parts):
        if i % 2 == 0:
            if not _INT.match(p):
                raise UnsupportedTaskError(f"{task}: term {p!r} of {expr!r} is not an integer")
            terms.append(int(p))
        else:
            if p not in ("+", "-"):
                raise UnsupportedTaskError(f"{task}: operator {p!r} of {expr!r} (only + and - have a writer)")
            ops.append(p)
    return terms, ops


def running_sum_steps(terms: list[int], ops: list[str]) -> tuple[list[str], int]:
    """Lines ``"{acc}{op}{term}={new acc}\\n"`` left to right, and the final value.

    Args:
        terms: the integers of the expression (at least 1).
        ops: ``"+"``/``"-"`` between consecutive terms (``len(terms) - 1`` of them).
    """
    acc = terms[0]
    lines = []
    for op, t in zip(ops, terms[1:]):
        new = acc + t if op == "+" else acc - t
        lines.append(f"{acc}{op}{t}={new}\n")
        acc = new
    return lines, acc


def column_addition_steps(a: int, b: int) -> tuple[list[str], int]:
    """Column addition of two non-negative integers, units first.

    Each line is ``"{da}+{db}[+1]={s} {digits}\\n"``: the two column digits (0 where a number is shorter), the
    carry in (``+1``) when there is one, the column sum ``s`` (0..19), and the answer's digits written so far
    (``s % 10`` prepended for inner columns, the whole ``s`` for the last column). The last line's digits are
    the sum.

    Raises:
        UnsupportedTaskError: a negative operand.
    """
    if a < 0 or b < 0:
        raise UnsupportedTaskError(f"column addition needs non-negative operands, got {a} and {b}")
    sa, sb = str(a)[::-1], str(b)[::-1]
    n = max(len(sa), len(sb))
    carry, digits, lines = 0, "", []
    for i in range(n):
        da = int(sa[i]) if i < len(sa) else 0
        db = int(sb[i]) if i < len(sb) else 0
        s = da + db + carry
        last = i == n - 1
        digits = (str(s) if last else str(s % 10)) + digits
        lines.append(f"{da}+{db}{'+1' if carry else ''}={s} {digits}\n")
        carry = s // 10
    return lines, int(digits)


def _arithmetic(task: str, entry: dict[str, Any]) -> str:
    expr = (entry.get("metadata") or {}).get("expression")
    if not isinstance(expr, str):
        raise UnsupportedTaskError(f"{task}: the entry has no metadata.expression")
    terms, ops = parse_expression(expr, task)
    if len(terms) == 2 and ops == ["+"] and min(terms) >= 0:
        lines, value = column_addition_steps(terms[0], terms[1])
    elif len(terms) >= 2:
        lines, value = running_sum_steps(terms, ops)
    else:
        raise UnsupportedTaskError(f"{task}: a one-term expression {expr!r} has no steps")
    return "".join(lines) + answer_block(str(value))


def legs_table() -> dict[str, int]:
    """Legs per animal, as reasoning-gym's leg_counting generator counts them (its ``ANIMALS`` table)."""
    from reasoning_gym.arithmetic.leg_counting import ANIMALS

    return dict(ANIMALS)


def _leg_counting(entry: dict[str, Any]) -> str:
    animals = (entry.get("metadata") or {}).get("animals")
    if not isinstance(animals, dict) or not animals:
        raise UnsupportedTaskError("leg_counting: the entry has no metadata.animals")
    legs = legs_table()
    lines, products = [], []
    for name, count in animals.items():  # the order of the question text
        if name not in legs:
            raise UnsupportedTaskError(f"leg_counting: unknown animal {name!r}")
        p = int(count) * legs[name]
        products.append(p)
        lines.append(f"{name} {count}*{legs[name]}={p}\n")
    if len(products) > 1:
        sum_lines, total = running_sum_steps(products, ["+"] * (len(products) - 1))
        lines += sum_lines
    else:
        total = products[0]
    return "".join(lines) + answer_block(str(total))


def _letter_counting(entry: dict[str, Any]) -> str:
    md = entry.get("metadata") or {}
    span, letter = md.get("span"), md.get("target_letter")
    if not isinstance(span, list) or not isinstance(letter, str) or len(letter) != 1:
        raise UnsupportedTaskError("letter_counting: the entry has no metadata.span / target_letter")
    total, lines = 0, []
    for word in span:
        c = str(word).lower().count(letter)  # the generator counts case-insensitively
        total += c
        lines.append(f"{word} +{c}={total}\n")
    return "".join(lines) + answer_block(str(total))


def worked_solution(task: str, entry: dict[str, Any]) -> str:
    """The worked-solution completion for one reasoning-gym entry.

    Args:
        task: the reasoning-gym dataset name (one of :data:`SUPPORTED_TASKS`).
        entry: the dataset item (``{"question", "answer", "metadata"}`` as ``dataset[i]`` returns it, or a
            :class:`~swarmnode.tasks.base.Task`'s fields); the steps are computed from ``metadata``.

    Returns:
        Reasoning lines, each ending in ``"\\n"``, then ``"<answer>{result}</answer>"`` (no EOS).

    Raises:
        UnsupportedTaskError: no writer for ``task``, or the entry has a shape the writer does not handle
            (e.g. ``*`` in an arithmetic expression).
    """
    if task in ("chain_sum", "basic_arithmetic"):
        return _arithmetic(task, entry)
    if task == "leg_counting":
        return _leg_counting(entry)
    if task == "letter_counting":
        return _letter_counting(entry)
    raise UnsupportedTaskError(f"no worked-solution writer for task {task!r} (supported: {', '.join(SUPPORTED_TASKS)})")


def reasoning_part(completion: str) -> str:
    """The text before the last ``<answer>`` of a completion (the reasoning lines)."""
    i = completion.rfind("<answer>")
    return completion if i < 0 else completion[:i]


# ------------------------------------------------------------------------------------------ space sizes
def letter_counting_space(min_words: int, max_words: int) -> int:
    """Exact number of distinct letter_counting questions: enumerates every (span start, span length, letter)
    the generator can draw over its text (``in_the_year_2889.txt``) and counts distinct question strings."""
    from reasoning_gym.data import read_data_file

    text = read_data_file("in_the_year_2889.txt")
    words = [w for w in re.findall(r"\b\w+\b", text) if w.isalnum()]
    seen: set[str] = set()
    for n in range(min_words, max_words + 1):
        n = min(n, len(words))
        for s in range(0, len(words) - n + 1):
            span = " ".join(words[s: s + n])
            for letter in set(span.replace(" ", "").lower()) or {"a"}:
                seen.add(f"{letter}\0{span}")
    return len(seen)


def question_space_size(task: str, config: dict[str, Any]) -> int:
    """Number of distinct questions the reasoning-gym generator can produce with ``config``.

    From the generators' code (reasoning-gym 0.1.19):

    * ``chain_sum``: ``t`` terms of ``d`` digits, values ``randint(0, 9)`` for ``d == 1`` else
      ``randint(10**(d-1), 10**d - 1)``, ``t - 1`` operators from ``{+, -}``: ``sum_t,d  V(d)**t * 2**(t-1)``
      (7 one-digit terms: 10^7 * 64 = 640M).
    * ``basic_arithmetic`` without parentheses: ``t`` terms, each ``randint(0, 10**d)`` (``10**d + 1`` values),
      operators from the config: ``sum_t,d (10**d + 1)**t * |ops|**(t-1)`` (2 terms, 5 digits, ``+``:
      100001^2 = 10,000,200,001). Upper bound when ``/`` is allowed (the generator may rewrite it).
    * ``leg_counting``: an ordered sample of ``k`` distinct animals out of 37 and a count in
      ``[min_instances, max_instances]`` for each: ``sum_k 37!/(37-k)! * n**k`` (2-3 animals, 1-10 each:
      133,200 + 46,620,000).
    * ``letter_counting``: exact count by enumeration (:func:`letter_counting_space`).

    Raises:
        UnsupportedTaskError: no formula for ``task``.
    """
    c = dict(config)
    if task == "chain_sum":
        total = 0
        for t in range(c.get("min_terms", 2), c.get("max_terms", 6) + 1):
            for d in range(c.get("min_digits", 1), c.get("max_digits", 4) + 1):
                v = 10 if d == 1 else 9 * 10 ** (d - 1)
                if c.get("allow_negation", False):
                    v = 2 * (10**d - 1) + 1
                total += v**t * 2 ** (t - 1)
        return total
    if task == "basic_arithmetic":
        ops = len(set(c.get("operators", ["+", "-", "*", "/"])))
        total = 0
        for t in range(c.get("min_terms", 2), c.get("max_terms", 6) + 1):
            for d in range(c.get("min_digits", 1), c.get("max_digits", 4) + 1):
                total += (10**d + 1) ** t * ops ** (t - 1)
        return total
    if task == "leg_counting":
        n = c.get("max_instances", 15) - c.get("min_instances", 1) + 1
        return sum(math.perm(len(legs_table()), k) * n**k
                   for k in range(c.get("min_animals", 3), c.get("max_animals", 10) + 1))
    if task == "letter_counting":
        return letter_counting_space(c.get("min_words", 5), c.get("max_words", 15))
    raise UnsupportedTaskError(f"no question-space formula for task {task!r}")
