"""Held-out evaluation that cannot flatter: exact greedy pass@1 on questions training never sees.

* **Held-out by content.** The questions come from :meth:`~swarmnode.tasks.mix.TaskMix.eval_refs`: the
  held-out partition of each task's question space (a hash of the normalized question text,
  ``swarmnode/tasks/partition.py``), distinct by content; the training stream never yields one of them.
* **Exact accuracy.** ``accuracy`` is the share of questions whose greedy completion gets the verifier's
  *full* score (1.0): reasoning-gym's ``score_answer`` on the extracted ``<answer>…</answer>``, Math-Verify
  for JSONL math. One greedy completion per question, so it is pass@1. reasoning-gym's partial credit
  (e.g. ``len(oracle)/len(answer)`` when the answer merely contains the oracle) is reported separately as
  ``partial_credit`` and is never the headline.
* **Per task.** Both numbers per task family, with the count of questions behind each.
* **Generalization.** ``tasks.probes`` are nearby-distribution task sources (one more term, one more digit)
  evaluated the same way on their own held-out questions and reported under ``generalization``.
* **What a constant answer would score.** Per task, the share of the held-out questions whose answer is that
  task's commonest answer (``constant_answer``): a policy that always writes that one answer scores exactly this,
  with no reasoning at all. Where a task's accuracy sits at this number, RL may have found the constant answer
  instead of the skill (letter counting, whose answer is mostly ``1``: docs/lab/results_log.md).
* **Where it goes wrong.** For tasks whose reasoning lines a program can check
  (:data:`~swarmnode.tasks.steps.CHECKED_TASKS`), every wrong completion is filed under its first invalid line
  (``first_wrong_step``), and the share of valid reasoning lines is reported (``step_validity``): which step a
  policy fails at, not only that it fails (``swarmnode eval --diagnose``).

Decoding is batched greedy ``model.generate`` with left padding; prompts are sorted by length so that a
batch pads little, and results are put back in question order.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from swarmnode.tasks.base import Scorer, Task
from swarmnode.tasks.steps import CHECKED_TASKS, check_steps

if TYPE_CHECKING:
    from swarmnode.tasks.mix import TaskMix

#: A verifier score at least this high counts as fully correct (float noise only).
EXACT_THRESHOLD = 1.0 - 1e-9


@dataclass
class EvalResult:
    """Held-out accuracy of one task mix (and, under ``generalization``, of each probe).

    Attributes:
        accuracy: exact greedy pass@1 over all questions: share whose verifier score is 1.0, in [0, 1].
        per_task: task family -> exact accuracy.
        counts: task family -> number of questions.
        n: total questions evaluated.
        partial_credit: mean raw verifier score (reasoning-gym's partial credit included), in [0, 1]; reported
            apart from ``accuracy`` and never instead of it.
        per_task_partial: task family -> mean raw verifier score.
        generalization: probe name -> the probe's own :class:`EvalResult` (nearby-distribution questions).
        examples: a few ``(question, completion, answer, exact score)`` tuples for inspection.
        seconds: wall time of the evaluation (decoding and scoring, probes included), in seconds.
        first_wrong_step: task family -> :func:`diagnose` category -> number of *wrong* completions (step-checked
            families only; right ones are not counted). Categories: ``"line K"`` (1-based: the first invalid
            reasoning line), ``"no reasoning lines"``, ``"lines right, steps missing"``, ``"lines right, answer
            wrong"``, ``"not checkable"`` (:func:`diagnose`).
        step_validity: task family -> valid reasoning lines / all reasoning lines of its completions, right and
            wrong, in [0, 1] (step-checked families with at least one line).
        constant_answer: the exact accuracy of the best constant policy: per task family the count of its
            commonest oracle answer (``task.answer``, stripped), summed and divided by ``n``, in [0, 1].
        per_task_constant: task family -> share of its questions whose oracle answer is the family's commonest
            one, in [0, 1] (what always writing that answer scores; ties count once).
    """

    accuracy: float
    per_task: dict[str, float]
    counts: dict[str, int]
    n: int
    partial_credit: float = 0.0
    per_task_partial: dict[str, float] = field(default_factory=dict)
    generalization: dict[str, "EvalResult"] = field(default_factory=dict)
    examples: list[tuple[str, str, str, float]] = field(default_factory=list)
    seconds: float = 0.0
    first_wrong_step: dict[str, dict[str, int]] = field(default_factory=dict)
    step_validity: dict[str, float] = field(default_factory=dict)
    constant_answer: float = 0.0
    per_task_constant: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready summary: ``accuracy`` (exact), ``n``, ``per_task``, ``counts``, ``partial_credit``,
        ``per_task_partial_credit``, ``constant_answer``, ``per_task_constant_answer``, ``first_wrong_step`` and
        ``step_validity`` (when any task is step-checked) and ``generalization`` (probe name -> the same keys but the step diagnosis, without nesting)."""
        d = {
            "accuracy": self.accuracy,
            "metric": "exact greedy pass@1",
            "n": self.n,
            "per_task": self.per_task,
            "counts": self.counts,
            "partial_credit": self.partial_credit,
            "per_task_partial_credit": self.per_task_partial,
            "constant_answer": self.constant_answer,
            "per_task_constant_answer": self.per_task_constant,
        }
        if self.first_wrong_step:
            d["first_wrong_step"] = self.first_wrong_step
            d["step_validity"] = self.step_validity
        if self.generalization:
            d["generalization"] = {k: _flat(v) for k, v in self.generalization.items()}
        return d


def _flat(r: EvalResult) -> dict:
    return {"accuracy": r.accuracy, "n": r.n, "per_task": r.per_task, "counts": r.counts,
            "partial_credit": r.partial_credit, "constant_answer": r.constant_answer}


@torch.no_grad()
def greedy_completions(
    model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int = 64,
    progress: Callable[[int, int], None] | None = None,
) -> list[str]:
    """Greedy-decode a completion for every prompt with ``model.generate`` (left padding, length-sorted batches).

    Args:
        model: a Hugging Face causal LM.
        tokenizer: its tokenizer (must have a pad token).
        prompts: prompt strings (chat template already applied).
        max_new_tokens: tokens generated at most per prompt.
        batch_size: prompts per ``generate`` call (>= 1).
        progress: called as ``progress(done, total)`` (prompts) before the first batch and after each one.

    Returns:
        The decoded completions (special tokens removed), in prompt order.

    Raises:
        ValueError: ``batch_size < 1`` or ``max_new_tokens < 1``.
    """
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size} and {max_new_tokens}")
    was_training = model.training
    model.eval()
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    device = next(model.parameters()).device
    lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: (lengths[i], i))
    out: list[str | None] = [None] * len(prompts)
    try:
        if progress is not None:
            progress(0, len(order))
        for i in range(0, len(order), batch_size):
            idx = order[i : i + batch_size]
            enc = tokenizer([prompts[j] for j in idx], return_tensors="pt", padding=True,
                            add_special_tokens=False).to(device)
            gen = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            new = gen[:, enc["input_ids"].shape[1] :]
            for j, text in zip(idx, tokenizer.batch_decode(new, skip_special_tokens=True)):
                out[j] = text
            if progress is not None:
                progress(min(i + batch_size, len(order)), len(order))
    finally:
        tokenizer.padding_side = old_side
        if was_training:
            model.train()
    return [t if t is not None else "" for t in out]


