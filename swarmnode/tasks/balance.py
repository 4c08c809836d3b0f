"""Answer balance: cap the share of any one answer in a task source's question distribution.

Some generators have a dominant answer: reasoning-gym ``letter_counting`` picks the letter among the span's own
letters, so about half of its 4-6-word questions have the answer ``1``, and a small policy can learn to answer
``1`` everywhere (a shortcut, not reasoning). A source with ``max_answer_share: x`` (config key of
``tasks.sources[i]`` and ``tasks.probes[i]``, reasoning-gym sources only) reshapes its distribution by
**deterministic rejection**, identically on every node:

1. **Estimate** (:func:`estimate_counts`): the answer histogram of :data:`ESTIMATE_ITEMS` (20,000) items of
   the source, items ``0, 1, 2, …`` of dataset seed :data:`ESTIMATE_SEED` (0; then seeds ``S``, ``2S``, … for a
   source of size ``S < 20000``; with the default ``tasks.seed`` 0 that is the first training epoch's seed).
   It depends only on the source (dataset, config, size), not on ``tasks.seed`` or ``tasks.eval_seed``, so the
   rule is a function of what the source's ``config_digest`` names. Answers are compared after
   :func:`normalize_answer`. The items are read from both partitions (train and held-out): the partition is a
   hash of the question, so both have the same answer distribution.
2. **Acceptance** (:func:`water_fill`): with estimated probabilities ``p(a)``, the most accepting rule whose
   accepted shares ``p(a)·acc(a) / Σ_b p(b)·acc(b)`` are all ``<= x``: the commonest answers are capped at
   share ``x`` one by one (largest first) until every other answer's share is at most ``x``; uncapped answers
   keep ``acc = 1``, and so does an answer the estimate never saw.
3. **Decision** (:meth:`AnswerBalance.accepts`): a question is accepted iff
   ``u(question) < acc(answer)``, where ``u`` is the first 8 bytes of SHA-256(:data:`BALANCE_TAG` + normalized
   question) / 2**64 (:func:`balance_uniform`; domain-separated from the held-out partition's hash). It is a
   pure function of the item's content, so every node makes the same decision for a peer's TaskRef.

The training stream redraws rejected questions the way it redraws held-out ones, the held-out set and probes
skip them, and :meth:`~swarmnode.tasks.mix.TaskMix.contains` refuses them (a peer's bundle naming one is
refused with ``foreign_task``). The estimate has sampling error (binomial std about 0.0035 on a share near 0.5
from 20,000 items), so the realized share of a capped answer can exceed ``x`` slightly: by about ``x·δp/p``
for an error ``δp`` on its probability ``p``. 2,000 items were too few: for letter_counting (4-6 words) they
estimate ``p(1) = 0.50`` against 0.525 over 100,000 items, and a cap of 0.3 gave a realized share of 0.32.
Building the rule generates the 20,000 items once per source (about 0.5 s for letter_counting).

:data:`BALANCE_TAG`, :data:`ESTIMATE_ITEMS` and :data:`ESTIMATE_SEED` are part of the rule: a node that changed
one would accept other questions than its peers under the same ``config_digest``.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from typing import Any, Callable, Mapping

from swarmnode.tasks.partition import normalize_question

#: Domain-separation tag of the acceptance hash (independent of the held-out partition's hash).
BALANCE_TAG = b"swarmnode-balance-v1\x00"

#: Items the answer histogram is estimated from (deterministic: always the same items of the source).
ESTIMATE_ITEMS = 20_000

#: Dataset seed of the estimate's first items.
ESTIMATE_SEED = 0

#: The key that ``max_answer_share`` adds to a reasoning-gym source's ``config_digest`` dict (protocol/SPEC.md
#: §3.1); a dotted name can never be a dataset keyword argument.
DIGEST_KEY = "swarmnode.max_answer_share"


class BalanceError(ValueError):
    """A ``max_answer_share`` that is out of range or that no acceptance rule can meet for the source's answers.

    The message says what was expected; its caller adds the config key (``tasks.sources[i].max_answer_share``,
    :func:`~swarmnode.tasks.mix.build_sources`)."""


def normalize_answer(answer: Any) -> str:
    """The answer as the balance rule compares it: ``str(answer)`` normalized like a question
    (NFKC, lower case, whitespace runs collapsed, stripped; :func:`~swarmnode.tasks.partition.normalize_question`)."""
    return normalize_question(str(answer))


def balance_uniform(question: str) -> float:
    """The acceptance uniform of a question, in [0, 1): first 8 bytes of SHA-256(tag + normalized text) / 2**64.

    Raises:
        TypeError: ``question`` is not a ``str``.
    """
    digest = hashlib.sha256(BALANCE_TAG + normalize_question(question).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def water_fill(counts: Mapping[str, int], max_share: float) -> dict[str, float]:
    """Acceptance probabilities that cap every answer's share at ``max_share``, accepting as much as possible.

    Answers are capped largest count first (ties by answer text): with the ``k`` largest capped, the accepted
    mass is ``M = U / (1 - k·x)`` (``U`` = the uncapped answers' probability) and the next answer is capped while
    its probability exceeds ``x·M``; a capped answer gets ``acc = x·M / p(a)``, the others ``acc = 1``.

    Args:
        counts: answer -> count (counts >= 0; zero counts are ignored).
        max_share: the cap ``x``, in (0, 1).

    Returns:
        answer -> acceptance probability in (0, 1], only for the capped answers (every other answer: 1).

    Raises:
        BalanceError: ``max_share`` not in (0, 1), or ``max_share`` below ``1 / K`` for the ``K`` distinct
            answers (no rule can cap them all; the message gives the range that can be met).
        ValueError: no positive count.
    """
    x = float(max_share)
    if isinstance(max_share, bool) or not 0.0 < x < 1.0:
        raise BalanceError(f"max_answer_share must be in (0, 1), got {max_share!r}")
    items = sorted(((a, int(c)) for a, c in counts.items() if int(c) > 0), key=lambda ac: (-ac[1], ac[0]))
    total = sum(c for _, c in items)
    if total == 0:
        raise ValueError("no answers to balance (empty histogram)")
    k_answers = len(items)
    if k_answers * x < 1.0:
        raise BalanceError(
            f"{x:g} is below 1/{k_answers}: the answer histogram has only {k_answers} distinct answers, so one of "
            f"them keeps a share of at least 1/{k_answers}; expected a number in [{1 / k_answers:.4g}, 1)"
        )
    uncapped = 1.0  # probability of the answers not capped yet
    k = 0
    mass = 1.0
    while k < len(items):
        # 1 - k·x > 0: answer k-1 was capped because x·M_{k-1} < p_{k-1} <= U_{k-1} = M_{k-1}·(1 - (k-1)·x)
        mass = uncapped / (1.0 - k * x)
        p = items[k][1] / total
        if p <= x * mass:
            break
        uncapped -= p
        k += 1
    return {a: min(1.0, (x * mass) / (c / total)) for a, c in items[:k]}


def estimate_counts(answer_at: Callable[[int, int], Any], size: int, n: int = ESTIMATE_ITEMS) -> Counter:
    """The normalized-answer histogram of the ``n`` estimate items of a source of ``size`` items per seed.

    Args:
        answer_at: ``(seed, index) -> answer`` of the source.
        size: items per seed (item ``pos`` of the walk is ``(ESTIMATE_SEED + (pos // size)·size, pos % size)``).
        n: items to read (default :data:`ESTIMATE_ITEMS`).
    """
    out: Counter = Counter()
    for pos in range(n):
        out[normalize_answer(answer_at(ESTIMATE_SEED + (pos // size) * size, pos % size))] += 1
    return out


class AnswerBalance:
    """The balance rule of one source: its cap, estimated histogram and acceptance table.

    Args:
        max_share: the cap on any answer's share, in (0, 1).
        counts: the estimated answer histogram (normalized answer -> count; :func:`estimate_counts`).

    Attributes:
        max_share: the cap.
        counts: the histogram (a copy).
        acceptance: normalized answer -> acceptance probability, capped answers only (others: 1).
        accept_rate: expected share of the source's draws that are accepted (``Σ p(a)·acc(a)`` over the estimate).

    Raises:
        BalanceError / ValueError: as :func:`water_fill`.
    """

    def __init__(self, max_share: float, counts: Mapping[str, int]) -> None:
        self.max_share = float(max_share)
        self.counts: dict[str, int] = dict(counts)
        self.acceptance: dict[str, float] = water_fill(self.counts, self.max_share)
        total = sum(self.counts.values())
        self.accept_rate = math.fsum(c / total * self.acceptance.get(a, 1.0) for a, c in self.counts.items())

    def __repr__(self) -> str:
        acc = {a: round(v, 4) for a, v in self.acceptance.items()}
        return f"AnswerBalance(max_share={self.max_share}, acceptance={acc}, accept_rate={self.accept_rate:.3f})"

    def accepts(self, question: str, answer: Any) -> bool:
        """Whether the item ``(question, answer)`` stays in the balanced distribution (a pure function of both).

        Raises:
            TypeError: ``question`` is not a ``str``.
        """
        acc = self.acceptance.get(normalize_answer(answer))
        return acc is None or balance_uniform(question) < acc
