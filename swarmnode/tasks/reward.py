"""The reward of a task mix: the answer format rule plus the source's correctness
(docs/reference/design.md §6).

``reward = correct + format_reward · format`` where ``format`` is the answer format rule
(:func:`~swarmnode.tasks.verifiers.format_reward` in {0, 1}: one ``<answer>…</answer>``, nothing but
whitespace after it) and ``correct`` is **exact** -- 1 only when the source's verifier gives a full score of
1.0, else 0; and 0 whenever the format rule fails -- unless ``tasks.partial_credit`` keeps the raw score for
local rewards (never for a peer's leaves); the total lies in ``[0, 1 + format_reward]`` (the format term is an
*extra* reward, as in DeepSeek-R1's rule-based rewards).
:meth:`TaskMix.score_detail` keeps the two parts apart; compare ``correct`` (not the total) when
re-scoring a peer's claim, since ``format_reward`` is a local setting.

:class:`MixRewards` is a mixin of :class:`~swarmnode.tasks.mix.TaskMix`: it reads the mix's ``format_reward`` and
``partial_credit`` and calls its ``source_for``.
"""

from __future__ import annotations

import math
from typing import Any

from swarmnode.tasks.base import Task
from swarmnode.tasks.reasoning_gym_source import EXACT_TOL
from swarmnode.tasks.verifiers import format_reward


class MixRewards:
    """The scoring half of :class:`~swarmnode.tasks.mix.TaskMix` (a mixin; see the module docstring)."""

    def score_detail(self, task: Task, completion: Any, *, external: bool = False) -> dict[str, float]:
        """The reward of ``completion`` and its parts; never raises.

        Args:
            task: the regenerated task (its ``ref`` picks the source; the gold answer is regenerated from it).
            completion: the completion text (untrusted; without a final EOS token).
            external: ``True`` when re-scoring a peer's leaf: correctness is then always exact, whatever
                ``partial_credit`` says.

        Returns:
            ``{"correct": c, "format": f, "reward": c + format_reward · f}`` with ``f`` in {0.0, 1.0} the answer
            format rule (:func:`~swarmnode.tasks.verifiers.format_reward`: one ``<answer>…</answer>``, nothing
            but whitespace after it) and ``c`` the source's correctness: exact (1.0 only for a full score of
            1.0, else 0.0) unless ``partial_credit`` is on and ``external`` is False. A completion that breaks
            the format rule gets ``c = 0`` and ``reward = 0`` (text outside the answer format is not free).
            ``c`` is 0.0 when ``task.ref`` is not from this mix; ``reward`` lies in ``[0, 1 + format_reward]``.
        """
        d = self.rescore(task, completion)
        correct = d["partial"] if (self.partial_credit and not external) else d["correct"]
        return {"correct": correct, "format": d["format"], "reward": correct + self.format_reward * d["format"]}

    def rescore(self, task: Task, completion: Any) -> dict[str, float]:
        """Both correctness readings of ``completion`` from one verifier call; never raises.

        Returns:
            ``{"correct": exact correctness, "partial": the source's raw score in [0, 1], "format": f}``, both
            correctness values 0.0 when the format rule fails (``f == 0``). The verifier (``swarm/verify.py``)
            trains on ``correct`` and accepts a peer's claim of either reading (a peer with
            ``tasks.partial_credit`` on claims its local partial rewards).
        """
        fmt = format_reward(completion)
        raw = 0.0
        if fmt > 0:
            try:
                s = self.source_for(getattr(task, "ref", None))
                if s is not None:
                    raw = float(s.score_raw(task, completion)) if hasattr(s, "score_raw") else float(
                        s.score(task, completion))
                    if not math.isfinite(raw):
                        raw = 0.0
                    raw = min(1.0, max(0.0, raw))
            except Exception:
                raw = 0.0
        exact = 1.0 if raw >= 1.0 - EXACT_TOL else 0.0
        return {"correct": exact, "partial": raw, "format": fmt}

    def score(self, task: Task, completion: Any) -> float:
        """``score_detail(task, completion)["reward"]``, in ``[0, 1 + format_reward]``; never raises."""
        return self.score_detail(task, completion)["reward"]
