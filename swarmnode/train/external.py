"""Which peer trees a step trains on, and the one call that turns them into samples (docs/reference/design.md §5-§6).

A node trains on its own rollouts plus rollouts gossiped by peers (SAPO: I local + J external groups per
step). This module only *selects* and *orchestrates*; each job lives beside the code it belongs with:

* normalization per source: :func:`swarmnode.rollout.advantages.source_advantages` (with the local
  estimators, one floored divisor for both);
* samples, length control and batch composition: :mod:`swarmnode.train.batch`
  (:func:`~swarmnode.train.batch.external_samples`, :func:`~swarmnode.train.batch.compose_batch`);
* off-policy weights: :mod:`swarmnode.train.off_policy` (beside the loss);
* the likelihood screen: :mod:`swarmnode.train.screen`.

**Selection** (:func:`select_external`) is bounded and not steerable by any one publisher:

1. zero-variance groups are dropped first (no signal; SAPO drops zero-advantage rollouts), then stale ones;
2. every surviving tree is **costed in tokens by the samples it expands into** (prompt + kept completion
   per leaf, after the length cap) before anything is decoded; a tree that does not fit what is left of
   ``external.max_external_tokens_per_step`` (all peers together) is skipped;
3. publishers take turns: peers are visited round-robin in an order drawn at random each step, one tree
   per turn, so no key can buy first place; ``contrast`` (highest reward variance first) or ``random``
   ranks trees only *within* one peer; each peer gets at most ``max(1, ceil(max_peer_share * J))`` trees.

Nothing here imports ``swarm``: the swarm layer builds :class:`PeerTree` s (docs/reference/architecture.md).
"""

from __future__ import annotations

import math
import random
import time
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

from swarmnode.rollout.advantages import STD_FLOOR, _std
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.step_credit import StepCredit
from swarmnode.train.batch import _zero_variance, external_samples, leaf_completion_length
from swarmnode.train.off_policy import _check_choice, _ids_match
from swarmnode.train.samples import Sample

if TYPE_CHECKING:
    from swarmnode.config import ExternalConfig

__all__ = ["select_external", "tree_sample_tokens", "process_external"]

_SELECTIONS = ("random", "contrast")


def _as_rng(rng: random.Random | int | None) -> random.Random:
    if isinstance(rng, random.Random):
        return rng
    if rng is None or (isinstance(rng, int) and not isinstance(rng, bool)):
        return random.Random(rng)
    raise TypeError(f"rng must be a random.Random, an int seed or None, got {type(rng).__name__}")


def tree_sample_tokens(
    ext: PeerTree,
    max_len: int | None = None,
    length_policy: Literal["drop", "truncate"] = "drop",
    max_prompt_len: int | None = None,
) -> int:
    """Tokens the trainer would see from ``ext``: the sum over its leaves of (prompt + kept completion).

    A tree is costed by the samples it expands into, not by its bytes: 255 leaves sharing one 16k-token
    segment cost 255 × 16k (measured: docs/lab/benchmarks.md, "Bounded by construction"). Leaves with an empty completion cost 0; with
    ``length_policy="drop"`` a leaf longer than ``max_len`` costs 0 (it will be dropped), with
    ``"truncate"`` it costs ``max_len``. Prompts count at most ``max_prompt_len``. Reads segment lengths
    only; builds no per-leaf list.

    Returns:
        The token count (int >= 0).
    """
    p = len(ext.tree.prompt_ids)
    if max_prompt_len is not None:
        p = min(p, max_prompt_len)
    total = 0
    for lid in ext.tree.leaves():
        n = leaf_completion_length(ext.tree, lid)
        if n == 0:
            continue
        if max_len is not None and n > max_len:
            if length_policy == "drop":
                continue
            n = max_len
        total += p + n
    return total


