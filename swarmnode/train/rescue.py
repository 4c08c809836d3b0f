"""Rescue: peers answer the questions a node got all wrong (docs/guide/swarm.md "Rescue").

An own group (rollout tree) whose leaves are all wrong has no reward variance: every advantage is 0 and the
node learns nothing from the question. Sharing pays exactly there: Mutual RL (arXiv 2605.07244) finds that
sharing a peer's successes on prompts the learner fails works best, and LUFFY (arXiv 2504.14945) / HACPO mix
off-policy correct completions into on-policy groups. This module holds the three pure parts; the node
(``swarmnode/node/levers.py``) wires them to the swarm layer:

* **asker** -- :class:`RescueBook`: the pending all-wrong groups (task key -> own tree, task, step), bounded in
  size, expired after ``levers.rescue.max_age_steps``; the newest refs are announced in heartbeats
  (protocol/SPEC.md §5.3 ``rescue``);
* **helper** -- :class:`RescueHelper`: which of the peers' requests this node answers this step, bounded per
  step whatever peers send (``answer_prompts``, ``max_answers_per_peer``, earned standing, each (asker, ref)
  once, held-out and unknown tasks refused, askers whose questions we never solve skipped for a while);
* **merge** -- :func:`merge_rescue`: peer leaves OUR verifier scores exactly correct (up to ``max_merged``)
  join the stored own wrong leaves in one mixed group, advantages by the node's estimator over that group.

Own leaves are stale by at most ``max_age_steps`` steps. The trainer takes the clipped ratio against the
current policy's log-probs (``Trainer._step``: ``old_logprobs`` are recomputed, or ``logprobs.detach()`` with
one iteration), not against the stored behaviour log-probs, so these leaves train as on-policy samples
without an importance correction; their behaviour log-probs ride along (``Sample.behaviour_logprobs``) and
are used by nothing for local samples. Peer leaves are external samples (``external:<peer>``), weighted by
``external.off_policy`` and masked by our step checks like every other external sample, their advantages
multiplied by ``levers.rescue.peer_advantage_scale``.

Nothing here imports ``swarm`` (docs/reference/architecture.md): requests arrive as ``(peer_id, TaskRef)``
pairs, peer trees as :class:`~swarmnode.rollout.peer_tree.PeerTree`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from swarmnode.config import RescueConfig
from swarmnode.rollout.advantages import STD_FLOOR, compute_advantages
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.step_credit import StepCredit
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import TaskRef
from swarmnode.train.off_policy import _ids_match
from swarmnode.train.samples import Sample
from swarmnode.turns import TurnQueue

__all__ = ["RESCUE_GROUP_SUFFIX", "PendingGroup", "RescueBook", "RescueHelper", "MergedGroup", "is_all_wrong",
           "merge_rescue", "CORRECT_THRESHOLD", "MAX_PEER_ADVANTAGE_SCALE"]

CORRECT_THRESHOLD = 1.0
"""A leaf is exactly correct when its verifier's ``correct`` is at least this (the node's definition)."""
RESCUE_GROUP_SUFFIX = "|rescue"
"""``Sample.group_id`` of a merged group: ``"<task key>|rescue"``."""
MAX_PEER_ADVANTAGE_SCALE = 16.0
"""Largest ``levers.rescue.peer_advantage_scale`` (the config's bound, checked again by :func:`merge_rescue`)."""
#: Question regenerations (the costly check) per answer slot and step: a flood of requests costs at most
#: ``answer_prompts * _CHECKS_PER_ANSWER`` regenerations a step.
_CHECKS_PER_ANSWER = 8
#: Most askers remembered (last served, failure streaks) and most (asker, ref) pairs remembered as answered.
_MAX_ASKERS = 4096
_MAX_ANSWERED = 4096


def is_all_wrong(correct: Sequence[float]) -> bool:
    """Whether a group with these per-leaf ``correct`` scores is all wrong: at least two leaves, none with
    ``correct >= CORRECT_THRESHOLD``. A single leaf is no group (it has no variance either way)."""
    return len(correct) >= 2 and all(float(c) < CORRECT_THRESHOLD for c in correct)


# ============================================================================================ asker
@dataclass
class PendingGroup:
    """One own all-wrong group waiting for a peer's answer.

    Attributes:
        key: ``tree.task.key()``.
        tree: our scored tree (every leaf carries our reward, its behaviour log-probs and policy version).
        step: the step (0-based) it was sampled in.
    """

    key: str
    tree: RolloutTree
    step: int
    answered: bool = False  # a peer's answer was merged (not yet trained: the screen may have dropped it)

    @property
    def ref(self) -> TaskRef:
        return self.tree.task


class RescueBook:
    """The asker's pending all-wrong groups, task key -> :class:`PendingGroup` (insertion order = age).

    Args:
        max_age_steps: an entry added at step ``s`` expires at step ``s + max_age_steps`` (:meth:`expire`).
        capacity: most entries held; adding beyond it evicts the oldest (counted as expired).

    Raises:
        ValueError: ``max_age_steps < 1`` or ``capacity < 1``.
    """

    def __init__(self, max_age_steps: int, capacity: int) -> None:
        if int(max_age_steps) < 1 or int(capacity) < 1:
            raise ValueError(f"RescueBook needs max_age_steps >= 1 and capacity >= 1, got {max_age_steps!r}, "
                             f"{capacity!r}")
        self.max_age_steps, self.capacity = int(max_age_steps), int(capacity)
        self._entries: OrderedDict[str, PendingGroup] = OrderedDict()
        self.evicted = 0  # entries pushed out by the capacity (not yet reported by expire)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def add(self, tree: RolloutTree, step: int) -> None:
        """Hold ``tree`` (scored, all wrong) from ``step``; a newer tree of the same task replaces the older."""
        key = tree.task.key()
        self._entries.pop(key, None)
        self._entries[key] = PendingGroup(key, tree, int(step))
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
            self.evicted += 1

    def expire(self, step: int) -> int:
        """Drop entries older than ``max_age_steps`` at ``step``; returns how many went (capacity evictions
        since the last call included)."""
        old = [k for k, e in self._entries.items() if step - e.step >= self.max_age_steps]
        for k in old:
            del self._entries[k]
        n, self.evicted = len(old) + self.evicted, 0
        return n

    def refs(self, n: int) -> list[TaskRef]:
        """The TaskRefs of ``n`` entries (what the heartbeats announce): the newest not yet answered first, then
        the newest answered ones (a merged answer the screen dropped: another peer may still answer it, but a
        helper that answered it refuses it as a repeat for a while, so it must not crowd out fresh questions)."""
        newest = sorted(reversed(self._entries.values()), key=lambda e: e.answered)  # stable: newest first in each
        return [e.ref for e in newest][: max(0, int(n))]

    def mark_answered(self, key: str) -> None:
        """A peer's answer to ``key`` was merged; the entry stays pending until its group trained."""
        e = self._entries.get(key)
        if e is not None:
            e.answered = True

    def get(self, key: str) -> PendingGroup | None:
        return self._entries.get(key)

    def take(self, key: str) -> PendingGroup | None:
        """Remove and return the entry of ``key`` (None when absent)."""
        return self._entries.pop(key, None)


# ============================================================================================ helper
@dataclass
class RescueHelper:
    """Which peers' rescue requests this node answers, step by step (bounded whatever peers send).

    Args:
        cfg: ``levers.rescue``.
        answered_ttl_steps: steps an answered question is remembered: it is not answered again within them, whoever
            asks (our answers are public bundles, so every asker of it gets them; keys repeating another's
            questions cannot make us answer one question many times).

    Per step (:meth:`select`): askers whose answered questions got no correct leaf from us
    ``skip_after_failures`` times in a row are skipped for ``skip_steps`` steps; askers with earned standing
    ``>= min_standing`` are visited first, then those below it (young keys, or weaker peers whose trees we do not
    train on), each kind in queue order (:class:`~swarmnode.turns.TurnQueue`): an asker's place is the step it
    was last served, or, never served, the step it first asked, so keys minted every step queue behind an asker
    that has been waiting; at most ``max_answers_per_peer`` refs of one asker, ``answer_prompts`` in all, and of
    them at most ``young_answers`` to askers below ``min_standing`` (the rest of theirs are refused for
    standing); each ref costs a question regeneration, at most ``answer_prompts * _CHECKS_PER_ANSWER`` a step
    (``young_answers * _CHECKS_PER_ANSWER`` for the young askers), and is refused when its task is not in our
    mix or its question is held out; an asker of a held-out question is skipped for ``skip_steps`` steps (an
    honest asker never announces one: its all-wrong groups are questions of its training stream), so a flood of
    such refs costs one regeneration per key and cannot hold the young slots.
    """

    cfg: RescueConfig
    answered_ttl_steps: int = 16
    _answered: OrderedDict = field(default_factory=OrderedDict)   # task key -> step answered (whoever asked)
    _fails: OrderedDict = field(default_factory=OrderedDict)      # asker -> answered steps in a row, none correct
    _skip_until: OrderedDict = field(default_factory=OrderedDict)  # asker -> first step it is answered again
    # askers' turns: the step an asker was last answered or, never answered, the step it first asked
    _turns: TurnQueue = field(default_factory=lambda: TurnQueue(_MAX_ASKERS))

    def select(
        self,
        requests: Iterable[Any],
        step: int,
        *,
        source_known: Callable[[TaskRef], bool],
        is_heldout: Callable[[TaskRef], bool],
        contains: Callable[[TaskRef], bool],
    ) -> tuple[list[tuple[str, TaskRef]], dict[str, int]]:
        """This step's requests to answer, and the counts of what was refused.

        Args:
            requests: ``(peer_id, TaskRef)`` pairs (``SwarmHook.rescue_requests``), optionally with a
                ``standing`` attribute (the asker's earned standing; absent = 0). Anything else is ignored.
            step: the current step (0-based).
            source_known: cheap check that the ref names a source of our mix (no regeneration).
            is_heldout: whether the ref's regenerated question is in the held-out partition (costly).
            contains: whether the ref is a task our training stream can produce (``TaskMix.contains``).

        Returns:
            ``(chosen, counts)``: at most ``answer_prompts`` ``(peer_id, ref)`` pairs, and ints
            ``rescue/refused_standing``, ``rescue/refused_skipped``, ``rescue/refused_repeat``,
            ``rescue/refused_task``, ``rescue/refused_heldout``, ``rescue/refused_budget``, ``rescue/checks``
            (regenerations spent). Each request is counted once, under the first reason that refused it.
        """
        c = {k: 0 for k in ("rescue/refused_standing", "rescue/refused_skipped", "rescue/refused_repeat",
                            "rescue/refused_task", "rescue/refused_heldout", "rescue/refused_budget",
                            "rescue/checks")}
        self._forget(step)
        by_peer: dict[str, list[TaskRef]] = {}
        standing: dict[str, int] = {}
        for r in requests:
            if not (isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], str) and isinstance(r[1], TaskRef)):
                continue
            peer, ref = r
            refs = by_peer.setdefault(peer, [])
            if ref not in refs:
                refs.append(ref)
            standing[peer] = max(standing.get(peer, 0), int(getattr(r, "standing", 0) or 0))
        eligible: list[str] = []
        for peer, refs in by_peer.items():
            if standing[peer] < self.cfg.min_standing and self.cfg.young_answers <= 0:
                c["rescue/refused_standing"] += len(refs)
            elif self._skip_until.get(peer, -1) > step:
                c["rescue/refused_skipped"] += len(refs)
            else:
                eligible.append(peer)
        # askers with standing first; then the young ones (below min_standing) in at most young_answers slots;
        # each kind in queue order (a stable sort keeps it)
        eligible = sorted(self._turns.order(eligible, step), key=lambda p: standing[p] < self.cfg.min_standing)
        chosen: list[tuple[str, TaskRef]] = []
        checks_left = self.cfg.answer_prompts * _CHECKS_PER_ANSWER
        young_left, young_checks = self.cfg.young_answers, self.cfg.young_answers * _CHECKS_PER_ANSWER
        for peer in eligible:
            taken = 0
            young = standing[peer] < self.cfg.min_standing
            for ref in by_peer[peer]:
                if young and (young_left <= 0 or young_checks <= 0):
                    c["rescue/refused_standing"] += 1
                    continue
                if (len(chosen) >= self.cfg.answer_prompts or taken >= self.cfg.max_answers_per_peer
                        or checks_left <= 0):
                    c["rescue/refused_budget"] += 1
                    continue
                if ref.key() in self._answered or any(r.key() == ref.key() for _, r in chosen):
                    c["rescue/refused_repeat"] += 1
                    continue
                if not source_known(ref):
                    c["rescue/refused_task"] += 1
                    continue
                checks_left -= 1
                young_checks -= young
                c["rescue/checks"] += 1
                if is_heldout(ref):  # no honest asker announces one: its all-wrong groups are training questions
                    c["rescue/refused_heldout"] += 1
                    self._skip_until[peer] = step + 1 + self.cfg.skip_steps
                    self._skip_until.move_to_end(peer)
                    rest = by_peer[peer][by_peer[peer].index(ref) + 1:]
                    c["rescue/refused_skipped"] += len(rest)
                    break
                if not contains(ref):
                    c["rescue/refused_task"] += 1
                    continue
                chosen.append((peer, ref))
                taken += 1
                young_left -= young
        for peer, ref in chosen:
            self._answered[ref.key()] = step
            self._answered.move_to_end(ref.key())
            self._turns.serve(peer, step)
        _trim(self._answered, _MAX_ANSWERED)
        _trim(self._skip_until, _MAX_ASKERS)
        return chosen, c

    def record(self, outcomes: dict[str, bool], step: int) -> None:
        """This step's outcome per answered asker: ``True`` when at least one of our leaves for its questions was
        exactly correct. ``skip_after_failures`` ``False`` in a row skip the asker until ``step + 1 +
        skip_steps``."""
        for peer, ok in outcomes.items():
            if ok:
                self._fails.pop(peer, None)
                continue
            n = self._fails.get(peer, 0) + 1
            if n >= self.cfg.skip_after_failures:
                self._fails.pop(peer, None)
                self._skip_until[peer] = step + 1 + self.cfg.skip_steps
                self._skip_until.move_to_end(peer)
            else:
                self._fails[peer] = n
                self._fails.move_to_end(peer)
        _trim(self._fails, _MAX_ASKERS)
        _trim(self._skip_until, _MAX_ASKERS)

    def _forget(self, step: int) -> None:
        while self._answered and step - next(iter(self._answered.values())) >= self.answered_ttl_steps:
            self._answered.popitem(last=False)
        for p in [p for p, s in self._skip_until.items() if s <= step]:
            del self._skip_until[p]


