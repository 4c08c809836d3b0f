"""The node's levers on what the swarm learns: the curriculum's task weights, cross-node expansion, and rescue.

- **curriculum** (``levers.curriculum``): :meth:`Levers.task_weights` reweights the draw toward tasks the swarm
  solves about half the time (``tasks/curriculum.py``); :meth:`Levers.note_success` records our own vote.
- **expansion** (``levers.expansion``): :meth:`Levers.expand` continues promising prefixes of re-verified peer
  trees with our own policy (``rollout/expansion.py``), after :meth:`Levers.check_prefix_steps` and
  :meth:`Levers.screen_prefixes`; the batch builder (``train/process.py``) turns the expansions into samples.
- **rescue** (``levers.rescue``, docs/guide/swarm.md "Rescue"): :meth:`Levers.answer_rescue` (the helper's
  side) and :meth:`Levers.merge_rescued` (the asker's side), over ``train/rescue.py``.

:class:`Levers` is a part of :class:`~swarmnode.node.Node`: it reads the node's ``cfg``, ``tasks``, ``policy``,
``backend``, ``swarm``, ``screen``, ``builder``, ``timer`` and the rescue state the node sets up.
"""

from __future__ import annotations

import logging
from functools import cache, cached_property
from typing import Any, Callable

import torch

from swarmnode.node.hooks import RescueSwarm
from swarmnode.rollout.generate import generate_rollouts
from swarmnode.rollout.expansion import Expansion, Fork, expand_forks, select_forks
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.sampler import PromptSpec
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import TaskRef
from swarmnode.tasks.curriculum import PeerRates, curriculum_weights, tally_votes
from swarmnode.tasks.partition import is_heldout_question
from swarmnode.tasks.steps import check_steps
from swarmnode.train.process import EXTERNAL_FAILURES
from swarmnode.train.rescue import CORRECT_THRESHOLD, MergedGroup, merge_rescue
from swarmnode.train.samples import Sample

log = logging.getLogger("swarmnode.node")


