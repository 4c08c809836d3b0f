"""Likelihood screen of external completions under our own policy ("Hail to the Thief", arXiv 2511.09780; docs/lab/benchmarks.md, "Likelihood screen").

A correct completion can carry a payload: text before or after the answer that the verifier ignores.
"Hail to the Thief" (arXiv 2511.09780) shows that such poisoned-but-correct completions, shared in
decentralized GRPO, teach the payload to the receivers; its defence for nodes of one model family is a
likelihood check of each external completion under the receiver's own policy. This module is that check.

**Statistics** of a completion ``y`` with per-token log-probs ``ℓ_t = log π(y_t | x, y_<t)`` (natural log,
under ``log_softmax(logits / temperature)``, the distribution our sampler draws from):

* ``mean``: ``(1/T) Σ_t ℓ_t``;
* ``window``: the lowest mean of ``ℓ`` over any ``w`` consecutive tokens (``w`` = ``external.screen.window``;
  the whole completion when ``T < w``). A short payload inside an otherwise likely completion lowers this
  one even when it barely moves the mean.

**Reference**: the same two statistics of our own recent completions, from their behaviour log-probs
(recorded at sampling time, so no extra forward), in a rolling window of ``external.screen.history``
completions. **Rule**: an external completion is rejected when either statistic is below the reference's
``quantile`` (``external.screen.quantile``) minus ``margin`` nats (``external.screen.margin``). Until the
reference holds ``min_history`` completions nothing is judged and nothing is kept (counted as
``screen/warmup`` and ``screen/warmup_held``): no external sample trains before the screen can judge it, and no
peer is charged for it (an outside attack trained a payload line in the first steps of a node with fewer local
leaves per step than ``min_history``).

**Groups go whole.** When one completion of an external group (``Sample.group_id``: a task of one source) is
rejected, that source's other samples of the group are dropped too (``screen/group_dropped``, not charged; other
peers' samples of a ``joint`` group stay, or one peer's rejected leaf would drop every peer's samples of the task): their advantages
were normalized against the rejected members, so without them the rest is no longer a fair contrast. The
poisoned-but-correct benchmark showed why (docs/lab/benchmarks.md): with only the payload leaves removed, the
same groups' payload-free *wrong* leaves -- the task's correct worked reasoning with a wrong final answer --
kept their negative advantages, taught the receivers to avoid correct reasoning, and held-out accuracy fell
from 52.5% to 28.3% in 200 steps although no payload was ever trained.

**Admitted by form.** A sample marked ``Sample.admitted_by_form`` (set by the receiver when it built the sample,
``external.screen.admit_step_form``: a completion whose every line a program checked to be in the task's exact step
form, :func:`swarmnode.tasks.steps.admissible_by_form`) is not judged: not scored, never rejected, never
charged, kept also in warm-up (it needs no reference), counted as ``screen/admitted_by_form``; since it is not
scored, a behaviour log-prob claim it carries cannot be checked and is dropped as an unchecked claim is (with
``max_claim_gap`` set: ``external.off_policy: tis`` weighs it with ratio 1). It has no free text
for a payload to ride in, so its likelihood says nothing about poison; and text a stronger model of another
family writes in the worked-solution form would otherwise be rejected for its style. With ``admit_step_form:
masked`` every completion of a task with a step checker is admitted when the step credit mask is on: its free
text rides along at advantage at most 0 (:meth:`swarmnode.rollout.step_credit.StepCredit.admits_masked`), so the
screen judges the tasks without a checker only. Groups still go whole: a
group with a rejected (or, in warm-up, held) member loses its admitted members too.

**Kept with the unscreened credit** (``admit_step_form: keep``). The same completions as under ``masked`` are
judged like any sample, but one the screen rejects (or holds in warm-up) is not lost: it carries
``Sample.unscreened_advantages`` (no negative push, a positive one only on valid step lines) and trains with
them, its behaviour claim dropped, its peer not charged (``screen/kept_unscreened``), and so does every keep
sample of its group (where ``correct`` drops the group whole). A group whose members all pass trains with the
step credit of screened samples (answer block and negative push included), as under ``correct``.

**Scoring**: one batched ``torch.no_grad()`` forward of our current policy over the external samples,
micro-batched by padded tokens like the trainer (:func:`swarmnode.train.trainer.pack_micro_batches`). The
samples were already cut to our length caps, so this forward is bounded. For a foreign tokenizer the
verification layer re-tokenized the text into our vocabulary; the screen scores those ids under our policy
just the same: text a model of another family writes in another style scores low under ours and is
rejected more often (the screen is a same-family defence; docs/lab/benchmarks.md "Likelihood screen").
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import torch

from swarmnode.train.loss import sequence_logprobs
from swarmnode.train.samples import Sample
from swarmnode.train.trainer import pack_micro_batches

if TYPE_CHECKING:
    from swarmnode.config import ScreenConfig

__all__ = ["completion_stats", "LikelihoodScreen", "ScreenResult", "SCREEN_REASON"]

SCREEN_REASON = "likelihood_screen"
"""The reason code a rejected sample is charged to its peer under (``SwarmHook.charge``)."""


def completion_stats(logprobs: Sequence[float], window: int) -> tuple[float, float]:
    """``(mean, lowest windowed mean)`` of one completion's token log-probs.

    Args:
        logprobs: per-token natural-log probabilities (finite floats), length T >= 1.
        window: w >= 1; when ``T < w`` the window is the whole completion.

    Returns:
        ``(mean, min over t of mean(logprobs[t : t + w]))``; non-finite inputs give ``-inf``.

    Raises:
        ValueError: empty ``logprobs`` or ``window < 1``.
    """
    if window < 1:
        raise ValueError(f"window (external.screen.window) must be >= 1, got {window}")
    xs = [float(x) for x in logprobs]
    if not xs:
        raise ValueError("completion_stats needs at least one token log-prob")
    if not all(math.isfinite(x) for x in xs):
        return -math.inf, -math.inf
    T = len(xs)
    mean = sum(xs) / T
    w = min(window, T)
    s = sum(xs[:w])
    lo = s
    for t in range(w, T):
        s += xs[t] - xs[t - w]
        lo = min(lo, s)
    return mean, lo / w


def _quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (``numpy.quantile`` default) of a non-empty list."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class ScreenResult:
    """What :meth:`LikelihoodScreen.screen` decided.

    Attributes:
        kept: the samples that passed (same objects, input order).
        rejected_by_peer: peer id -> number of its samples rejected.
        metrics: ``screen/checked`` (samples offered, admitted ones included), ``screen/rejected``, ``screen/warmup`` (1 while the reference is too small),
            ``screen/reference`` (completions in it), ``screen/threshold_mean``, ``screen/threshold_window``
            (nats/token; NaN in warm-up), ``screen/ext_mean_median`` (median mean log-prob of the checked samples),
            ``screen/behaviour_claims_dropped`` (kept samples whose claimed behaviour log-probs were discarded),
            ``screen/group_dropped`` (passing samples dropped because their group lost a member; not charged),
            ``screen/admitted_by_form`` (samples not judged: admitted by their step form),
            ``screen/kept_unscreened`` (samples with ``unscreened_advantages`` kept with those advantages: the
            screen rejected or held them, or a member of their group; not counted as rejected, not charged).
        stats: per input sample ``(mean, window)`` under our policy; ``(nan, nan)`` for an admitted sample (not
            scored).
    """

    kept: list[Sample]
    rejected_by_peer: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    stats: list[tuple[float, float]] = field(default_factory=list)


class LikelihoodScreen:
    """Rolling reference of our own completions, and the screen of external ones against it.

    Args:
        window, history, min_history, quantile, margin: ``external.screen.*`` (swarmnode/config/swarm.py
            ``ScreenConfig``; meanings in the module docstring).
        temperature: our ``sampling.temperature`` (the screen scores under the distribution we sample from).
        pad_token_id: id for padded positions of the forward.
        max_rows, max_tokens: micro-batch bounds of the scoring forward (``train.micro_batch_size``,
            ``train.max_tokens_per_micro_batch``).
        max_claim_gap: nats/token (``external.screen.max_claim_gap``). A kept sample whose claimed behaviour
            log-probs differ from our own scores by more than this on average loses them
            (``behaviour_logprobs = None``), so ``tis`` treats it with ratio 1 instead of the capped weight
            ``min(π/μ, C)`` that an extreme claimed μ saturates at C. ``None``: off.

    Raises:
        ValueError: a parameter out of range.
    """

    def __init__(
        self,
        window: int = 8,
        history: int = 1024,
        min_history: int = 32,
        quantile: float = 0.01,
        margin: float = 1.0,
        *,
        temperature: float = 1.0,
        pad_token_id: int = 0,
        max_rows: int = 16,
        max_tokens: int | None = None,
        max_claim_gap: float | None = 1.0,
    ) -> None:
        if window < 1 or history < 1 or min_history < 1:
            raise ValueError(f"screen window/history/min_history must be >= 1, got {window}/{history}/{min_history}")
        if not 0 < quantile < 0.5:
            raise ValueError(f"screen quantile must be in (0, 0.5), got {quantile}")
        if not (math.isfinite(margin) and margin >= 0):
            raise ValueError(f"screen margin must be a finite float >= 0, got {margin}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.window = int(window)
        self.min_history = int(min_history)
        self.quantile = float(quantile)
        self.margin = float(margin)
        self.temperature = float(temperature)
        self.pad_token_id = int(pad_token_id)
        self.max_rows = int(max_rows)
        self.max_tokens = max_tokens
        self.max_claim_gap = max_claim_gap
        self._ref: deque[tuple[float, float]] = deque(maxlen=int(history))

    @classmethod
    def from_config(cls, screen_cfg: ScreenConfig, *, temperature: float, pad_token_id: int, max_rows: int,
                    max_tokens: int | None) -> "LikelihoodScreen":
        """Build from a :class:`swarmnode.config.ScreenConfig`."""
        return cls(screen_cfg.window, screen_cfg.history, screen_cfg.min_history, screen_cfg.quantile,
                   screen_cfg.margin, temperature=temperature, pad_token_id=pad_token_id, max_rows=max_rows,
                   max_tokens=max_tokens, max_claim_gap=screen_cfg.max_claim_gap)

    # ------------------------------------------------------------------ reference
    def __len__(self) -> int:
        return len(self._ref)

    def observe(self, logprob_rows: Iterable[Sequence[float] | None]) -> int:
        """Add our own completions (their behaviour log-probs) to the reference; returns how many were added.

        Rows that are ``None`` or empty, or hold a non-finite value, are skipped.
        """
        n = 0
        for row in logprob_rows:
            if not row:
                continue
            st = completion_stats(row, self.window)
            if math.isfinite(st[0]) and math.isfinite(st[1]):
                self._ref.append(st)
                n += 1
        return n

    def thresholds(self) -> tuple[float, float] | None:
        """``(mean threshold, window threshold)`` in nats/token, or ``None`` during warm-up."""
        if len(self._ref) < self.min_history:
            return None
        means = [a for a, _ in self._ref]
        wins = [b for _, b in self._ref]
        return (_quantile(means, self.quantile) - self.margin, _quantile(wins, self.quantile) - self.margin)

    # ------------------------------------------------------------------ screening
    @torch.no_grad()
    def score_tokens(self, model: torch.nn.Module, samples: Sequence[Sample]) -> list[list[float]]:
        """Per-token log-probs of each sample's completion under ``model`` (one no-grad forward per micro-batch).

        Returns:
            One list of T floats per sample, input order.
        """
        out: dict[int, list[float]] = {}
        was_training = model.training
        model.eval()
        try:
            for mb in pack_micro_batches(list(samples), self.max_rows, self.max_tokens):
                lp, _ = sequence_logprobs(model, [s.prompt_ids for s in mb], [s.completion_ids for s in mb],
                                          temperature=self.temperature, pad_token_id=self.pad_token_id)
                for i, s in enumerate(mb):
                    out[id(s)] = lp[i, : len(s.completion_ids)].tolist()
        finally:
            model.train(was_training)
        return [out[id(s)] for s in samples]

    def score(self, model: torch.nn.Module, samples: Sequence[Sample]) -> list[tuple[float, float]]:
        """``(mean, window)`` of each sample's completion under ``model``; ``(-inf, -inf)`` for an empty one."""
        return [completion_stats(r, self.window) if r else (-math.inf, -math.inf)
                for r in self.score_tokens(model, samples)]

    def screen(self, model: torch.nn.Module, samples: Sequence[Sample]) -> ScreenResult:
        """Score external ``samples`` under ``model`` and reject the outliers (module docstring).

        Args:
            model: our current policy (HF causal LM).
            samples: external samples (``source = "external:<peer>"``).

        Returns:
            :class:`ScreenResult`. In warm-up no judged sample is kept and none is charged (all are still scored,
            for the metrics; ``screen/warmup_held`` counts them). Samples marked ``admitted_by_form`` are not
            scored nor judged and are kept unless their group goes whole; samples with ``unscreened_advantages``
            that are rejected or held are kept with those advantages (module docstring).

        Raises:
            Whatever the forward raises (RuntimeError / MemoryError / IndexError on bad input): the node
            catches it and drops the external samples of the step.
        """
        judged = [s for s in samples if not s.admitted_by_form]
        scored = iter(self.score_tokens(model, judged) if judged else [])
        rows = [[] if s.admitted_by_form else next(scored) for s in samples]
        stats = [(math.nan, math.nan) if s.admitted_by_form else
                 completion_stats(r, self.window) if r else (-math.inf, -math.inf) for s, r in zip(samples, rows)]
        th = self.thresholds()
        kept: list[Sample] = []
        rejected: dict[str, int] = {}
        n_claims_dropped = n_admitted = 0
        demoted: set[int] = set()  # keep samples that take their unscreened credit
        for s, (mean, win), row in zip(samples, stats, rows):
            if s.admitted_by_form:  # every line program-checked in exact form: its likelihood is not asked
                if s.behaviour_logprobs is not None and self.max_claim_gap is not None:
                    s.behaviour_logprobs = None  # not scored, so its claim cannot be checked: tis takes ratio 1
                    n_claims_dropped += 1
                kept.append(s)
                n_admitted += 1
                continue
            if th is None or mean < th[0] or win < th[1]:
                if s.unscreened_advantages is not None:  # admit_step_form keep: trains on its checked steps only
                    demoted.add(id(s))
                    kept.append(s)
                    continue
                if th is None:  # warm-up: nothing is judged, so nothing trains
                    continue
                peer = s.source.split(":", 1)[1] if s.source.startswith("external:") else s.source
                rejected[peer] = rejected.get(peer, 0) + 1
                continue
            if s.behaviour_logprobs is not None and row and self.max_claim_gap is not None:
                gap = sum(abs(a - b) for a, b in zip(s.behaviour_logprobs, row)) / len(row)
                if not gap <= self.max_claim_gap:  # also NaN / inf claims
                    s.behaviour_logprobs = None  # tis falls back to ratio 1 for this sample
                    n_claims_dropped += 1
            kept.append(s)
        kept_ids = {id(k) for k in kept}
        # a source's group that lost a member goes whole (by source too: under `joint` normalization group ids are
        # shared by every peer, and one peer's rejected leaf must not drop the others' samples); under keep a group
        # with a rejected member trains whole on the unscreened credit instead: its advantages were normalized with
        # the rejected members' rewards (an outside attack put rejected right-answer junk beside likely wrong
        # leaves, whose negative push on our right steps the junk's rewards made larger)
        tainted = {(s.source, s.group_id) for s in samples
                   if s.group_id and (id(s) not in kept_ids or id(s) in demoted)}
        n_before = len(kept)
        if tainted:
            demoted |= {id(s) for s in kept if (s.source, s.group_id) in tainted and s.unscreened_advantages is not None}
            kept = [s for s in kept if (s.source, s.group_id) not in tainted or id(s) in demoted]
        for s in kept:
            if id(s) in demoted:
                s.advantages = list(s.unscreened_advantages)
                s.behaviour_logprobs = None  # unlikely under our policy, or beside such a sample: not trusted
        n_unscreened = len(demoted)
        means = sorted(a for a, _ in stats if not math.isnan(a))
        metrics: dict[str, Any] = {
            "screen/checked": len(samples),
            "screen/rejected": sum(rejected.values()),
            "screen/group_dropped": n_before - len(kept),
            "screen/warmup": int(th is None),
            "screen/warmup_held": len(judged) - n_unscreened if th is None else 0,
            "screen/admitted_by_form": n_admitted,
            "screen/kept_unscreened": n_unscreened,
            "screen/reference": len(self._ref),
            "screen/threshold_mean": th[0] if th else float("nan"),
            "screen/threshold_window": th[1] if th else float("nan"),
            "screen/ext_mean_median": means[len(means) // 2] if means else float("nan"),
            "screen/behaviour_claims_dropped": n_claims_dropped,
        }
        return ScreenResult(kept, rejected, metrics, stats)
