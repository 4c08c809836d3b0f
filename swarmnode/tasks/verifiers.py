"""Reward functions shared by every task source: answer extraction, math equivalence, format reward.

Every function here takes *untrusted* text -- the policy's own output or a peer's completion -- and
**never raises**: ``None``, bytes, empty strings, megabytes of junk, lone surrogates, nested or unbalanced
tags all give ``None`` / ``0.0``.

Conventions (the answer-tag format is reasoning-gym's ``SYSTEM_PROMPTS["default"]``; see
``reasoning_gym.utils.extract_answer``):

* The answer is the text between the **last** ``</answer>`` and the nearest ``<answer>`` before it,
  stripped. If that span itself contains an ``<answer>`` / ``</answer>`` tag the output is malformed and
  there is no answer (this is stricter than reasoning-gym's regex, which returns ``"<answer>5"`` for
  ``"<answer><answer>5</answer></answer>"``).
* Math equivalence is Hugging Face Math-Verify (``math_verify.parse`` / ``math_verify.verify``, gold first;
  https://github.com/huggingface/Math-Verify) with an exact-string fallback.

Time limits: a hostile answer can make a verifier run for a very long time (reasoning-gym's ``countdown``
feeds the answer to ``sympy.parse_expr``, so ``9**9**9**9`` runs until interrupted). :func:`time_limit`
bounds such calls with ``SIGALRM``; signals only work on the main thread, so **off the main thread there
is no time bound** and only the length caps (:data:`MAX_ANSWER_CHARS`, :data:`MAX_MATH_CHARS`) protect
the caller. Score peers' completions on the main thread (or in a worker process) when that matters.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

logger = logging.getLogger(__name__)

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

#: Answers longer than this (characters) are not scored at all (score 0).
MAX_ANSWER_CHARS = 20_000
#: Answers longer than this (characters) skip Math-Verify's sympy parsing; only exact match can score.
MAX_MATH_CHARS = 1_000
#: Seconds allowed for one Math-Verify ``parse``/``verify`` call on the main thread (Math-Verify takes ints).
MATH_VERIFY_TIMEOUT_S = 2


class VerifierTimeout(BaseException):
    """Raised inside a verifier call by :func:`time_limit` when its time is up.

    A ``BaseException`` (not ``Exception``) so that a verifier's own ``except Exception`` cannot swallow it.
    """


def in_main_thread() -> bool:
    """True when called on the interpreter's main thread (where ``signal.alarm``/``setitimer`` work)."""
    return threading.current_thread() is threading.main_thread()


@contextmanager
def time_limit(seconds: float | None) -> Iterator[bool]:
    """Bound the wall-clock time of the ``with`` body; raises :class:`VerifierTimeout` when it is exceeded.

    Uses ``signal.setitimer(ITIMER_REAL)`` + ``SIGALRM``, so it only acts on the main thread of a POSIX
    process. It nests with an outer real-time timer (e.g. pytest-timeout's): when the outer one would fire
    first it is left alone and the body runs under it only; otherwise ours is armed and, on exit, the outer
    handler is restored and the outer timer re-armed with its remaining time.

    Yields ``True`` when our limit is armed, ``False`` when it is not (``seconds`` is None/<=0, not the main
    thread, no ``SIGALRM`` on this platform, or an outer timer fires sooner).

    Do not nest it around code that itself uses ``signal.alarm`` (Math-Verify does): that code cancels the
    timer on exit.
    """
    armed = False
    prev_handler: Any = None
    prev_delay = prev_interval = 0.0
    t0 = 0.0
    if seconds is not None and seconds > 0 and hasattr(signal, "setitimer") and in_main_thread():

        def _on_alarm(signum, frame):  # noqa: ARG001
            raise VerifierTimeout(f"verifier exceeded {seconds} s")

        try:
            prev_handler = signal.signal(signal.SIGALRM, _on_alarm)
            t0 = time.monotonic()
            prev_delay, prev_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
            if 0 < prev_delay <= seconds:  # the outer timer fires first: give it back untouched
                signal.setitimer(signal.ITIMER_REAL, prev_delay, prev_interval)
                signal.signal(signal.SIGALRM, prev_handler)
            else:
                armed = True
        except (ValueError, OSError):  # pragma: no cover - platform without usable signals
            armed = False
    try:
        yield armed
    finally:
        if armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, prev_handler)
            if prev_delay > 0:
                left = max(prev_delay - (time.monotonic() - t0), 1e-3)
                signal.setitimer(signal.ITIMER_REAL, left, prev_interval)