class Levers:
    """Curriculum weights, cross-node expansion and rescue of the node's round (module docstring)."""

    def task_weights(self) -> tuple[list[float] | None, dict[str, Any]]:
        """This step's per-source sampling weights under the swarm curriculum, and their metrics.

        ``None`` (the configured weights) when ``levers.curriculum.enabled`` is off. Otherwise each source's rate
        is the median of our own recent rate and one vote per seated established peer, and its weight is its
        configured weight times the median of the seats' factors within ``[min_factor, max_factor]``
        (:func:`tally_votes`, :func:`curriculum_weights`; young peers get no seat).
        Metrics: ``curriculum/rate/<task>`` (NaN = no votes), ``curriculum/factor/<task>`` (the weight
        multiplier), ``curriculum/share/<task>`` (share of the draws) and
        ``curriculum/voters`` (peers whose votes were used for at least one task).
        """
        cc = self.cfg.levers.curriculum
        if not cc.enabled:
            return None, {}
        keys = [self.tasks.source_key(i) for i in range(len(self.tasks.sources))]
        peers: list[PeerRates] = []
        if self.swarm is not None:
            peers = self.swarm.peer_task_rates()
        tallies = tally_votes(keys, self.local_rates.counts(), peers, min_samples=cc.min_samples,
                              max_age_s=cc.max_age_seconds, max_voters=cc.max_voters,
                              established_after=self.cfg.swarm.trust.established_after,
                              own_peer_id=None if self.swarm is None else self.swarm.peer_id,
                              min_factor=cc.min_factor, max_factor=cc.max_factor)
        rates = {k: t.rate for k, t in tallies.items()}
        weights = curriculum_weights(self.tasks.weights, factors=[tallies[k].factor for k in keys],
                                     min_factor=cc.min_factor, max_factor=cc.max_factor)
        total = sum(weights)
        # peers whose votes were used for at least one task (not every heartbeat read)
        m: dict[str, Any] = {"curriculum/voters": len({p for t in tallies.values() for p in t.peers})}
        for i, k in enumerate(keys):
            name = self._task_label(i)
            m[f"curriculum/rate/{name}"] = float("nan") if rates[k] is None else rates[k]
            m[f"curriculum/factor/{name}"] = tallies[k].factor
            m[f"curriculum/share/{name}"] = weights[i] / total
        return weights, m

    @cached_property
    def _labels_by_key(self) -> dict[str, str]:
        """``{source_key(i): _task_label(i)}`` for every task source (the sources are fixed for the node's life)."""
        return {self.tasks.source_key(i): self._task_label(i) for i in range(len(self.tasks.sources))}

    def _task_label(self, i: int) -> str:
        name = self.tasks.sources[i].name
        return name if [s.name for s in self.tasks.sources].count(name) == 1 else f"{name}#{i}"

    def note_success(self, step_counts: dict[str, Any]) -> None:
        """Record this step's per-task ``(leaves, correct leaves)`` pairs of our local samples (the curriculum's own
        vote) and hand the window's counts to the swarm layer for our heartbeats (curriculum on only)."""
        if not self.cfg.levers.curriculum.enabled:
            return
        self.local_rates.observe(step_counts)
        if self.swarm is not None:
            self.swarm.share_task_rates(self.local_rates.counts())

    def expand(self, candidates: list[PeerTree], step: int, exclude_peers: set[str],
               metrics: dict[str, Any] | None = None) -> list[Expansion]:
        """Cross-node tree expansion (``levers.expansion``): continue the most promising prefixes of this step's
        re-verified peer trees with our own policy, under our own prompt, scored by our verifier
        (:func:`~swarmnode.rollout.expansion.expand_forks`). Only trees of established keys are expanded, one
        fork per peer (:func:`~swarmnode.rollout.expansion.select_forks`); peers in ``exclude_peers`` (rejected by
        the likelihood screen this step) are not, and with the screen on a fork whose prefix our policy finds
        unlikely is skipped (:meth:`screen_prefixes`; their count goes to ``metrics["expansion/prefix_rejected"]``),
        and so is a fork whose prefix has a reasoning line a program finds wrong (:meth:`check_prefix_steps`,
        ``metrics["expansion/prefix_wrong_step"]``). Returns the new trees (never published)."""
        xc = self.cfg.levers.expansion
        max_comp = self.cfg.sampling.max_completion_length
        tok = self.policy.tokenizer
        forks = select_forks(candidates, len(candidates), max_prefix_tokens=max_comp - xc.min_continuation_tokens,
                             accept_task=self.tasks.contains, exclude_peers=exclude_peers,
                             decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
                             step_delimiters=self.cfg.sampling.tree.step_delimiters)
        prompt_of = cache(self._prompt_for_ref)  # our prompt per task, built once for the screen and the samples
        forks, n_wrong = self.check_prefix_steps(forks)
        forks, n_rejected = self.screen_prefixes(forks, prompt_of)
        forks = forks[: xc.max_forks]
        if metrics is not None:
            metrics["expansion/prefix_wrong_step"] = n_wrong
            metrics["expansion/prefix_rejected"] = n_rejected
        if not forks:
            return []
        gen = torch.Generator(device="cpu").manual_seed((self.cfg.seed * 1_000_003 + step) % (2**63) ^ 0x5E1F)

        def sample(prompts: list[PromptSpec], scfg: Any) -> list[RolloutTree]:
            return generate_rollouts(self.backend, tok, prompts, scfg, policy_version=step, generator=gen)

        def score(ref: Any, text: str) -> dict[str, float]:
            return self.tasks.score_detail(self.tasks.get(ref), text)

        out = expand_forks(forks, our_prompt=prompt_of, sample=sample,
                           score=score, decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
                           sampling=self.cfg.sampling, num_generations=xc.num_generations,
                           min_continuation_tokens=xc.min_continuation_tokens)
        for e in out:
            e.tree.model_id, e.tree.tokenizer_id = self.base_model_id, self.policy.tokenizer_id
        return out

    def _prompt_for_ref(self, ref: TaskRef) -> PromptSpec:
        """Our own prompt for the task ``ref`` names (regenerated from our task mix)."""
        return self._prompt_spec(self.tasks.get(ref))

    def check_prefix_steps(self, forks: list[Fork]) -> tuple[list[Fork], int]:
        """The forks whose prefix has no wrong step, in order, and how many had one.

        A fork's prefix becomes the context our policy continues from. For a task with a step checker
        (:func:`~swarmnode.tasks.steps.check_steps`, against the task's metadata regenerated by us), a prefix
        with a line in the form of one of the task's steps (``"3+4=7"`` and the like) that is not the step the
        worked-solution writer takes from the line before it is skipped. The likelihood screen cannot tell: a
        wrong running sum in our own style passed it in 25 of 30 tries (an outside attack). Lines of
        other text (another model's prose) are left to the likelihood screen; forks of tasks without a checker
        pass. The peer is not charged (our own policy writes wrong lines too). Never raises on any prefix text."""
        kept = []
        for f in forks:
            task = self.tasks.get(f.task)
            report = check_steps(task.name, task.metadata, f.prefix_text)
            if report is None or all(c.valid or not c.in_form for c in report.lines):
                kept.append(f)
        return kept, len(forks) - len(kept)

    def screen_prefixes(self, forks: list[Fork],
                        prompt_of: Callable[[TaskRef], PromptSpec] | None = None) -> tuple[list[Fork], int]:
        """The forks whose prefix passes the likelihood screen (``external.screen``), in order, and how many did not.

        A fork's prefix becomes the context our policy continues from, so it meets the rule peers' completions
        meet (:class:`~swarmnode.train.screen.LikelihoodScreen`): its per-token log-probs under our current policy,
        after our own prompt for the task, must not fall below the reference's mean and window thresholds. A
        prefix of text our policy would not write (an injected instruction, a payload) is skipped; the peer is not
        charged (honest prefixes fail too now and then). With the screen off, or still in warm-up, every fork
        passes. ``prompt_of`` gives our prompt for a task (default: built from the regenerated task). Raises what
        the forward raises (the caller drops the expansion)."""
        th = self.screen.thresholds() if self.cfg.external.screen.enabled else None
        if th is None or not forks:
            return forks, 0
        prompt_of = prompt_of or self._prompt_for_ref
        rows = [Sample(prompt_ids=list(prompt_of(f.task).prompt_ids),
                       completion_ids=list(f.prefix_ids), advantages=[0.0] * len(f.prefix_ids)) for f in forks]
        stats = self.screen.score(self.policy.model, rows)
        kept = [f for f, (mean, win) in zip(forks, stats) if mean >= th[0] and win >= th[1]]
        return kept, len(forks) - len(kept)

    # ------------------------------------------------------------------ rescue
    def _rescue_swarm(self) -> RescueSwarm | None:
        """The swarm layer as rescue uses it, or None (no swarm, rescue off, or a hook without the methods)."""
        if self.swarm is None or not self.cfg.levers.rescue.enabled or not isinstance(self.swarm, RescueSwarm):
            return None
        return self.swarm

    def answer_rescue(self, step: int, m: dict[str, Any]) -> None:
        """The helper's side of rescue: answer at most ``levers.rescue.answer_prompts`` of the peers' requests
        (:class:`~swarmnode.train.rescue.RescueHelper` decides which), sampled with our policy and sampling config,
        scored by our verifier; the trees with an exactly correct leaf are published (``publish_rescue``). We do
        not train on them. Metrics into ``m``: ``rescue/requests_seen``, ``rescue/answered`` (trees published),
        ``rescue/answered_leaves_correct`` and the refusal counts. A failure is logged and dropped."""
        swarm = self._rescue_swarm()
        if swarm is None:
            return
        reqs = swarm.rescue_requests()
        m["rescue/requests_seen"] = len(reqs)
        m["rescue/answered"] = m["rescue/answered_leaves_correct"] = 0
        heldout_cache: dict[TaskRef, bool] = {}

        def is_heldout(ref: TaskRef) -> bool:
            if ref not in heldout_cache:
                try:
                    heldout_cache[ref] = is_heldout_question(self.tasks.get(ref).question, self.tasks.eval_fraction)
                except (KeyError, ValueError, TypeError, IndexError):
                    heldout_cache[ref] = False  # not regenerable: contains() refuses it as not our task
            return heldout_cache[ref]

        chosen, cm = self.rescue_helper.select(
            reqs, step, source_known=lambda r: self.tasks.source_index(r) is not None, is_heldout=is_heldout,
            contains=self.tasks.contains)
        m.update(cm)
        if not chosen:
            return
        try:
            with self.timer.phase("rescue_answer"):
                tasks = [self.tasks.get(ref) for _, ref in chosen]
                gen = torch.Generator(device="cpu").manual_seed((self.cfg.seed * 1_000_003 + step) % (2**63) ^ 0x5E5C)
                trees = generate_rollouts(self.backend, self.policy.tokenizer, [self._prompt_spec(t) for t in tasks],
                                          self.cfg.sampling, policy_version=step, generator=gen)
                self.tokens_generated += sum(t.generated_tokens() for t in trees)
                outcomes: dict[str, bool] = {}
                answers: list[RolloutTree] = []
                for (peer, _), task, tree in zip(chosen, tasks, trees):
                    tree.model_id, tree.tokenizer_id = self.base_model_id, self.policy.tokenizer_id
                    tree = tree.without_pruned()
                    n_ok = 0
                    for leaf in tree.leaves():
                        d = self.tasks.score_detail(task, tree.completion_text(leaf))
                        tree.nodes[leaf].reward = d["reward"]
                        n_ok += int(d["correct"] >= CORRECT_THRESHOLD)
                    tree.update_stats()
                    outcomes[peer] = outcomes.get(peer, False) or n_ok > 0
                    if n_ok:
                        answers.append(tree)
                        m["rescue/answered_leaves_correct"] += n_ok
                self.rescue_helper.record(outcomes, step)
                if answers:
                    # as publish: off the main thread, watched (it waits for the verifier's lock)
                    pm = self._watched(lambda: swarm.publish_rescue(answers, step, policy_version=step),
                                       "publish_rescue", dict)
                    m.update(pm)
                    m["rescue/answered"] = int(pm.get("rescue/published_trees", len(answers)))
        except EXTERNAL_FAILURES as e:
            m["rescue/failed"] = 1
            log.warning("step %d: answering %d rescue requests failed (%s: %s); skipped", step + 1, len(chosen),
                        type(e).__name__, str(e)[:200])

    def merge_rescued(self, rescue_cands: list[PeerTree], m: dict[str, Any]) -> list[MergedGroup]:
        """The asker's side of rescue: merge the peer trees of our pending questions into our stored all-wrong
        groups (:func:`~swarmnode.train.rescue.merge_rescue`), at most ``levers.rescue.max_requests`` groups a step.
        An entry leaves the book only once its merged group trained (``RoundLoop._settle``): a group whose peer
        samples the screen dropped keeps its question pending, so an answer that carries a payload cannot use up
        our question before a clean answer arrives (outside attack: payload answers from fresh keys, each taking a
        question, held the honest answerer's merges at 0 in 9 steps). The peer's samples are marked ``admitted_by_form`` as other peers' samples
        are (``external.screen.admit_step_form``, :meth:`~swarmnode.rollout.step_credit.StepCredit.admission`), so a worked
        solution in exact step form (with ``masked``: any completion of a checked task) meets no likelihood screen;
        with ``keep`` such a sample is judged and, if rejected, trains with its ``unscreened_advantages``. Metrics into ``m``: ``rescue/merged`` (groups),
        ``rescue/merged_samples``."""
        cfg = self.cfg
        by_key: dict[str, list[PeerTree]] = {}
        for pt in rescue_cands:
            by_key.setdefault(pt.task_key, []).append(pt)
        out: list[MergedGroup] = []
        credit = self.builder.external_step_credit()
        admit = credit if cfg.external.screen.admit_step_form != "off" else None
        for key, pts in by_key.items():
            if len(out) >= cfg.levers.rescue.max_requests:
                break
            entry = self.rescue_book.get(key)
            if entry is None:
                continue
            task = self.tasks.get(entry.ref)

            def score(text: str, task=task) -> tuple[bool, float]:
                d = self.tasks.score_detail(task, text, external=True)
                return d["correct"] >= CORRECT_THRESHOLD, d["reward"]

            try:
                g = merge_rescue(entry, pts, score, max_merged=cfg.levers.rescue.max_merged,
                                 estimator=cfg.train.advantage_estimator, scale_rewards=cfg.train.scale_rewards,
                                 std_floor=cfg.train.advantage_std_floor,
                                 mask_truncated=cfg.train.mask_truncated_completions,
                                 max_len=cfg.external.max_external_completion_length,
                                 our_model_id=self.base_model_id, our_tokenizer_id=self.policy.tokenizer_id,
                                 peer_advantage_scale=cfg.levers.rescue.peer_advantage_scale, step_credit=credit)
            except EXTERNAL_FAILURES as e:
                log.warning("rescue: merging %d peer trees of %s failed (%s: %s); skipped", len(pts), key,
                            type(e).__name__, str(e)[:200])
                continue
            if g is not None:
                if admit is not None:  # as any peer sample: a worked solution in exact step form skips the screen
                    mode = cfg.external.screen.admit_step_form
                    for smp in g.peer:
                        if admit.admission(entry.ref, smp.completion_ids, mode):  # without the screen only
                            smp.advantages, smp.unscreened_advantages, smp.admitted_by_form, _ = admit.admitted_credit(
                                admit.report(entry.ref, smp.completion_ids), smp.completion_ids, smp.advantages,
                                mode)  # checked steps pushed up, nothing pushed down
                out.append(g)  # the entry stays pending until the group trained (RoundLoop._settle)
                self.rescue_book.mark_answered(key)  # announced after the unanswered questions from now on
        m["rescue/merged"] = len(out)
        m["rescue/merged_samples"] = sum(len(g.own) + len(g.peer) for g in out)
        return out
