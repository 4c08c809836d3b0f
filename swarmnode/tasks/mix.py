"""The task mix: a weighted set of task sources, a deterministic training stream and a held-out set.

Every node with the same ``tasks`` config regenerates the same stream: the TaskRefs of training step ``s`` are
a pure function of ``(tasks.seed, s, n, stream)``, and the held-out refs a pure function of ``eval_seed``.
A peer's TaskRef is accepted for training only if :meth:`TaskMix.contains` says the training stream can
produce it, which keeps held-out tasks out of training even when a peer offers them (design.md §6 step 6).

Held-out separation
-------------------
reasoning-gym items are mostly generated from ``random.Random(seed + index)`` (see
:mod:`swarmnode.tasks.reasoning_gym_source`), so two datasets overlap whenever their ranges
``[seed, seed + size)`` overlap. For a reasoning-gym source of size ``S``:

* held-out refs use dataset seed ``eval_seed`` and indices ``0, 1, 2, …`` (range ``[eval_seed, eval_seed + S)``);
* training epoch ``e`` uses dataset seed ``tasks.seed + k·S`` where ``k`` is the ``e``-th integer ``>= 0``
  whose range ``[tasks.seed + k·S, tasks.seed + (k+1)·S)`` does not meet ``[eval_seed, eval_seed + S)``.
  Consecutive epochs therefore never repeat an item either. A training seed never equals ``eval_seed``.

For a JSONL source, a fixed fraction ``jsonl_holdout`` of its lines (``floor(lines · jsonl_holdout)``,
chosen by SHA-256 of ``"<eval_seed>:<line>"``) is held out; training draws only the other lines.

Reward
------
``reward = correct + format_reward · format`` where ``correct`` is the source's verifier score in [0, 1]
and ``format`` is :func:`~swarmnode.tasks.verifiers.format_reward` in {0, 1}; the total lies in
``[0, 1 + format_reward]`` (the format term is an *extra* reward, as in DeepSeek-R1's rule-based rewards).
:meth:`TaskMix.score_detail` keeps the two parts apart; compare ``correct`` (not the total) when
re-scoring a peer's claim, since ``format_reward`` is a local setting.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any, Sequence, Union

import numpy as np

from swarmnode.config import TasksConfig
from swarmnode.tasks.base import Task, TaskRef
from swarmnode.tasks.jsonl_source import JsonlSource
from swarmnode.tasks.reasoning_gym_source import ReasoningGymSource
from swarmnode.tasks.verifiers import format_reward

Source = Union[ReasoningGymSource, JsonlSource]

_STREAM_TAG = 0x53574E4D  # "SWNM": domain separation of the training stream's SeedSequence


class TaskMix:
    """A weighted mix of task sources with a deterministic training stream and a disjoint held-out set.

    Args:
        sources: the task sources (reasoning-gym or JSONL); each ``(source_id, config_digest)`` at most once.
        weights: relative sampling weights, one per source, finite and > 0.
        seed: ``tasks.seed`` -- seed of the training stream (int >= 0).
        eval_seed: seed of the held-out set (int >= 0, != ``seed``).
        eval_size: default number of held-out tasks (:meth:`eval_refs` with ``n=None``).
        format_reward: weight of the format term of the reward, in [0, 1].
        jsonl_holdout: fraction of each JSONL file held out for evaluation, in [0, 1).

    Raises:
        ValueError: empty or mismatched ``sources``/``weights``, a non-positive or non-finite weight, a
            source listed twice, ``seed == eval_seed``, or an argument out of range.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        weights: Sequence[float],
        *,
        seed: int = 0,
        eval_seed: int = 1_000_003,
        eval_size: int = 200,
        format_reward: float = 0.0,
        jsonl_holdout: float = 0.1,
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
        if not isinstance(eval_size, int) or eval_size < 1:
            raise ValueError(f"eval_size must be an int >= 1, got {eval_size!r}")
        if not 0.0 <= float(format_reward) <= 1.0:
            raise ValueError(f"format_reward must be in [0, 1], got {format_reward}")
        if not 0.0 <= float(jsonl_holdout) < 1.0:
            raise ValueError(f"jsonl_holdout must be in [0, 1), got {jsonl_holdout}")
        self.sources: list[Source] = sources
        self.weights: list[float] = weights
        total = sum(weights)
        self.probs: list[float] = [w / total for w in weights]
        self._cum = np.cumsum(np.asarray(self.probs, dtype=np.float64))
        self._cum[-1] = 1.0
        self.seed = seed
        self.eval_seed = eval_seed
        self.eval_size = eval_size
        self.format_reward = float(format_reward)
        self.jsonl_holdout = float(jsonl_holdout)

        self._by_key: dict[tuple[str, str], int] = {}
        for i, s in enumerate(sources):
            key = (s.source_id, s.config_digest)
            if key in self._by_key:
                raise ValueError(f"source {i} ({s!r}) is the same as source {self._by_key[key]}: listed twice")
            self._by_key[key] = i

        # Per-source split data.
        self._bad_k: list[tuple[int, ...]] = []  # rg: skipped epoch multipliers k
        self._jsonl_train: list[np.ndarray | None] = []
        self._jsonl_eval: list[np.ndarray | None] = []
        self._jsonl_eval_set: list[frozenset[int]] = []
        for s in sources:
            if isinstance(s, ReasoningGymSource):
                self._bad_k.append(self._overlapping_epochs(s.size))
                self._jsonl_train.append(None)
                self._jsonl_eval.append(None)
                self._jsonl_eval_set.append(frozenset())
            elif isinstance(s, JsonlSource):
                n = len(s)
                k = int(math.floor(n * self.jsonl_holdout))
                order = sorted(range(n), key=lambda i: hashlib.sha256(f"{eval_seed}:{i}".encode()).digest())
                held = np.asarray(sorted(order[:k]), dtype=np.int64)
                train = np.asarray(sorted(order[k:]), dtype=np.int64)
                self._bad_k.append(())
                self._jsonl_train.append(train)
                self._jsonl_eval.append(held)
                self._jsonl_eval_set.append(frozenset(int(i) for i in held))
            else:
                raise ValueError(f"unsupported task source {s!r} (expected ReasoningGymSource or JsonlSource)")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(
        cls, cfg: TasksConfig, base_dir: str | Path | None = None, *, jsonl_holdout: float = 0.1
    ) -> "TaskMix":
        """Build the mix of a validated ``tasks`` config.

        Args:
            cfg: the ``tasks`` section (:class:`~swarmnode.config.TasksConfig`).
            base_dir: directory that relative JSONL paths are resolved against (usually the config file's
                directory); ``None`` = the current directory.
            jsonl_holdout: fraction of each JSONL file held out (see :class:`TaskMix`).

        Raises:
            ValueError: naming ``tasks.sources[i]`` for an unknown dataset, a bad config, an unreadable or
                malformed JSONL file, or a ``config`` given to a JSONL source; or as :class:`TaskMix`.
        """
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        sources: list[Source] = []
        for i, sc in enumerate(cfg.sources):
            try:
                if sc.type == "reasoning_gym":
                    sources.append(ReasoningGymSource(sc.name, dict(sc.config), size=sc.size))
                else:
                    if sc.config:
                        raise ValueError("`config` is not used by jsonl sources (remove it)")
                    p = Path(sc.path).expanduser()
                    if not p.is_absolute():
                        p = base / p
                    sources.append(JsonlSource(p, name=sc.name))
            except ValueError as e:
                raise ValueError(f"tasks.sources[{i}]: {e}") from e
        return cls(
            sources,
            [sc.weight for sc in cfg.sources],
            seed=cfg.seed,
            eval_seed=cfg.eval_seed,
            eval_size=cfg.eval_size,
            format_reward=cfg.format_reward,
            jsonl_holdout=jsonl_holdout,
        )

    # ------------------------------------------------------------------ seeds
    def _overlapping_epochs(self, size: int) -> tuple[int, ...]:
        """Epoch multipliers k >= 0 whose range [seed + kS, seed + (k+1)S) meets [eval_seed, eval_seed + S)."""
        lo = (self.eval_seed - self.seed) // size - 1
        return tuple(k for k in range(max(lo, 0), max(lo, 0) + 4) if abs(self.seed + k * size - self.eval_seed) < size)

    def train_seed(self, source_index: int, epoch: int) -> int:
        """The dataset seed of training epoch ``epoch`` (>= 0) of reasoning-gym source ``source_index``."""
        s = self.sources[source_index]
        if not isinstance(s, ReasoningGymSource):
            raise ValueError(f"source {source_index} is not a reasoning-gym source")
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        k = epoch
        for bad in self._bad_k[source_index]:  # sorted ascending
            if k >= bad:
                k += 1
        return self.seed + k * s.size

    def _is_train_seed(self, source_index: int, seed: int) -> bool:
        size = self.sources[source_index].size
        d = seed - self.seed
        return d >= 0 and d % size == 0 and (d // size) not in self._bad_k[source_index]

    # ------------------------------------------------------------------ streams
    @property
    def task_names(self) -> list[str]:
        """Task-family names in config order, without repeats (e.g. ``["chain_sum", "leg_counting"]``)."""
        out: list[str] = []
        for s in self.sources:
            if s.name not in out:
                out.append(s.name)
        return out

    def refs_for_step(self, step: int, n: int, *, stream: int = 0) -> list[TaskRef]:
        """The ``n`` training TaskRefs of step ``step``; the same on every node and process.

        Algorithm: a NumPy ``Generator(PCG64)`` seeded by ``SeedSequence([tag, tasks.seed, step, stream])``
        draws two uniforms per item with ``Generator.random`` (stable across NumPy versions, unlike
        ``choice``): the first picks the source by the cumulative weights, the second the index. A
        reasoning-gym source of size ``S`` and probability ``p`` is in epoch ``floor(step · n · p / S)``
        (it moves to the next seed after about ``S`` draws) and draws ``index = floor(u · S)`` with replacement;
        a JSONL source draws uniformly among its non-held-out lines.

        Args:
            step: the training step (int >= 0).
            n: how many refs (int >= 0).
            stream: an extra stream id (int >= 0), e.g. to give nodes of one swarm different questions for
                the same step; ``0`` by default.

        Returns:
            ``n`` TaskRefs (repeats are possible: draws are with replacement), every one accepted by
            :meth:`contains`.
        """
        for what, v in (("step", step), ("n", n), ("stream", stream)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{what} must be an int >= 0, got {v!r}")
        step, n, stream = int(step), int(n), int(stream)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([_STREAM_TAG, self.seed, step, stream])))
        u = rng.random((n, 2))
        src = np.searchsorted(self._cum, u[:, 0], side="right")
        src = np.minimum(src, len(self.sources) - 1)
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
                refs.append(TaskRef(s.source_id, s.config_digest, epoch_seed[i], idx))
            else:
                train = self._jsonl_train[i]
                if train is None or len(train) == 0:  # pragma: no cover - holdout < 1 keeps >= 1 line
                    raise ValueError(f"JSONL source {s!r} has no training lines")
                k = min(int(u[j, 1] * len(train)), len(train) - 1)
                refs.append(TaskRef(s.source_id, "", 0, int(train[k])))
        return refs

    def eval_refs(self, n: int | None = None) -> list[TaskRef]:
        """The held-out TaskRefs: distinct, deterministic given ``eval_seed``, disjoint from training.

        ``n`` (default ``eval_size``) is split across sources in proportion to the weights (largest remainder,
        ties to the earlier source); a JSONL source gives at most its held-out lines and the rest goes to the
        other sources. A reasoning-gym source contributes indices ``0..k-1`` of dataset seed ``eval_seed``.
        Refs are grouped by source in config order. Fewer than ``n`` refs come back only when every source is
        exhausted (e.g. a JSONL-only mix with a small file).
        """
        n = self.eval_size if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        cap = []
        for i, s in enumerate(self.sources):
            cap.append(s.size if isinstance(s, ReasoningGymSource) else len(self._jsonl_eval[i]))
        alloc = [0] * len(self.sources)
        active = [i for i in range(len(self.sources)) if cap[i] > 0]
        while active:
            remaining = n - sum(alloc)
            if remaining <= 0:
                break
            wsum = sum(self.weights[i] for i in active)
            raw = {i: remaining * self.weights[i] / wsum for i in active}
            quota = {i: int(math.floor(raw[i])) for i in active}
            left = remaining - sum(quota.values())
            for i in sorted(active, key=lambda i: (-(raw[i] - quota[i]), i))[:left]:
                quota[i] += 1
            for i in active:
                alloc[i] += min(quota[i], cap[i] - alloc[i])
            active = [i for i in active if alloc[i] < cap[i]]
        refs: list[TaskRef] = []
        for i, s in enumerate(self.sources):
            if isinstance(s, ReasoningGymSource):
                refs.extend(TaskRef(s.source_id, s.config_digest, self.eval_seed, k) for k in range(alloc[i]))
            else:
                held = self._jsonl_eval[i]
                refs.extend(TaskRef(s.source_id, "", 0, int(held[k])) for k in range(alloc[i]))
        return refs

    # ------------------------------------------------------------------ membership and tasks
    def source_for(self, ref: TaskRef) -> Source | None:
        """The source that ``ref`` names (by source id and config digest), or ``None``."""
        if not isinstance(ref, TaskRef):
            return None
        i = self._by_key.get((ref.source, ref.config_digest))
        return None if i is None else self.sources[i]

    def is_eval(self, ref: TaskRef) -> bool:
        """True when ``ref`` is in the held-out set of this mix (any index the held-out split can produce)."""
        if not isinstance(ref, TaskRef):
            return False
        i = self._by_key.get((ref.source, ref.config_digest))
        if i is None or not isinstance(ref.seed, int) or not isinstance(ref.index, int):
            return False
        s = self.sources[i]
        if isinstance(s, ReasoningGymSource):
            return ref.seed == self.eval_seed and 0 <= ref.index < s.size
        return ref.seed == 0 and ref.index in self._jsonl_eval_set[i]

    def contains(self, ref: Any, *, include_eval: bool = False) -> bool:
        """True when ``ref`` is a task the training stream of this mix can produce.

        Checks: ``ref`` is a TaskRef of a known source with the same config digest, its index is in range,
        and its seed is one of that source's training seeds (reasoning-gym) or its line is not held out
        (JSONL; seed must be 0). Held-out refs are rejected unless ``include_eval=True`` -- so a peer cannot
        make this node train on its held-out set. Never raises.
        """
        try:
            if not isinstance(ref, TaskRef):
                return False
            i = self._by_key.get((ref.source, ref.config_digest))
            if i is None:
                return False
            if isinstance(ref.seed, bool) or isinstance(ref.index, bool):
                return False
            if not isinstance(ref.seed, int) or not isinstance(ref.index, int):
                return False
            s = self.sources[i]
            if not s.owns(ref):
                return False
            if include_eval and self.is_eval(ref):
                return True
            if isinstance(s, ReasoningGymSource):
                return self._is_train_seed(i, ref.seed)
            return ref.index not in self._jsonl_eval_set[i]
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

    # ------------------------------------------------------------------ rewards
    def score_detail(self, task: Task, completion: Any) -> dict[str, float]:
        """The reward of ``completion`` and its parts; never raises.

        Returns:
            ``{"correct": c, "format": f, "reward": c + format_reward · f}`` with ``c`` the source's verifier
            score in [0, 1] (0.0 when ``task.ref`` is not from this mix), ``f`` in {0.0, 1.0}
            (:func:`~swarmnode.tasks.verifiers.format_reward`) and ``reward`` in ``[0, 1 + format_reward]``.
        """
        try:
            s = self.source_for(getattr(task, "ref", None))
            correct = float(s.score(task, completion)) if s is not None else 0.0
        except Exception:
            correct = 0.0
        fmt = format_reward(completion)
        return {"correct": correct, "format": fmt, "reward": correct + self.format_reward * fmt}

    def score(self, task: Task, completion: Any) -> float:
        """``score_detail(task, completion)["reward"]``, in ``[0, 1 + format_reward]``; never raises."""
        return self.score_detail(task, completion)["reward"]


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

