"""Swarm curriculum: draw more of the tasks the swarm finds about half solvable (docs/guide/swarm.md "Swarm curriculum").

A group of binary rewards carries a policy gradient only when its rewards differ: with success rate ``p`` a
group of ``G`` leaves has variance with probability ``1 - p^G - (1-p)^G``, and the expected reward variance
``p(1-p)`` peaks at ``p = 0.5``. Each node publishes the per-task success counts of its recent local samples
in its heartbeats (protocol/SPEC.md §5.3, key ``rates``); every node combines the swarm's rates and reweights
its task mix toward tasks whose success is near 0.5 and away from those at ~0 or ~1.

Peers are untrusted, so the statistic is bounded by construction (:func:`tally_votes`):

* **one vote per peer id** (the newest heartbeat of a peer), plus our own; banned peers, rates older than
  ``max_age_seconds`` (measured from when *we* first read the heartbeat, never from its signed time) and
  rates with fewer than ``min_samples`` leaves are no votes;
* **only trusted votes count**: our own and those of *established* peers (at least ``established_after``
  useful trees trained on, ``swarm.trust.established_after``; at least 1). Young keys (fresh or with a few useful
  trees, possibly Sybils: one cheap mixed tree per key used to be enough) get no seat: any seat they could
  fill, free keys fill. With no trusted vote the task has no rate and keeps its configured weight;
* **every established peer counts once, whatever its standing**: standing only decides whether a peer is
  established, never which peers sit or how much a vote weighs (seats ranked by standing let a few liars with
  top standing take every seat beside a majority of honest peers). When more peers are established than
  ``max_voters`` (bounded work), the seats are a uniformly random subset of them, drawn afresh on every call
  (once per step in the node) from a secret seed no voter can know or steer, the same seats for every task;
* every rate is ``k / n`` clamped to [0, 1]; a NaN, an infinity, a negative or non-numeric count is no vote;
  counts only decide whether a rate is a vote (they weigh nothing);
* **the weight follows the seats' factors**: every seat (ours, and each seated established peer) holds one
  value, the :func:`curriculum_factor` of its own rate, or the neutral factor 1 when it abstains (fewer than
  ``min_samples`` leaves of the task, or, for our seat, no vote of ours); the task's factor is the **median** of
  those values (of an even count, the geometric mean of the two middle ones). The median is taken over factors,
  not rates, because the factor is not monotone in the rate (honest rates at 0 and 1 with one liar at 0.5 gave a
  median rate of 0.5 and the maximum factor where every honest seat said the minimum), and an abstention is
  neutral: it never repeats a vote, so liars cannot use their own or honest peers' abstentions;
* the swarm's **rate** of a task (shown in the metrics, not used for the weight) is the median of the trusted
  votes; with our own vote each abstaining seat repeats it, and without it the task has a rate only when more
  than half of the seats voted;
* whatever the median says, a task's weight stays within ``[min_factor, max_factor]`` x its configured
  weight (:func:`curriculum_weights`): hostile values can move a task's share of the draws by at most the
  factor ``max_factor / min_factor`` and can never take a task out of the mix or make it the only one.

**Guarantee.** Let a task's seats be ``m`` honest ones (our own seat always among them, abstaining or not) and
``k`` held by liars, who may vote any values or abstain. While ``m > k`` (``H >= k`` honest established peers
seated beside ``k`` liars), the factor lies between the honest seats' factors of ranks ``ceil((m - k) / 2)``
and ``floor((m + k) / 2) + 1`` (1-based, ascending): within the range of the honest seats' factors, at most
about ``k / 2`` ranks from their own median, and **equal to it when the honest seats agree**. Every established
peer sits while at most ``max_voters`` are established (the default, 1,024, is the most peers whose rates the
swarm layer keeps); beyond that the bound holds for the drawn seats, and the liars hold a majority of them only
with the hypergeometric chance of the draw (e.g. 40 liars among 100 established peers, 32 seats and our own
vote: 5.3% of steps).

The weights only choose among sources; :meth:`swarmnode.tasks.mix.TaskMix.refs_for_step` keeps the held-out
partition out of training and stays a pure function of ``(tasks.seed, step, n, stream, weights)``.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

__all__ = [
    "MAX_RATE_TASKS",
    "MAX_TASK_KEY_BYTES",
    "MAX_RATE_COUNT",
    "PeerRates",
    "LocalRates",
    "clean_count",
    "vote_rate",
    "VoteTally",
    "draw_seats",
    "tally_votes",
    "combine_rates",
    "learnability",
    "curriculum_factor",
    "curriculum_weights",
]

#: Most tasks one heartbeat reports rates for (protocol/SPEC.md §5.3).
MAX_RATE_TASKS = 16
#: Most UTF-8 bytes of a task key (``"<source_id>#<config_digest>"``) in a heartbeat.
MAX_TASK_KEY_BYTES = 128
#: Largest leaf count a rate may claim; larger counts are capped (they only decide whether a rate is a vote).
MAX_RATE_COUNT = 1 << 20


@dataclass(frozen=True)
class PeerRates:
    """One peer's per-task success counts, as the swarm layer read them from its newest valid heartbeat.

    Attributes:
        peer_id: the signer's peer id (one vote per id).
        rates: task key -> ``(n, k)``: ``n`` leaves of which ``k`` were correct (claims; sanitized on use).
        age_s: seconds since WE first read this heartbeat (receiver's clock).
        standing: the peer's earned standing (useful trees trained on from it); it only decides whether the peer
            is established (its vote counts, once), never its seat or its weight.
    """

    peer_id: str
    rates: Mapping[str, Any]
    age_s: float = 0.0
    standing: int = 0


def clean_count(v: Any) -> int | None:
    """A claimed leaf count as an int in ``[0, MAX_RATE_COUNT]``, or ``None`` when it is not a finite number >= 0
    (NaN, inf, negative, bool, str, bytes, ...): only an ``int`` or a ``float`` is a count."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(f) or f < 0:
        return None
    return int(min(f, MAX_RATE_COUNT))


def vote_rate(entry: Any, min_samples: int) -> float | None:
    """The success rate in [0, 1] that one ``(n, k)`` entry votes for, or ``None`` (no vote).

    ``n`` and ``k`` are cleaned with :func:`clean_count`; ``n < min_samples`` is no vote; ``k > n`` counts as ``n``
    (rate 1). Never raises.
    """
    try:
        n_raw, k_raw = entry
    except (TypeError, ValueError):
        return None
    n, k = clean_count(n_raw), clean_count(k_raw)
    if n is None or k is None or n < max(1, int(min_samples)):
        return None
    n_f, k_f = float(n_raw), float(k_raw)  # finite and >= 0 (clean_count); the rate of the uncapped counts
    return min(1.0, max(0.0, min(k_f, n_f) / n_f))


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


def _log_median(xs: Sequence[float]) -> float:
    """Median of positive factors; of an even count, the geometric mean of the two middle ones (factors are
    log-linear)."""
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else math.sqrt(s[m - 1] * s[m])


@dataclass(frozen=True)
class VoteTally:
    """How one task's swarm rate came about (:func:`tally_votes`).

    Attributes:
        rate: the median of the votes used, in [0, 1]; ``None`` when no trusted vote exists. Shown in metrics; the
            weight follows ``factor``.
        peers: peer ids whose votes were used (seated established peers that voted on the task).
        trusted: trusted votes used (our own, if any, plus established peers').
        factor: the task's weight multiplier in ``[min_factor, max_factor]``: the median over every seat (ours and
            each seated established peer) of the seat's :func:`curriculum_factor`, an abstaining seat counting as
            the neutral factor 1 (the module docstring gives the rule and its guarantee).
    """

    rate: float | None
    peers: tuple[str, ...] = ()
    trusted: int = 0
    factor: float = 1.0


def draw_seats(peer_ids: Iterable[str], max_voters: int, seed: bytes | None = None) -> list[str]:
    """The peers that hold the curriculum's seats: all of ``peer_ids`` when there are at most ``max_voters``,
    otherwise a uniformly random subset of ``max_voters`` of them.

    The subset is the ``max_voters`` ids with the smallest keyed BLAKE2b digest under ``seed``: for a seed the
    peers cannot know (the default: 16 fresh bytes from ``os.urandom`` on every call), every subset of that size
    is equally likely whatever the ids and whatever their standing, and no key can be ground to be seated.

    Args:
        peer_ids: distinct peer ids (the established ones).
        max_voters: seats (values below 0 count as 0).
        seed: the draw's seed (any bytes; tests pass one to repeat a draw), ``None`` for a fresh secret one.

    Returns:
        The seated ids: in the given order when all sit, else in draw order. O(N log max_voters) work.

    Raises:
        TypeError: ``seed`` is neither bytes nor ``None``.
    """
    ids = list(peer_ids)
    cap = max(0, int(max_voters))
    if len(ids) <= cap:
        return ids
    if seed is not None and not isinstance(seed, (bytes, bytearray)):
        raise TypeError(f"seed must be bytes or None, got {type(seed).__name__}")
    key = hashlib.blake2b(os.urandom(16) if seed is None else bytes(seed), digest_size=32).digest()
    return heapq.nsmallest(cap, ids, key=lambda pid: hashlib.blake2b(pid.encode("utf-8", "replace"), key=key).digest())


def tally_votes(
    keys: Sequence[str],
    own: Mapping[str, Any],
    peers: Iterable[PeerRates],
    *,
    min_samples: int = 8,
    max_age_s: float = 120.0,
    max_voters: int = 1024,
    established_after: int = 16,
    own_peer_id: str | None = None,
    seed: bytes | None = None,
    min_factor: float = 0.5,
    max_factor: float = 2.0,
) -> dict[str, VoteTally]:
    """The swarm's success rate of each task, with the votes it used: the median over our own vote and one vote
    per seated established peer (the module docstring gives the rule and its guarantee).

    Args:
        keys: the task keys to rate (:meth:`swarmnode.tasks.mix.TaskMix.source_key`, config order).
        own: our recent local counts, task key -> ``(n, k)`` (:meth:`LocalRates.counts`).
        peers: the peers' counts (any number, any values; untrusted). A peer id that appears several times
            votes once, with its freshest (smallest ``age_s``) entry; ``own_peer_id`` (our own heartbeat read
            back from the DHT) is skipped.
        min_samples: leaves a rate needs to be a vote (int >= 1).
        max_age_s: seconds; entries with a larger (or non-finite) ``age_s`` are ignored.
        max_voters: seats: every established peer sits while there are at most this many, otherwise a uniformly
            random subset of this many (:func:`draw_seats`, one draw for all tasks); standing never ranks them.
        established_after: useful trained trees (``standing``) that make a peer's vote count
            (``swarm.trust.established_after``; values below 1 count as 1). Peers below it (young keys) get no seat:
            any seat they could fill, free keys fill. A seated peer without ``min_samples`` leaves of a task
            abstains on it: with our own vote, each abstention repeats our vote; without it, the task has a rate
            only when more than half of the seats voted.
        own_peer_id: our own peer id, or ``None``.
        seed: the seat draw's seed (only used when more than ``max_voters`` peers are established); ``None``, the
            default, draws a fresh secret one per call.
        min_factor / max_factor: the factor bounds of :func:`curriculum_factor` (``curriculum.min_factor`` and
            ``max_factor``); raises ValueError unless ``0 < min_factor <= max_factor``.

    Returns:
        task key -> :class:`VoteTally`. Its ``rate`` lies between the lowest and the highest trusted vote. Its
        ``factor`` (what the weight follows): with ``k`` lying seats and ``m > k`` honest seats (ours included,
        voting or abstaining), between the honest seats' factors of ranks ``ceil((m - k) / 2)`` and
        ``floor((m + k) / 2) + 1``. Never raises on hostile peer values.
    """
    neutral = curriculum_factor(None, min_factor, max_factor)  # raises on bad bounds
    best: dict[str, PeerRates] = {}
    for pr in peers:
        if not isinstance(pr, PeerRates) or not isinstance(pr.peer_id, str) or not pr.peer_id:
            continue
        if own_peer_id is not None and pr.peer_id == own_peer_id:
            continue
        try:
            age = float(pr.age_s)
        except (TypeError, ValueError, OverflowError):
            continue
        if not math.isfinite(age) or age > max_age_s or not isinstance(pr.rates, Mapping):
            continue
        prev = best.get(pr.peer_id)
        if prev is None or age < float(prev.age_s):
            best[pr.peer_id] = pr

    bar = max(1, int(established_after))
    # standing decides only who is established (young keys get no seat: any seat they could fill, free keys fill);
    # it never ranks the seats (outside attack: liars with top standing took every seat beside more honest peers)
    established = [pid for pid, pr in best.items() if (clean_count(pr.standing) or 0) >= bar]
    seated = [best[pid] for pid in draw_seats(established, max_voters, seed)]
    out: dict[str, VoteTally] = {}
    for key in keys:
        mine = vote_rate(own.get(key), min_samples) if isinstance(own, Mapping) else None
        peer_votes: list[tuple[str, float]] = []
        for pr in seated:
            try:
                r = vote_rate(pr.rates.get(key), min_samples)
            except Exception:  # noqa: BLE001 - a hostile mapping is no vote
                r = None
            if r is not None:
                peer_votes.append((pr.peer_id, r))
        # a seated peer without enough samples of this task abstains, and an abstention is not a free seat for
        # whoever claims samples (outside attack: two liars owned a rare task's rate for any number of honest
        # established peers): with our own vote, each abstaining seat repeats it; without it, the task gets a rate
        # only when most seats voted
        abstain = len(seated) - len(peer_votes)
        # the weight: one value per seat, its own factor or, abstaining, the neutral 1; the median over factors,
        # not over rates, because the factor is not monotone in the rate (outside attack: honest votes at 0 and 1
        # with one liar at 0.5 took a median rate of 0.5 and the maximum factor, where every honest seat said the
        # minimum), and an abstention counts as neutral rather than repeating our vote or needing a quorum
        # (outside attack: liars beside honest peers that abstained set a rare task's factor without our vote)
        seat_factors = [neutral if mine is None else curriculum_factor(mine, min_factor, max_factor)]
        seat_factors += [curriculum_factor(r, min_factor, max_factor) for _, r in peer_votes] + [neutral] * abstain
        factor = _log_median(seat_factors)
        if mine is not None:
            trusted = [mine] * (1 + abstain) + [r for _, r in peer_votes]
        elif peer_votes and 2 * len(peer_votes) > len(seated):
            trusted = [r for _, r in peer_votes]
        else:
            out[key] = VoteTally(None, tuple(p for p, _ in peer_votes), len(peer_votes), factor)
            continue
        out[key] = VoteTally(_median(trusted), tuple(p for p, _ in peer_votes),
                             len(peer_votes) + (mine is not None), factor)
    return out


def combine_rates(keys: Sequence[str], own: Mapping[str, Any], peers: Iterable[PeerRates],
                  **kwargs: Any) -> dict[str, float | None]:
    """task key -> the swarm's success rate in [0, 1] (``None``: no trusted vote); :func:`tally_votes`'s rates,
    same arguments."""
    return {k: t.rate for k, t in tally_votes(keys, own, peers, **kwargs).items()}


def learnability(p: float) -> float:
    """``4 p (1 - p)`` in [0, 1]: 1 at p = 0.5, 0 at p = 0 or 1 (``p`` is clamped to [0, 1]; NaN gives 0)."""
    if not isinstance(p, (int, float)) or not math.isfinite(p):
        return 0.0
    p = min(1.0, max(0.0, float(p)))
    return 4.0 * p * (1.0 - p)


def curriculum_factor(rate: float | None, min_factor: float = 0.5, max_factor: float = 2.0) -> float:
    """The weight multiplier of a task with swarm success ``rate``: log-linear in :func:`learnability`,
    ``min_factor`` at rate 0 or 1, ``max_factor`` at 0.5; ``rate None`` (no votes) gives 1 clamped into the range.

    Always within ``[min_factor, max_factor]``. Raises ValueError unless ``0 < min_factor <= max_factor`` (finite).
    """
    if not (math.isfinite(min_factor) and math.isfinite(max_factor) and 0 < min_factor <= max_factor):
        raise ValueError(f"need 0 < min_factor <= max_factor, got {min_factor!r}, {max_factor!r}")
    if rate is None:
        return min(max_factor, max(min_factor, 1.0))
    g = learnability(rate)
    f = math.exp(math.log(min_factor) + g * (math.log(max_factor) - math.log(min_factor)))
    return min(max_factor, max(min_factor, f))


def curriculum_weights(configured: Sequence[float], rates: Sequence[float | None] | None = None, *,
                       factors: Sequence[float] | None = None, min_factor: float = 0.5,
                       max_factor: float = 2.0) -> list[float]:
    """Per-source sampling weights: ``configured[i] * curriculum_factor(rates[i])``, or ``configured[i] *
    factors[i]`` (clamped into the bounds) when the factors are given (:attr:`VoteTally.factor`, what the node uses).

    Args:
        configured: the configured weights (finite, > 0), one per source.
        rates: the swarm's rate per source (:func:`combine_rates`, same order), ``None`` = unknown.
        factors: instead of ``rates``, the factor per source (same order).
        min_factor / max_factor: the floor and ceiling multipliers (``levers.curriculum``).

    Returns:
        Weights, each within ``[min_factor, max_factor] x configured[i]``; hence each source's share of the
        draws is at least ``min_factor / max_factor`` and at most ``max_factor / min_factor`` times its
        configured share (capped at 1).

    Raises:
        ValueError: lengths differ, a configured weight is not finite and > 0, or bad factors.
    """
    if (rates is None) == (factors is None):
        raise ValueError("give either rates or factors")
    if factors is not None:
        curriculum_factor(None, min_factor, max_factor)  # checks the bounds
        mults = [min(max_factor, max(min_factor, float(f))) if math.isfinite(float(f)) else 1.0 for f in factors]
        what = "factors"
    else:
        mults = [curriculum_factor(r, min_factor, max_factor) for r in rates]
        what = "rates"
    if len(configured) != len(mults):
        raise ValueError(f"{len(configured)} configured weights but {len(mults)} {what}")
    out = []
    for w, f in zip(configured, mults):
        w = float(w)
        if not math.isfinite(w) or w <= 0:
            raise ValueError(f"configured weights must be finite and > 0, got {w}")
        out.append(w * f)
    return out


@dataclass
class LocalRates:
    """Our own per-task success counts over the last ``window_steps`` steps (what our heartbeats publish).

    Args:
        window_steps: steps kept (int >= 1).

    Raises:
        ValueError: ``window_steps < 1``.
    """

    window_steps: int = 8
    _steps: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        if int(self.window_steps) < 1:
            raise ValueError(f"window_steps must be >= 1, got {self.window_steps!r}")
        self._steps = deque(maxlen=int(self.window_steps))

    def observe(self, step_counts: Mapping[str, tuple[int, int]]) -> None:
        """Add one step: task key -> ``(leaves, correct leaves)`` of our local samples (the oldest step leaves)."""
        self._steps.append({str(k): (int(n), int(c)) for k, (n, c) in step_counts.items()})

    def counts(self) -> dict[str, tuple[int, int]]:
        """Task key -> ``(n, k)`` summed over the window (at most :data:`MAX_RATE_TASKS` keys with the most
        leaves, ties by key; keys over :data:`MAX_TASK_KEY_BYTES` bytes are left out), counts capped at
        :data:`MAX_RATE_COUNT`."""
        tot: dict[str, list[int]] = {}
        for d in self._steps:
            for k, (n, c) in d.items():
                t = tot.setdefault(k, [0, 0])
                t[0] += n
                t[1] += c
        items = [(k, v) for k, v in tot.items() if v[0] > 0 and len(k.encode("utf-8")) <= MAX_TASK_KEY_BYTES]
        items.sort(key=lambda kv: (-kv[1][0], kv[0]))
        return {k: _capped(n, c) for k, (n, c) in items[:MAX_RATE_TASKS]}


def _capped(n: int, c: int) -> tuple[int, int]:
    """``(n, c)`` with ``c <= n``, scaled down together when ``n`` exceeds :data:`MAX_RATE_COUNT` (the rate
    ``c / n`` kept; capping each alone would turn ``(2**21, 2**20)``, rate 0.5, into rate 1)."""
    c = min(c, n)
    if n <= MAX_RATE_COUNT:
        return n, c
    return MAX_RATE_COUNT, (c * MAX_RATE_COUNT) // n
