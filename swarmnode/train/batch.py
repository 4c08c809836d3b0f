"""From scored rollout trees and their advantages to trainer :class:`~swarmnode.train.samples.Sample` s.

Lives in ``train`` because ``rollout`` never imports ``train`` (design.md §3).
"""

from __future__ import annotations

from typing import Sequence

from swarmnode.rollout.advantages import AdvantageResult
from swarmnode.rollout.tree import RolloutTree
from swarmnode.train.samples import Sample


def samples_from_trees(
    trees: Sequence[RolloutTree],
    result: AdvantageResult,
    source: str = "local",
    drop_zero_variance: bool = True,
    mask_truncated: bool = False,
    include_dropped: bool = False,
) -> list[Sample]:
    """One :class:`Sample` per leaf, with the per-token advantages of ``result``.

    Args:
        trees: the trees ``result`` was computed from (same list, same order).
        result: output of :func:`swarmnode.rollout.advantages.compute_advantages` on ``trees``.
        source: the Sample ``source`` tag: ``"local"`` or ``"external:<peer id>"``.
        drop_zero_variance: skip leaves of zero-variance groups (they carry no signal; DAPO dynamic sampling).
        mask_truncated: loss mask 0 for completions that stopped at the length limit
            (``finish_reason == "length"``; TRL ``mask_truncated_completions`` / DAPO overlong filtering).
        include_dropped: emit leaves in ``result.dropped`` (MC-GRPO's median sample) with an all-zero loss
            mask instead of skipping them. Skipping is the default: a row with no loss token would still
            count as a sequence in the ``grpo`` / ``dr_grpo`` normalizers and cost a forward pass.

    Returns:
        Samples in tree order, then leaf order. Each has ``prompt_ids = tree.prompt_ids``,
        ``completion_ids = tree.completion_ids(leaf)``, ``advantages`` (one float per completion token),
        ``behaviour_logprobs = tree.completion_logprobs(leaf)`` (``None`` if any segment lacks them),
        ``reward`` the leaf reward, ``group_id`` the group key (task key by default),
        ``policy_version`` the oldest policy version on the leaf's path (what staleness must be measured
        from), ``model_id = tree.model_id`` and ``truncated = finish_reason == "length"``.
        Leaves with an empty completion are skipped (nothing to train on).

    Raises:
        ValueError: ``trees`` and ``result`` do not match (different count or a leaf without advantages).
    """
    if len(trees) != len(result.advantages):
        raise ValueError(
            f"result has advantages for {len(result.advantages)} trees but {len(trees)} trees were given; "
            "pass the same list that compute_advantages saw"
        )
    out: list[Sample] = []
    for ti, tree in enumerate(trees):
        zero = result.is_zero_variance(ti)
        if zero and drop_zero_variance:
            continue
        advs = result.advantages[ti]
        for lid in tree.leaves():
            if lid not in advs:
                raise ValueError(f"no advantages for leaf {lid} of trees[{ti}] (task {tree.task.key()})")
            dropped = lid in result.dropped[ti]
            if dropped and not include_dropped:
                continue
            comp = tree.completion_ids(lid)
            if not comp:
                continue
            adv = advs[lid]
            if len(adv) != len(comp):
                raise ValueError(
                    f"leaf {lid} of trees[{ti}]: {len(adv)} advantages for {len(comp)} completion tokens"
                )
            node = tree.nodes[lid]
            truncated = node.finish_reason == "length"
            masked = dropped or (mask_truncated and truncated)
            path = tree.path(lid)
            out.append(
                Sample(
                    prompt_ids=list(tree.prompt_ids),
                    completion_ids=comp,
                    advantages=[float(a) for a in adv],
                    source=source,
                    behaviour_logprobs=tree.completion_logprobs(lid),
                    loss_mask=[0 if masked else 1] * len(comp),
                    reward=float(node.reward) if node.reward is not None else 0.0,
                    group_id=result.group_keys[ti],
                    policy_version=min(tree.nodes[n].policy_version for n in path),
                    model_id=tree.model_id,
                    truncated=truncated,
                )
            )
    return out
