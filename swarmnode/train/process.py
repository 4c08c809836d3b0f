"""Step 6 of the round loop, *process*: from this round's scored trees and the peers' re-verified trees to the
batch the trainer steps on (docs/reference/design.md §1, docs/reference/architecture.md "The round loop").

:meth:`BatchBuilder.build` runs, in this order:

1. **local**: advantages of our own trees (``rollout/advantages.py``), with step checks on the step credit and
   the process reward (``rollout/step_credit.py``), then our samples (``train/batch.py``);
2. **external selection**: each peer group normalized within its own source, bounded in tokens, length and
   share (``train/external.py``);
3. **peer samples of rescue**: the peers' answers of our merged all-wrong groups join the external samples;
4. **the screen**: peers' completions scored against our own policy's log-probs (``train/screen.py``); each
   peer whose samples it rejects is *charged*;
5. **composition**: external samples capped to ``external.max_external_share`` of the batch (``train/batch.py``),
   merged rescue groups and expansion samples added after the cap;
6. **expansion samples**: our own continuations of peers' prefixes (``rollout/expansion.py``), trained as local.

Peer input never kills the node: a stage that fails on it (:data:`EXTERNAL_FAILURES`) drops that stage's samples,
counts it (``external/failed``, ``external/failed_stage``; ``expansion/failed``) and logs one line, all in one
place (:meth:`BatchBuilder._peer_stage`). This module never talks to the swarm layer: it takes peers' trees as
data and returns the charges and credits as data (:class:`BuiltBatch`), which the round loop hands to the swarm
layer in one place after the update.
"""

from __future__ import annotations

import logging
import random
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar

import torch

from swarmnode.config import RunConfig
from swarmnode.rollout.advantages import AdvantageResult, compute_advantages
from swarmnode.rollout.expansion import Expansion
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.step_credit import StepCredit, apply_step_credit, step_reports, step_reward_bonus
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import Task, TaskRef
from swarmnode.train.batch import compose_batch, samples_from_trees, trained_groups_by_peer
from swarmnode.train.external import process_external
from swarmnode.train.rescue import RESCUE_GROUP_SUFFIX, MergedGroup
from swarmnode.train.samples import Sample
from swarmnode.train.screen import SCREEN_REASON, LikelihoodScreen

log = logging.getLogger("swarmnode.node")

_T = TypeVar("_T")

#: Failures of external input inside steps 6-7 that must not kill the node: the allocator's RuntimeError
#: ("can't allocate memory"; CUDA OOM is a RuntimeError too), MemoryError, and the ValueError / TypeError /
#: IndexError of bad shapes or ids.
EXTERNAL_FAILURES = (RuntimeError, MemoryError, ValueError, TypeError, IndexError)

#: ``(peer_id, reason, n)``: ``n`` of the peer's samples rejected under ``reason`` (``SwarmHook.charge``).
Charge = tuple[str, str, int]
#: ``(peer_id, n)``: ``n`` useful trees of the peer (``SwarmHook.credit``).
Credit = tuple[str, int]

#: ``(peer trees, peers to skip, metrics) -> expansions``: the node's cross-node expansion of this round.
ExpandFn = Callable[[list[PeerTree], set[str], dict[str, Any]], list[Expansion]]


