"""Held-out evaluation: greedy accuracy of a policy on tasks the training stream never draws.

Accuracy of one task = its verifier's correctness score of the greedy completion (reasoning-gym's
``score_answer`` on the extracted ``<answer>…</answer>``, math-verify for JSONL math). Reported per task
family and overall, in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from swarmnode.tasks.base import Task


@dataclass
class EvalResult:
    """Held-out accuracy.

    Attributes:
        accuracy: mean correctness over all tasks, in [0, 1].
        per_task: task family -> mean correctness.
        counts: task family -> number of tasks.
        n: total tasks evaluated.
        examples: a few (question, completion, answer, score) tuples for inspection.
    """

    accuracy: float
    per_task: dict[str, float]
    counts: dict[str, int]
    n: int
    examples: list[tuple[str, str, str, float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"accuracy": self.accuracy, "per_task": self.per_task, "counts": self.counts, "n": self.n}


@torch.no_grad()
def greedy_completions(
    model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int = 64
) -> list[str]:
    """Greedy-decode a completion for every prompt with ``model.generate`` (left padding).

    Args:
        model: a Hugging Face causal LM.
        tokenizer: its tokenizer (must have a pad token).
        prompts: prompt strings (chat template already applied).
        max_new_tokens: tokens generated at most per prompt.
        batch_size: prompts per ``generate`` call.

    Returns:
        The decoded completions (special tokens removed), in prompt order.
    """
    was_training = model.training
    model.eval()
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    device = next(model.parameters()).device
    out: list[str] = []
    try:
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i : i + batch_size]
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            gen = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            new = gen[:, enc["input_ids"].shape[1] :]
            out.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
    finally:
        tokenizer.padding_side = old_side
        if was_training:
            model.train()
    return out


def evaluate(
    model,
    tokenizer,
    tasks: list[Task],
    prompt_fn,
    score_fn,
    max_new_tokens: int,
    batch_size: int = 64,
    keep_examples: int = 4,
) -> EvalResult:
    """Greedy held-out accuracy of ``model`` on ``tasks``.

    Args:
        tasks: regenerated tasks (from held-out TaskRefs).
        prompt_fn: ``Task -> str`` building the prompt (chat template applied).
        score_fn: ``(Task, completion) -> float`` correctness in [0, 1]; must never raise.
        max_new_tokens: decoding cap (the run's ``max_completion_length``).
    """
    if not tasks:
        return EvalResult(0.0, {}, {}, 0)
    comps = greedy_completions(model, tokenizer, [prompt_fn(t) for t in tasks], max_new_tokens, batch_size)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    examples = []
    total = 0.0
    for t, c in zip(tasks, comps):
        s = float(score_fn(t, c))
        total += s
        name = t.name or t.ref.source
        sums[name] = sums.get(name, 0.0) + s
        counts[name] = counts.get(name, 0) + 1
        if len(examples) < keep_examples:
            examples.append((t.question, c, t.answer, s))
    per_task = {k: sums[k] / counts[k] for k in sorted(sums)}
    return EvalResult(total / len(tasks), per_task, counts, len(tasks), examples)
