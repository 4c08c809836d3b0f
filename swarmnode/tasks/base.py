"""Task identity and the task interface shared by every task source.

A :class:`TaskRef` names one task so that *any* node can regenerate the exact question and ground truth
locally (docs/reference/design.md §4): reasoning-gym datasets are deterministic given (name, config, seed), and a JSONL
file is named by its SHA-256. Shared rollouts carry TaskRefs, never a trusted answer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, order=True)
class TaskRef:
    """Names one task reproducibly.

    Attributes:
        source: the task source id: ``"rg:<dataset name>"`` for reasoning-gym, ``"jsonl:<sha256 of file>"``
            for a JSONL file.
        config_digest: hex SHA-256 (first 16 chars) of the canonical JSON of the source's config
            (``""`` for JSONL, whose digest is already in ``source``).
        seed: the dataset seed (int, >= 0).
        index: the item index inside the seeded dataset (int, >= 0).
    """

    source: str
    config_digest: str
    seed: int
    index: int

    def key(self) -> str:
        """A compact printable id, e.g. ``rg:chain_sum/1a2b3c4d5e6f7a8b/7/42``."""
        return f"{self.source}/{self.config_digest}/{self.seed}/{self.index}"

    def to_list(self) -> list:
        """The wire form ``[source, config_digest, seed, index]``."""
        return [self.source, self.config_digest, self.seed, self.index]

    @classmethod
    def from_list(cls, v: list) -> "TaskRef":
        """Inverse of :meth:`to_list`. Raises ``ValueError`` on a wrong shape or types."""
        if not isinstance(v, (list, tuple)) or len(v) != 4:
            raise ValueError(f"TaskRef must be a 4-item list, got {type(v).__name__}")
        s, d, seed, idx = v
        if not isinstance(s, str) or not isinstance(d, str):
            raise ValueError("TaskRef source and config_digest must be strings")
        if isinstance(seed, bool) or isinstance(idx, bool) or not isinstance(seed, int) or not isinstance(idx, int):
            raise ValueError("TaskRef seed and index must be integers")
        if seed < 0 or idx < 0:
            raise ValueError("TaskRef seed and index must be >= 0")
        return cls(s, d, seed, idx)


def config_digest(config: dict[str, Any]) -> str:
    """Hex SHA-256 (first 16 chars) of the canonical JSON (sorted keys, no spaces) of ``config``."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass
class Task:
    """One regenerated task: what the policy is asked and what the verifier checks against.

    Attributes:
        ref: the TaskRef that regenerates it.
        question: the question text shown to the policy.
        answer: the ground-truth answer string (never taken from a peer).
        metadata: source-specific data needed by the verifier (e.g. reasoning-gym's entry metadata).
        name: a short task-family name for per-task metrics (e.g. ``"chain_sum"``).
    """

    ref: TaskRef
    question: str
    answer: str
    metadata: dict[str, Any] = field(default_factory=dict)
    name: str = ""


class TaskSource(Protocol):
    """What the node needs from a source of verifiable tasks."""

    source_id: str

    def get(self, ref: TaskRef) -> Task:
        """Regenerate the task named by ``ref``. Raises ``KeyError`` if ``ref`` is not from this source."""

    def score(self, task: Task, completion: str) -> float:
        """Reward in [0, 1] for a completion text; never raises on any model output."""


class Scorer(Protocol):
    """The scoring seam: what the verification pipeline (``swarm/verify.py``) and the node need to regenerate a
    task from its :class:`TaskRef` and re-score a completion. :class:`swarmnode.tasks.mix.TaskMix` implements it.
    """

    format_reward: float
    """Weight of the format term of the local reward, in [0, 1] (``tasks.format_reward``)."""

    def contains(self, ref: TaskRef) -> bool:
        """Whether ``ref`` names a training task of this task set (a peer's tree for any other task is refused)."""
        ...

    def get(self, ref: TaskRef) -> Task:
        """Regenerate the task named by ``ref``. Raises ``KeyError`` if it is not from this task set."""
        ...

    def score(self, task: Task, completion: str) -> float:
        """The local reward of a completion text (never raises on any model output)."""
        ...

    def score_detail(self, task: Task, completion: str) -> dict[str, float]:
        """``{"correct", "format", "reward"}`` of a completion text (exact correctness, format bonus, reward)."""
        ...

    def rescore(self, task: Task, completion: str) -> dict[str, float]:
        """``{"correct", "partial", "format"}`` of a completion text from one verifier call: exact correctness,
        the source's raw score in [0, 1], the format rule in {0, 1} (both correctness values 0 when it fails).
        Re-scoring a peer's leaf and held-out evaluation use it; never raises."""
        ...