def _exact_and_partial(value: Any) -> tuple[float, float]:
    """``(exact, partial)`` from a score function's return: a float raw score or an ``(exact, partial)`` pair."""
    if isinstance(value, (tuple, list)):
        exact, partial = float(value[0]), float(value[1])
    else:
        partial = float(value)
        exact = 1.0 if partial >= EXACT_THRESHOLD else 0.0
    if not math.isfinite(partial):
        partial = 0.0
    return (1.0 if exact >= EXACT_THRESHOLD else 0.0), min(1.0, max(0.0, partial))


#: :func:`diagnose`'s categories besides ``"line K"``.
NO_LINES = "no reasoning lines"
STOPPED_EARLY = "lines right, steps missing"
LINES_RIGHT = "lines right, answer wrong"
NOT_CHECKED = "not checkable"


def diagnose(task: Task, completion: str) -> tuple[str, int, int] | None:
    """Where a completion first goes wrong, by the program checks of :func:`~swarmnode.tasks.steps.check_steps`.

    Args:
        task: the regenerated task (its ``name`` picks the checker, its ``metadata`` is the ground truth).
        completion: the completion text.

    Returns:
        ``(category, valid_lines, lines)``: ``category`` is ``"line K"`` for the first invalid reasoning line
        (1-based); :data:`NO_LINES` when there is no reasoning line; :data:`STOPPED_EARLY` when every line is
        valid but there are fewer than the question needs (stopped, or cut off at the completion length, before
        the last step); else :data:`LINES_RIGHT`. ``valid_lines`` / ``lines`` count the reasoning lines.
        :data:`NOT_CHECKED` (``0, 0``) when the family has a checker but this task's metadata has a shape it does
        not handle; ``None`` when the family has no step checker. Never raises on any completion text. The caller
        decides whether the completion was wrong: a right completion with all lines valid is also
        :data:`LINES_RIGHT`.
    """
    report = check_steps(task.name, task.metadata, completion)
    if report is None:
        return (NOT_CHECKED, 0, 0) if task.name in CHECKED_TASKS else None
    valid = [c.valid for c in report.lines]
    if not valid:
        return NO_LINES, 0, 0
    first = next((k for k, v in enumerate(valid) if not v), None)
    if first is not None:
        category = f"line {first + 1}"
    else:
        category = STOPPED_EARLY if len(valid) < report.needed else LINES_RIGHT
    return category, sum(valid), len(valid)


