"""The branching rules of the tree sampler as pure functions (docs/reference/design.md §5; docs/reference/references.md
§1.1, §1.2, §1.4).

:func:`swarmnode.rollout.sampler.sample_rollouts` decides, after every segment, how many paths continue and where
new branches start; the arithmetic and the choices it makes are here, free of engines and trees, so that each rule
can be tested on its own:

* :func:`treepo_total_copies` -- TreePO's budget transfer (how many paths continue);
* :func:`split_copies` -- ``uniform`` branching: the copies spread over the live paths at a segment boundary;
* :func:`surprisal_fork_points` -- ``surprisal`` branching (TreeRL/EPTree): the most surprising tokens;
* :func:`step_fork_points` -- ``step`` branching: the ends of reasoning steps, one row at a time;
* :func:`lookahead_alternative` -- ``lookahead`` branching (LATR): the near-tie test and the token a branch takes;
* :func:`near_duplicate` / :func:`prune_near_duplicates` -- LATR's pruning of a branch that repeats its sibling.

The sampler's module docstring (``rollout/sampler.py``) says how the rules fit together.
"""

from __future__ import annotations

import difflib
from typing import Sequence

import torch

__all__ = [
    "treepo_total_copies",
    "split_copies",
    "surprisal_fork_points",
    "step_fork_points",
    "lookahead_alternative",
    "near_duplicate",
    "prune_near_duplicates",
]


def treepo_total_copies(width: int, finished_total: int, finished_now: int, live: int, branching_factor: int) -> int:
    """TreePO budget transfer (docs/reference/references.md §1.1 step 4): how many paths continue after this step.

    ``remaining = max(width - finished_total, 0)``; ``total = max(min(remaining, b*finished_now + b*live), live)``.
    ``finished_total`` includes ``finished_now``. Returns 0 when ``live == 0``.

    Example: width 8, nothing finished, 2 live, b=2 -> 4 (each path forks in two).
    """
    if live <= 0:
        return 0
    remaining = max(width - finished_total, 0)
    return max(min(remaining, branching_factor * finished_now + branching_factor * live), live)


def split_copies(total: int, n_paths: int, generator: torch.Generator | None = None) -> list[int]:
    """Spread ``total`` continuations over ``n_paths`` live paths: ``floor(total/n)`` each (>= 1), the remainder
    one each to randomly chosen paths (drawn with ``generator``; first paths when it is ``None``).

    Raises:
        ValueError: ``total < n_paths`` (every live path continues at least once).
    """
    if n_paths == 0:
        return []
    if total < n_paths:
        raise ValueError(f"total copies {total} < live paths {n_paths}")
    base, rem = divmod(total, n_paths)
    out = [base] * n_paths
    if rem:
        # the permutation is drawn on the generator's own device: a CUDA generator (the sampler's RNG on a GPU
        # node, see ``rollout.generate.device_generator``) cannot drive a CPU randperm
        order = (torch.randperm(n_paths, generator=generator, device=generator.device).tolist()
                 if generator is not None else list(range(n_paths)))
        for i in order[:rem]:
            out[i] += 1
    return out


def surprisal_fork_points(
    surprisals: Sequence[Sequence[float]],
    eligible: Sequence[Sequence[bool]],
    n: int,
) -> list[tuple[int, int]]:
    """TreeRL/EPTree fork selection (docs/reference/references.md §1.2 step 2): the ``n`` eligible tokens with the highest
    surprisal ``-log p(sampled token)`` across all given segments.

    Args:
        surprisals: per segment, per token surprisal (nats).
        eligible: same shape; ``False`` excludes a token (a branch's first token, inside/after the answer).
        n: forks wanted (>= 0).

    Returns:
        ``(segment index, token offset)`` pairs, highest surprisal first; ties go to the earlier segment, then
        the earlier token. Fewer than ``n`` when fewer tokens are eligible.
    """
    if len(surprisals) != len(eligible):
        raise ValueError("surprisals and eligible must have one entry per segment")
    cands = []
    for si, (ss, ee) in enumerate(zip(surprisals, eligible)):
        if len(ss) != len(ee):
            raise ValueError(f"segment {si}: {len(ss)} surprisals but {len(ee)} eligibility flags")
        for ti, (s, e) in enumerate(zip(ss, ee)):
            if e:
                cands.append((-float(s), si, ti))
    cands.sort()
    return [(si, ti) for _, si, ti in cands[: max(n, 0)]]


