"""Step-checked credit: outcome advantages that do not blame a correct line (``train.step_credit: mask``).

An outcome advantage gives every token of a completion the same sign. In a wrong completion of a multi-step task
(``3+5=8\\n8-2=7\\n7+4=11\\n...``) that pushes down the correct lines along with the one wrong line; in a right
completion that took a wrong step and was lucky, it pushes the wrong step up. When a program can check every
reasoning line (:func:`swarmnode.tasks.steps.check_steps`), the credit can follow the lines instead:

* a token of a **valid** line keeps a positive advantage and loses a negative one (``A_t = max(A_t, 0)``);
* a token of an **invalid** line keeps a negative advantage and loses a positive one (``A_t = min(A_t, 0)``);
* the answer block, text outside the checked lines, and completions of tasks without a checker keep their
  outcome advantage unchanged.

With the step reward on (``train.step_reward_weight``), the advantage of a checked line comes from the
reward plus the bonus, and so does the answer block when it is exactly the answer the completion's own last
line implies (``<answer>{its result}</answer>``, :attr:`StepReport.answer_follows`: copying the last total is
a right step even when the total is wrong); everything else keeps the advantage of the outcome alone. The
process reward is paid to what a program checked, never to unchecked text or to an answer that does not
follow from the lines (a payload there gets outcome credit, at most 0 for a wrong answer). The line checks
only remove credit whose sign contradicts the program's verdict on that line: a correct step is never pushed
down and a wrong one never up.

This is a process-supervision mask in the spirit of step-level verification (Lightman et al., "Let's Verify
Step by Step", 2023), with a program in place of a learned process reward model; the rewards, the groups and
the advantage estimator are unchanged (docs/reference/step_credit.md).

Tokens are mapped to lines by the character where each token's text starts in the completion (a token that
spans a line end belongs to the line it starts in).

Peers' completions get the same credit on the receiving node (:class:`StepCredit`, used by
:func:`swarmnode.train.batch.external_samples` with ``external.external_step_credit``): the receiver regenerates
the task from its own task set, checks the lines of the re-verified text itself, and adds the bonus and the mask
to its own per-source advantages. Nothing a peer claims about its steps is read. With the mask on, a peer's
completion gets one rule more (:func:`checked_chars`): a token that covers any character outside its checked
lines and its answer block -- an empty or whitespace-only line, text after ``</answer>`` -- keeps no positive
advantage. Our own completions keep outcome credit there; a peer could otherwise teach free text that is not a
line (an outside attack trained runs of empty lines into a node through right answers, each ``"\n"`` at +42.65
under ``levers.rescue.peer_advantage_scale: 16``).

So with the mask on, a peer's token keeps a positive advantage only on text a program checked: a valid step
line, the answer tags with an answer in canonical integer form, the final EOS. That is what
``external.screen.admit_step_form: masked`` rests on (:meth:`StepCredit.admits_masked`): a completion of a
checked task meets no likelihood screen, because no payload in it can be pushed up whatever its likelihood; and
since the mask protects a right step from a negative push only where it is valid at its position, a completion
that skipped the screen keeps no negative advantage and a positive one only on its valid lines
(:meth:`StepCredit.unscreened_advantages`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from swarmnode.rollout.advantages import AdvantageResult
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import Task, TaskRef
from swarmnode.tasks.solutions import worked_solution
from swarmnode.tasks.steps import StepCheck, StepReport, admissible_by_form, canonical_integer, check_steps

__all__ = ["token_char_starts", "mask_advantages", "checked_chars", "step_reports", "step_reward_bonus",
           "apply_step_credit", "StepCredit", "ADMISSIONS", "special_token_ids"]

ADMISSIONS = ("off", "correct", "in_form", "masked", "keep")
"""The values of ``external.screen.admit_step_form`` (:meth:`StepCredit.admission`)."""


def special_token_ids(tokenizer: Any) -> set[int]:
    """Every special token id of a Hugging Face tokenizer: ``all_special_ids`` plus each added token marked
    ``special`` (``added_tokens_decoder``; chat-role tokens such as ``<|user|>`` are often only there).

    Args:
        tokenizer: a ``transformers`` tokenizer (duck-typed; missing attributes count as none).

    Returns:
        The set of ids (ints). Never raises.
    """
    out: set[int] = set()
    try:
        out.update(int(t) for t in (getattr(tokenizer, "all_special_ids", None) or []))
    except Exception:  # noqa: BLE001
        pass
    try:
        for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            if getattr(tok, "special", False):
                out.add(int(i))
    except Exception:  # noqa: BLE001
        pass
    return out


def token_char_starts(tokenizer: Any, ids: Sequence[int]) -> list[int]:
    """Offset (characters) in ``tokenizer.decode(ids, skip_special_tokens=True)`` where each token's text starts.

    Uses per-token pieces when they concatenate to the whole decode (byte-level BPE without merges across
    pieces), else prefix decodes (quadratic in ``len(ids)``, exact for any tokenizer).

    Args:
        tokenizer: a Hugging Face tokenizer (``decode``).
        ids: completion token ids (list[int]).

    Returns:
        ``len(ids)`` non-decreasing offsets; a special token (decoded to nothing) starts where the next text does.
    """
    ids = [int(t) for t in ids]
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    pieces = [tokenizer.decode([t], skip_special_tokens=True) for t in ids]
    if "".join(pieces) == whole:
        out, pos = [], 0
        for p in pieces:
            out.append(pos)
            pos += len(p)
        return out
    return _prefix_starts(tokenizer, ids)


def _prefix_starts(tokenizer: Any, ids: list[int]) -> list[int]:
    """:func:`token_char_starts` by prefix decodes: token k starts where the decode of ``ids[:k]`` ends."""
    whole = len(tokenizer.decode(ids, skip_special_tokens=True))
    out, prev = [], 0
    for k in range(len(ids)):
        out.append(min(prev, whole))
        prev = max(prev, len(tokenizer.decode(ids[: k + 1], skip_special_tokens=True).rstrip("\ufffd")))
    return out


def mask_advantages(advantages: Sequence[float], starts: Sequence[int], checks: Sequence[StepCheck],
                    outcome: Sequence[float] | None = None, mask: bool = True,
                    answer_from: int | None = None, textless_outcome: bool = True,
                    checked: Sequence[bool] | None = None, final_eos: bool = True,
                   protect: Sequence[bool] | None = None) -> tuple[list[float], int]:
    """Step-checked credit of one completion's per-token advantages.

    A token is on the checked line its text starts in, or on none (the answer block, text between lines). A
    token on a valid line takes ``advantages[t]``, clipped to ``max(A, 0)`` when ``mask`` is on; a token on an
    invalid line takes ``min(advantages[t], 0)`` when ``mask`` is on and ``outcome[t]`` when it is off (an
    invalid line never takes the step reward: it would push free text up); a token from character
    ``answer_from`` on (an answer that follows from the completion's own last line,
    :attr:`StepReport.answer_follows`) takes ``advantages[t]`` unclipped; any other token takes ``outcome[t]``.
    A token without text of its own (a special token: it starts where the next token starts) is on no line
    and takes ``outcome[t]``; only a single last token (the final end-of-sequence token) is exempt.

    Args:
        advantages: per-token advantages (floats, one per completion token) from the reward plus the step bonus
            (or the outcome alone without a bonus).
        starts: per-token character offsets (:func:`token_char_starts`), same length.
        checks: the completion's checked lines (:func:`~swarmnode.tasks.steps.check_steps`).
        outcome: the outcome-only advantages of the same tokens (default: ``advantages``).
        mask: clip a checked line's tokens toward its verdict (``train.step_credit == "mask"``).
        answer_from: see above (``None``: the answer takes the outcome's advantages).
        textless_outcome: a token without text of its own takes ``outcome[t]`` (True, our own samples), or is
            judged with the text it precedes (False, peers' samples: with a byte-level tokenizer every byte of a
            multi-byte character but the last decodes to nothing, and an outside review found 28 of 40 tokens
            of a payload line of emoji and CJK keeping their positive advantage).
        checked: peers' samples with the mask on (:func:`checked_chars`): per character of the completion
            (decoded without special tokens), whether it is on a checked line or in the answer block. A token whose
            text covers any other character (from its start to the next token's) keeps no positive advantage,
            whatever the rules above gave it, and neither does a token without text of its own (a special id, a
            byte of a multi-byte character: checked text is ASCII); a last token that starts at or after the end
            of the text (the final end-of-sequence token) is exempt when ``final_eos`` (the caller saw the EOS id
            there; a completion cut by a length cap ends on another token, which then takes no positive push).
        protect: peers' samples: per checked line, whether its text is a right step of the question at *some*
            position (:meth:`StepCredit.right_step_lines`); a token on such a line keeps no negative advantage even
            when the line is invalid where it stands (an outside attack: the worked solution with its first step
            written twice shifts every later right step off its position, passes the likelihood screen as our
            own style, and its wrong answer pushed those right steps down).

    Returns:
        ``(new advantages, number of tokens whose advantage the mask set to 0)``.

    Raises:
        ValueError: ``advantages``, ``starts`` and ``outcome`` differ in length.
    """
    outcome = advantages if outcome is None else outcome
    if not (len(advantages) == len(starts) == len(outcome)):
        raise ValueError(f"{len(advantages)} advantages, {len(starts)} token offsets and {len(outcome)} outcome "
                         "advantages")
    out = [float(a) for a in outcome]
    zeroed, j, last = 0, 0, len(starts) - 1
    for t, s in enumerate(starts):
        if textless_outcome and ((t < last and starts[t + 1] == s) or (t == last and t > 0 and starts[t - 1] == s)):
            continue  # no text of its own (a special token that is not the one final token): outcome credit
        while j < len(checks) and checks[j].end <= s:
            j += 1
        if answer_from is not None and s >= answer_from:
            out[t] = float(advantages[t])  # the answer the lines imply: the step reward reaches it
            continue
        if j == len(checks) or s < checks[j].start:
            continue  # answer block or text between lines: outcome credit
        a = float(advantages[t])
        if not checks[j].valid and not mask:
            continue  # an invalid line without the mask: outcome credit, never the step reward
        if mask and ((checks[j].valid and a < 0) or (not checks[j].valid and a > 0)):
            a = 0.0
            zeroed += 1
        if a < 0 and protect is not None and j < len(protect) and protect[j]:
            a = 0.0
            zeroed += 1
        out[t] = a
    if checked is not None:
        n = len(checked)
        for t, s in enumerate(starts):
            if out[t] <= 0 or (t == last and s >= n and final_eos):
                continue
            if t < last and starts[t + 1] == s:  # no text of its own (a special id, a partial byte): no push
                out[t] = 0.0
                zeroed += 1
                continue
            end = max(starts[t + 1] if t < last else n, s + 1)
            if not all(checked[s:end]) or end > n:
                out[t] = 0.0
                zeroed += 1
    return out, zeroed


def checked_chars(report: StepReport, text: str) -> list[bool]:
    """Per character of ``text`` (a completion decoded without special tokens, as :func:`token_char_starts`
    decodes it): whether it lies on one of ``report``'s checked lines (:attr:`StepReport.lines`, each line's
    ``"\n"`` included) or in its first answer block, ``<answer>`` at :attr:`StepReport.answer_start` through the
    first ``</answer>`` after it, whose content counts only when it is an integer in canonical form
    (:func:`~swarmnode.tasks.steps.canonical_integer`, whitespace around it excepted: the checked tasks' answers
    are integers). Every other character is free text: an empty or whitespace-only line (not a line for the
    checker), text after ``</answer>``, a second answer block, whitespace inside the block, and the whole content
    of a block the verifier accepts in another form (``+020.0e0``, ``,,,,20``: chain_sum's verifier strips
    commas and reads decimals).
    ``mask_advantages(checked=...)`` takes the positive advantage from a peer's token that covers one.

    Returns:
        list[bool] of ``len(text)``.
    """
    ok = [False] * len(text)
    for c in report.lines:
        ok[c.start:c.end] = [True] * (min(c.end, len(text)) - c.start)
    a = report.answer_start
    if a >= 0:
        close = text.find("</answer>", a)
        if close >= 0:
            end, body = close + len("</answer>"), a + len("<answer>")
            ok[a:body] = [True] * (body - a)
            ok[close:end] = [True] * (end - close)
            if canonical_integer(text[body:close].strip()):
                ok[body:close] = [not text[c].isspace() for c in range(body, close)]
    return ok


def _answer_from(report: StepReport) -> int | None:
    return report.answer_start if report.answer_follows else None


def step_reports(trees: Sequence[RolloutTree], tasks: Sequence[Task]) -> list[dict[int, StepReport | None]]:
    """Check the reasoning lines of every leaf of every tree (:func:`~swarmnode.tasks.steps.check_steps`).

    Args:
        trees: the step's local rollout trees, aligned with ``tasks``.
        tasks: the regenerated task of each tree (its ``name`` and ``metadata`` feed the checker).

    Returns:
        One dict per tree: leaf id -> its :class:`~swarmnode.tasks.steps.StepReport`, or ``None`` for a task
        without a checker.

    Raises:
        ValueError: ``trees`` and ``tasks`` differ in length.
    """
    if len(trees) != len(tasks):
        raise ValueError(f"{len(trees)} trees but {len(tasks)} tasks")
    return [{leaf: check_steps(task.name, task.metadata, tree.completion_text(leaf)) for leaf in tree.leaves()}
            for tree, task in zip(trees, tasks)]


def _check_weight(weight: float) -> None:
    """Raise ``ValueError`` unless ``weight`` (``train.step_reward_weight``) is a finite number >= 0."""
    if not (weight >= 0 and weight != float("inf")):
        raise ValueError(f"step reward weight must be a finite number >= 0, got {weight!r}")


def step_reward_bonus(reports: Sequence[Mapping[int, StepReport | None]], weight: float) -> list[dict[int, float]]:
    """The process reward ``weight * progress`` of every checked leaf (``train.step_reward_weight``).

    ``progress`` is the share of the question's needed steps that the completion did right
    (:attr:`StepReport.progress`, 0 to 1), so a wrong answer reached through mostly right steps ranks above a
    wrong answer with no right step, and a group whose answers are all wrong still has a signal. The bonus
    enters the advantage only (:func:`~swarmnode.rollout.advantages.compute_advantages`'s ``reward_bonus``);
    the leaves' verified rewards, and every reported reward and accuracy, stay the outcome.

    Args:
        reports: :func:`step_reports`' output.
        weight: reward units per fully-right reasoning (>= 0); an exact answer is worth 1.

    Returns:
        One dict per tree: leaf id -> bonus (float); unchecked leaves are absent (bonus 0).

    Raises:
        ValueError: a negative or non-finite ``weight``.
    """
    _check_weight(weight)
    return [{leaf: weight * r.progress for leaf, r in per_tree.items() if r is not None} for per_tree in reports]


def apply_step_credit(trees: Sequence[RolloutTree], reports: Sequence[Mapping[int, StepReport | None]],
                      adv: AdvantageResult, tokenizer: Any, *, outcome: AdvantageResult | None = None,
                      mask: bool = True) -> dict[str, float]:
    """Give ``adv``'s per-token advantages step-checked credit in place (:func:`mask_advantages` per leaf).

    Args:
        trees: the step's local rollout trees (scored), aligned with ``reports`` and with ``adv.advantages``.
        reports: :func:`step_reports` of ``trees``.
        adv: the advantages of ``trees`` (:func:`~swarmnode.rollout.advantages.compute_advantages`), with the
            step reward in ``reward_bonus`` when it is on; zero-variance groups and dropped leaves are left
            alone (their advantages are 0).
        tokenizer: the policy's tokenizer (maps tokens to characters).
        outcome: the same call's advantages without the bonus (``None``: ``adv`` is the outcome's). The answer,
            unchecked text and unchecked completions get these.
        mask: clip checked lines by their verdicts (``train.step_credit == "mask"``).

    Returns:
        Metrics: ``step_credit/checked_leaves`` (leaves of groups with signal whose task has a checker),
        ``step_credit/lines``, ``step_credit/valid_lines`` (over those leaves), ``step_credit/zeroed_tokens``
        and ``step_credit/zeroed_frac`` (of those leaves' tokens).

    Raises:
        ValueError: ``trees``, ``reports``, ``adv.advantages`` (and ``outcome.advantages``) differ in length.
    """
    if not (len(trees) == len(reports) == len(adv.advantages)) or (
            outcome is not None and len(outcome.advantages) != len(trees)):
        raise ValueError(f"{len(trees)} trees, {len(reports)} step reports and {len(adv.advantages)} advantage lists"
                         + (f" ({len(outcome.advantages)} outcome lists)" if outcome is not None else ""))
    leaves = lines = valid = zeroed = tokens = 0
    for i, tree in enumerate(trees):
        if adv.is_zero_variance(i):
            continue
        for leaf, a in adv.advantages[i].items():
            if leaf in adv.dropped[i]:
                continue
            report = reports[i].get(leaf)
            base = outcome.advantages[i].get(leaf, [0.0] * len(a)) if outcome is not None else a
            if report is None or not report.lines:  # unchecked: the outcome alone
                adv.advantages[i][leaf] = list(base)
                if report is not None:
                    leaves += 1
                    tokens += len(a)
                continue
            checks = report.lines
            leaves += 1
            lines += len(checks)
            valid += sum(c.valid for c in checks)
            tokens += len(a)
            new, z = mask_advantages(a, token_char_starts(tokenizer, tree.completion_ids(leaf)), checks, base, mask,
                                     _answer_from(report))
            adv.advantages[i][leaf] = new
            zeroed += z
    return {
        "step_credit/checked_leaves": float(leaves),
        "step_credit/lines": float(lines),
        "step_credit/valid_lines": float(valid),
        "step_credit/zeroed_tokens": float(zeroed),
        "step_credit/zeroed_frac": zeroed / tokens if tokens else 0.0,
    }


@dataclass(frozen=True)
class StepCredit:
    """Step-checked credit for completions the node did not sample: peers' re-verified leaves.

    The receiver's own judgement only: :meth:`report` regenerates the task from ``task_of`` (our task set) and
    runs :func:`~swarmnode.tasks.steps.check_steps` on the decode of the completion ids in **our** vocabulary,
    the same decode :func:`token_char_starts` maps tokens into. The ids are hostile input that passed
    verification; a failure anywhere gives ``None`` (outcome credit), never an exception.

    Attributes:
        task_of: ``TaskRef -> Task`` (the node's ``TaskMix.get``).
        tokenizer: our tokenizer (``decode``).
        mask: apply :func:`mask_advantages` (``train.step_credit == "mask"``).
        weight: ``train.step_reward_weight`` (reward units per fully right reasoning, >= 0).

    Raises:
        ValueError: a negative or non-finite ``weight``.
    """

    task_of: Callable[[TaskRef], Task]
    tokenizer: Any
    mask: bool = True
    weight: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.weight, bool):
            raise ValueError(f"step reward weight must be a finite number >= 0, got {self.weight!r}")
        _check_weight(self.weight)

    def report(self, ref: TaskRef, completion_ids: Sequence[int]) -> StepReport | None:
        """The line checks of one completion (token ids, list[int]) of task ``ref``; ``None`` when the task has no
        checker or anything fails (an unknown ref, ids our tokenizer cannot decode)."""
        try:
            task = self.task_of(ref)
            text = self.tokenizer.decode([int(t) for t in completion_ids], skip_special_tokens=True)
            return check_steps(task.name, task.metadata, text)
        except Exception:  # noqa: BLE001 - peer input: no step credit, never a crash
            return None

    def admits(self, ref: TaskRef, completion_ids: Sequence[int], *, allow_wrong: bool = False) -> bool:
        """Whether one completion (token ids in our vocabulary, list[int]) of task ``ref`` is admitted by its step
        form (:func:`~swarmnode.tasks.steps.admissible_by_form`; ``allow_wrong``: the ``in_form`` variant).

        What trains is what is checked: the ids are decoded by our tokenizer **with** special tokens and without
        clean-up of tokenization spaces; one final end-of-sequence id is allowed (the sampler's stop), any other
        special id anywhere fails. The task is regenerated from ``ref`` by :attr:`task_of` (our task set, never
        a peer's metadata). Any failure (unknown ref, undecodable ids) gives ``False``, never an exception.
        """
        try:
            ids = self._plain_ids(completion_ids)
            if ids is None:
                return False
            task = self.task_of(ref)
            text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            return admissible_by_form(task.name, task.metadata, text, allow_wrong=allow_wrong)
        except Exception:  # noqa: BLE001 - peer input: not admitted (screened as usual), never a crash
            return False

    def admits_masked(self, ref: TaskRef, completion_ids: Sequence[int]) -> bool:
        """Whether one completion (token ids in our vocabulary, list[int]) of task ``ref`` is admitted because the
        mask decides its push (``external.screen.admit_step_form: masked``): :attr:`mask` is on, the task has a
        step checker that handles the regenerated question (:meth:`report` is not ``None``), and no special id is
        in it but one final end-of-sequence id (:func:`special_token_ids`: chat-role tokens too, which decode to
        nothing). Then :meth:`token_advantages` and :meth:`mask_tokens` leave a
        positive advantage only on text a program checked -- a valid step line, the answer tags and an answer
        in canonical integer form, the final EOS -- so a payload anywhere in the completion, in any form,
        takes no positive push. The screen also kept hostile *negative* pushes off our own right steps; an
        admitted completion therefore keeps no negative advantage and a positive one only on its valid lines
        (:meth:`unscreened_advantages`). Any failure gives ``False`` (screened as usual), never an exception."""
        if not self.mask:
            return False
        try:
            ids = self._plain_ids(completion_ids)
            return ids is not None and self.report(ref, ids) is not None
        except Exception:  # noqa: BLE001 - peer input: not admitted (screened as usual), never a crash
            return False

    def unscreened_advantages(self, report: StepReport | None, completion_ids: Sequence[int],
                              advantages: Sequence[float]) -> tuple[list[float], int]:
        """The per-token ``advantages`` (list[float], one per id of ``completion_ids``) of a peer's completion that
        skipped the likelihood screen (admitted by its step form, any ``admit_step_form``): every negative
        advantage is set to 0, and a positive one is kept only on a token of a valid line -- or everywhere when
        the completion is the task's worked solution (``report.all_valid``); returns ``(advantages, tokens
        changed)``.

        The mask spares a right step a negative push only where it is valid *at its position*, and validity
        chains from the line before. Outside attacks on the unscreened path, each measured with a plain
        policy-gradient loop on the embedded model (log-prob per token of 24 held-out worked solutions, -0.02
        before; an honest peer: -0.01): one junk line before right steps made every one of them invalid, and wrong
        leaves built that way pushed our right steps down (-1.63 in 10 steps); a wrong leaf in exact form whose
        lines each add one (every line invalid, every ``x+y=`` prefix right text) did the same (-0.92; -1.06
        interleaving copies of the worked solution's own lines); right answers after payload lines pushed the
        answer block up after text that is no reasoning (-0.07). The likelihood screen rejected all of them; a
        completion that skips it teaches only the steps a program checked, never pushes anything down."""
        adv = [float(a) for a in advantages]
        whole = report is not None and report.all_valid
        valid = [c for c in (report.lines if report is not None else []) if c.valid]
        starts = token_char_starts(self.tokenizer, completion_ids) if valid and not whole else []
        out, n = [], 0
        for t, a in enumerate(adv):
            keep = a > 0 and (whole or any(c.start <= starts[t] < c.end for c in valid))
            b = a if keep else 0.0
            n += b != a
            out.append(b)
        return out, n

    def admission(self, ref: TaskRef, completion_ids: Sequence[int], mode: str) -> bool:
        """Admission of one completion under ``external.screen.admit_step_form`` = ``mode``: ``"off"`` never;
        ``"correct"``: :meth:`admits`; ``"in_form"``: :meth:`admits` with ``allow_wrong`` when :attr:`mask` is on
        (else as ``"correct"``); ``"masked"`` and ``"keep"``: :meth:`admits_masked` when :attr:`mask` is on (else
        as ``"correct"``). Under ``"keep"`` an admitted completion is still judged by the screen
        (:meth:`keeps_on_rejection`).

        Raises:
            ValueError: an unknown ``mode``.
        """
        if mode not in ADMISSIONS:
            raise ValueError(f"admit_step_form (external.screen.admit_step_form) must be one of {ADMISSIONS}, "
                             f"got {mode!r}")
        if mode == "off":
            return False
        if mode in ("masked", "keep") and self.mask:
            return self.admits_masked(ref, completion_ids)
        return self.admits(ref, completion_ids, allow_wrong=mode == "in_form" and self.mask)

    def keeps_on_rejection(self, mode: str) -> bool:
        """Whether a completion admitted under ``mode`` (:meth:`admission`) is judged by the likelihood screen
        and, when rejected, kept with :meth:`unscreened_advantages` (``Sample.unscreened_advantages``) instead of
        skipping the screen: ``"keep"`` with :attr:`mask` on. A completion the screen passes then keeps the credit
        of a screened sample (its answer block, its negative push): the screen decides the credit, never the
        loss of a checked task's completion."""
        return mode == "keep" and self.mask

    def admitted_credit(self, report: StepReport | None, completion_ids: Sequence[int], advantages: Sequence[float],
                        mode: str) -> tuple[list[float], list[float] | None, bool, int]:
        """The credit of a peer's completion that :meth:`admission` admitted under ``mode``, as the fields of its
        ``Sample``: ``(advantages, unscreened_advantages, admitted_by_form, tokens changed)``. Unjudged
        (:meth:`keeps_on_rejection` false): it trains with :meth:`unscreened_advantages` and is marked admitted by
        form; under ``"keep"``: it keeps ``advantages`` (the screened credit) and carries the unscreened one for a
        rejection. ``advantages``: its per-token advantages from :meth:`token_advantages` (list[float], one per id)."""
        unscreened, n = self.unscreened_advantages(report, completion_ids, advantages)
        if self.keeps_on_rejection(mode):
            return [float(a) for a in advantages], unscreened, False, n
        return unscreened, None, True, n

    def bonus(self, report: StepReport | None) -> float:
        """``weight * report.progress`` (0.0 without a report): added to the reward for the advantage only."""
        return self.weight * report.progress if report is not None else 0.0

    def token_advantages(self, advantage: float, completion_ids: Sequence[int], report: StepReport | None,
                         outcome: float | None = None, ref: TaskRef | None = None) -> tuple[list[float], int]:
        """One completion's per-token advantages (list[float], one per id) by :func:`mask_advantages`:
        ``advantage`` (from the reward plus :meth:`bonus`) on the checked lines, masked when :attr:`mask` is on,
        and ``outcome`` (from the reward alone; default ``advantage``) everywhere else, except that with the mask
        on a token on no checked line and outside the answer block keeps no positive advantage (peers' completions:
        :func:`checked_chars`), and with ``ref`` (the task) no line that is a right step of the question somewhere
        takes a negative one (:meth:`right_step_lines`); returns ``(advantages, tokens zeroed)``."""
        outcome = advantage if outcome is None else outcome
        n = len(completion_ids)
        if report is None or (not report.lines and not self.mask):
            return [float(outcome)] * n, 0
        return mask_advantages([float(advantage)] * n, token_char_starts(self.tokenizer, completion_ids),
                               report.lines, [float(outcome)] * n, self.mask, _answer_from(report),
                               textless_outcome=False, checked=self._checked(report, completion_ids),
                               final_eos=self._ends_with_eos(completion_ids),
                               protect=self.right_step_lines(ref, report, completion_ids) if ref is not None else None)

    def right_step_lines(self, ref: TaskRef, report: StepReport, completion_ids: Sequence[int]) -> list[bool] | None:
        """Per checked line of ``report`` (one completion of task ``ref``): whether its text (without its
        ``"\n"``) is one of the lines of the task's worked solution (:func:`~swarmnode.tasks.solutions.worked_solution`
        on our regenerated question): a right step, wherever it stands. ``None`` when the task has no writer or
        anything fails (then nothing is protected)."""
        try:
            task = self.task_of(ref)
            sol = worked_solution(task.name, {"metadata": task.metadata})
            right = {ln for ln in sol[: sol.index("<answer>")].split("\n") if ln}
            text = self.tokenizer.decode([int(t) for t in completion_ids], skip_special_tokens=True)
            return [text[c.start:c.end].rstrip("\n") in right for c in report.lines]
        except Exception:  # noqa: BLE001 - peer input: no protection, never a crash
            return None

    def _plain_ids(self, completion_ids: Sequence[int]) -> list[int] | None:
        """The ids without one final EOS, or None when that leaves nothing or a special id (chat-role tokens
        included, :func:`special_token_ids`: they decode to nothing) remains. Raises on ids that are not ints."""
        ids = [int(t) for t in completion_ids]
        if self._ends_with_eos(ids):
            ids = ids[:-1]
        special = special_token_ids(self.tokenizer)
        return None if not ids or any(t in special for t in ids) else ids

    def _ends_with_eos(self, completion_ids: Sequence[int]) -> bool:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return bool(completion_ids) and isinstance(eos, int) and int(completion_ids[-1]) == eos

    def _checked(self, report: StepReport, completion_ids: Sequence[int]) -> list[bool] | None:
        """:func:`checked_chars` of a peer's completion when the mask is on (else None: no free-text rule)."""
        if not self.mask:
            return None
        return checked_chars(report, self.tokenizer.decode([int(t) for t in completion_ids], skip_special_tokens=True))

    def mask_tokens(self, ref: TaskRef, completion_ids: Sequence[int],
                    advantages: Sequence[float]) -> tuple[list[float], int]:
        """Per-token ``advantages`` (list[float], one per id) of one completion of task ``ref`` clipped toward our
        verdict on each of its lines (:func:`mask_advantages` with :attr:`mask`; no step reward): a token of an
        invalid line -- free text, a payload line -- keeps no positive advantage, and neither does a token on no
        line and outside the answer block (:func:`checked_chars`: an empty line, text after ``</answer>``).
        Without a report (no checker, an unknown ref, ids we cannot decode) or with :attr:`mask` off they come
        back unchanged; returns ``(advantages, tokens zeroed)``.

        Raises:
            ValueError: ``advantages`` and ``completion_ids`` differ in length.
        """
        adv = [float(a) for a in advantages]
        if len(adv) != len(completion_ids):
            raise ValueError(f"{len(adv)} advantages for {len(completion_ids)} completion ids")
        report = self.report(ref, completion_ids) if self.mask else None
        if report is None:
            return adv, 0
        return mask_advantages(adv, token_char_starts(self.tokenizer, completion_ids), report.lines, None, True,
                               _answer_from(report), textless_outcome=False,
                               checked=self._checked(report, completion_ids),
                               final_eos=self._ends_with_eos(completion_ids),
                               protect=self.right_step_lines(ref, report, completion_ids))
