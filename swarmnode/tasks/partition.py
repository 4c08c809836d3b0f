"""Train / held-out partition of a task space **by question content**.

A different dataset seed is not a different question: a small task space (two one-digit terms has about
242 distinct questions) draws the same questions under any seed. So the held-out set is defined by the
question itself: a question belongs to the held-out partition when the SHA-256 of its normalized text falls
below ``eval_fraction`` of the hash range. The rule is a pure function of the text, so every node (and the
model builder in ``scripts/build_tiny_model.py``) agrees on it without coordination, and no training draw
can ever yield a held-out question, whatever its seed or index.

Normalization: Unicode NFKC, lower case, every run of whitespace collapsed to one space, stripped. Two
questions that differ only in spacing or case are the same question.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

#: Domain-separation tag of the partition hash; changing it re-draws every partition.
PARTITION_TAG = b"swarmnode-heldout-v1\x00"

#: Default share of each task's question space that is held out (10%).
DEFAULT_EVAL_FRACTION = 0.1

_WS = re.compile(r"\s+")


def normalize_question(question: str) -> str:
    """The canonical form of a question text used for partitioning and copy detection.

    Args:
        question: any question text.

    Returns:
        NFKC-normalized, lower-cased text with whitespace runs collapsed to one space, stripped.

    Raises:
        TypeError: ``question`` is not a ``str``.
    """
    if not isinstance(question, str):
        raise TypeError(f"question must be a str, got {type(question).__name__}")
    return _WS.sub(" ", unicodedata.normalize("NFKC", question).lower()).strip()


def question_hash(question: str) -> float:
    """Position of a question in [0, 1): the first 8 bytes of SHA-256(tag + normalized text) / 2**64."""
    digest = hashlib.sha256(PARTITION_TAG + normalize_question(question).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def is_heldout_question(question: str, eval_fraction: float = DEFAULT_EVAL_FRACTION) -> bool:
    """Whether ``question`` is in the held-out partition (never trained on, by any node).

    Args:
        question: the question text as the task source generates it.
        eval_fraction: share of the question space held out, in (0, 1).

    Raises:
        ValueError: ``eval_fraction`` not in (0, 1).
        TypeError: ``question`` is not a ``str``.
    """
    if not 0.0 < float(eval_fraction) < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction!r}")
    return question_hash(question) < float(eval_fraction)
