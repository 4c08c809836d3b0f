"""Source-specific processing of external (peer) rollouts (design.md §5, last bullet; references.md §3).

A node trains on its own rollouts plus rollouts gossiped by peers (SAPO: I local + J external groups per
step). External rollouts come from *another* policy, so they are processed separately from local ones:

1. **Selection** (:func:`select_external`): one candidate is one :class:`PeerTree` — one peer's group
   of leaves for one task, already re-verified (every leaf reward is the receiver's own re-score).
   Zero-variance groups are dropped first (no signal; SAPO drops zero-advantage rollouts), then stale
   groups, then ``contrast`` (highest reward variance first) or ``random`` (uniform) picks at most
   ``num_external`` groups with a per-peer cap.
2. **Normalization** (:func:`external_samples`): ``per_source`` (ERILS arXiv 2608.01717 as summarized in
   references.md §3.2; SAPO arXiv 2509.08721 by construction) z-scores every external group within its own
   source (producing peer + task): ``A_i = (r_i - mean) / (std + 1e-4)``. ``joint`` pools the external
   leaves of a task with the local leaves of the same task (LUFFY arXiv 2504.14945's advantage) — kept
   only for the ablation: joint processing collapsed training in ERILS.
   **Std convention:** unbiased (Bessel, ``n - 1``), i.e. ``torch.Tensor.std`` with its default, which is
   what TRL's ``GRPOTrainer`` uses (``rewards.view(-1, G).std(dim=1)``); a single value has std 0.
3. **Length control**: completions longer than ``max_external_completion_length`` are dropped or truncated
   (the first L tokens kept, the rest cut off) — ERILS: uncontrolled long external traces degrade training.
4. **Off-policy correction** (:func:`external_token_loss`, :func:`off_policy_token_weights`): ``none``
   (SAPO: ratio 1), ``luffy`` (LUFFY policy shaping f(π) = π/(π+γ), no clip), ``tis`` (truncated importance
   sampling, Yao et al. 2025, only when the producer's model and tokenizer ids equal ours).
5. **Batch composition** (:func:`compose_batch`): the external share of a batch is capped (SAPO: 4/4 best,
   2/6 oscillated); zero-advantage external samples are dropped first; per-source metrics.

Nothing here imports ``swarm``: the swarm layer builds :class:`PeerTree` s (design.md §3).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence

import torch

from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import TaskRef
from swarmnode.train.samples import Sample

__all__ = [
    "ADV_EPS",
    "ZERO_STD_ATOL",
    "select_external",
    "external_samples",
    "joint_task_stats",
    "effective_off_policy_mode",
    "off_policy_token_weights",
    "external_token_loss",
    "compose_batch",
    "external_cap",
    "process_external",
]

ADV_EPS = 1e-4
"""Added to the std in ``A = (r - mean) / (std + ADV_EPS)`` (design.md §5; TRL's value)."""

ZERO_STD_ATOL = 1e-8
"""A group whose unbiased reward std is at most this carries no signal (same threshold as
:mod:`swarmnode.rollout.advantages`, TRL's ``torch.isclose(std, 0)``)."""

_ZERO_ADV_ATOL = 1e-12
_SELECTIONS = ("random", "contrast")
_NORMALIZATIONS = ("per_source", "joint")
_LENGTH_POLICIES = ("drop", "truncate")
_OFF_POLICY_MODES = ("none", "luffy", "tis")
_SCALE_REWARDS = ("group", "batch", "none")


# ------------------------------------------------------------------------------------------ stats
# mean and unbiased std (``torch.std`` default, TRL's convention) are the estimators' own helpers
from swarmnode.rollout.advantages import _mean, _std  # noqa: E402


def _zero_variance(xs: Sequence[float]) -> bool:
    return len(xs) < 2 or _std(xs) <= ZERO_STD_ATOL


def _ids_match(theirs: str, ours: str | None) -> bool:
    """Ids match only when both are known (non-empty) and equal."""
    return bool(theirs) and bool(ours) and theirs == ours


def _as_rng(rng: random.Random | int | None) -> random.Random:
    if isinstance(rng, random.Random):
        return rng
    if rng is None or (isinstance(rng, int) and not isinstance(rng, bool)):
        return random.Random(rng)
    raise TypeError(f"rng must be a random.Random, an int seed or None, got {type(rng).__name__}")


def _check_choice(name: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


# ------------------------------------------------------------------------------------------ selection
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
) -> list[PeerTree]:
    """Pick at most ``num_external`` external groups for this step (SAPO's J; design.md §5).

    Order of filters:

    1. **Zero-variance groups are dropped first** (fewer than two leaves, or unbiased reward std
       ``<= ZERO_STD_ATOL``): every per-source advantage would be 0 — SAPO drops zero-advantage rollouts.
    2. **Stale groups** are dropped: when the producer's ``model_id`` equals ``our_model_id`` (both
       non-empty) and ``current_version - policy_version > max_staleness`` (config ``swarm.max_staleness``;
       prime-rl drops episodes more than 8 steps old). Versions of a different model are not comparable
       and are never called stale. Skipped when ``current_version`` or ``max_staleness`` is ``None``.
    3. **Ranking**: ``contrast`` orders by reward variance, highest first, ties broken at random;
       ``random`` is a uniform shuffle of the survivors (SAPO's uniform sampling).
    4. **Per-peer cap**: walking the ranking, a group is skipped when its peer already has
       ``max(1, ceil(max_peer_share * num_external))`` groups; stops at ``num_external``.

    Args:
        candidates: re-verified external trees.
        num_external: groups wanted (int >= 0).
        selection: ``"random"`` or ``"contrast"``.
        max_peer_share: one peer's cap as a share of ``num_external``, in (0, 1].
        rng: a ``random.Random`` (used in place), an int seed, or ``None`` (fresh entropy).
        current_version: our policy version (optimizer step), for the staleness filter.
        max_staleness: drop same-model groups more than this many versions old.
        our_model_id: our model id, for the staleness filter.
        stats: optional dict updated in place with counts ``select/candidates``,
            ``select/dropped_zero_variance``, ``select/dropped_stale``, ``select/dropped_peer_cap``
            (survivors skipped because of the per-peer cap), ``select/selected``, ``select/peer_cap``.

    Returns:
        The chosen trees in rank order (a new list; the inputs are not modified).

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
    gen = _as_rng(rng)
    for i, c in enumerate(candidates):
        if not isinstance(c, PeerTree):
            raise TypeError(f"candidates[{i}] is a {type(c).__name__}, expected a PeerTree")

    # tolerance: 0.3 * 10 == 3.0000000000000004 must give 3, not 4
    peer_cap = max(1, math.ceil(max_peer_share * num_external - 1e-9))
    n_zero = n_stale = n_cap = 0
    scored: list[tuple[PeerTree, float]] = []
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
        ):
            n_stale += 1
            continue
        scored.append((c, _std(rewards) ** 2))

    gen.shuffle(scored)  # random order; for contrast it breaks variance ties at random (sort is stable)
    if selection == "contrast":
        scored.sort(key=lambda cv: cv[1], reverse=True)

    chosen: list[PeerTree] = []
    per_peer: dict[str, int] = {}
    for c, _ in scored:
        if len(chosen) >= num_external:
            break
        if per_peer.get(c.peer_id, 0) >= peer_cap:
            n_cap += 1
            continue
        per_peer[c.peer_id] = per_peer.get(c.peer_id, 0) + 1
        chosen.append(c)

    if stats is not None:
        stats.update(
            {
                "select/candidates": len(candidates),
                "select/dropped_zero_variance": n_zero,
                "select/dropped_stale": n_stale,
                "select/dropped_peer_cap": n_cap,
                "select/selected": len(chosen),
                "select/peer_cap": peer_cap,
            }
        )
    return chosen


# ------------------------------------------------------------------------------------------ samples
def _local_rewards_for(local_rewards_by_task: Mapping[Any, Sequence[float]] | None, task: TaskRef) -> list[float]:
    if not local_rewards_by_task:
        return []
    vals = local_rewards_by_task.get(task.key())
    if vals is None:
        vals = local_rewards_by_task.get(task)
    if vals is None:
        return []
    out = [float(v) for v in vals]
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"local_rewards_by_task[{task.key()!r}] holds a non-finite reward")
    return out


def joint_task_stats(
    selected: Sequence[PeerTree],
    local_rewards_by_task: Mapping[Any, Sequence[float]] | None,
) -> dict[str, tuple[float, float, int]]:
    """Pooled reward statistics per task for ``joint`` normalization (ablation only).

    For each task key present in ``selected``: the pool is every leaf reward of every selected external
    tree of that task (all peers) plus ``local_rewards_by_task[task]``. Use it to normalize the *local*
    leaves with the same statistics when running the joint ablation end to end.

    Returns:
        ``{task_key: (mean, unbiased std, pool size)}``.
    """
    pools: dict[str, list[float]] = {}
    tasks: dict[str, TaskRef] = {}
    for ext in selected:
        pools.setdefault(ext.task_key, []).extend(ext.rewards())
        tasks[ext.task_key] = ext.tree.task
    out = {}
    for key, pool in pools.items():
        full = pool + _local_rewards_for(local_rewards_by_task, tasks[key])
        out[key] = (_mean(full), _std(full), len(full))
    return out


@dataclass
class _Leaf:
    ext: PeerTree
    leaf: int
    reward: float
    completion: list[int]
    logprobs: list[float] | None
    truncated: bool


def external_samples(
    selected: Sequence[PeerTree],
    normalization: Literal["per_source", "joint"] = "per_source",
    local_rewards_by_task: Mapping[Any, Sequence[float]] | None = None,
    max_len: int | None = None,
    length_policy: Literal["drop", "truncate"] = "drop",
    off_policy: Literal["none", "luffy", "tis"] = "none",
    our_model_id: str | None = None,
    our_tokenizer_id: str | None = None,
    scale_rewards: Literal["group", "batch", "none"] = "group",
) -> tuple[list[Sample], dict[str, Any]]:
    """Turn selected external trees into trainer Samples with source-specific advantages.

    **Length control first** (ERILS: ``A_i = Norm_source(R_i)`` over leaves with ``|y_i| <= L``): with
    ``max_len = L`` set, a completion longer than L is dropped (``"drop"``; it leaves its group before
    normalization) or truncated (``"truncate"``: the first L tokens are kept with loss mask 1 and the rest is
    cut off; the leaf keeps its verified reward and ``Sample.truncated = True``).

    **Normalization** (each leaf's advantage is broadcast to all its completion tokens):

    * ``per_source``: group = (producing peer, task); ``A = (r - mean_g) / (std_g + 1e-4)`` over the
      group's remaining leaves (several trees of the same peer and task are pooled). ``std`` is the
      unbiased std (``torch.std`` default, as TRL). A group left with zero variance (or < 2 leaves) after
      length control yields no samples (counted).
    * ``joint`` (ablation): group = task; the pool is the remaining external leaves of the task (all
      peers) plus ``local_rewards_by_task[task key]`` (keys: ``TaskRef.key()`` strings or TaskRefs);
      ``A = (r - mean_pool) / (std_pool + 1e-4)``.
    * ``scale_rewards``: ``"group"`` as above; ``"batch"`` divides by the unbiased std of every reward in
      every pool of the call (TRL's batch scaling; mean still per group); ``"none"`` only centres.

    **Ids**: ``behaviour_logprobs`` are kept only when the producer's model id and tokenizer id equal
    ours (both non-empty), ``same_tokenizer`` is true and every segment on the leaf's path has them;
    otherwise ``None``. With ``off_policy="tis"`` each sample without them will fall back to ``none``
    in :func:`external_token_loss` — counted as ``external/tis_fallback_samples``.

    Args:
        selected: output of :func:`select_external`.
        normalization, local_rewards_by_task, max_len, length_policy, off_policy, our_model_id,
            our_tokenizer_id, scale_rewards: as above (config keys ``swarm.normalization``,
            ``swarm.max_external_completion_length``, ``swarm.external_length_policy``, ``swarm.off_policy``,
            ``train.scale_rewards``).

    Returns:
        ``(samples, metrics)``. Samples are in input order, leaf order; each has ``source =
        "external:<peer_id>"``, ``group_id = "<task key>|external:<peer_id>"`` (per_source) or
        ``"<task key>|joint"``, ``model_id`` and ``policy_version`` of the producer. Metrics (ints):
        ``external/groups_in``, ``external/leaves_in``, ``external/samples``, ``external/dropped_overlong``,
        ``external/truncated``, ``external/dropped_empty``, ``external/dropped_zero_variance_groups``,
        ``external/samples_with_behaviour_logprobs``, ``external/tis_fallback_samples``.

    Raises:
        ValueError / TypeError: bad arguments, or a tree with an unscored leaf.
    """
    _check_choice("normalization", normalization, _NORMALIZATIONS)
    _check_choice("length_policy", length_policy, _LENGTH_POLICIES)
    _check_choice("off_policy", off_policy, _OFF_POLICY_MODES)
    _check_choice("scale_rewards", scale_rewards, _SCALE_REWARDS)
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
        raise ValueError(f"max_len (swarm.max_external_completion_length) must be an int >= 1 or None, got {max_len!r}")
    for i, e in enumerate(selected):
        if not isinstance(e, PeerTree):
            raise TypeError(f"selected[{i}] is a {type(e).__name__}, expected a PeerTree")

    m = {
        "external/groups_in": len(selected),
        "external/leaves_in": 0,
        "external/samples": 0,
        "external/dropped_overlong": 0,
        "external/truncated": 0,
        "external/dropped_empty": 0,
        "external/dropped_zero_variance_groups": 0,
        "external/samples_with_behaviour_logprobs": 0,
        "external/tis_fallback_samples": 0,
    }

    # 1. collect leaves with length control, grouped by normalization key
    groups: dict[str, list[_Leaf]] = {}
    group_task: dict[str, TaskRef] = {}
    for ext in selected:
        rewards = ext.rewards()
        keep_lp = (
            ext.same_tokenizer
            and _ids_match(ext.model_id, our_model_id)
            and _ids_match(ext.tokenizer_id, our_tokenizer_id)
        )
        gkey = f"{ext.task_key}|{ext.source}" if normalization == "per_source" else f"{ext.task_key}|joint"
        group_task[gkey] = ext.tree.task
        bucket = groups.setdefault(gkey, [])
        for lid, r in zip(ext.tree.leaves(), rewards):
            m["external/leaves_in"] += 1
            comp = ext.tree.completion_ids(lid)
            lp = ext.tree.completion_logprobs(lid) if keep_lp else None
            if not comp:
                m["external/dropped_empty"] += 1
                continue
            truncated = ext.tree.nodes[lid].finish_reason == "length"
            if max_len is not None and len(comp) > max_len:
                if length_policy == "drop":
                    m["external/dropped_overlong"] += 1
                    continue
                comp = comp[:max_len]
                lp = lp[:max_len] if lp is not None else None
                truncated = True
                m["external/truncated"] += 1
            bucket.append(_Leaf(ext, lid, r, comp, lp, truncated))

    # 2. normalization statistics per group
    stats: dict[str, tuple[float, float]] = {}
    all_rewards: list[float] = []
    for gkey, leaves in groups.items():
        pool = [lf.reward for lf in leaves]
        if normalization == "joint":
            pool = pool + _local_rewards_for(local_rewards_by_task, group_task[gkey])
        stats[gkey] = (_mean(pool), _std(pool))
        all_rewards.extend(pool)
    batch_std = _std(all_rewards)

    # 3. samples
    samples: list[Sample] = []
    for gkey, leaves in groups.items():
        mean, std = stats[gkey]
        if normalization == "per_source" and _zero_variance([lf.reward for lf in leaves]):
            m["external/dropped_zero_variance_groups"] += 1
            continue
        if not leaves:
            continue
        if scale_rewards == "group":
            scale = std + ADV_EPS
        elif scale_rewards == "batch":
            scale = batch_std + ADV_EPS
        else:
            scale = 1.0
        for lf in leaves:
            a = (lf.reward - mean) / scale
            ext = lf.ext
            if lf.logprobs is not None:
                m["external/samples_with_behaviour_logprobs"] += 1
            elif off_policy == "tis":
                m["external/tis_fallback_samples"] += 1
            samples.append(
                Sample(
                    prompt_ids=list(ext.tree.prompt_ids),
                    completion_ids=list(lf.completion),
                    advantages=[a] * len(lf.completion),
                    source=ext.source,
                    behaviour_logprobs=list(lf.logprobs) if lf.logprobs is not None else None,
                    loss_mask=[1] * len(lf.completion),
                    reward=lf.reward,
                    group_id=gkey,
                    policy_version=ext.policy_version,
                    model_id=ext.model_id,
                    truncated=lf.truncated,
                )
            )
    m["external/samples"] = len(samples)
    return samples, m


# ------------------------------------------------------------------------------------------ off-policy
def effective_off_policy_mode(
    mode: Literal["none", "luffy", "tis"],
    *,
    model_id: str,
    tokenizer_id: str,
    our_model_id: str | None,
    our_tokenizer_id: str | None,
    has_behaviour_logprobs: bool,
) -> str:
    """The mode actually applied to one external sample group.

    ``tis`` is only valid when the producer's model id **and** tokenizer id equal ours (both non-empty) and
    behaviour log-probs are present (references.md §3.6: never importance-weight against a foreign model);
    otherwise it falls back to ``none``. ``none`` and ``luffy`` need nothing and are returned unchanged.

    Raises:
        ValueError: unknown ``mode``.
    """
    _check_choice("off_policy", mode, _OFF_POLICY_MODES)
    if mode != "tis":
        return mode
    ok = has_behaviour_logprobs and _ids_match(model_id, our_model_id) and _ids_match(tokenizer_id, our_tokenizer_id)
    return "tis" if ok else "none"


def _check_2d(name: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape [B, T], got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must have shape [B, T], got {tuple(t.shape)}")
    return t


def _check_params(mode: str, gamma: float, cap: float) -> None:
    _check_choice("off_policy mode", mode, _OFF_POLICY_MODES)
    if not isinstance(gamma, (int, float)) or not math.isfinite(gamma) or gamma <= 0:
        raise ValueError(f"gamma (swarm.luffy_gamma) must be a finite float > 0, got {gamma!r}")
    if not isinstance(cap, (int, float)) or not math.isfinite(cap) or cap <= 0:
        raise ValueError(f"cap (swarm.tis_cap) must be a finite float > 0, got {cap!r}")


def _tis_weights(logp: torch.Tensor, behaviour: torch.Tensor, cap: float) -> torch.Tensor:
    """``min(exp(logp - μ), C)``, detached; non-finite ratios: +inf -> C, NaN -> 1 (treated as on-policy)."""
    dt = torch.promote_types(logp.dtype, torch.float32)  # bf16 logits: compute the ratio in fp32
    ratio = torch.exp(logp.detach().to(dt) - behaviour.detach().to(device=logp.device, dtype=dt))
    ratio = torch.nan_to_num(ratio, nan=1.0, posinf=float(cap), neginf=0.0)
    return ratio.clamp(max=float(cap)).to(logp.dtype)


def off_policy_token_weights(
    logp_current: torch.Tensor,
    behaviour_logprobs: torch.Tensor | None,
    mode: Literal["none", "luffy", "tis"],
    gamma: float = 0.1,
    cap: float = 2.0,
    *,
    stats: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, bool]:
    """Per-token weights for the trainer's clipped surrogate hook (``token_weights``), and whether to clip.

    Contract: for external tokens the trainer uses ratio ``ρ = exp(logp - logp.detach())`` (value 1,
    gradient ``∇log π``; SAPO's "old = current.detach()") and computes ``L_t = -w_t · surrogate_t`` where
    ``surrogate_t = min(ρA, clip(ρ)A)`` when ``use_clip`` else ``ρA``. The weights are detached. Then the
    per-token gradient is ``-A · w_t · ∇log π_θ(y_t)`` and:

    * ``none`` (SAPO, arXiv 2509.08721): ``w = 1``, ``use_clip = True`` (the clip never fires at ρ = 1).
    * ``luffy`` (LUFFY policy shaping, arXiv 2504.14945): objective ``-A · f(π)``, ``f(π) = π / (π + γ)``,
      no clip; ``∇f = γπ/(π+γ)² ∇log π`` so ``w = γπ/(π+γ)²`` with ``π = exp(logp)``, ``use_clip = False``.
      The *gradient* matches exactly; the loss *value* then reads ``-A·w`` instead of ``-A·f(π)`` — use
      :func:`external_token_loss` when the value matters.
    * ``tis`` (truncated importance sampling, Yao et al. 2025, fengyao.notion.site/off-policy-rl):
      ``w = min(π_θ/μ, C) = min(exp(logp - μ_logp), C)``, detached, ``use_clip = True``. Without behaviour
      log-probs (``None``: another model or tokenizer) it falls back to ``none`` and
      ``stats["tis_fallback"]`` is incremented. Non-finite ratios: +inf -> C, NaN -> 1.

    Args:
        logp_current: ``[B, T]`` log-probs of the sampled tokens under the current policy (natural log).
        behaviour_logprobs: ``[B, T]`` behaviour log-probs of the same tokens, or ``None``.
        mode: ``"none" | "luffy" | "tis"`` (config ``swarm.off_policy``).
        gamma: LUFFY γ (> 0; config ``swarm.luffy_gamma``, default 0.1).
        cap: TIS cap C (> 0; config ``swarm.tis_cap``, default 2.0).
        stats: optional dict; ``"tis_fallback"`` is incremented on a fallback.

    Returns:
        ``(weights [B, T] detached, same dtype/device as logp_current, use_clip)``.

    Raises:
        TypeError / ValueError: wrong types, shapes, mode, gamma or cap.
    """
    logp = _check_2d("logp_current", logp_current)
    _check_params(mode, gamma, cap)
    if behaviour_logprobs is not None:
        _check_2d("behaviour_logprobs", behaviour_logprobs)
        if behaviour_logprobs.shape != logp.shape:
            raise ValueError(
                f"behaviour_logprobs shape {tuple(behaviour_logprobs.shape)} != logp_current shape {tuple(logp.shape)}"
            )
    if mode == "tis" and behaviour_logprobs is None:
        if stats is not None:
            stats["tis_fallback"] = stats.get("tis_fallback", 0) + 1
        mode = "none"
    if mode == "none":
        return torch.ones_like(logp).detach(), True
    if mode == "luffy":
        p = torch.exp(logp.detach())
        return (gamma * p / (p + gamma) ** 2).detach(), False
    return _tis_weights(logp, behaviour_logprobs, cap), True  # type: ignore[arg-type]


def external_token_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    mode: Literal["none", "luffy", "tis"],
    gamma: float = 0.1,
    cap: float = 2.0,
) -> torch.Tensor:
    """Per-token policy-gradient loss for external samples; value and gradient follow each source exactly.

    With ``ρ = exp(logp - logp.detach())`` (value 1, gradient ``∇log π``), ``π = exp(logp)``:

    * ``none`` — SAPO (arXiv 2509.08721): external rollouts are treated as on-policy, old = current.detach(),
      so ``ℓ_t = -A·ρ`` (value ``-A``, gradient ``-A ∇log π``; a PPO clip never fires at ρ = 1).
    * ``luffy`` — LUFFY (arXiv 2504.14945, ``off_policy_reshape="p_div_p_0.1"``): behaviour probability set
      to 1, policy shaping ``f(π) = π/(π+γ)``, no clip: ``ℓ_t = -A·π/(π+γ)``; its gradient is
      ``-A·γπ/(π+γ)² ∇log π`` (up-weights low-probability tokens).
    * ``tis`` — truncated importance sampling (Yao et al. 2025): ``ℓ_t = -A·w·ρ`` with the detached
      ``w = min(exp(logp - μ), C)``; value ``-A·w``, gradient ``-A·w ∇log π``. Valid only when the producer's
      model and tokenizer equal ours; with ``behaviour_logp=None`` it falls back to ``none`` (see
      :func:`effective_off_policy_mode` and ``external/tis_fallback_samples``).

    Masked positions (``mask == 0``) give exactly 0 loss and 0 gradient, even when their ``logp`` is
    ``-inf`` or garbage padding. The result is *not* aggregated: apply the trainer's ``loss_type``.

    Args:
        logp: ``[B, T]`` float, requires grad: log π_θ of the completion tokens.
        behaviour_logp: ``[B, T]`` behaviour log-probs μ (``tis`` only) or ``None``.
        advantages: ``[B]`` (per sequence) or ``[B, T]`` (per token).
        mask: ``[B, T]`` bool/int/float loss mask.
        mode: ``"none" | "luffy" | "tis"``.
        gamma: LUFFY γ (> 0). cap: TIS cap C (> 0).

    Returns:
        ``[B, T]`` per-token loss, same dtype as ``logp``.

    Raises:
        TypeError / ValueError: wrong types or shapes, unknown mode, bad gamma or cap.
    """
    logp = _check_2d("logp", logp)
    _check_params(mode, gamma, cap)
    mask = _check_2d("mask", mask)
    if mask.shape != logp.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != logp shape {tuple(logp.shape)}")
    if not isinstance(advantages, torch.Tensor):
        raise TypeError(f"advantages must be a torch.Tensor of shape [B] or [B, T], got {type(advantages).__name__}")
    if advantages.dim() == 1 and advantages.shape[0] == logp.shape[0]:
        adv = advantages.unsqueeze(1).expand_as(logp)
    elif advantages.shape == logp.shape:
        adv = advantages
    else:
        raise ValueError(
            f"advantages must have shape [B]={logp.shape[0]} or [B, T]={tuple(logp.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    if behaviour_logp is not None:
        _check_2d("behaviour_logp", behaviour_logp)
        if behaviour_logp.shape != logp.shape:
            raise ValueError(f"behaviour_logp shape {tuple(behaviour_logp.shape)} != logp shape {tuple(logp.shape)}")
    if mode == "tis" and behaviour_logp is None:
        mode = "none"

    active = mask.to(torch.bool)
    adv = adv.detach().to(logp.dtype)
    safe = torch.where(active, logp, torch.zeros_like(logp))  # no inf/nan leaks into masked grads
    ratio = torch.exp(safe - safe.detach())
    if mode == "none":
        loss = -adv * ratio
    elif mode == "luffy":
        p = torch.exp(safe)
        loss = -adv * p / (p + gamma)
    else:
        beh = behaviour_logp.to(device=logp.device, dtype=logp.dtype)  # type: ignore[union-attr]
        beh = torch.where(active, beh, torch.zeros_like(beh))
        w = _tis_weights(safe, beh, cap)
        loss = -adv * w * ratio
    return torch.where(active, loss, torch.zeros_like(loss))


# ------------------------------------------------------------------------------------------ batch
def external_cap(n_local: int, max_external_share: float) -> int:
    """The largest external sample count ``k`` with ``k <= max_external_share * (n_local + k)``.

    ``share = 1`` allows any number; ``share < 1`` gives ``floor(share * n_local / (1 - share))``
    (so with no local samples and share < 1 no external sample fits). Returns ``-1`` for "unbounded".
    """
    if max_external_share >= 1:
        return -1
    k = math.floor(max_external_share * n_local / (1 - max_external_share) + 1e-9)
    while k > 0 and k > max_external_share * (n_local + k) + 1e-12:
        k -= 1
    return max(k, 0)


def _is_zero_advantage(s: Sample) -> bool:
    return all(abs(a) <= _ZERO_ADV_ATOL for a, mk in zip(s.advantages, s.loss_mask) if mk) or not any(s.loss_mask)


def _sample_adv(s: Sample) -> float:
    vals = [a for a, mk in zip(s.advantages, s.loss_mask) if mk]
    return _mean(vals)


def compose_batch(
    local: Sequence[Sample],
    external: Sequence[Sample],
    max_external_share: float,
) -> tuple[list[Sample], dict[str, Any]]:
    """Mix local and external samples with the external share of the batch capped (SAPO; design.md §5).

    1. Zero-advantage external samples (every loss-masked advantage is 0, or no loss token) are dropped
       first — they carry no policy gradient.
    2. The batch never holds more than ``max_external_share`` external samples by count:
       ``n_ext <= max_external_share * (n_local + n_ext)`` (see :func:`external_cap`).
    3. When the cap binds, whole external groups (``group_id``) are taken in the given order (first fit, so
       a smaller later group can fill a gap); remaining room is filled with single samples of the groups
       left, largest |advantage| first (counted as ``batch/partial_groups``).

    Local samples are never dropped. Output order: all local samples, then the chosen external ones in
    input order.

    Args:
        local: samples with ``source == "local"``.
        external: samples with ``source == "external:<peer>"``.
        max_external_share: in [0, 1] (config ``swarm.max_external_share``).

    Returns:
        ``(batch, metrics)``. Metrics: ``batch/samples``, ``batch/local``, ``batch/external``,
        ``batch/external_share``, ``batch/external_cap`` (-1 = unbounded), ``batch/dropped_zero_advantage``,
        ``batch/dropped_cap``, ``batch/partial_groups``; and per source ``S`` (``"local"``,
        ``"external:<peer>"``): ``S/accepted`` (samples offered), ``S/used`` (in the batch),
        ``S/reward_mean``, ``S/adv_mean``, ``S/adv_std`` (over used samples, each sample's mean
        loss-masked advantage; population std; NaN when none used), ``S/tokens`` (loss-masked completion
        tokens used), ``S/zero_std_group_frac`` (offered groups whose rewards all equal).

    Raises:
        ValueError / TypeError: a local sample with an external source or vice versa, a non-Sample, or a
            share outside [0, 1].
    """
    if not isinstance(max_external_share, (int, float)) or not 0 <= max_external_share <= 1:
        raise ValueError(f"max_external_share must be in [0, 1], got {max_external_share!r}")
    for name, seq, want_local in (("local", local, True), ("external", external, False)):
        for i, s in enumerate(seq):
            if not isinstance(s, Sample):
                raise TypeError(f"{name}[{i}] is a {type(s).__name__}, expected a Sample")
            if s.is_local != want_local:
                raise ValueError(
                    f"{name}[{i}] has source {s.source!r}; expected "
                    + ("'local'" if want_local else "'external:<peer id>'")
                )

    nonzero = [(i, s) for i, s in enumerate(external) if not _is_zero_advantage(s)]
    n_zero = len(external) - len(nonzero)
    cap = external_cap(len(local), max_external_share)
    room = len(nonzero) if cap < 0 else min(cap, len(nonzero))

    chosen_idx: set[int] = set()
    partial_groups = 0
    if room >= len(nonzero):
        chosen_idx = {i for i, _ in nonzero}
    else:
        groups: dict[str, list[int]] = {}
        for i, s in nonzero:
            groups.setdefault(f"{s.source}\x00{s.group_id}", []).append(i)
        left: list[list[int]] = []
        for members in groups.values():
            if len(members) <= room - len(chosen_idx):
                chosen_idx.update(members)
            else:
                left.append(members)
        singles = sorted(
            ((i, abs(_sample_adv(external[i]))) for members in left for i in members),
            key=lambda ia: ia[1],
            reverse=True,
        )
        touched: set[str] = set()
        for i, _ in singles:
            if len(chosen_idx) >= room:
                break
            chosen_idx.add(i)
            touched.add(f"{external[i].source}\x00{external[i].group_id}")
        partial_groups = len(touched)

    ext_used = [s for i, s in enumerate(external) if i in chosen_idx]
    batch = list(local) + ext_used
    n_ext = len(ext_used)

    metrics: dict[str, Any] = {
        "batch/samples": len(batch),
        "batch/local": len(local),
        "batch/external": n_ext,
        "batch/external_share": n_ext / len(batch) if batch else 0.0,
        "batch/external_cap": cap,
        "batch/dropped_zero_advantage": n_zero,
        "batch/dropped_cap": len(nonzero) - n_ext,
        "batch/partial_groups": partial_groups,
    }
    metrics.update(_source_metrics(list(local) + list(external), batch))
    return batch, metrics


def _source_metrics(offered: Iterable[Sample], used: Iterable[Sample]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    by_src_off: dict[str, list[Sample]] = {}
    by_src_used: dict[str, list[Sample]] = {}
    for s in offered:
        by_src_off.setdefault(s.source, []).append(s)
    for s in used:
        by_src_used.setdefault(s.source, []).append(s)
    for src, off in by_src_off.items():
        u = by_src_used.get(src, [])
        advs = [_sample_adv(s) for s in u]
        am = _mean(advs) if advs else float("nan")
        groups: dict[str, list[float]] = {}
        for s in off:
            groups.setdefault(s.group_id, []).append(s.reward)
        out[f"{src}/accepted"] = len(off)
        out[f"{src}/used"] = len(u)
        out[f"{src}/reward_mean"] = _mean([s.reward for s in u]) if u else float("nan")
        out[f"{src}/adv_mean"] = am
        out[f"{src}/adv_std"] = math.sqrt(_mean([(a - am) ** 2 for a in advs])) if advs else float("nan")
        out[f"{src}/tokens"] = sum(sum(1 for mk in s.loss_mask if mk) for s in u)
        out[f"{src}/zero_std_group_frac"] = (
            sum(1 for rs in groups.values() if max(rs) - min(rs) <= ZERO_STD_ATOL) / len(groups)
        )
    return out


# ------------------------------------------------------------------------------------------ one call
def process_external(
    candidates: Sequence[PeerTree],
    swarm_cfg: Any,
    *,
    current_version: int,
    our_model_id: str,
    our_tokenizer_id: str,
    local_rewards_by_task: Mapping[Any, Sequence[float]] | None = None,
    scale_rewards: Literal["group", "batch", "none"] = "group",
    rng: random.Random | int | None = None,
) -> tuple[list[Sample], dict[str, Any]]:
    """:func:`select_external` then :func:`external_samples` with the settings of a ``SwarmConfig``.

    Uses ``num_external``, ``selection``, ``max_peer_share``, ``max_staleness``, ``normalization``,
    ``max_external_completion_length``, ``external_length_policy`` and ``off_policy`` of ``swarm_cfg``
    (a :class:`swarmnode.config.SwarmConfig`). The caller then runs :func:`compose_batch` with
    ``swarm_cfg.max_external_share`` and its local samples.

    Returns:
        ``(external samples, metrics)`` — the selection and sample metrics merged.
    """
    m: dict[str, Any] = {}
    chosen = select_external(
        candidates,
        swarm_cfg.num_external,
        swarm_cfg.selection,
        swarm_cfg.max_peer_share,
        rng,
        current_version=current_version,
        max_staleness=swarm_cfg.max_staleness,
        our_model_id=our_model_id,
        stats=m,
    )
    samples, sm = external_samples(
        chosen,
        normalization=swarm_cfg.normalization,
        local_rewards_by_task=local_rewards_by_task,
        max_len=swarm_cfg.max_external_completion_length,
        length_policy=swarm_cfg.external_length_policy,
        off_policy=swarm_cfg.off_policy,
        our_model_id=our_model_id,
        our_tokenizer_id=our_tokenizer_id,
        scale_rewards=scale_rewards,
    )
    m.update(sm)
    return samples, m


def make_token_weight_fn(swarm_cfg: Any, stats: dict[str, Any] | None = None):
    """A ``Trainer.step`` ``token_weight_fn`` applying ``swarm.off_policy`` to external rows only.

    Local rows keep weight 1 (their normal clipped ratio); each external row gets
    :func:`off_policy_token_weights` under ``swarm_cfg.off_policy`` (``luffy_gamma``, ``tis_cap``), with its
    behaviour log-probs when it carries them (``tis`` falls back to ``none`` per row otherwise).

    Returns:
        ``None`` when the mode is ``none`` (nothing to weight), else a callable
        ``(micro_batch_samples, logprobs [b,T] detached, old_logprobs [b,T], loss_mask [b,T]) -> weights [b,T]``.
    """
    mode = swarm_cfg.off_policy
    if mode == "none":
        return None

    def fn(mb, logprobs, old_logprobs, loss_mask):  # noqa: ARG001 - trainer hook signature
        w = torch.ones_like(logprobs)
        for i, s in enumerate(mb):
            if s.is_local:
                continue
            T = len(s.completion_ids)
            lp = logprobs[i : i + 1, :T]
            beh = None
            if s.behaviour_logprobs is not None:
                beh = torch.tensor([s.behaviour_logprobs], dtype=logprobs.dtype, device=logprobs.device)
            wi, _ = off_policy_token_weights(
                lp, beh, mode, gamma=swarm_cfg.luffy_gamma, cap=swarm_cfg.tis_cap, stats=stats
            )
            w[i, :T] = wi[0]
        return w

    return fn