def select_external(
    candidates: Sequence[PeerTree],
    num_external: int,
    selection: Literal["random", "contrast"],
    max_peer_share: float,
    rng: random.Random | int | None = None,
    *,
    current_version: int | None = None,
    max_staleness: int | None = None,
    our_model_id: str | None = None,
    stats: dict[str, Any] | None = None,
    max_tokens: int | None = None,
    max_len: int | None = None,
    length_policy: Literal["drop", "truncate"] = "drop",
    max_prompt_len: int | None = None,
    max_age_seconds: float | None = None,
    now: float | None = None,
) -> list[PeerTree]:
    """Pick at most ``num_external`` external groups for this step (SAPO's J; docs/reference/design.md §5).

    Order of filters:

    1. **Zero-variance groups are dropped first** (fewer than two leaves, or unbiased reward std
       ``<= ZERO_STD_ATOL``): every per-source advantage would be 0 — SAPO drops zero-advantage rollouts.
    2. **Stale groups** are dropped: when the producer's ``model_id`` equals ``our_model_id`` (both
       non-empty) and ``current_version - policy_version > max_staleness`` (config ``external.max_staleness``).
       Versions of a different model are not comparable and are never called stale. Skipped when
       ``current_version`` or ``max_staleness`` is ``None``. The version is the producer's signed *claim*;
       the bound a peer cannot lie about is the receiver's own clock: a tree whose body arrived more than
       ``max_age_seconds`` before ``now`` (``PeerTree.received_at``, set by our verification pipeline; config
       ``external.max_age_seconds``) is stale whatever version it claims. Trees with ``received_at == 0`` (built
       outside the swarm layer) skip that check.
    3. **Ranking within each peer**: ``contrast`` orders a peer's trees by reward variance, highest first
       (ties at random); ``random`` shuffles them (SAPO's uniform sampling).
    4. **Round-robin over peers**: the peers are ordered by a random key drawn from ``rng`` (a new order
       every call), and take turns, one tree per turn. A peer with
       ``max(1, ceil(max_peer_share * num_external))`` trees is done (its other trees count as
       ``select/dropped_peer_cap``). So a 2-leaf ``[1, 0]`` tree (the highest variance there is) wins
       nothing over other peers' trees: ranking never crosses publishers (Sybil keys: docs/lab/benchmarks.md, "Sybil keys").
    5. **Token budget** (``max_tokens``, config ``external.max_external_tokens_per_step``): a tree whose
       :func:`tree_sample_tokens` exceeds what is left is skipped (``select/dropped_token_budget``), costed
       before anything is decoded.

    Args:
        candidates: re-verified external trees.
        num_external: groups wanted (int >= 0).
        selection: ``"random"`` or ``"contrast"``.
        max_peer_share: one peer's cap as a share of ``num_external``, in (0, 1].
        rng: a ``random.Random`` (used in place), an int seed, or ``None`` (fresh entropy).
        current_version, max_staleness, our_model_id: the staleness filter on the claimed version.
        max_age_seconds, now: the staleness filter on the receiver-measured arrival time (seconds; ``now``
            defaults to ``time.time()``).
        stats: optional dict updated in place with counts ``select/candidates``,
            ``select/dropped_zero_variance``, ``select/dropped_stale``, ``select/dropped_peer_cap``,
            ``select/dropped_token_budget``, ``select/selected``, ``select/peer_cap``, ``select/peers``
            (distinct publishers among the selected), ``select/tokens`` (their cost).
        max_tokens: token budget for all selected trees together (None: unbounded).
        max_len, length_policy, max_prompt_len: how trees will be cut into samples (for the cost; see
            :func:`tree_sample_tokens`).

    Returns:
        The chosen trees in selection order (a new list; the inputs are not modified).

    Raises:
        ValueError / TypeError: a bad argument (the message names it and what was expected), or a
            candidate with an unscored leaf.
    """
    if isinstance(num_external, bool) or not isinstance(num_external, int) or num_external < 0:
        raise ValueError(f"num_external must be an int >= 0, got {num_external!r}")
    _check_choice("selection", selection, _SELECTIONS)
    if not isinstance(max_peer_share, (int, float)) or not 0 < max_peer_share <= 1:
        raise ValueError(f"max_peer_share must be in (0, 1], got {max_peer_share!r}")
    if max_staleness is not None and (not isinstance(max_staleness, int) or max_staleness < 0):
        raise ValueError(f"max_staleness must be an int >= 0 or None, got {max_staleness!r}")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0):
        raise ValueError(f"max_tokens (external.max_external_tokens_per_step) must be an int >= 0 or None, got {max_tokens!r}")
    if max_age_seconds is not None and not (isinstance(max_age_seconds, (int, float)) and max_age_seconds > 0):
        raise ValueError(f"max_age_seconds (external.max_age_seconds) must be > 0 or None, got {max_age_seconds!r}")
    now = time.time() if now is None else float(now)
    gen = _as_rng(rng)
    for i, c in enumerate(candidates):
        if not isinstance(c, PeerTree):
            raise TypeError(f"candidates[{i}] is a {type(c).__name__}, expected a PeerTree")

    # tolerance: 0.3 * 10 == 3.0000000000000004 must give 3, not 4
    peer_cap = max(1, math.ceil(max_peer_share * num_external - 1e-9))
    n_zero = n_stale = n_cap = n_budget = 0
    by_peer: dict[str, list[tuple[PeerTree, float]]] = {}
    for c in candidates:
        rewards = c.rewards()
        if _zero_variance(rewards):
            n_zero += 1
            continue
        if (
            current_version is not None
            and max_staleness is not None
            and _ids_match(c.model_id, our_model_id)
            and current_version - c.policy_version > max_staleness
        ) or (max_age_seconds is not None and c.received_at > 0 and now - c.received_at > max_age_seconds):
            n_stale += 1
            continue
        by_peer.setdefault(c.peer_id, []).append((c, _std(rewards) ** 2))

    queues: list[list[PeerTree]] = []
    keys = {p: gen.random() for p in sorted(by_peer)}  # sorted first: the order depends on rng only
    for p in sorted(by_peer, key=lambda q: keys[q]):
        items = by_peer[p]
        gen.shuffle(items)  # random order; for contrast it breaks variance ties at random (sort is stable)
        if selection == "contrast":
            items.sort(key=lambda cv: cv[1], reverse=True)
        queues.append([c for c, _ in items])

    chosen: list[PeerTree] = []
    taken = [0] * len(queues)
    left = max_tokens
    used_tokens = 0
    active = list(range(len(queues)))
    while active and len(chosen) < num_external:
        nxt: list[int] = []
        for qi in active:
            if len(chosen) >= num_external:
                nxt.append(qi)
                break
            q = queues[qi]
            if taken[qi] >= peer_cap:
                continue  # this peer is done; its other trees are counted below
            while q:
                c = q.pop(0)
                cost = tree_sample_tokens(c, max_len, length_policy, max_prompt_len)
                if left is not None and cost > left:
                    n_budget += 1
                    continue
                if left is not None:
                    left -= cost
                used_tokens += cost
                chosen.append(c)
                taken[qi] += 1
                break
            if q:
                nxt.append(qi)
        active = nxt
    n_cap = sum(len(q) for q, t in zip(queues, taken) if t >= peer_cap)  # skipped because of the per-peer cap

    if stats is not None:
        stats.update(
            {
                "select/candidates": len(candidates),
                "select/dropped_zero_variance": n_zero,
                "select/dropped_stale": n_stale,
                "select/dropped_peer_cap": n_cap,
                "select/dropped_token_budget": n_budget,
                "select/selected": len(chosen),
                "select/peer_cap": peer_cap,
                "select/peers": len({c.peer_id for c in chosen}),
                "select/tokens": used_tokens,
            }
        )
    return chosen


