"""The batch: from scored rollout trees and their advantages to trainer :class:`~swarmnode.train.samples.Sample` s.

* :func:`samples_from_trees` — local trees (advantages from :mod:`swarmnode.rollout.advantages`);
* :func:`external_samples` — selected peer trees, length-controlled and normalized per source
  (ERILS arXiv 2608.01717; SAPO arXiv 2509.08721): completions longer than the cap are dropped or truncated
  (the first L tokens kept), each (peer, task) group is normalized on its own;
* :func:`compose_batch` — local + external with the external share capped (SAPO: 4/4 best, 2/6 oscillated);
  zero-advantage external samples dropped first; per-source metrics.
* :func:`trained_groups_by_peer` — the peers' groups a step trained on, each with reward contrast of its own
  (what earns a peer standing, ``swarm/peers.py``);
* :func:`leaf_completion_length`, :func:`leaf_prefix` — cost a leaf in tokens before building it.

Lives in ``train`` because ``rollout`` never imports ``train`` (docs/reference/architecture.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence

from swarmnode.rollout.advantages import (
    STD_FLOOR,
    ZERO_STD_ATOL,
    AdvantageResult,
    _local_rewards_for,
    _mean,
    _std,
    source_advantages,
)
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.step_credit import ADMISSIONS, StepCredit
from swarmnode.tasks.steps import StepReport
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import TaskRef
from swarmnode.train.off_policy import OFF_POLICY_MODES, _check_choice, _ids_match
from swarmnode.train.samples import Sample

_ZERO_ADV_ATOL = 1e-12
_NORMALIZATIONS = ("per_source", "joint")
_LENGTH_POLICIES = ("drop", "truncate")
_OFF_POLICY_MODES = OFF_POLICY_MODES
_SCALE_REWARDS = ("group", "batch", "none")


def _zero_variance(xs: Sequence[float]) -> bool:
    return len(xs) < 2 or _std(xs) <= ZERO_STD_ATOL


def leaf_completion_length(tree: RolloutTree, leaf: int) -> int:
    """Completion tokens of ``leaf`` (sum of its path's segment lengths), without building the list.

    Raises:
        ValueError: a cycle in the tree (from :meth:`RolloutTree.path`).
    """
    return sum(len(tree.nodes[n].token_ids) for n in tree.path(leaf))


def leaf_prefix(tree: RolloutTree, leaf: int, n: int, with_logprobs: bool = False) -> tuple[list[int], list[float] | None]:
    """The first ``n`` completion token ids of ``leaf`` (and their behaviour log-probs), copying only those.

    Returns:
        ``(ids, logprobs)``; ``logprobs`` is ``None`` unless ``with_logprobs`` and every segment on the path
        (up to the cut) carries one log-prob per token.
    """
    ids: list[int] = []
    lps: list[float] | None = [] if with_logprobs else None
    for nid in tree.path(leaf):
        if len(ids) >= n:
            break
        node = tree.nodes[nid]
        take = n - len(ids)
        ids.extend(node.token_ids[:take])
        if lps is not None:
            if len(node.logprobs) != len(node.token_ids):
                lps = None
            else:
                lps.extend(node.logprobs[:take])
    return ids, lps


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


# ------------------------------------------------------------------------------------------ external
@dataclass
class _Leaf:
    ext: PeerTree
    leaf: int
    reward: float
    completion: list[int]
    logprobs: list[float] | None
    truncated: bool
    report: StepReport | None = None  # our line checks (step credit on)
    bonus: float = 0.0  # step reward, for the advantage only
    admitted: bool = False  # admitted by step form (the screen does not judge it)


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
    *,
    max_prompt_len: int | None = None,
    std_floor: float = STD_FLOOR,
    step_credit: StepCredit | None = None,
    local_bonus_by_task: Mapping[Any, Sequence[float]] | None = None,
    admit_step_form: Literal["off", "correct", "in_form", "masked"] = "off",
) -> tuple[list[Sample], dict[str, Any]]:
    """Turn selected external trees into trainer Samples with source-specific advantages.

    **Length control first** (ERILS: ``A_i = Norm_source(R_i)`` over leaves with ``|y_i| <= L``): with
    ``max_len = L`` set, a completion longer than L is dropped (``"drop"``; it leaves its group before
    normalization) or truncated (``"truncate"``: the first L tokens are kept with loss mask 1 and the rest is
    cut off; the leaf keeps its verified reward and ``Sample.truncated = True``). Lengths are read from the
    tree's segments before any per-leaf list is built, and only the kept prefix is copied, so a tree whose
    leaves share one huge segment costs what its *kept* samples cost. Prompts longer than
    ``max_prompt_len`` are left-truncated (as the node truncates its own prompts; counted).

    **Normalization** (each leaf's advantage is broadcast to all its completion tokens):

    * ``per_source``: group = (producing peer, task); ``A = (r - mean_g) / (max(std_g, floor) + 1e-4)`` over the
      group's remaining leaves (several trees of the same peer and task are pooled). ``std`` is the
      unbiased std (``torch.std`` default, as TRL). A group left with zero variance (or < 2 leaves) after
      length control yields no samples (counted).
    * ``joint`` (ablation): group = task; the pool is the remaining external leaves of the task (all
      peers) plus ``local_rewards_by_task[task key]`` (keys: ``TaskRef.key()`` strings or TaskRefs);
      ``A = (r - mean_pool) / (max(std_pool, floor) + 1e-4)``.
    * the floor is ``std_floor`` (config ``train.advantage_std_floor``), shared with the local estimators
      (:func:`swarmnode.rollout.advantages.source_advantages`).
    * ``scale_rewards``: ``"group"`` as above; ``"batch"`` divides by the unbiased std of every reward in
      every pool of the call (TRL's batch scaling; mean still per group); ``"none"`` only centres.

    **Step-checked credit** (``step_credit``, :class:`~swarmnode.rollout.step_credit.StepCredit`; docs/reference/step_credit.md):
    each kept completion's lines are checked by us. The checked lines' tokens get the advantage of
    ``r + weight * progress`` (so a group whose rewards differ only by the bonus is not zero-variance), masked
    by the line verdicts when ``mask`` is on (a checked-right line is never pushed down, a wrong one never up);
    every other token (the answer, unchecked text) gets the advantage of ``r`` alone, the same normalization
    without the bonus, so no bonus ever pushes an answer up. ``Sample.reward`` stays the verified outcome.
    With ``joint``, ``local_bonus_by_task`` (aligned with ``local_rewards_by_task``) puts the local pool on the
    same scale.

    **Admission by step form** (``admit_step_form``, config ``external.screen.admit_step_form``; needs
    ``step_credit``, whose task regeneration and tokenizer it uses): each kept completion -- the ids that will
    train, after the length cap -- is checked by :meth:`StepCredit.admits
    <swarmnode.rollout.step_credit.StepCredit.admits>`; ``"correct"`` admits the task's worked solution only,
    ``"in_form"`` also a wrong completion whose every line is in exact form and whose answer follows its last
    line, but only with ``step_credit.mask`` on (otherwise its valid lines would take its negative advantage;
    it falls back to ``"correct"``); ``"masked"`` every completion of a task with a step checker when
    ``step_credit.mask`` is on (:meth:`StepCredit.admits_masked
    <swarmnode.rollout.step_credit.StepCredit.admits_masked>`: the mask then leaves a positive advantage only on
    program-checked text; without the mask it falls back to ``"correct"``). An admitted sample, in every mode,
    keeps no negative advantage and a positive one only on its valid lines unless it is the worked solution
    (:meth:`StepCredit.unscreened_advantages <swarmnode.rollout.step_credit.StepCredit.unscreened_advantages>`:
    the screen kept hostile negative pushes off our right steps). Admitted samples get ``Sample.admitted_by_form = True``; the likelihood
    screen does not judge them. ``"keep"`` admits what ``"masked"`` admits but leaves the verdict to the screen
    (:meth:`StepCredit.keeps_on_rejection <swarmnode.rollout.step_credit.StepCredit.keeps_on_rejection>`): such
    a sample keeps the screened credit in ``advantages`` and carries the admitted credit in
    ``Sample.unscreened_advantages``, which it trains with if the screen rejects it.

    **Ids**: ``behaviour_logprobs`` are kept only when the producer's model id and tokenizer id equal
    ours (both non-empty), ``same_tokenizer`` is true and every segment on the leaf's path has them;
    otherwise ``None``. With ``off_policy="tis"`` each sample without them will fall back to ``none``
    in :func:`swarmnode.train.off_policy.external_token_loss` — counted as ``external/tis_fallback_samples``.

    Args:
        selected: output of :func:`swarmnode.train.external.select_external`.
        normalization, local_rewards_by_task, max_len, length_policy, off_policy, our_model_id,
            our_tokenizer_id, scale_rewards: as above (config keys ``external.normalization``,
            ``external.max_external_completion_length``, ``external.external_length_policy``, ``external.off_policy``,
            ``train.scale_rewards``).
        max_prompt_len: our ``sampling.max_prompt_length`` (None: no cap).
        std_floor: see :func:`swarmnode.rollout.advantages.scale_divisor`.

    Returns:
        ``(samples, metrics)``. Samples are in input order, leaf order; each has ``source =
        "external:<peer_id>"``, ``group_id = "<task key>|external:<peer_id>"`` (per_source) or
        ``"<task key>|joint"``, ``model_id`` and ``policy_version`` of the producer. Metrics (ints):
        ``external/groups_in``, ``external/leaves_in``, ``external/samples``, ``external/dropped_overlong``,
        ``external/truncated``, ``external/dropped_empty``, ``external/dropped_zero_variance_groups``,
        ``external/samples_with_behaviour_logprobs``, ``external/tis_fallback_samples``,
        ``external/prompts_truncated``, ``external/step_checked`` (samples whose lines we checked),
        ``external/step_zeroed_tokens``, ``external/admitted_by_form`` (samples admitted by form, ``keep``'s
        included: they cannot be lost to the screen) and
        ``external/unscreened_tokens_zeroed`` (tokens of admitted samples whose advantage
        :meth:`StepCredit.unscreened_advantages` set to 0).

    Raises:
        ValueError / TypeError: bad arguments, or a tree with an unscored leaf.
    """
    _check_choice("normalization", normalization, _NORMALIZATIONS)
    _check_choice("length_policy", length_policy, _LENGTH_POLICIES)
    _check_choice("off_policy", off_policy, _OFF_POLICY_MODES)
    _check_choice("scale_rewards", scale_rewards, _SCALE_REWARDS)
    _check_choice("admit_step_form", admit_step_form, ADMISSIONS)
    admit = step_credit is not None and admit_step_form != "off"
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
        raise ValueError(f"max_len (external.max_external_completion_length) must be an int >= 1 or None, got {max_len!r}")
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
        "external/prompts_truncated": 0,
        "external/step_checked": 0,
        "external/step_zeroed_tokens": 0,
        "external/admitted_by_form": 0,
        "external/unscreened_tokens_zeroed": 0,
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
            n = leaf_completion_length(ext.tree, lid)  # costed before any list is built
            if n == 0:
                m["external/dropped_empty"] += 1
                continue
            truncated = ext.tree.nodes[lid].finish_reason == "length"
            keep = n
            if max_len is not None and n > max_len:
                if length_policy == "drop":
                    m["external/dropped_overlong"] += 1
                    continue
                keep = max_len
                truncated = True
                m["external/truncated"] += 1
            comp, lp = leaf_prefix(ext.tree, lid, keep, with_logprobs=keep_lp)
            report = step_credit.report(ext.tree.task, comp) if step_credit is not None else None
            admitted = admit and step_credit.admission(ext.tree.task, comp, admit_step_form)
            bucket.append(_Leaf(ext, lid, r, comp, lp, truncated, report,
                                step_credit.bonus(report) if step_credit is not None else 0.0, admitted))

    # 2. normalization (rollout/advantages.py: the same floored divisor as the local estimators); with step
    #    credit twice: with the step bonus (the checked lines) and without it (the answer and the rest)
    live = {g: [lf.reward + lf.bonus for lf in leaves] for g, leaves in groups.items() if leaves}
    if normalization == "per_source":
        zero = {g for g, rs in live.items() if _zero_variance(rs)}
        m["external/dropped_zero_variance_groups"] += len(zero)
        live = {g: rs for g, rs in live.items() if g not in zero}
        pools = outcome_pools = None
    else:
        local = {g: _local_rewards_for(local_rewards_by_task, group_task[g]) for g in live}
        bonus = {g: _local_rewards_for(local_bonus_by_task, group_task[g]) for g in live}
        pools = {g: rs + ([r + b for r, b in zip(local[g], bonus[g])] if bonus[g] else local[g])
                 for g, rs in live.items()}
        outcome_pools = {g: [lf.reward for lf in groups[g]] + local[g] for g in live}
    adv_by_group = source_advantages(live, pools, scale_rewards, std_floor)
    outcome_by_group = adv_by_group
    if step_credit is not None:
        outcome_by_group = source_advantages({g: [lf.reward for lf in groups[g]] for g in live}, outcome_pools,
                                             scale_rewards, std_floor)

    # 3. samples
    samples: list[Sample] = []
    for gkey, leaves in groups.items():
        if gkey not in adv_by_group:
            continue
        for lf, a, a_out in zip(leaves, adv_by_group[gkey], outcome_by_group[gkey]):
            ext = lf.ext
            if lf.logprobs is not None:
                m["external/samples_with_behaviour_logprobs"] += 1
            elif off_policy == "tis":
                m["external/tis_fallback_samples"] += 1
            prompt = list(ext.tree.prompt_ids)
            if max_prompt_len is not None and len(prompt) > max_prompt_len:
                prompt = prompt[-max_prompt_len:]  # left-truncated, as our own prompts (node/lifecycle.py)
                m["external/prompts_truncated"] += 1
            unscreened, unjudged = None, False
            if step_credit is not None:
                advantages, zeroed = step_credit.token_advantages(a, lf.completion, lf.report, a_out, ext.tree.task)
                m["external/step_checked"] += lf.report is not None
                m["external/step_zeroed_tokens"] += zeroed
                if lf.admitted:  # without the screen only checked steps pushed up, nothing pushed down
                    advantages, unscreened, unjudged, clipped = step_credit.admitted_credit(
                        lf.report, lf.completion, advantages, admit_step_form)
                    m["external/unscreened_tokens_zeroed"] += clipped
            else:
                advantages = [a] * len(lf.completion)
            samples.append(
                Sample(
                    prompt_ids=prompt,
                    completion_ids=list(lf.completion),
                    advantages=advantages,
                    source=ext.source,
                    behaviour_logprobs=list(lf.logprobs) if lf.logprobs is not None else None,
                    loss_mask=[1] * len(lf.completion),
                    reward=lf.reward,
                    group_id=gkey,
                    policy_version=ext.policy_version,
                    model_id=ext.model_id,
                    truncated=lf.truncated,
                    admitted_by_form=unjudged,
                    unscreened_advantages=unscreened,
                    copied=lf.leaf in ext.copied_leaves,
                )
            )
            m["external/admitted_by_form"] += lf.admitted
    m["external/samples"] = len(samples)
    return samples, m


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
    """Mix local and external samples with the external share of the batch capped (SAPO; docs/reference/design.md §5).

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
        max_external_share: in [0, 1] (config ``external.max_external_share``).

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


def trained_groups_by_peer(offered: Iterable[Sample], trained: Iterable[Sample]) -> dict[str, int]:
    """Count, per peer, the external groups a step trained on that carry reward contrast of their own.

    A group here is one ``(source, group_id)`` pair: the samples of one peer for one task (under ``joint``
    normalization the peer's share of the pooled group). It counts for the peer when at least one of its
    samples is in ``trained`` (it passed selection, the token budget, the likelihood screen and the share cap,
    and the update ran on it) and the peer's samples of that group in ``offered`` that are not copies
    (``Sample.copied``: text another key or we held first) have rewards that differ (our re-scores; by more than
    ``ZERO_STD_ATOL``): a copier who adds a new wrong leaf to an author's tree earns nothing for it. This is what earns a peer standing
    (``SwarmHook.credit``, ``swarm/peers.py`` "Earned standing"): trees admitted but never trained -- over the
    token budget, cut by the share cap, dropped by the screen -- earn nothing.

    Args:
        offered: the external samples offered to :func:`compose_batch` (after the screen).
        trained: the samples the update ran on (local ones are ignored).

    Returns:
        ``{peer id: groups}`` with every count >= 1 (peer id: ``Sample.source`` without ``"external:"``).
    """
    rewards: dict[tuple[str, str], list[float]] = {}
    for s in offered:
        if not s.is_local and not s.copied:
            rewards.setdefault((s.source, s.group_id), []).append(s.reward)
    used = {(s.source, s.group_id) for s in trained if not s.is_local}
    out: dict[str, int] = {}
    for key in used:
        rs = rewards.get(key, [])
        if len(rs) >= 2 and max(rs) - min(rs) > ZERO_STD_ATOL:
            peer = key[0].removeprefix("external:")
            out[peer] = out.get(peer, 0) + 1
    return out


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


