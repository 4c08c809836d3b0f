"""The task mix: a weighted set of task sources, a deterministic training stream and a held-out set.

Every node with the same ``tasks`` config regenerates the same stream: the TaskRefs of training step ``s`` are
a pure function of ``(tasks.seed, s, n, stream)``, and the held-out refs a pure function of ``(eval_seed,
eval_fraction)``.
A peer's TaskRef is accepted for training only if :meth:`TaskMix.contains` says the training stream can
produce it, which keeps held-out tasks out of training even when a peer offers them (docs/reference/design.md §6 step 6).

Held-out separation (by content)
--------------------------------
A different dataset seed is not a different question: two one-digit terms have a few hundred distinct
questions, and every seed draws from the same few hundred. So the split is made on the **question text**,
with :func:`~swarmnode.tasks.partition.is_heldout_question`: a question is held out when the SHA-256 of its
normalized text falls below ``eval_fraction`` (``tasks.eval_fraction``, default 0.1) of the hash range.
The rule is a pure function of the text, so every node agrees on it without coordination.

* **Training stream.** :meth:`TaskMix.refs_for_step` never yields a held-out question. A draw whose question
  is held out is redrawn (same source, a new index) from a second generator seeded by
  ``(tag, tasks.seed, step, stream)``, so the stream stays a pure function of ``(tasks.seed, step, n, stream)``.
* **Held-out set.** :meth:`TaskMix.eval_refs` walks items ``0, 1, 2, …`` of dataset seed ``eval_seed`` (then
  ``eval_seed + S``, ``eval_seed + 2S``, … for a source of size ``S``) and keeps the held-out questions that
  are new by normalized content, until it has its share of ``n`` (default ``tasks.eval_size``, 500) or the
  source's held-out space looks exhausted (no new question in ``max(2000, 20 / eval_fraction)`` draws in a
  row). A small task space therefore gives fewer than ``n`` held-out questions, never repeats.
* **Peers' refs.** :meth:`TaskMix.contains` regenerates the question and refuses a held-out one, whatever its
  seed. It also refuses seeds that are not training-epoch seeds, and epochs beyond :data:`MAX_TRAIN_DRAWS`
  draws of a source (a far-future epoch seed is not a task this swarm will ever schedule).
* Training epochs still avoid the seed range ``[eval_seed, eval_seed + S)`` (reasoning-gym mostly seeds
  item ``i`` of seed ``s`` with ``random.Random(s + i)``), so the training stream and the first ``S`` items
  of the held-out walk do not even share generator states. The content rule is what makes the split exact.

Answer balance (opt-in, per source)
-----------------------------------
A reasoning-gym source with ``max_answer_share`` (``tasks.sources[i].max_answer_share``, also on probes) keeps
only the questions its :class:`~swarmnode.tasks.balance.AnswerBalance` rule accepts -- a pure function of the
question and its answer that caps every answer's share (:mod:`swarmnode.tasks.balance`). A rejected question
is treated like a held-out one on the training side: :meth:`TaskMix.refs_for_step` redraws it with the same
redraw generator, and :meth:`TaskMix.contains` refuses it. It is not held out either: :meth:`TaskMix.eval_refs`
(and so the probes) skips it and :meth:`TaskMix.is_eval` is False for it, so training and held-out questions
follow the same balanced distribution. The option is part of the source's ``config_digest``.

A JSONL source is split the same way, by each line's question: held-out lines are those whose question is
held out (duplicates by normalized content count once); training draws only the other lines.

Reward
------
``reward = correct + format_reward · format``, exact correctness unless ``tasks.partial_credit``
(:mod:`swarmnode.tasks.reward`).

Modules
-------
The mix is one class over three modules: this one (construction, seeds, the partition, the training stream,
membership), :mod:`swarmnode.tasks.heldout` (:class:`~swarmnode.tasks.heldout.HeldOutSet`: the held-out walk,
``eval_refs``, ``is_eval``) and :mod:`swarmnode.tasks.reward` (:class:`~swarmnode.tasks.reward.MixRewards`:
``score_detail``, ``rescore``, ``score``); sources are built from config by :mod:`swarmnode.tasks.sources`.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from swarmnode.config import TasksConfig
from swarmnode.tasks.base import Task, TaskRef
from swarmnode.tasks.heldout import MAX_EVAL_SCAN, HeldOutSet
from swarmnode.tasks.jsonl_source import JsonlSource
from swarmnode.tasks.partition import DEFAULT_EVAL_FRACTION, is_heldout_question, normalize_question
from swarmnode.tasks.reasoning_gym_source import ReasoningGymSource
from swarmnode.tasks.reward import MixRewards
from swarmnode.tasks.sources import Source, build_sources

__all__ = ["MAX_EVAL_SCAN", "MAX_REDRAWS", "MAX_TRAIN_DRAWS", "Source", "TaskMix", "build_sources", "stream_for_peer"]

_STREAM_TAG = 0x53574E4D  # "SWNM": domain separation of the training stream's SeedSequence
_REDRAW_TAG = 0x53574E52  # "SWNR": the generator that redraws held-out questions of the training stream

#: Training draws per source that the epoch schedule covers (2**32: about 5·10^8 steps of 8 prompts). A ref
#: whose epoch lies beyond it is refused by :meth:`TaskMix.contains`, and :meth:`TaskMix.refs_for_step` raises
#: instead of reaching it.
MAX_TRAIN_DRAWS = 2**32

#: Redraws of one training item before the stream gives up (the held-out share would have to be ~1).
MAX_REDRAWS = 10_000


class TaskMix(HeldOutSet, MixRewards):
    """A weighted mix of task sources with a deterministic training stream and a content-disjoint held-out set.

    Args:
        sources: the task sources (reasoning-gym or JSONL); each ``(source_id, config_digest)`` at most once.
        weights: relative sampling weights, one per source, finite and > 0.
        seed: ``tasks.seed`` -- seed of the training stream (int >= 0).
        eval_seed: first dataset seed of the held-out walk (int >= 0, != ``seed``).
        eval_size: default number of held-out tasks (:meth:`eval_refs` with ``n=None``).
        format_reward: weight of the format term of the reward, in [0, 1].
        eval_fraction: share of every task's question space held out, in (0, 1)
            (:func:`~swarmnode.tasks.partition.is_heldout_question`).
        partial_credit: ``tasks.partial_credit``: local rewards keep reasoning-gym's partial credit
            (:meth:`score_detail`); peers' leaves are always re-scored exactly.

    Raises:
        ValueError: empty or mismatched ``sources``/``weights``, a non-positive or non-finite weight, a
            source listed twice, ``seed == eval_seed``, an argument out of range, or a JSONL file all of
            whose questions are held out (nothing left to train on).
    """

    def __init__(
        self,
        sources: Sequence[Source],
        weights: Sequence[float],
        *,
        seed: int = 0,
        eval_seed: int = 1_000_003,
        eval_size: int = 500,
        format_reward: float = 0.0,
        eval_fraction: float = DEFAULT_EVAL_FRACTION,
        partial_credit: bool = False,
    ) -> None:
        sources = list(sources)
        weights = [float(w) for w in weights]
        if not sources:
            raise ValueError("a task mix needs at least one source")
        if len(sources) != len(weights):
            raise ValueError(f"got {len(sources)} sources but {len(weights)} weights")
        for i, w in enumerate(weights):
            if not math.isfinite(w) or w <= 0:
                raise ValueError(f"weight of source {i} ({sources[i]!r}) must be finite and > 0, got {w}")
        for what, v in (("seed", seed), ("eval_seed", eval_seed)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{what} must be an int >= 0, got {v!r}")
        if seed == eval_seed:
            raise ValueError(
                f"tasks.seed ({seed}) must differ from tasks.eval_seed ({eval_seed}): training must never "
                f"use the held-out seed"
            )
        if isinstance(eval_size, bool) or not isinstance(eval_size, int) or eval_size < 1:
            raise ValueError(f"eval_size must be an int >= 1, got {eval_size!r}")
        if not 0.0 <= float(format_reward) <= 1.0:
            raise ValueError(f"format_reward must be in [0, 1], got {format_reward}")
        if isinstance(eval_fraction, bool) or not 0.0 < float(eval_fraction) < 1.0:
            raise ValueError(f"tasks.eval_fraction must be in (0, 1), got {eval_fraction!r}")
        self.sources: list[Source] = sources
        self.weights: list[float] = weights
        total = sum(weights)
        self.probs: list[float] = [w / total for w in weights]
        self._cum = np.cumsum(np.asarray(self.probs, dtype=np.float64))
        self._cum[-1] = 1.0
        self.seed = seed
        self.eval_seed = eval_seed
        self.eval_size = eval_size
        #: Cap on this mix's questions when it is evaluated as a probe (``tasks.probes[i].eval_size``);
        #: ``None`` = the evaluation's ``n``.
        self.probe_eval_size: int | None = None
        self.format_reward = float(format_reward)
        self.eval_fraction = float(eval_fraction)
        self.partial_credit = bool(partial_credit)

        self._by_key: dict[tuple[str, str], int] = {}
        for i, s in enumerate(sources):
            key = (s.source_id, s.config_digest)
            if key in self._by_key:
                raise ValueError(f"source {i} ({s!r}) is the same as source {self._by_key[key]}: listed twice")
            self._by_key[key] = i

        # Per-source split data.
        self._bad_k: list[tuple[int, ...]] = []  # rg: skipped epoch multipliers k
        self._max_epoch: list[int] = []  # rg: last epoch the schedule covers (MAX_TRAIN_DRAWS)
        self._jsonl_train: list[np.ndarray | None] = []
        self._jsonl_eval: list[np.ndarray | None] = []  # distinct (by content) held-out lines, file order
        self._jsonl_heldout: list[frozenset[int]] = []  # every held-out line (duplicates included)
        # rg: the held-out walk so far: distinct held-out refs found, walk position, exhausted flag.
        self._eval_found: list[list[TaskRef]] = [[] for _ in sources]
        self._eval_seen: list[set[str]] = [set() for _ in sources]
        self._eval_pos: list[int] = [0] * len(sources)
        self._eval_done: list[bool] = [False] * len(sources)
        self._split_cache: OrderedDict[TaskRef, tuple[bool, bool]] = OrderedDict()  # ref -> (held out, balanced)
        for i, s in enumerate(sources):
            if isinstance(s, ReasoningGymSource):
                self._bad_k.append(self._overlapping_epochs(s.size))
                self._max_epoch.append(max(1, -(-MAX_TRAIN_DRAWS // s.size)))
                self._jsonl_train.append(None)
                self._jsonl_eval.append(None)
                self._jsonl_heldout.append(frozenset())
            elif isinstance(s, JsonlSource):
                held, train, distinct, seen = [], [], [], set()
                for line in range(len(s)):
                    q = s.get(TaskRef(s.source_id, "", 0, line)).question
                    if is_heldout_question(q, self.eval_fraction):
                        held.append(line)
                        key = normalize_question(q)
                        if key not in seen:
                            seen.add(key)
                            distinct.append(line)
                    else:
                        train.append(line)
                if not train:
                    raise ValueError(
                        f"every question of JSONL source {s.path} is in the held-out partition "
                        f"(tasks.eval_fraction {self.eval_fraction}): nothing left to train on"
                    )
                self._bad_k.append(())
                self._max_epoch.append(0)
                self._jsonl_train.append(np.asarray(train, dtype=np.int64))
                self._jsonl_eval.append(np.asarray(distinct, dtype=np.int64))
                self._jsonl_heldout.append(frozenset(held))
                self._eval_done[i] = True
            else:
                raise ValueError(f"unsupported task source {s!r} (expected ReasoningGymSource or JsonlSource)")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: TasksConfig, base_dir: str | Path | None = None) -> "TaskMix":
        """Build the mix of a validated ``tasks`` config.

        Args:
            cfg: the ``tasks`` section (:class:`~swarmnode.config.TasksConfig`).
            base_dir: directory that relative JSONL paths are resolved against (usually the config file's
                directory); ``None`` = the current directory.

        Raises:
            ValueError: naming ``tasks.sources[i]`` for an unknown dataset, a bad config, an unreadable or
                malformed JSONL file, or a ``config`` given to a JSONL source; or as :class:`TaskMix`.
        """
        return cls(
            build_sources(cfg.sources, base_dir, what="tasks.sources"),
            [sc.weight for sc in cfg.sources],
            seed=cfg.seed,
            eval_seed=cfg.eval_seed,
            eval_size=cfg.eval_size,
            format_reward=cfg.format_reward,
            eval_fraction=cfg.eval_fraction,
            partial_credit=cfg.partial_credit,
        )

    @classmethod
    def probes_from_config(cls, cfg: TasksConfig, base_dir: str | Path | None = None) -> dict[str, "TaskMix"]:
        """One held-out mix per ``tasks.probes`` entry (nearby-distribution generalization probes).

        Each probe is a single-source mix with the same seeds, ``eval_fraction`` and ``eval_size`` as the
        training mix; only its held-out questions (:meth:`eval_refs`) are used. A probe's own ``eval_size``
        (when set) caps its questions in every evaluation (:attr:`probe_eval_size`). A probe's name is its
        ``label`` or, by default, ``"<dataset or file stem>"`` plus ``"#<i>"`` when that name repeats.

        Raises:
            ValueError: naming ``tasks.probes[i]``, as :meth:`from_config`.
        """
        out: dict[str, TaskMix] = {}
        sources = build_sources(cfg.probes, base_dir, what="tasks.probes")
        for i, (pc, src) in enumerate(zip(cfg.probes, sources)):
            name = getattr(pc, "label", None) or src.name
            if name in out:
                name = f"{name}#{i}"
            out[name] = cls([src], [1.0], seed=cfg.seed, eval_seed=cfg.eval_seed, eval_size=cfg.eval_size,
                            format_reward=cfg.format_reward, eval_fraction=cfg.eval_fraction)
            out[name].probe_eval_size = getattr(pc, "eval_size", None)
        return out

    # ------------------------------------------------------------------ seeds
    def _overlapping_epochs(self, size: int) -> tuple[int, ...]:
        """Epoch multipliers k >= 0 whose range [seed + kS, seed + (k+1)S) meets [eval_seed, eval_seed + S)."""
        lo = (self.eval_seed - self.seed) // size - 1
        return tuple(k for k in range(max(lo, 0), max(lo, 0) + 4) if abs(self.seed + k * size - self.eval_seed) < size)

    def train_seed(self, source_index: int, epoch: int) -> int:
        """The dataset seed of training epoch ``epoch`` (>= 0) of reasoning-gym source ``source_index``.

        Raises:
            ValueError: not a reasoning-gym source, ``epoch < 0``, or ``epoch`` beyond the schedule
                (:data:`MAX_TRAIN_DRAWS` draws of the source).
        """
        s = self.sources[source_index]
        if not isinstance(s, ReasoningGymSource):
            raise ValueError(f"source {source_index} is not a reasoning-gym source")
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch > self._max_epoch[source_index]:
            raise ValueError(
                f"epoch {epoch} of {s.source_id} is beyond the schedule ({self._max_epoch[source_index]} epochs of "
                f"{s.size} items = MAX_TRAIN_DRAWS draws); raise the source's `size`"
            )
        k = epoch
        for bad in self._bad_k[source_index]:  # sorted ascending
            if k >= bad:
                k += 1
        return self.seed + k * s.size

    def _train_epoch(self, source_index: int, seed: int) -> int | None:
        """The epoch whose training seed is ``seed``, or None (not a training seed, or beyond the schedule)."""
        size = self.sources[source_index].size
        d = seed - self.seed
        if d < 0 or d % size:
            return None
        k = d // size
        bad = self._bad_k[source_index]
        if k in bad:
            return None
        epoch = k - sum(1 for b in bad if b < k)
        return epoch if epoch <= self._max_epoch[source_index] else None

    def _is_train_seed(self, source_index: int, seed: int) -> bool:
        return self._train_epoch(source_index, seed) is not None

    # ------------------------------------------------------------------ the partition
    def is_heldout(self, ref: TaskRef) -> bool:
        """Whether the question that ``ref`` regenerates is in the held-out partition (``tasks.eval_fraction``).

        Raises:
            KeyError: ``ref`` is not a TaskRef of this mix (see :meth:`get`).
        """
        return self._split(ref)[0]

    def is_balanced(self, ref: TaskRef) -> bool:
        """Whether the question that ``ref`` regenerates passes its source's answer balance
        (``max_answer_share``, :meth:`ReasoningGymSource.accepts`); always True for a source without it.

        Raises:
            KeyError: ``ref`` is not a TaskRef of this mix (see :meth:`get`).
        """
        return self._split(ref)[1]

    def _split(self, ref: TaskRef) -> tuple[bool, bool]:
        """``(held out, balanced)`` of the question ``ref`` regenerates (LRU-cached). Raises KeyError as :meth:`get`."""
        hit = self._split_cache.get(ref)
        if hit is not None:
            self._split_cache.move_to_end(ref)
            return hit
        i = self._by_key.get((ref.source, ref.config_digest)) if isinstance(ref, TaskRef) else None
        if i is not None and isinstance(self.sources[i], JsonlSource) and self.sources[i].owns(ref):
            return ref.index in self._jsonl_heldout[i], True
        task = self.get(ref)
        s = self.sources[i]
        value = (is_heldout_question(task.question, self.eval_fraction), s.accepts(task))
        self._split_cache[ref] = value
        while len(self._split_cache) > 65_536:
            self._split_cache.popitem(last=False)
        return value

    # ------------------------------------------------------------------ streams
    @property
    def task_names(self) -> list[str]:
        """Task-family names in config order, without repeats (e.g. ``["chain_sum", "leg_counting"]``)."""
        out: list[str] = []
        for s in self.sources:
            if s.name not in out:
                out.append(s.name)
        return out

    def _cumulative(self, weights: Sequence[float]) -> np.ndarray:
        """Cumulative probabilities of per-source ``weights`` (the last one exactly 1.0).

        Raises:
            ValueError: not one weight per source, or a weight that is not finite and > 0.
        """
        w = [float(x) for x in weights]
        if len(w) != len(self.sources):
            raise ValueError(f"weights: expected {len(self.sources)} (one per source), got {len(w)}")
        if not all(math.isfinite(x) and x > 0 for x in w):
            raise ValueError(f"weights must be finite and > 0, got {w}")
        cum = np.cumsum(np.asarray(w, dtype=np.float64) / sum(w))
        cum[-1] = 1.0
        return cum

    def source_key(self, i: int) -> str:
        """The curriculum key of source ``i``: ``"<source_id>#<config_digest>"`` (what heartbeats carry; at most
        :data:`swarmnode.tasks.curriculum.MAX_TASK_KEY_BYTES` bytes for reasoning-gym and JSONL sources).

        Raises:
            IndexError: no source ``i``.
        """
        s = self.sources[i]
        return f"{s.source_id}#{s.config_digest}"

    def source_index(self, ref: TaskRef) -> int | None:
        """The index of the source that ``ref`` names (by source id and config digest), or ``None``."""
        if not isinstance(ref, TaskRef):
            return None
        return self._by_key.get((ref.source, ref.config_digest))

    def refs_for_step(self, step: int, n: int, *, stream: int = 0,
                      weights: Sequence[float] | None = None) -> list[TaskRef]:
        """The ``n`` training TaskRefs of step ``step``; the same on every node and process.

        Algorithm: a NumPy ``Generator(PCG64)`` seeded by ``SeedSequence([tag, tasks.seed, step, stream])``
        draws two uniforms per item with ``Generator.random`` (stable across NumPy versions, unlike
        ``choice``): the first picks the source by the cumulative weights, the second the index. A
        reasoning-gym source of size ``S`` and probability ``p`` is in epoch ``floor(step · n · p / S)``
        (it moves to the next seed after about ``S`` draws) and draws ``index = floor(u · S)`` with replacement;
        a JSONL source draws uniformly among its training lines. A reasoning-gym draw whose question is in
        the held-out partition is redrawn (same source and seed, a new index) with uniforms from a second
        generator, ``SeedSequence([redraw tag, tasks.seed, step, stream])``, consumed in item order; so is a
        draw that its source's answer balance rejects (``max_answer_share``, :meth:`is_balanced`).

        Args:
            step: the training step (int >= 0).
            n: how many refs (int >= 0).
            stream: an extra stream id (int >= 0), e.g. to give nodes of one swarm different questions for
                the same step; ``0`` by default.
            weights: per-source sampling weights for this step's source pick, one per source in config order,
                finite and > 0 (the swarm curriculum's, :func:`swarmnode.tasks.curriculum.curriculum_weights`);
                ``None`` = the configured weights. Only the source pick changes: epochs (hence seeds) follow the
                configured probabilities, so every ref stays one :meth:`contains` accepts, and the stream is a
                pure function of ``(tasks.seed, step, n, stream, weights)``.

        Returns:
            ``n`` TaskRefs (repeats are possible: draws are with replacement), every one accepted by
            :meth:`contains` (none of them a held-out question or one the answer balance rejects).

        Raises:
            ValueError: a negative or non-int argument; ``weights`` of the wrong length or with a value that is
                not finite and > 0; a step beyond the epoch schedule (:data:`MAX_TRAIN_DRAWS`); or
                :data:`MAX_REDRAWS` held-out or balance-rejected draws in a row.
        """
        for what, v in (("step", step), ("n", n), ("stream", stream)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{what} must be an int >= 0, got {v!r}")
        step, n, stream = int(step), int(n), int(stream)
        cum = self._cum if weights is None else self._cumulative(weights)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([_STREAM_TAG, self.seed, step, stream])))
        u = rng.random((n, 2))
        src = np.searchsorted(cum, u[:, 0], side="right")
        src = np.minimum(src, len(self.sources) - 1)
        redraw: np.random.Generator | None = None
        refs: list[TaskRef] = []
        epoch_seed: dict[int, int] = {}
        for j in range(n):
            i = int(src[j])
            s = self.sources[i]
            if isinstance(s, ReasoningGymSource):
                if i not in epoch_seed:
                    epoch = int(math.floor(step * n * self.probs[i] / s.size))
                    epoch_seed[i] = self.train_seed(i, epoch)
                idx = min(int(u[j, 1] * s.size), s.size - 1)
                ref = TaskRef(s.source_id, s.config_digest, epoch_seed[i], idx)
                tries = 0
                while True:
                    held, balanced = self._split(ref)
                    if balanced and not held:
                        break
                    tries += 1
                    if tries > MAX_REDRAWS:
                        raise ValueError(
                            f"{MAX_REDRAWS} draws in a row of {s.source_id} were held-out questions or rejected by "
                            f"its max_answer_share: is tasks.eval_fraction ({self.eval_fraction}) close to 1?"
                        )
                    if redraw is None:
                        redraw = np.random.Generator(
                            np.random.PCG64(np.random.SeedSequence([_REDRAW_TAG, self.seed, step, stream]))
                        )
                    idx = min(int(redraw.random() * s.size), s.size - 1)
                    ref = TaskRef(s.source_id, s.config_digest, epoch_seed[i], idx)
                refs.append(ref)
            else:
                train = self._jsonl_train[i]
                k = min(int(u[j, 1] * len(train)), len(train) - 1)
                refs.append(TaskRef(s.source_id, "", 0, int(train[k])))
        return refs

    # ------------------------------------------------------------------ membership and tasks
    def source_for(self, ref: TaskRef) -> Source | None:
        """The source that ``ref`` names (by source id and config digest), or ``None``."""
        if not isinstance(ref, TaskRef):
            return None
        i = self._by_key.get((ref.source, ref.config_digest))
        return None if i is None else self.sources[i]

    def _well_formed(self, ref: Any) -> int | None:
        """The source index of a TaskRef this mix's source owns (int fields, in range), else None."""
        if not isinstance(ref, TaskRef):
            return None
        i = self._by_key.get((ref.source, ref.config_digest))
        if i is None:
            return None
        if isinstance(ref.seed, bool) or isinstance(ref.index, bool):
            return None
        if not isinstance(ref.seed, int) or not isinstance(ref.index, int):
            return None
        return i if self.sources[i].owns(ref) else None

    def contains(self, ref: Any, *, include_eval: bool = False) -> bool:
        """True when ``ref`` is a task the training stream of this mix can produce.

        Checks: ``ref`` is a TaskRef of a known source with the same config digest and int fields, its index
        is in range, its seed is a training-epoch seed within the schedule (reasoning-gym: ``tasks.seed +
        k·S`` outside the held-out seed range, epoch <= ``MAX_TRAIN_DRAWS / S``; JSONL: seed 0), and the
        question it regenerates is **not** in the held-out partition (by content, whatever the seed) and passes
        its source's answer balance (``max_answer_share``, :meth:`is_balanced`). So a peer cannot make this node
        train on a held-out question, nor on one the balance rejects (the verifier refuses both as
        ``foreign_task``). ``include_eval=True`` also accepts held-out
        questions (:meth:`is_eval`). Never raises.
        """
        try:
            i = self._well_formed(ref)
            if i is None:
                return False
            if include_eval and self.is_eval(ref):
                return True
            s = self.sources[i]
            if isinstance(s, ReasoningGymSource) and not self._is_train_seed(i, ref.seed):
                return False
            held, balanced = self._split(ref)
            return balanced and not held
        except Exception:
            return False

    def get(self, ref: TaskRef) -> Task:
        """Regenerate the task named by ``ref`` (training or held-out).

        Raises:
            KeyError: no source of this mix has ``ref``'s source id and config digest, or the source rejects
                it (see :meth:`ReasoningGymSource.get`, :meth:`JsonlSource.get`).
        """
        s = self.source_for(ref)
        if s is None:
            key = ref.key() if isinstance(ref, TaskRef) else repr(ref)
            raise KeyError(f"TaskRef {key} is not from this task mix (sources: {[x.source_id for x in self.sources]})")
        return s.get(ref)


_STREAM_ID_TAG = b"swarmnode-task-stream-v1\x00"


def stream_for_peer(peer_id: str) -> int:
    """The default training task stream of a swarm node: a pure function of its peer id.

    Nodes of one swarm share ``tasks.seed`` (so every TaskRef stays verifiable by every peer) but should not
    answer the same questions in the same step; ``tasks.stream`` left unset (None) gives each node the stream
    ``1 + (first 4 bytes of SHA-256(tag + peer_id)) mod 2**31`` (never 0, the solo stream).

    Raises:
        ValueError: ``peer_id`` is empty or not a ``str``.
    """
    if not isinstance(peer_id, str) or not peer_id:
        raise ValueError(f"peer_id must be a non-empty str, got {peer_id!r}")
    digest = hashlib.sha256(_STREAM_ID_TAG + peer_id.encode("utf-8")).digest()
    return 1 + int.from_bytes(digest[:4], "big") % (2**31)