def process_external(
    candidates: Sequence[PeerTree],
    external_cfg: ExternalConfig,
    *,
    current_version: int,
    our_model_id: str,
    our_tokenizer_id: str,
    local_rewards_by_task: Mapping[Any, Sequence[float]] | None = None,
    scale_rewards: Literal["group", "batch", "none"] = "group",
    rng: random.Random | int | None = None,
    max_completion_length: int | None = None,
    max_prompt_length: int | None = None,
    std_floor: float = STD_FLOOR,
    step_credit: StepCredit | None = None,
    local_bonus_by_task: Mapping[Any, Sequence[float]] | None = None,
) -> tuple[list[Sample], dict[str, Any]]:
    """:func:`select_external` then :func:`~swarmnode.train.batch.external_samples` with an ``ExternalConfig``.

    Uses ``num_external``, ``selection``, ``max_peer_share``, ``max_staleness``, ``normalization``,
    ``max_external_completion_length``, ``external_length_policy``, ``max_external_tokens_per_step`` and
    ``off_policy`` of ``external_cfg`` (the ``external`` section, a :class:`swarmnode.config.ExternalConfig`).
    The completion cap ``L`` is ``external_cfg.max_external_completion_length`` (a validated ``RunConfig``
    derives it from ``sampling.max_completion_length`` when unset); a standalone section that leaves it
    ``None`` uses ``max_completion_length``: external samples are never longer than ours unless configured.
    The caller then screens them (:mod:`swarmnode.train.screen`) and runs
    :func:`~swarmnode.train.batch.compose_batch` with ``external_cfg.max_external_share``. ``step_credit`` (our
    checks of the selected completions' lines) and ``local_bonus_by_task`` are passed through to
    ``external_samples``, with ``external_cfg.screen.admit_step_form`` (admission by step form: the screen then
    skips the samples marked ``admitted_by_form``).

    Returns:
        ``(external samples, metrics)`` — the selection and sample metrics merged, plus
        ``external/max_completion_length`` (the L applied; -1 = none).
    """
    m: dict[str, Any] = {}
    max_len = external_cfg.max_external_completion_length or max_completion_length
    policy = external_cfg.external_length_policy
    chosen = select_external(
        candidates,
        external_cfg.num_external,
        external_cfg.selection,
        external_cfg.max_peer_share,
        rng,
        current_version=current_version,
        max_staleness=external_cfg.max_staleness,
        max_age_seconds=external_cfg.max_age_seconds,
        our_model_id=our_model_id,
        stats=m,
        max_tokens=external_cfg.max_external_tokens_per_step,
        max_len=max_len,
        length_policy=policy,
        max_prompt_len=max_prompt_length,
    )
    samples, sm = external_samples(
        chosen,
        normalization=external_cfg.normalization,
        local_rewards_by_task=local_rewards_by_task,
        max_len=max_len,
        length_policy=policy,
        off_policy=external_cfg.off_policy,
        our_model_id=our_model_id,
        our_tokenizer_id=our_tokenizer_id,
        scale_rewards=scale_rewards,
        max_prompt_len=max_prompt_length,
        std_floor=std_floor,
        step_credit=step_credit,
        local_bonus_by_task=local_bonus_by_task,
        admit_step_form=external_cfg.screen.admit_step_form,
    )
    m.update(sm)
    m["external/max_completion_length"] = max_len if max_len is not None else -1
    return samples, m
