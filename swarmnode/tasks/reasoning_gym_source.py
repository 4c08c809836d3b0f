"""Procedural tasks from reasoning-gym, named by :class:`~swarmnode.tasks.base.TaskRef` and regenerated locally.

reasoning-gym (https://github.com/open-thought/reasoning-gym) builds every item deterministically from the
dataset name, its config and ``(seed, index)``: ``reasoning_gym.create_dataset(name, seed=seed, size=size,
**config)[index]`` is ``{"question", "answer", "metadata"}``. A node therefore never needs a peer's answer:
it regenerates the entry from the TaskRef and scores with the dataset's own ``score_answer`` (docs/reference/design.md §4,
§6 step 6).

Two facts about reasoning-gym that matter here (checked against reasoning-gym 0.1.25):

* Most generators seed ``random.Random(seed + index)`` per item, so item ``(seed, i + 1)`` equals item
  ``(seed + 1, i)``. Separating train and held-out data by seed alone is therefore not enough;
  :class:`~swarmnode.tasks.mix.TaskMix` keeps whole seed ranges apart.
* A few datasets generate all items up front from ``size`` (e.g. ``acre``), so ``size`` is part of the
  identity of an item: it is folded into :attr:`ReasoningGymSource.config_digest`.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from cachetools import LRUCache

from swarmnode.tasks.balance import DIGEST_KEY, AnswerBalance, BalanceError, estimate_counts
from swarmnode.tasks.base import Task, TaskRef, config_digest
from swarmnode.tasks.verifiers import VerifierTimeout, clamp01, extract_answer, time_limit

logger = logging.getLogger(__name__)

#: A raw score at least ``1 - EXACT_TOL`` counts as fully correct (exact rewards; float noise only).
EXACT_TOL = 1e-9

#: Seconds one ``score_answer`` call may take on the main thread before it scores 0.
DEFAULT_SCORE_TIMEOUT_S = 2.0

#: Datasets whose items depend on Python's string-hash randomization (set iteration order): with default
#: configs and seed 7 they produced different items in two fresh processes (reasoning-gym 0.1.25), and the same
#: items when both ran with ``PYTHONHASHSEED=0``. Nodes can only verify each other's rollouts on them when
#: every node runs with ``PYTHONHASHSEED=0``. All other datasets matched across processes in that check
#: (``composite`` was not checked: it needs dataset specs).
HASH_SEED_DEPENDENT_DATASETS = frozenset(
    {"isomorphic_strings", "knight_swap", "polynomial_multiplication", "ransom_note", "word_ladder"}
)


class ReasoningGymSource:
    """One reasoning-gym dataset (name + config) as a task source.

    Args:
        name: a reasoning-gym dataset name (``reasoning_gym.factory.DATASETS``), e.g. ``"chain_sum"``.
        config: keyword arguments of the dataset's config dataclass (e.g. ``{"min_terms": 2, "max_terms": 2}``);
            must be JSON-serialisable and must not contain ``seed`` or ``size`` (those come from the TaskRef
            and from ``size``).
        size: items per seed; valid indices are ``0 <= index < size``.
        cache_seeds: how many seeded datasets to keep (LRU). Creating a dataset is cheap for most tasks but
            slow for some (those that pre-generate ``size`` items), so keep a few.
        score_timeout: seconds a single ``score_answer`` call may take (main thread only; see
            :func:`~swarmnode.tasks.verifiers.time_limit`). ``None`` disables the bound.
        max_answer_share: cap on any one answer's share of the source's questions, in (0, 1); ``None`` (default)
            = off. When set, the answer histogram of 20,000 fixed items is estimated at construction and questions
            of over-represented answers are rejected deterministically (:mod:`swarmnode.tasks.balance`,
            :meth:`accepts`).

    Attributes:
        name: the dataset name.
        source_id: ``"rg:<name>"``.
        config: a copy of ``config``.
        size: items per seed.
        config_digest: :func:`~swarmnode.tasks.base.config_digest` of ``{**config, "size": size}`` -- i.e. of
            exactly the keyword arguments given to ``create_dataset`` except ``seed`` (``size`` is included
            because some datasets' items depend on it) -- plus ``"swarmnode.max_answer_share": x`` when
            ``max_answer_share`` is set (the balanced source is another question distribution).
        max_answer_share: the cap, or ``None``.
        balance: the :class:`~swarmnode.tasks.balance.AnswerBalance` rule, or ``None`` when off.
        portable: ``False`` when the dataset is in :data:`HASH_SEED_DEPENDENT_DATASETS` and this process does not
            run with ``PYTHONHASHSEED=0`` (then another process may regenerate different items; a warning is
            logged at construction).

    Raises:
        ValueError: unknown dataset name, ``config`` not a dict, containing ``seed``/``size``, rejected by
            the dataset's config validation, ``size < 1``, or ``max_answer_share`` not in (0, 1).
        swarmnode.tasks.balance.BalanceError: (a ``ValueError``) ``max_answer_share`` below ``1/K`` for the ``K``
            distinct answers of the estimate (the message names the dataset and the range that can be met).
    """

    def __init__(
        self,
        name: str,
        config: dict[str, Any] | None = None,
        size: int = 100_000,
        *,
        cache_seeds: int = 4,
        score_timeout: float | None = DEFAULT_SCORE_TIMEOUT_S,
        max_answer_share: float | None = None,
    ) -> None:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS

        config = {} if config is None else config
        if not isinstance(name, str) or name not in DATASETS:
            raise ValueError(
                f"unknown reasoning-gym dataset {name!r}; expected one of reasoning_gym.factory.DATASETS "
                f"(e.g. 'chain_sum', 'leg_counting', 'basic_arithmetic')"
            )
        if not isinstance(config, dict):
            raise ValueError(f"reasoning-gym config for {name!r} must be a dict, got {type(config).__name__}")
        for k in ("seed", "size"):
            if k in config:
                raise ValueError(
                    f"reasoning-gym config for {name!r} must not set {k!r}: the seed comes from the TaskRef "
                    f"and the size from the source's `size`"
                )
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an int >= 1, got {size!r}")
        if cache_seeds < 1:
            raise ValueError(f"cache_seeds must be >= 1, got {cache_seeds!r}")
        if max_answer_share is not None and (
                isinstance(max_answer_share, bool) or not isinstance(max_answer_share, (int, float))
                or not 0.0 < float(max_answer_share) < 1.0):
            raise ValueError(f"max_answer_share must be None or a number in (0, 1), got {max_answer_share!r}")
        self._rg = reasoning_gym
        self.name = name
        self.config = dict(config)
        self.size = size
        self.source_id = f"rg:{name}"
        self.max_answer_share = None if max_answer_share is None else float(max_answer_share)
        digest_of = {**self.config, "size": size}
        if self.max_answer_share is not None:
            digest_of[DIGEST_KEY] = self.max_answer_share
        self.config_digest = config_digest(digest_of)
        self.score_timeout = score_timeout
        self.portable = name not in HASH_SEED_DEPENDENT_DATASETS or os.environ.get("PYTHONHASHSEED") == "0"
        if not self.portable:
            logger.warning(
                "reasoning-gym dataset %r depends on Python's hash randomization: other processes regenerate "
                "different items unless every node runs with PYTHONHASHSEED=0",
                name,
            )
        self._cache_seeds = cache_seeds
        self._cache: LRUCache[int, Any] = LRUCache(maxsize=cache_seeds)
        self._lock = threading.Lock()
        # Validate the config now (the dataset's own validate() runs in create_dataset), with a tiny size
        # so that datasets that pre-generate items stay cheap.
        try:
            reasoning_gym.create_dataset(name, seed=0, size=1, **self.config)
        except Exception as e:
            raise ValueError(f"invalid reasoning-gym config for {name!r}: {config!r}: {e}") from e
        self.balance: AnswerBalance | None = None
        if self.max_answer_share is not None:
            counts = estimate_counts(lambda seed, i: self.dataset(seed)[i]["answer"], size)
            try:
                self.balance = AnswerBalance(self.max_answer_share, counts)
            except BalanceError as e:
                raise BalanceError(f"for {name!r}, {e}") from e
            logger.info("answer balance of %s (max_answer_share %s): %r", self.source_id, self.max_answer_share,
                        self.balance)

    def __repr__(self) -> str:
        extra = "" if self.max_answer_share is None else f", max_answer_share={self.max_answer_share}"
        return f"ReasoningGymSource({self.name!r}, {self.config!r}, size={self.size}{extra})"

    def accepts(self, task: Task) -> bool:
        """Whether ``task`` (an item of this source) is in the source's balanced distribution: always True
        without ``max_answer_share``; else :meth:`~swarmnode.tasks.balance.AnswerBalance.accepts` of its question
        and answer (a pure function of the item's content)."""
        return self.balance is None or self.balance.accepts(task.question, task.answer)

    # ------------------------------------------------------------------ refs and regeneration
    def ref(self, seed: int, index: int) -> TaskRef:
        """The TaskRef of item ``index`` of the dataset seeded with ``seed``.

        Raises:
            ValueError: ``seed < 0``, ``index`` outside ``[0, size)`` or either not an int.
        """
        for what, v in (("seed", seed), ("index", index)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{what} must be an int, got {type(v).__name__}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if not 0 <= index < self.size:
            raise ValueError(f"index must be in [0, {self.size}) for {self.source_id}, got {index}")
        return TaskRef(self.source_id, self.config_digest, int(seed), int(index))

    def owns(self, ref: TaskRef) -> bool:
        """True when ``ref`` names an item of this source (same source id and digest, valid seed and index)."""
        return (
            isinstance(ref, TaskRef)
            and ref.source == self.source_id
            and ref.config_digest == self.config_digest
            and isinstance(ref.seed, int)
            and isinstance(ref.index, int)
            and ref.seed >= 0
            and 0 <= ref.index < self.size
        )

    def dataset(self, seed: int) -> Any:
        """The reasoning-gym ``ProceduralDataset`` for ``seed`` (LRU-cached; thread-safe)."""
        with self._lock:
            ds = self._cache.get(seed)  # a hit becomes the most recently used
            if ds is not None:
                return ds
        ds = self._rg.create_dataset(self.name, seed=seed, size=self.size, **self.config)
        with self._lock:
            self._cache[seed] = ds  # evicts the least recently used beyond cache_seeds
        return ds

    def get(self, ref: TaskRef) -> Task:
        """Regenerate the task named by ``ref``.

        Returns:
            A :class:`~swarmnode.tasks.base.Task` with reasoning-gym's question, answer (``str``) and
            metadata (the entry's own ``metadata`` dict), ``name`` = the dataset name.

        Raises:
            KeyError: ``ref`` is not a TaskRef of this source: other source id, other config digest (another
                config or size), negative seed, or index outside ``[0, size)``. The message says which.
        """
        if not isinstance(ref, TaskRef):
            raise KeyError(f"expected a TaskRef, got {type(ref).__name__}")
        if ref.source != self.source_id:
            raise KeyError(f"TaskRef source {ref.source!r} is not {self.source_id!r}")
        if ref.config_digest != self.config_digest:
            raise KeyError(
                f"TaskRef {ref.key()} has config digest {ref.config_digest!r}, but this {self.source_id} source "
                f"(config {self.config!r}, size {self.size}) has {self.config_digest!r}"
            )
        if not isinstance(ref.seed, int) or ref.seed < 0:
            raise KeyError(f"TaskRef {ref.key()} has an invalid seed (expected an int >= 0)")
        if not isinstance(ref.index, int) or not 0 <= ref.index < self.size:
            raise KeyError(f"TaskRef {ref.key()} index is out of range [0, {self.size})")
        entry = self.dataset(ref.seed)[ref.index]
        return Task(
            ref=ref,
            question=str(entry["question"]),
            answer=str(entry["answer"]),
            metadata=dict(entry.get("metadata") or {}),
            name=self.name,
        )

    # ------------------------------------------------------------------ scoring
    def score(self, task: Task, completion: Any, *, partial_credit: bool = False) -> float:
        """Correctness reward of ``completion`` for ``task``: **exact** by default; never raises.

        ``1.0`` only when the dataset's full score (:meth:`score_raw`) is 1.0 (within :data:`EXACT_TOL`), else
        ``0.0``. reasoning-gym's own scores can be partial -- its base rule gives ``len(oracle)/len(answer)``
        when the answer merely *contains* the oracle, so a completion listing many numbers collects 0.01-0.03,
        which per-group normalization turns into an advantage as large as a correct answer's (a
        farmable score found by an outside attack). Partial credit is therefore no reward unless ``partial_credit=True`` (config
        ``tasks.partial_credit``, for *local* rewards only; re-scores of peers' leaves are always exact), which
        returns the raw score in [0, 1].
        """
        v = self.score_raw(task, completion)
        if partial_credit:
            return v
        return 1.0 if v >= 1.0 - EXACT_TOL else 0.0

    def score_raw(self, task: Task, completion: Any) -> float:
        """The dataset's own score in [0, 1] of ``completion`` for ``task`` (partial credit kept); never raises.

        The answer is :func:`~swarmnode.tasks.verifiers.extract_answer` of the completion (the last
        ``<answer>…</answer>``). It is scored by the dataset's own ``score_answer(answer, entry)`` where
        ``entry`` is **regenerated from task.ref** (question/answer/metadata are never taken from the
        ``task`` object's fields, which may have come from a peer). reasoning-gym's scores can be partial
        (e.g. the base rule gives ``len(oracle)/len(answer)`` when the oracle is contained in the answer;
        ``countdown`` gives 0.01 for a malformed expression); they are kept as the dataset defines them and
        clamped to [0, 1].

        Fallback when there is no answer tag: **0.0**. The system prompt asks for the tag; crediting untagged
        text (e.g. after a last ``"answer:"``) would reward a format the prompt forbids and let a
        completion that lists many candidates collect partial credit. A missing tag, a foreign or invalid
        ref, an exception, a NaN, or a ``score_answer`` call longer than ``score_timeout`` (main thread
        only) all give 0.0.
        """
        try:
            answer = extract_answer(completion)
            if answer is None or answer == "":
                return 0.0
            ref = task.ref
            if not self.owns(ref):
                return 0.0
            ds = self.dataset(ref.seed)
            entry = ds[ref.index]
            with time_limit(self.score_timeout):
                value = ds.score_answer(answer, entry)
            return clamp01(value)
        except VerifierTimeout:
            logger.debug("score_answer of %s timed out after %s s", self.source_id, self.score_timeout)
            return 0.0
        except BaseException as e:  # noqa: BLE001 - any verifier failure is a 0 reward, never a crash
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            logger.debug("score_answer failed: %r", e)
            return 0.0
