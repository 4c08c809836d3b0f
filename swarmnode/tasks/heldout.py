"""The held-out set of a task mix: the walk that finds held-out questions, their share per source, and
the test of a held-out ref (docs/reference/design.md §6 step 6; the split itself is
:func:`~swarmnode.tasks.partition.is_heldout_question`, by question content).

:class:`HeldOutSet` is a mixin of :class:`~swarmnode.tasks.mix.TaskMix`: it reads the mix's sources, weights,
``eval_seed``, ``eval_fraction``, ``eval_size`` and the per-source walk state that the mix's constructor sets up
(``_eval_found``, ``_eval_seen``, ``_eval_pos``, ``_eval_done``, ``_jsonl_eval``), and calls the mix's
``get``, ``_well_formed``, ``_is_train_seed`` and ``_split``.

The walk of a reasoning-gym source of size ``S`` visits items ``0, 1, 2, …`` of dataset seed ``eval_seed``, then
``eval_seed + S``, ``eval_seed + 2S``, …, keeping held-out questions that are new by normalized content and that
the source's answer balance accepts, until it has what was asked for or the source's held-out space looks
exhausted (no new question in ``max(2000, 20 / eval_fraction)`` draws in a row, or :data:`MAX_EVAL_SCAN` draws).
A JSONL source's held-out set is its held-out lines in file order, computed once by the mix.
"""

from __future__ import annotations

import logging
import math

from swarmnode.tasks.base import TaskRef
from swarmnode.tasks.jsonl_source import JsonlSource
from swarmnode.tasks.partition import is_heldout_question, normalize_question
from swarmnode.tasks.reasoning_gym_source import ReasoningGymSource

# the task mix's logger: the walk's messages are the mix's (log filters name it)
log = logging.getLogger("swarmnode.tasks.mix")

#: Most draws one held-out walk of a source makes (stops earlier when it has enough questions).
MAX_EVAL_SCAN = 1_000_000


class HeldOutSet:
    """The held-out half of :class:`~swarmnode.tasks.mix.TaskMix` (a mixin; see the module docstring)."""

    def _eval_patience(self) -> int:
        return max(2000, int(math.ceil(20 / self.eval_fraction)))

    def _eval_extend(self, i: int, k: int) -> None:
        """Walk reasoning-gym source ``i``'s held-out seeds until it has ``k`` distinct questions or is exhausted."""
        s = self.sources[i]
        found, seen = self._eval_found[i], self._eval_seen[i]
        patience = self._eval_patience()
        since_new = 0
        while len(found) < k and not self._eval_done[i]:
            pos = self._eval_pos[i]
            if pos >= MAX_EVAL_SCAN or since_new >= patience:
                self._eval_done[i] = True
                break
            ref = TaskRef(s.source_id, s.config_digest, self.eval_seed + (pos // s.size) * s.size, pos % s.size)
            self._eval_pos[i] = pos + 1
            task = self.get(ref)
            q = task.question
            since_new += 1
            if not is_heldout_question(q, self.eval_fraction) or not s.accepts(task):
                continue
            key = normalize_question(q)
            if key in seen:
                continue
            seen.add(key)
            found.append(ref)
            since_new = 0
        if self._eval_done[i] and len(found) < k:
            log.info("held-out walk of %s found %d distinct held-out questions (asked for %d): the task's "
                     "question space is small", s.source_id, len(found), k)

    def _eval_capacity(self, i: int, k: int) -> int:
        """How many distinct held-out refs source ``i`` can give, looking for at most ``k``."""
        if isinstance(self.sources[i], JsonlSource):
            return min(k, len(self._jsonl_eval[i]))
        self._eval_extend(i, k)
        return min(k, len(self._eval_found[i]))

    def eval_refs(self, n: int | None = None) -> list[TaskRef]:
        """The held-out TaskRefs: questions of the held-out partition, distinct by normalized content.

        ``n`` (default ``eval_size``) is split across sources in proportion to the weights (largest remainder,
        ties to the earlier source); a source whose held-out space holds fewer distinct questions gives them
        all and the rest goes to the other sources. A reasoning-gym source contributes the first held-out
        questions of its walk (items ``0, 1, …`` of seed ``eval_seed``, see the module docstring); a JSONL
        source its held-out lines in file order. A source with ``max_answer_share`` skips the questions its
        answer balance rejects, as its training stream does (:meth:`is_balanced`). Refs are grouped by source
        in config order; a question that two sources share counts once (the earlier source keeps it). Fewer
        than ``n`` refs come back only when every source's held-out space is exhausted (small task spaces or
        small files).

        Deterministic: a pure function of the sources, ``eval_seed``, ``eval_fraction`` and ``n``.

        Raises:
            ValueError: ``n`` not an int >= 0.
        """
        n = self.eval_size if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        alloc = [0] * len(self.sources)
        full = [False] * len(self.sources)
        while True:
            active = [i for i in range(len(self.sources)) if not full[i]]
            remaining = n - sum(alloc)
            if remaining <= 0 or not active:
                break
            wsum = sum(self.weights[i] for i in active)
            raw = {i: remaining * self.weights[i] / wsum for i in active}
            quota = {i: int(math.floor(raw[i])) for i in active}
            left = remaining - sum(quota.values())
            for i in sorted(active, key=lambda i: (-(raw[i] - quota[i]), i))[:left]:
                quota[i] += 1
            for i in active:
                want = alloc[i] + quota[i]
                got = self._eval_capacity(i, want)
                if got < want:
                    full[i] = True
                alloc[i] = got
        refs: list[TaskRef] = []
        seen: set[str] = set()
        for i, s in enumerate(self.sources):
            if isinstance(s, ReasoningGymSource):
                mine = self._eval_found[i][: alloc[i]]
            else:
                mine = [TaskRef(s.source_id, "", 0, int(line)) for line in self._jsonl_eval[i][: alloc[i]]]
            for r in mine:
                key = normalize_question(self.get(r).question)
                if key not in seen:
                    seen.add(key)
                    refs.append(r)
        return refs

    def is_eval(self, ref: TaskRef) -> bool:
        """True when ``ref`` names a held-out question: a well-formed ref of this mix whose question is in the
        held-out partition, with a seed of the held-out walk (``eval_seed + k·S``, within the walk's reach)
        or of the training schedule (reasoning-gym), or seed 0 (JSONL), and that its source's answer balance
        accepts (:meth:`is_balanced`; the held-out set never holds a rejected question). Never raises."""
        try:
            i = self._well_formed(ref)
            if i is None:
                return False
            s = self.sources[i]
            if isinstance(s, ReasoningGymSource):
                d = ref.seed - self.eval_seed
                walk = d >= 0 and d % s.size == 0 and d // s.size <= MAX_EVAL_SCAN // s.size
                if not walk and not self._is_train_seed(i, ref.seed):
                    return False
            held, balanced = self._split(ref)
            return held and balanced
        except Exception:
            return False