def aggregate(tasks: list[Task], comps: list[str], score_fn: Callable[[Task, str], Any],
              keep_examples: int) -> EvalResult:
    """Score ``comps[i]`` against ``tasks[i]`` and fold the scores into an :class:`EvalResult`.

    Args:
        tasks / comps: the held-out tasks and one completion text each (same length).
        score_fn: ``(task, completion) -> float | (exact, partial)`` (:func:`mix_scorer`); a bare float is
            the raw score (exact = 1.0 only for a full score).
        keep_examples: how many ``(question, completion, answer, exact)`` examples to keep (>= 0).

    Returns:
        Per task family (``task.name``, else the source id) the exact and partial means and counts, the share
        of its commonest oracle answer (what a constant answer scores), and for step-checked families the first
        wrong step of each wrong completion and the share of valid lines (:func:`diagnose`); an empty result (accuracy 0, ``n = 0``) for no tasks.
    """
    if not tasks:
        return EvalResult(0.0, {}, {}, 0)
    ex_sum: dict[str, float] = {}
    pa_sum: dict[str, float] = {}
    counts: dict[str, int] = {}
    first_wrong: dict[str, dict[str, int]] = {}
    lines_valid: dict[str, list[int]] = {}
    answers: dict[str, Counter[str]] = {}
    examples = []
    for t, c in zip(tasks, comps):
        exact, partial = _exact_and_partial(score_fn(t, c))
        name = t.name or t.ref.source
        answers.setdefault(name, Counter())[str(t.answer).strip()] += 1
        ex_sum[name] = ex_sum.get(name, 0.0) + exact
        pa_sum[name] = pa_sum.get(name, 0.0) + partial
        counts[name] = counts.get(name, 0) + 1
        diag = diagnose(t, c)
        if diag is not None:
            category, valid, total = diag
            first_wrong.setdefault(name, {})
            if exact < 1.0:
                first_wrong[name][category] = first_wrong[name].get(category, 0) + 1
            vt = lines_valid.setdefault(name, [0, 0])
            vt[0] += valid
            vt[1] += total
        if len(examples) < keep_examples:
            examples.append((t.question, c, t.answer, exact))
    n = len(tasks)
    names = sorted(counts)
    commonest = {k: answers[k].most_common(1)[0][1] for k in names}
    return EvalResult(
        accuracy=sum(ex_sum.values()) / n,
        per_task={k: ex_sum[k] / counts[k] for k in names},
        counts={k: counts[k] for k in names},
        n=n,
        partial_credit=sum(pa_sum.values()) / n,
        per_task_partial={k: pa_sum[k] / counts[k] for k in names},
        examples=examples,
        first_wrong_step={k: dict(sorted(first_wrong[k].items(), key=_category_order)) for k in sorted(first_wrong)},
        step_validity={k: v / t for k, (v, t) in sorted(lines_valid.items()) if t > 0},
        constant_answer=sum(commonest.values()) / n,
        per_task_constant={k: commonest[k] / counts[k] for k in names},
    )


def _category_order(item: tuple[str, int]) -> tuple[int, int]:
    """Sort key of :func:`diagnose` categories: no lines, line 1, line 2, ..., lines right."""
    key = item[0]
    last = {NO_LINES: (0, 0), STOPPED_EARLY: (2, 0), LINES_RIGHT: (3, 0), NOT_CHECKED: (4, 0)}
    if key in last:
        return last[key]
    return (1, int(key.split()[1]))