@dataclass
class BuiltBatch:
    """What :meth:`BatchBuilder.build` returns: the batch, and what the round loop applies or reports.

    Attributes:
        samples: the batch to train on (local samples, external samples within the share cap, then merged rescue
            groups and expansion samples).
        local: our own samples of this round's trees (``samples_local``).
        external: peers' samples the screen kept (rescue answers apart), as offered to composition; the credits
            count the groups of these that trained (:meth:`credits`).
        advantages: the local trees' advantages (``groups``, ``zero_variance_groups``).
        trained_rescue: merged rescue groups in the batch (each with a peer sample the screen kept).
        charges: ``(peer_id, reason, n)`` for each peer the screen rejected samples of, in the screen's order.
        metrics: this stage's metrics, in the order they were produced.
        expansion_tokens: tokens our policy generated for the expansions (counted into ``tokens_total``).
    """

    samples: list[Sample]
    local: list[Sample]
    external: list[Sample]
    advantages: AdvantageResult
    trained_rescue: list[MergedGroup] = field(default_factory=list)
    charges: list[Charge] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    expansion_tokens: int = 0

    def credits(self, trained: Sequence[Sample]) -> list[Credit]:
        """``(peer_id, n)`` for the peers whose samples made useful trees of ``trained`` (the batch the update
        ran on): groups of their samples with reward contrast of their own
        (:func:`~swarmnode.train.batch.trained_groups_by_peer`), then one tree per peer of each trained rescue
        group. The round loop applies them only when the update ran and the screen (when on) was out of its
        warm-up."""
        out: list[Credit] = list(trained_groups_by_peer(self.external, trained).items())
        for g in self.trained_rescue:
            out.extend((peer, 1) for peer in g.peers)  # a rescued group is a useful tree of each peer that answered
        return out


