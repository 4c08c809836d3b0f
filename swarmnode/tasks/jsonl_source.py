"""Tasks from a JSONL file of question/answer pairs, scored with Math-Verify.

Each non-blank line is a JSON object ``{"question": str, "answer": str, "metadata": {...}?}`` (other keys are
ignored; a numeric ``answer`` is accepted and turned into a string). The file is named by the SHA-256 of its
bytes (docs/reference/design.md §4): ``source_id = "jsonl:<64 hex>"``, so a node can only verify a JSONL task when it holds
the very same file, and any edit to the file makes a new source.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from swarmnode.tasks.base import Task, TaskRef
from swarmnode.tasks.verifiers import extract_answer, math_verify_score


class JsonlFormatError(ValueError):
    """A JSONL task file is unreadable or malformed; the message names the file and the 1-based line."""


class JsonlSource:
    """Question/answer pairs from a JSONL file as a task source.

    Indexing: ``index`` counts task lines from 0 in file order, blank lines skipped (error messages use
    1-based *file* line numbers). Every TaskRef of this source has ``config_digest == ""`` and ``seed == 0``:
    one canonical ref per task line, so duplicates cannot hide behind other seeds. ``ref(seed, index)`` uses
    the seed only to permute the order in which a stream walks the file (seed 0 = file order); the returned
    ref still carries seed 0 and the chosen line.

    Scoring: the last ``<answer>…</answer>`` of the completion against the file's answer with
    :func:`~swarmnode.tasks.verifiers.math_verify_score` (Math-Verify, gold first, exact-string fallback).

    Args:
        path: the JSONL file.
        name: short task-family name for metrics; default the file's stem.

    Attributes:
        path: resolved ``Path`` of the file.
        sha256: hex SHA-256 of the file bytes.
        source_id: ``"jsonl:" + sha256``.
        config_digest: ``""``.
        name: task-family name.

    Raises:
        JsonlFormatError (a ``ValueError``): missing/unreadable file, invalid UTF-8 or JSON, a line that is not
            an object, a missing or non-string ``question``/``answer``, non-object ``metadata``, or no task
            lines at all. The message names the file and the line.
    """

    config_digest = ""

    def __init__(self, path: str | Path, name: str | None = None) -> None:
        p = Path(path).expanduser().resolve()
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            raise JsonlFormatError(f"JSONL task file {p} does not exist") from None
        except OSError as e:
            raise JsonlFormatError(f"JSONL task file {p} cannot be read: {e}") from None
        self.path = p
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.source_id = f"jsonl:{self.sha256}"
        self.name = name or p.stem
        self._items: list[tuple[str, str, dict[str, Any]]] = []
        for lineno, raw in enumerate(data.split(b"\n"), start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise JsonlFormatError(f"{p}:{lineno}: not valid UTF-8 ({e})") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise JsonlFormatError(f"{p}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise JsonlFormatError(
                    f"{p}:{lineno}: expected a JSON object with 'question' and 'answer', got {type(obj).__name__}"
                )
            for key in ("question", "answer"):
                if key not in obj:
                    raise JsonlFormatError(f"{p}:{lineno}: missing key {key!r} (expected 'question' and 'answer')")
            q, a = obj["question"], obj["answer"]
            if not isinstance(q, str) or not q.strip():
                raise JsonlFormatError(f"{p}:{lineno}: 'question' must be a non-empty string, got {q!r:.60}")
            if isinstance(a, bool) or not isinstance(a, (str, int, float)):
                raise JsonlFormatError(
                    f"{p}:{lineno}: 'answer' must be a string (or a number), got {type(a).__name__}"
                )
            a = str(a)
            if not a.strip():
                raise JsonlFormatError(f"{p}:{lineno}: 'answer' is empty")
            meta = obj.get("metadata", {})
            if meta is None:
                meta = {}
            if not isinstance(meta, dict):
                raise JsonlFormatError(f"{p}:{lineno}: 'metadata' must be an object, got {type(meta).__name__}")
            self._items.append((q, a, meta))
        if not self._items:
            raise JsonlFormatError(f"JSONL task file {p} has no task lines (expected one JSON object per line)")

    def __len__(self) -> int:
        """Number of task lines."""
        return len(self._items)

    def __repr__(self) -> str:
        return f"JsonlSource({str(self.path)!r}, {len(self)} tasks, sha256={self.sha256[:12]}…)"

    def ref(self, seed: int, index: int) -> TaskRef:
        """The TaskRef of the ``index``-th task of the order given by ``seed``.

        ``seed == 0`` is file order; any other seed walks the lines in the permutation
        ``numpy.random.default_rng(seed).permutation(len(self))``. The ref always stores seed 0 and the line.

        Raises:
            ValueError: non-int arguments, ``seed < 0`` or ``index`` outside ``[0, len(self))``.
        """
        for what, v in (("seed", seed), ("index", index)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{what} must be an int, got {type(v).__name__}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if not 0 <= index < len(self):
            raise ValueError(f"index must be in [0, {len(self)}) for {self.path.name}, got {index}")
        line = index if seed == 0 else int(np.random.default_rng(seed).permutation(len(self))[index])
        return TaskRef(self.source_id, "", 0, line)

    def owns(self, ref: TaskRef) -> bool:
        """True when ``ref`` is a canonical ref of this file (source id, empty digest, seed 0, valid index)."""
        return (
            isinstance(ref, TaskRef)
            and ref.source == self.source_id
            and ref.config_digest == ""
            and ref.seed == 0
            and isinstance(ref.index, int)
            and 0 <= ref.index < len(self)
        )

    def get(self, ref: TaskRef) -> Task:
        """The task on line ``ref.index``.

        Raises:
            KeyError: ``ref`` names another file, has a non-empty config digest, a seed other than 0, or an
                index outside ``[0, len(self))``.
        """
        if not isinstance(ref, TaskRef):
            raise KeyError(f"expected a TaskRef, got {type(ref).__name__}")
        if ref.source != self.source_id:
            raise KeyError(f"TaskRef source {ref.source!r} is not this file ({self.path.name}, {self.source_id})")
        if ref.config_digest != "":
            raise KeyError(f"TaskRef {ref.key()}: a JSONL ref has an empty config digest")
        if ref.seed != 0:
            raise KeyError(f"TaskRef {ref.key()}: a JSONL ref has seed 0 (got {ref.seed})")
        if not isinstance(ref.index, int) or not 0 <= ref.index < len(self):
            raise KeyError(f"TaskRef {ref.key()} index is out of range [0, {len(self)}) of {self.path.name}")
        q, a, meta = self._items[ref.index]
        return Task(ref=ref, question=q, answer=a, metadata=dict(meta), name=self.name)

    def score(self, task: Task, completion: Any, *, partial_credit: bool = False) -> float:
        """Correctness reward in {0.0, 1.0} (always exact; ``partial_credit`` is accepted and has no effect);
        never raises.

        The gold answer is read again from the file via ``task.ref`` (never from ``task.answer``); the
        prediction is the last ``<answer>…</answer>`` of ``completion`` (no tag: 0.0); equivalence is
        :func:`~swarmnode.tasks.verifiers.math_verify_score` (so ``0.5`` matches ``\\frac{1}{2}``).
        """
        try:
            if not self.owns(task.ref):
                return 0.0
            pred = extract_answer(completion)
            if not pred:
                return 0.0
            gold = self._items[task.ref.index][1]
            return math_verify_score(gold, pred)
        except Exception:
            return 0.0

    def score_raw(self, task: Task, completion: Any) -> float:
        """Same as :meth:`score` (a JSONL answer is right or wrong: there is no partial credit)."""
        return self.score(task, completion)