def evaluate(
    model,
    tokenizer,
    tasks: list[Task],
    prompt_fn: Callable[[Task], str],
    score_fn: Callable[[Task, str], Any],
    max_new_tokens: int,
    batch_size: int = 64,
    keep_examples: int = 4,
) -> EvalResult:
    """Exact greedy pass@1 of ``model`` on ``tasks``, per task family, with partial credit apart.

    Args:
        model, tokenizer: a Hugging Face causal LM and its tokenizer (with a pad token).
        tasks: regenerated tasks (from held-out TaskRefs).
        prompt_fn: ``Task -> str`` building the prompt (chat template applied).
        score_fn: ``(Task, completion) -> score``; either the verifier's raw score in [0, 1] (exact = a score of
            1.0) or an ``(exact, partial)`` pair. Must never raise (:func:`mix_scorer` builds one).
        max_new_tokens: decoding cap (the run's ``max_completion_length``).
        batch_size: prompts per ``generate`` call.
        keep_examples: how many examples to keep in the result.

    Returns:
        An :class:`EvalResult` (``generalization`` empty; see :func:`evaluate_mix`).
    """
    import time

    t0 = time.perf_counter()
    comps = greedy_completions(model, tokenizer, [prompt_fn(t) for t in tasks], max_new_tokens, batch_size) \
        if tasks else []
    res = aggregate(tasks, comps, score_fn, keep_examples)
    res.seconds = time.perf_counter() - t0
    return res


def mix_scorer(mix: Scorer) -> Callable[[Task, str], tuple[float, float]]:
    """``(task, completion) -> (exact, partial)`` of a task set (``Scorer.rescore``: exact and raw correctness
    from one verifier call); never raises (a scorer error scores ``(0.0, 0.0)``). The format bonus
    (``tasks.format_reward``) is never part of either number.
    """

    def score(task: Task, completion: str) -> tuple[float, float]:
        try:
            d = mix.rescore(task, completion)
            return float(d["correct"]), float(d.get("partial", d["correct"]))
        except Exception:
            return 0.0, 0.0

    return score


def evaluate_mix(
    model,
    tokenizer,
    mix: TaskMix,
    prompt_fn: Callable[[Task], str],
    max_new_tokens: int,
    n: int | None = None,
    probes: Mapping[str, TaskMix] | None = None,
    batch_size: int = 64,
    keep_examples: int = 4,
    progress: Callable[[int, int], None] | None = None,
) -> EvalResult:
    """Held-out exact accuracy of ``model`` on a task mix, plus each generalization probe, in one decoding pass.

    Args:
        mix: the training :class:`~swarmnode.tasks.mix.TaskMix`; its :meth:`eval_refs` ``(n)`` are evaluated.
        prompt_fn: ``Task -> str`` (the node's prompt, chat template applied).
        max_new_tokens: decoding cap.
        n: held-out questions (default the mix's ``eval_size``); probes use the same ``n``, capped at a probe's
            own ``eval_size`` (``TaskMix.probe_eval_size``, from ``tasks.probes[i].eval_size``) when it has one.
        probes: probe name -> single-source held-out mix (:meth:`TaskMix.probes_from_config`); ``None`` = none.
        batch_size, keep_examples: as :func:`evaluate`.
        progress: ``progress(done, total)`` questions (probes included), as :func:`greedy_completions`.

    Returns:
        The mix's :class:`EvalResult` with ``generalization[name]`` for every probe; ``seconds`` covers all.
    """
    import time

    t0 = time.perf_counter()
    groups: list[tuple[str | None, TaskMix, list[Task]]] = [(None, mix, [mix.get(r) for r in mix.eval_refs(n)])]
    for name, pm in (probes or {}).items():
        cap = getattr(pm, "probe_eval_size", None)
        pn = n if cap is None else min(cap, n if n is not None else mix.eval_size)
        groups.append((name, pm, [pm.get(r) for r in pm.eval_refs(pn)]))
    prompts = [prompt_fn(t) for _, _, ts in groups for t in ts]
    comps = greedy_completions(model, tokenizer, prompts, max_new_tokens, batch_size, progress) if prompts else []
    results: list[EvalResult] = []
    k = 0
    for _, m, ts in groups:
        results.append(aggregate(ts, comps[k : k + len(ts)], mix_scorer(m), keep_examples))
        k += len(ts)
    main = results[0]
    main.generalization = {name: r for (name, _, _), r in zip(groups[1:], results[1:])}
    main.seconds = time.perf_counter() - t0
    return main


def format_accuracy(res: EvalResult) -> str:
    """One line: ``"41.2% exact (n=500; partial credit 44.0%)"`` plus ``"; probes: name 12.0% (n=500), …"``."""
    s = f"{100 * res.accuracy:.1f}% exact (n={res.n}; partial credit {100 * res.partial_credit:.1f}%)"
    if res.generalization:
        s += "; probes: " + ", ".join(f"{k} {100 * v.accuracy:.1f}% (n={v.n})" for k, v in res.generalization.items())
    return s