def step_fork_points(
    boundaries: Sequence[Sequence[int]],
    n: int,
) -> list[tuple[int, int]]:
    """Step-boundary fork selection (``tree.branching: step``): ``n`` fork points among the step ends of this step's
    segments, one row at a time.

    Args:
        boundaries: per segment (row), the eligible fork points -- completion indices right after a token that
            ends a reasoning step -- in any order.
        n: forks wanted (>= 0).

    Returns:
        ``(segment index, fork point)`` pairs: round-robin over the segments in order, each segment's latest step
        end first (the fork shares the longest prefix), then its next latest, ... Fewer than ``n`` when fewer
        points are eligible.
    """
    per = [sorted(set(int(k) for k in b), reverse=True) for b in boundaries]
    out: list[tuple[int, int]] = []
    depth = 0
    while len(out) < n and any(depth < len(b) for b in per):
        for si, b in enumerate(per):
            if depth < len(b) and len(out) < n:
                out.append((si, b[depth]))
        depth += 1
    return out


def lookahead_alternative(
    top2_ids: Sequence[int],
    top2_probs: Sequence[float],
    sampled: int,
    tau_abs: float,
    tau_rel: float,
) -> int | None:
    """LATR's branch test (docs/reference/references.md §1.4 step 2): branch when ``p2 > tau_abs`` and ``p1 - p2 < tau_rel``.

    Args:
        top2_ids: the two most likely token ids (untempered softmax), most likely first.
        top2_probs: their probabilities ``(p1, p2)``.
        sampled: the token the path sampled at this position.
        tau_abs, tau_rel: thresholds.

    Returns:
        The token the new branch takes -- the second-ranked token, or the first-ranked one when the path itself
        sampled the second -- or ``None`` when the test fails.
    """
    (i1, i2), (p1, p2) = top2_ids, top2_probs
    if not (p2 > tau_abs and p1 - p2 < tau_rel):
        return None
    return int(i1) if int(sampled) == int(i2) else int(i2)


def near_duplicate(a: str, b: str, threshold: float) -> bool:
    """True when ``difflib.SequenceMatcher(None, a, b).ratio() >= threshold`` (LATR-style near-duplicate test)."""
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() >= threshold


def prune_near_duplicates(paths: Sequence, decode_text, threshold: float, min_tokens: int) -> int:
    """LATR's lookahead pruning (docs/reference/references.md §1.4 step 6) of the live paths of one decoding step, in place.

    Each path (any object with ``completion: list[int]``, ``born_at: int``, ``ref`` (the sibling it is compared
    with, or ``None``), ``finish_reason`` and ``pruned``) that is a new branch is compared once, as soon as it
    has decoded ``min_tokens`` tokens since it diverged, with its sibling's continuation cut to the same length;
    if :func:`near_duplicate` holds at ``threshold`` it stops with ``finish_reason="pruned"``. A finished
    branch is a result and never pruned. The sampler runs it after every segment, on every engine.

    Args:
        paths: the live paths after a segment was decoded.
        decode_text: ``token ids -> str`` (the tokenizer's decode).
        threshold: ``tree.prune_similarity`` in (0, 1].
        min_tokens: ``tree.prune_min_tokens`` (LATR's r), >= 1.

    Returns:
        The number of paths pruned.
    """
    pruned = 0
    for pp in paths:
        ref = pp.ref
        if ref is None:
            continue
        if pp.finish_reason is not None:
            pp.ref = None  # a finished branch is a result, never pruned
            continue
        mine = pp.completion[pp.born_at:]
        if len(mine) < min_tokens:
            continue
        pp.ref = None
        theirs = ref.completion[pp.born_at:] if len(ref.completion) > pp.born_at else []
        n = min(len(mine), len(theirs))
        if n == 0 or ref.completion[: pp.born_at] != pp.completion[: pp.born_at]:
            continue
        if near_duplicate(decode_text(mine[:n]), decode_text(theirs[:n]), threshold):
            pp.finish_reason = "pruned"
            pp.pruned = True
            pruned += 1
    return pruned