def _trim(d: OrderedDict, cap: int) -> None:
    while len(d) > cap:
        d.popitem(last=False)


# ============================================================================================ merge
@dataclass
class MergedGroup:
    """One own all-wrong group merged with peers' correct leaves.

    Attributes:
        key: the task key.
        own: our leaves as local samples (``source="local"``, our behaviour log-probs, negative advantages).
        peer: the peers' correct leaves as external samples (``source="external:<peer>"``, positive advantages).
        rewards: the mixed group's rewards, own leaves first (our verifier's scores).
    """

    key: str
    own: list[Sample]
    peer: list[Sample]
    rewards: list[float]

    @property
    def peers(self) -> set[str]:
        return {s.source.removeprefix("external:") for s in self.peer}


def merge_rescue(
    entry: PendingGroup,
    peer_trees: Sequence[PeerTree],
    score: Callable[[str], tuple[bool, float]],
    *,
    max_merged: int,
    estimator: str,
    scale_rewards: str = "group",
    std_floor: float = STD_FLOOR,
    mask_truncated: bool = False,
    max_len: int | None = None,
    our_model_id: str = "",
    our_tokenizer_id: str = "",
    peer_advantage_scale: float = 1.0,
    step_credit: StepCredit | None = None,
) -> MergedGroup | None:
    """Merge the peer leaves our verifier finds exactly correct into our stored all-wrong group.

    Peers take turns (one correct leaf per peer per turn, trees in the given order) until ``max_merged``
    leaves are taken; a leaf longer than ``max_len`` tokens or with an empty completion is skipped. The
    mixed group -- our tree plus one subtree per peer tree holding its taken leaves, all under OUR prompt
    for the task (``entry.tree.prompt_ids``) -- gets advantages from :func:`~swarmnode.rollout.advantages.
    compute_advantages` with the node's estimator over one group key (every tree of it is one prompt group),
    with the same std floor as the local groups. With binary rewards the own wrong leaves get ``A < 0`` and the
    peer correct leaves ``A > 0``.

    Args:
        entry: the pending own group.
        peer_trees: this step's re-verified peer trees of ``entry.key`` (PeerTree leaf rewards are our
            re-scores already; ``score`` decides exact correctness).
        score: ``completion text -> (exactly correct, reward)`` by OUR verifier (untrusted text; never raises).
        max_merged: most peer leaves taken (>= 1).
        estimator, scale_rewards, std_floor: ``train.advantage_estimator``, ``train.scale_rewards``,
            ``train.advantage_std_floor``.
        mask_truncated: ``train.mask_truncated_completions`` for our own leaves.
        max_len: most completion tokens of a peer leaf (our ``sampling.max_completion_length``; None: no cap).
        our_model_id, our_tokenizer_id: a peer leaf keeps its behaviour log-probs only when its producer's ids
            equal these and its ids were not re-tokenized (as :func:`~swarmnode.train.batch.external_samples`).
        peer_advantage_scale: factor (1 to :data:`MAX_PEER_ADVANTAGE_SCALE`) on the peer leaves' advantages
            after the group's advantages are computed (``levers.rescue.peer_advantage_scale``; ReLIFT, arXiv
            2506.07527); the own leaves keep
            theirs.
        step_credit: our step checks of peer completions (``external.external_step_credit``); when given with its
            mask on, each peer leaf's per-token advantages are clipped toward our verdict on its lines
            (:meth:`~swarmnode.rollout.step_credit.StepCredit.mask_tokens`), as every other external sample's
            are: a free-text or payload line of a right answer keeps no positive advantage.

    Returns:
        The :class:`MergedGroup`, or ``None`` when no peer leaf is exactly correct (or the mixed group has no
        reward variance).

    Raises:
        ValueError: ``max_merged < 1``, ``peer_advantage_scale`` not a number from 1 to 16, or a leaf of our
            tree without a reward.
    """
    if int(max_merged) < 1:
        raise ValueError(f"max_merged (levers.rescue.max_merged) must be >= 1, got {max_merged!r}")
    if isinstance(peer_advantage_scale, bool) or not isinstance(peer_advantage_scale, (int, float)) or not (
            1.0 <= float(peer_advantage_scale) <= MAX_PEER_ADVANTAGE_SCALE):
        raise ValueError("peer_advantage_scale (levers.rescue.peer_advantage_scale) must be a number from 1 to "
                         f"{MAX_PEER_ADVANTAGE_SCALE:g}, got {peer_advantage_scale!r}")
    k = float(peer_advantage_scale)
    own = entry.tree
    by_peer: dict[str, list[PeerTree]] = {}
    for pt in peer_trees:
        if isinstance(pt, PeerTree) and pt.task_key == entry.key:
            by_peer.setdefault(pt.peer_id, []).append(pt)
    cursors = {p: [(ti, list(t.tree.leaves())) for ti, t in enumerate(ts)] for p, ts in by_peer.items()}
    taken: dict[tuple[str, int], dict[int, float]] = {}  # (peer, tree index) -> leaf -> our reward
    n_taken = 0
    active = list(by_peer)
    while active and n_taken < max_merged:
        nxt = []
        for p in active:
            if n_taken >= max_merged:
                break
            found = False
            while cursors[p] and not found:
                ti, leaves = cursors[p][0]
                if not leaves:
                    cursors[p].pop(0)
                    continue
                lid = leaves.pop(0)
                tree = by_peer[p][ti].tree
                n = len(tree.completion_ids(lid))
                if n == 0 or (max_len is not None and n > max_len):
                    continue
                ok, reward = score(tree.completion_text(lid))
                if ok:
                    taken.setdefault((p, ti), {})[lid] = float(reward)
                    n_taken += 1
                    found = True
            if cursors[p]:
                nxt.append(p)
        active = nxt
    if not taken:
        return None

    subs: list[tuple[PeerTree, RolloutTree]] = []
    for (p, ti), leaf_rewards in taken.items():
        pt = by_peer[p][ti]
        sub = pt.tree.subtree(sorted(leaf_rewards))
        for new_lid, old_lid in zip(sub.leaves(), sorted(leaf_rewards)):
            sub.nodes[new_lid].reward = leaf_rewards[old_lid]
        sub.prompt_ids, sub.prompt_text = list(own.prompt_ids), own.prompt_text
        sub.update_stats()
        subs.append((pt, sub))
    trees = [own] + [s for _, s in subs]
    result = compute_advantages(trees, estimator, scale_rewards, group_key=lambda t: entry.key,
                                std_floor=std_floor)
    if result.is_zero_variance(0):
        return None
    gid = entry.key + RESCUE_GROUP_SUFFIX
    own_samples: list[Sample] = []
    rewards: list[float] = []
    for lid in own.leaves():
        rewards.append(float(own.nodes[lid].reward))
        comp = own.completion_ids(lid)
        if not comp or lid in result.dropped[0]:
            continue
        node = own.nodes[lid]
        truncated = node.finish_reason == "length"
        own_samples.append(Sample(
            prompt_ids=list(own.prompt_ids), completion_ids=comp,
            advantages=[float(a) for a in result.advantages[0][lid]], source="local",
            behaviour_logprobs=own.completion_logprobs(lid),
            loss_mask=[0 if (mask_truncated and truncated) else 1] * len(comp), reward=float(node.reward),
            group_id=gid, policy_version=min(own.nodes[n].policy_version for n in own.path(lid)),
            model_id=own.model_id, truncated=truncated))
    peer_samples: list[Sample] = []
    for ti, (pt, sub) in enumerate(subs, start=1):
        keep_lp = pt.same_tokenizer and _ids_match(pt.model_id, our_model_id) and _ids_match(pt.tokenizer_id,
                                                                                             our_tokenizer_id)
        for lid in sub.leaves():
            rewards.append(float(sub.nodes[lid].reward))
            if lid in result.dropped[ti]:
                continue
            comp = sub.completion_ids(lid)
            lp = sub.completion_logprobs(lid) if keep_lp else None
            adv = [k * float(a) for a in result.advantages[ti][lid]]
            if step_credit is not None:
                adv, _ = step_credit.mask_tokens(entry.ref, comp, adv)
            peer_samples.append(Sample(
                prompt_ids=list(own.prompt_ids), completion_ids=comp,
                advantages=adv, source=pt.source,
                behaviour_logprobs=lp, loss_mask=[1] * len(comp), reward=float(sub.nodes[lid].reward),
                group_id=gid, policy_version=pt.policy_version, model_id=pt.model_id,
                truncated=sub.nodes[lid].finish_reason == "length"))
    if not peer_samples:
        return None
    return MergedGroup(entry.key, own_samples, peer_samples, rewards)