def extract_answer(text: Any) -> str | None:
    """The stripped content of the last ``<answer>…</answer>`` in ``text``; ``None`` if there is none.

    Args:
        text: a completion (``str``). Anything else (``None``, bytes, numbers) gives ``None``.

    Returns:
        The content between the last ``</answer>`` and the nearest preceding ``<answer>``, stripped of
        surrounding whitespace; may be ``""`` for ``<answer></answer>``. ``None`` when there is no closing
        tag, no opening tag before it, or the span contains another answer tag (nested/unbalanced tags).
        Answers longer than :data:`MAX_ANSWER_CHARS` characters also give ``None``. Never raises.
    """
    try:
        if not isinstance(text, str):
            return None
        end = text.rfind(ANSWER_CLOSE)
        if end < 0:
            return None
        start = text.rfind(ANSWER_OPEN, 0, end)
        if start < 0:
            return None
        inner = text[start + len(ANSWER_OPEN) : end]
        # "<answer>1</answer></answer>" and nested "<answer><answer>5</answer></answer>" both leave a closing
        # tag inside the span (the last </answer> pairs with the nearest <answer>): malformed.
        if ANSWER_CLOSE in inner:
            return None
        inner = inner.strip()
        if len(inner) > MAX_ANSWER_CHARS:
            return None
        return inner
    except Exception:  # pragma: no cover - defensive: str methods do not raise here
        return None


def format_reward(text: Any) -> float:
    """1.0 when ``text`` obeys the answer format rule, else 0.0. Never raises.

    The rule (the task's answer format, applied to our own and to peers' completions alike): exactly one
    ``<answer>`` and exactly one ``</answer>`` in the whole text, the opening tag first, non-whitespace content
    between them, and **nothing but whitespace after** ``</answer>``. Text before the pair (reasoning) is
    allowed. Text after the answer is not: it is not part of any answer, and a format that let it through
    would train arbitrary trailing text with the full advantage of a correct answer. A final EOS token is
    not text: callers score the completion without it (``swarm/verify.py`` strips one final EOS id before
    decoding). Non-``str`` input gives 0.0. (DeepSeek-R1 / Open-R1's ``format_reward``, reduced to the
    answer tag that reasoning-gym's default system prompt asks for.)
    """
    try:
        if not isinstance(text, str):
            return 0.0
        if text.count(ANSWER_OPEN) != 1 or text.count(ANSWER_CLOSE) != 1:
            return 0.0
        start = text.find(ANSWER_OPEN)
        end = text.find(ANSWER_CLOSE)
        if end < start:
            return 0.0
        inner = text[start + len(ANSWER_OPEN) : end]
        if text[end + len(ANSWER_CLOSE) :].strip():
            return 0.0
        return 1.0 if inner.strip() else 0.0
    except Exception:  # pragma: no cover - defensive
        return 0.0


def clamp01(x: Any) -> float:
    """``x`` as a float clipped to [0, 1]; NaN, non-numbers and errors give 0.0. Never raises."""
    try:
        v = float(x)
    except Exception:
        return 0.0
    if math.isnan(v):
        return 0.0
    return min(1.0, max(0.0, v))


def _exact(gold: str, pred: str) -> bool:
    return gold.strip() == pred.strip()


def math_verify_score(gold: Any, pred: Any) -> float:
    """1.0 when ``pred`` is mathematically equivalent to ``gold``, else 0.0. Never raises.

    Algorithm: exact string match (after stripping) scores 1.0 at once; otherwise both strings go through
    ``math_verify.parse`` with its default extraction (LaTeX + plain expressions), and
    ``math_verify.verify(gold, pred)`` decides (gold first: the check is not symmetric). So ``"\\frac{1}{2}"``
    vs ``"0.5"`` scores 1.0. When either side parses to nothing, only the exact match counts.

    Args:
        gold: the ground-truth answer string (trusted, from the task).
        pred: the extracted answer string (untrusted).

    Time: on the main thread Math-Verify's own ``signal.alarm`` timeouts apply
    (:data:`MATH_VERIFY_TIMEOUT_S` per call); on other threads they are disabled
    (``parsing_timeout=None``, ``timeout_seconds=None``) because ``signal`` only works on the main thread, and
    ``pred`` longer than :data:`MAX_MATH_CHARS` is never parsed (exact match only).
    """
    try:
        if not isinstance(gold, str) or not isinstance(pred, str):
            return 0.0
        if not gold.strip() or not pred.strip():
            return 0.0
        if _exact(gold, pred):
            return 1.0
        if len(pred) > MAX_MATH_CHARS or len(gold) > 4 * MAX_MATH_CHARS:
            return 0.0
        from math_verify import parse, verify

        t = MATH_VERIFY_TIMEOUT_S if in_main_thread() else None
        g = parse(gold, parsing_timeout=t)
        if not g:
            return 0.0
        p = parse(pred, parsing_timeout=t)
        if not p:
            return 0.0
        return 1.0 if verify(g, p, timeout_seconds=t) else 0.0
    except BaseException as e:  # noqa: BLE001 - includes Math-Verify's TimeoutException and RecursionError
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        logger.debug("math_verify_score failed: %r", e)
        return 0.0