class BatchBuilder:
    """Builds each round's batch from local and peers' trees (module docstring).

    Args:
        cfg: the run configuration (reads ``train``, ``sampling``, ``swarm``, ``seed``).
        get_task: regenerates a task from its :class:`~swarmnode.tasks.base.TaskRef` (``TaskMix.get``).
        tokenizer: the policy's tokenizer (step credit decodes trained ids with it).
        tokenizer_id: its id (external samples must match it).
        model: the policy model (the screen scores peers' completions with it).
        our_model_id: the base model id (external samples must match it).
        screen: the likelihood screen (shared with the node's prefix screen of expansion).
        phase: ``phase(name)`` times a stage (``PhaseTimer.phase``; ``screen``, ``expand``).
    """

    def __init__(self, cfg: RunConfig, *, get_task: Callable[[TaskRef], Task], tokenizer: Any, tokenizer_id: str,
                 model: torch.nn.Module, our_model_id: str, screen: LikelihoodScreen,
                 phase: Callable[[str], AbstractContextManager]) -> None:
        self.cfg, self.get_task, self.tokenizer, self.tokenizer_id = cfg, get_task, tokenizer, tokenizer_id
        self.model, self.our_model_id, self.screen, self.phase = model, our_model_id, screen, phase

    def external_step_credit(self) -> StepCredit | None:
        """Our step checks for peers' completions (``external.external_step_credit`` with step credit on), or None."""
        t = self.cfg.train
        if not self.cfg.external.external_step_credit or (t.step_credit == "none" and not t.step_reward_weight):
            return None
        return StepCredit(self.get_task, self.tokenizer, mask=t.step_credit == "mask", weight=t.step_reward_weight)

    def build(self, step: int, trees: list[RolloutTree], tasks: Sequence[Task], candidates: list[PeerTree],
              rescued: list[MergedGroup], *, screen_peers: bool, expand: ExpandFn | None = None) -> BuiltBatch:
        """The batch of round ``step`` (0-based; logs name ``step + 1``).

        Args:
            step: the round's step (the policy version of our trees; seeds the external selection's RNG).
            trees: our scored trees of the round (pruned branches removed), in task order.
            tasks: their tasks.
            candidates: peers' re-verified trees (rescue answers apart).
            rescued: merged rescue groups (``Levers.merge_rescued``).
            screen_peers: a swarm is attached: with ``external.screen`` on, our completions join the screen's
                reference and peers' samples are screened.
            expand: the node's expansion of this round's peer trees (``levers.expansion``).

        Returns:
            :class:`BuiltBatch`. Raises only on our own input (peer input is caught once, module docstring).
        """
        cfg = self.cfg
        m: dict[str, Any] = {}
        local, adv, bonus = self._local(trees, tasks, m)
        m["external/failed"] = 0
        external: list[Sample] = []
        if candidates:
            external = self._peer_stage(m, step, "process", f"processing {len(candidates)} external trees",
                                        lambda: self._select(step, candidates, trees, bonus, m), [])
        external += [s for g in rescued for s in g.peer]  # rescue answers meet the screen with the other samples
        charges: list[Charge] = []
        if cfg.external.screen.enabled and screen_peers:
            # our own completions of this step join the reference, then peers' are scored against it
            self.screen.observe(tree.completion_logprobs(leaf) for tree in trees for leaf in tree.leaves())
            if external:
                external = self._peer_stage(m, step, "screen", f"screening {len(external)} external samples",
                                            lambda: self._screen(external, charges, m), [])
        rescue_kept = [s for s in external if s.group_id.endswith(RESCUE_GROUP_SUFFIX)]
        external = [s for s in external if not s.group_id.endswith(RESCUE_GROUP_SUFFIX)]
        batch, bm = compose_batch(local, external, cfg.external.max_external_share)
        trained_rescue = self._add_rescued(batch, rescued, rescue_kept, m) if rescued else []
        tokens = 0
        if cfg.levers.expansion.enabled and candidates and expand is not None:
            # continue re-verified peers' promising prefixes with our policy: the prefix is context only, the
            # continuation is ours (on-policy, our log-probs, our verifier's rewards), so it trains as local
            # samples -- added after the external cap, so they never make room for more external samples
            screened_out = {peer for peer, _, _ in charges}
            samples, tokens = self._peer_stage(m, step, "expand", "expanding peer prefixes",
                                               lambda: self._expansion(candidates, screened_out, expand, m), ([], 0))
            batch += samples
        m.update(bm)
        return BuiltBatch(batch, local, external, adv, trained_rescue, charges, m, tokens)

    # ------------------------------------------------------------------ the stages
    def _peer_stage(self, m: dict[str, Any], step: int, stage: str, what: str, call: Callable[[], _T],
                    dropped: _T) -> _T:
        """Run one stage on peer input: the one place a failure of peer input is caught. A failure returns
        ``dropped`` (the stage's samples are left out), counts it (``external/failed`` and
        ``external/failed_stage``; ``expansion/failed`` for ``expand``) and logs one line naming ``what``."""
        try:
            return call()
        except EXTERNAL_FAILURES as e:  # peer input never kills the node: drop it, count it, go on
            if stage == "expand":
                m["expansion/failed"] = 1
                after = "skipped"
            else:
                m["external/failed"] += 1
                m["external/failed_stage"] = stage
                after = "training on local samples only"
            log.warning("step %d: %s failed (%s: %s); %s", step + 1, what, type(e).__name__, str(e)[:200], after)
            return dropped

    def _local(self, trees: list[RolloutTree], tasks: Sequence[Task],
               m: dict[str, Any]) -> tuple[list[Sample], AdvantageResult, list[dict[int, float]] | None]:
        """Our samples: advantages from the local trees; with step checks on, a process reward for the right
        steps and no credit against a line's verdict. Returns the samples, the advantages and the step bonus."""
        t = self.cfg.train
        reports = step_reports(trees, tasks) if t.step_credit != "none" or t.step_reward_weight else None
        bonus = step_reward_bonus(reports, t.step_reward_weight) if t.step_reward_weight else None
        adv = compute_advantages(trees, t.advantage_estimator, t.scale_rewards, std_floor=t.advantage_std_floor,
                                 reward_bonus=bonus)
        if reports is not None:  # the bonus pays checked lines only: the answer keeps the outcome's advantage
            outcome = compute_advantages(trees, t.advantage_estimator, t.scale_rewards,
                                         std_floor=t.advantage_std_floor) if bonus else None
            m.update(apply_step_credit(trees, reports, adv, self.tokenizer, outcome=outcome,
                                       mask=t.step_credit == "mask"))
        local = samples_from_trees(trees, adv, source="local", drop_zero_variance=t.drop_zero_variance_groups,
                                   mask_truncated=t.mask_truncated_completions)
        return local, adv, bonus

    def _select(self, step: int, candidates: list[PeerTree], trees: list[RolloutTree],
                bonus: list[dict[int, float]] | None, m: dict[str, Any]) -> list[Sample]:
        """Peers' samples: each external group normalized within its own source (peer, task), bounded in tokens
        and length, capped in share (:func:`~swarmnode.train.external.process_external`)."""
        cfg = self.cfg
        ext_credit = self.external_step_credit()
        local_bonus = ({t.task.key(): [b.get(leaf, 0.0) for leaf in t.leaves()] for t, b in zip(trees, bonus)}
                       if ext_credit is not None and bonus else None)  # `joint` pools with the local bonus
        external, em = process_external(
            candidates,
            cfg.external,
            current_version=step,
            our_model_id=self.our_model_id,
            our_tokenizer_id=self.tokenizer_id,
            local_rewards_by_task={t.task.key(): t.leaf_rewards() for t in trees},
            local_bonus_by_task=local_bonus,
            scale_rewards=cfg.train.scale_rewards,
            rng=random.Random(cfg.seed * 7_919 + step),
            max_completion_length=cfg.sampling.max_completion_length,
            max_prompt_length=cfg.sampling.max_prompt_length,
            std_floor=cfg.train.advantage_std_floor,
            step_credit=ext_credit,
        )
        m.update(em)
        return external

    def _screen(self, external: list[Sample], charges: list[Charge], m: dict[str, Any]) -> list[Sample]:
        """The samples the likelihood screen keeps; a charge per peer it rejected samples of."""
        with self.phase("screen"):
            sr = self.screen.screen(self.model, external)
        m.update(sr.metrics)
        charges.extend((peer, SCREEN_REASON, n) for peer, n in sr.rejected_by_peer.items())
        return sr.kept

    @staticmethod
    def _add_rescued(batch: list[Sample], rescued: list[MergedGroup], rescue_kept: list[Sample],
                     m: dict[str, Any]) -> list[MergedGroup]:
        """Add to ``batch`` the merged rescue groups with a peer sample the screen kept (after the external cap,
        bounded by max_requests x (max_merged + our group's leaves), as expansions are); returns those groups."""
        kept_ids = {id(s) for s in rescue_kept}
        trained: list[MergedGroup] = []
        for g in rescued:
            peer = [s for s in g.peer if id(s) in kept_ids]
            if peer:
                batch += g.own + peer
                trained.append(g)
        m["rescue/merged"] = len(trained)
        m["rescue/merged_samples"] = sum(len(g.own) + len([s for s in g.peer if id(s) in kept_ids]) for g in trained)
        return trained

    def _expansion(self, candidates: list[PeerTree], exclude: set[str], expand: ExpandFn,
                   m: dict[str, Any]) -> tuple[list[Sample], int]:
        """The local samples of this round's expansions and the tokens generated for them, with their metrics put
        into ``m``: ``expansion/forks``, ``expansion/leaves``, ``expansion/correct`` (mean),
        ``expansion/zero_variance``, ``expansion/samples``, ``expansion/tokens`` (``expand`` adds
        ``expansion/prefix_wrong_step``, ``expansion/prefix_rejected``)."""
        t = self.cfg.train
        with self.phase("expand"):
            exps = expand(candidates, exclude, m)
        trees_x = [e.tree for e in exps]
        if not trees_x:
            m.update({"expansion/forks": 0, "expansion/samples": 0})
            return [], 0
        adv = compute_advantages(trees_x, t.advantage_estimator, t.scale_rewards, std_floor=t.advantage_std_floor)
        samples = samples_from_trees(trees_x, adv, source="local", drop_zero_variance=t.drop_zero_variance_groups,
                                     mask_truncated=t.mask_truncated_completions)
        tokens = sum(tr.generated_tokens() for tr in trees_x)
        corr = [c for e in exps for c in e.correct]
        m.update({"expansion/forks": len(exps), "expansion/leaves": len(corr),
                  "expansion/correct": sum(corr) / max(len(corr), 1),
                  "expansion/zero_variance": adv.num_zero_variance_groups,
                  "expansion/samples": len(samples), "expansion/tokens": tokens})
        return samples, tokens


__all__ = ["EXTERNAL_FAILURES", "BatchBuilder", "BuiltBatch", "Charge", "Credit", "ExpandFn"]
