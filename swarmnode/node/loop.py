"""The round loop, read top to bottom (docs/reference/design.md §1): :meth:`RoundLoop.run_step`.

Each step:

1. **draw** tasks whose answers a program can check (TaskRefs any node can regenerate); with
   ``levers.curriculum`` on, the task mix is reweighted toward tasks the swarm solves about half the time
   (``tasks/curriculum.py``, through ``node/levers.py``);
2. **sample** tree-structured rollouts from the current policy (``rollout/generate.py``);
3. **score** every leaf with the task's verifier;
4. **publish** the verified trees (pruned) to the swarm, signed;
5. **gather** peers' trees, re-verified locally (the swarm layer trusts no claim); with ``levers.rescue`` on,
   peers' answers to our all-wrong questions are merged and peers' questions answered (``node/levers.py``);
6. **process**: advantages per source (local trees, each external group on its own), the screen, batch
   composition and, with ``levers.expansion`` on, our own continuations of peers' prefixes
   (``train/process.py``'s :class:`~swarmnode.train.process.BatchBuilder`);
7. **update**: a clipped policy-gradient step; then the screen's charges and the credits for useful trees go
   to the swarm layer (in one place, :meth:`RoundLoop._settle`); checkpoint every ``save_steps`` steps, after
   ``save_seconds`` of wall clock since the last checkpoint, and on SIGINT/SIGTERM.

Steps 4–5 run only when a swarm is attached (``Node.swarm``); a solo node skips them. Once a stop is requested
(SIGINT/SIGTERM, the memory guard) the step still finishes and checkpoints, but it waits for a running publish at
most ``swarm.net.stop_wait_seconds`` and skips gather, so a call hung on the network cannot hold the stop past a
supervisor's grace (``node/stop.py``).

:class:`RoundLoop` is a part of :class:`~swarmnode.node.Node`, which sets up what it reads.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from swarmnode.monitor.metrics import node_memory_bytes
from swarmnode.node.hooks import RescueSwarm
from swarmnode.policy.backends import sync_weights
from swarmnode.rollout.generate import generate_rollouts
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import Task
from swarmnode.train.process import EXTERNAL_FAILURES, BuiltBatch, Charge, Credit
from swarmnode.train.rescue import CORRECT_THRESHOLD, RESCUE_GROUP_SUFFIX, MergedGroup, is_all_wrong
from swarmnode.train.samples import Sample

log = logging.getLogger("swarmnode.node")


@dataclass
class StepResult:
    """What one round produced (for the CLI's live view and the tests)."""

    step: int
    metrics: dict[str, Any]
    trees: list[RolloutTree] = field(default_factory=list)


@dataclass
class Round:
    """One round's state as it passes down the loop.

    Attributes:
        step: the round's step (0-based; the policy version of its trees).
        m: the round's metrics row (``docs/reference/metrics.md``), filled in loop order.
        t_start: ``time.perf_counter()`` at the start (``step_time``).
        stream: the task stream drawn from.
        tasks, trees: the drawn tasks and their sampled trees (pruned branches removed; scored in place).
        gen_tokens, n_pruned: tokens generated (pruned branches included) and pruned leaves.
        correct, fmt, n_leaves: sums of the leaves' correctness and format scores, and the leaf count.
        rescue_swarm: the swarm layer as rescue uses it, or None.
        candidates: peers' re-verified trees for normal external processing.
        rescue_cands: peers' trees of our pending rescue questions.
        rescued: the merged rescue groups.
    """

    step: int
    m: dict[str, Any]
    t_start: float
    stream: int = 0
    tasks: list[Task] = field(default_factory=list)
    trees: list[RolloutTree] = field(default_factory=list)
    gen_tokens: int = 0
    n_pruned: int = 0
    correct: float = 0.0
    fmt: float = 0.0
    n_leaves: int = 0
    rescue_swarm: RescueSwarm | None = None
    candidates: list[PeerTree] = field(default_factory=list)
    rescue_cands: list[PeerTree] = field(default_factory=list)
    rescued: list[MergedGroup] = field(default_factory=list)


class RoundLoop:
    """The round of :class:`~swarmnode.node.Node` (module docstring)."""

    def run_step(self) -> StepResult:
        """One round: draw -> sample -> score -> publish -> gather -> process -> update (-> checkpoint)."""
        rnd = self._sample()                               # 1-2. draw tasks, sample trees with our policy
        self._score(rnd)                                   # 3. our verifier's rewards (curriculum, rescue book)
        self._publish(rnd)                                 # 4. our trees to the swarm (watched)
        self._gather(rnd)                                  # 5. peers' trees, re-verified; rescue answered, merged
        batch = self._build_batch(rnd)                     # 6. advantages, selection, screen, composition
        trained, tm = self._update(rnd, batch)             # 7. the policy-gradient step
        return self._settle(rnd, batch, trained, tm)       # charges and credits, checkpoint, metrics

    # ------------------------------------------------------------------ 1-2. draw, sample
    def _sample(self) -> Round:
        """Draw this round's tasks (with the swarm curriculum on, from task weights the swarm's success rates
        moved) and sample their trees; pruned branches are dropped (neither scored nor trained on)."""
        cfg, step = self.cfg, self.step
        rnd = Round(step=step, m={"step": step + 1}, t_start=time.perf_counter())
        rnd.stream = self.task_stream
        weights, cm = self.task_weights()
        rnd.m.update(cm)
        refs = self.tasks.refs_for_step(step, cfg.sampling.prompts_per_step, stream=rnd.stream, weights=weights)
        rnd.tasks = [self.tasks.get(r) for r in refs]
        with self.timer.phase("sample"):
            trees = generate_rollouts(
                self.backend,
                self.policy.tokenizer,
                [self._prompt_spec(t) for t in rnd.tasks],
                cfg.sampling,
                policy_version=step,
                generator=self.step_generator(step),
            )
        for tr in trees:
            tr.model_id, tr.tokenizer_id = self.base_model_id, self.policy.tokenizer_id
        rnd.gen_tokens = sum(t.generated_tokens() for t in trees)  # pruned branches' tokens were generated too
        rnd.n_pruned = sum(len(t.pruned_leaves()) for t in trees)
        rnd.trees = [t.without_pruned() for t in trees]  # a pruned branch is neither scored nor trained on
        return rnd

    # ------------------------------------------------------------------ 3. score
    def _score(self, rnd: Round) -> None:
        """Score every leaf with the task's verifier; record our per-task success (the curriculum's own vote),
        and with rescue on, hold our all-wrong groups and announce the newest (next heartbeats)."""
        m = rnd.m
        with self.timer.phase("score"):
            success: dict[str, list[int]] = {}  # task key -> [leaves, correct leaves] (the curriculum's counts)
            all_wrong: list[RolloutTree] = []  # own groups with no exact-correct leaf (rescue)
            for task, tree in zip(rnd.tasks, rnd.trees):
                counts = success.setdefault(self.tasks.source_key(self.tasks.source_index(task.ref)), [0, 0])
                leaf_correct = []
                for leaf in tree.leaves():
                    d = self.tasks.score_detail(task, tree.completion_text(leaf))
                    tree.nodes[leaf].reward = d["reward"]
                    rnd.correct += d["correct"]
                    rnd.fmt += d["format"]
                    rnd.n_leaves += 1
                    counts[0] += 1
                    counts[1] += int(d["correct"] >= CORRECT_THRESHOLD)
                    leaf_correct.append(d["correct"])
                tree.update_stats()
                if is_all_wrong(leaf_correct):
                    all_wrong.append(tree)
        self.note_success(success)  # our per-task success: the curriculum's own vote, and what our heartbeats carry
        labels = self._labels_by_key
        for key, (n, c) in success.items():  # per-task local leaves and exact-correct leaves (task-mix-aware reports)
            m[f"task/{labels.get(key, key)}/leaves"] = n
            m[f"task/{labels.get(key, key)}/correct"] = c
        self.tokens_generated += rnd.gen_tokens
        rnd.rescue_swarm = self._rescue_swarm()
        if rnd.rescue_swarm is not None:  # hold our all-wrong groups and announce the newest (next heartbeats)
            rc = self.cfg.levers.rescue
            m.update({f"rescue/{k}": 0 for k in (
                "requests_seen", "answered", "answered_leaves_correct", "merged", "merged_samples", "refused_heldout",
                "refused_task", "refused_standing", "refused_budget", "refused_skipped", "refused_repeat")})
            m["rescue/expired"] = self.rescue_book.expire(rnd.step)
            for tree in all_wrong:
                self.rescue_book.add(tree, rnd.step)
            self.rescue_totals["all_wrong"] += len(all_wrong)
            asked = self.rescue_book.refs(rc.max_requests)
            rnd.rescue_swarm.announce_rescue(asked)
            m["rescue/asked"] = len(asked)

    # ------------------------------------------------------------------ 4. publish, 5. gather (swarm only)
    def _publish(self, rnd: Round) -> None:
        """Publish our scored trees, off the main thread and watched (``node/stop.py``)."""
        if self.swarm is None:
            return
        swarm, step = self.swarm, rnd.step
        with self.timer.phase("gossip"):
            rnd.m.update(self._watched(lambda: swarm.publish(rnd.trees, step, policy_version=step), "publish", dict))

    def _gather(self, rnd: Round) -> None:
        """Gather peers' re-verified trees (not once a stop is requested: this step then trains on its local
        samples and checkpoints); act on a swarm-layer stall the monitor flags; with rescue on, answer peers'
        questions and merge peers' answers to ours (``node/levers.py``)."""
        m, step = rnd.m, rnd.step
        if self.swarm is not None:
            if not self.stop_requested:  # stopping: this step trains on its local samples, then checkpoints
                with self.timer.phase("verify"):
                    rnd.candidates, sm = self.swarm.gather(step, policy_version=step)
                    m.update(sm)
                if rnd.rescue_swarm is not None:  # answers to our pending questions leave normal external processing
                    rnd.rescue_cands = [c for c in rnd.candidates if c.task_key in self.rescue_book]
                    rnd.candidates = [c for c in rnd.candidates if c.task_key not in self.rescue_book]
                    self.answer_rescue(step, m)  # spare budget: peers' questions, sampled, scored, published
            self._act_on_stall_flag()
        rnd.rescued = self.merge_rescued(rnd.rescue_cands, m) if rnd.rescue_cands else []

    # ------------------------------------------------------------------ 6. process
    def _build_batch(self, rnd: Round) -> BuiltBatch:
        """The batch (``train/process.py``): local advantages, external selection, the screen, composition and
        expansion samples; its metrics join the round's, its expansion tokens our token count."""
        step = rnd.step
        batch = self.builder.build(step, rnd.trees, rnd.tasks, rnd.candidates, rnd.rescued,
                                   screen_peers=self.swarm is not None,
                                   expand=lambda cands, exclude, m: self.expand(cands, step, exclude, m))
        rnd.m.update(batch.metrics)
        self.tokens_generated += batch.expansion_tokens
        return batch

    # ------------------------------------------------------------------ 7. update
    def _update(self, rnd: Round, batch: BuiltBatch) -> tuple[list[Sample], dict[str, Any]]:
        """The policy-gradient step on the batch; returns the samples it trained on and the trainer's metrics.

        A failure with external samples in the batch zeroes the gradients and redoes the step on local samples
        only (a rescued group's own wrong leaves go too: they lose their contrast); without external samples
        the failure is ours and propagates."""
        m, samples = rnd.m, batch.samples
        external_used = [s for s in samples if not s.is_local]
        with self.timer.phase("train"):
            try:
                tm = self.trainer.step(samples, token_weight_fn=self.token_weight_fn if external_used else None)
            except EXTERNAL_FAILURES as e:
                if not external_used:
                    raise  # our own samples: a real bug, not peer input
                self.trainer.optimizer.zero_grad(set_to_none=True)
                m["external/failed"] += 1
                m["external/failed_stage"] = "train"
                m["external/failed_samples"] = len(external_used)
                log.warning("step %d: training on %d external samples failed (%s: %s); redoing the step on local "
                            "samples only", rnd.step + 1, len(external_used), type(e).__name__, str(e)[:200])
                # our wrong leaves of a rescued group lose their contrast with the peers' leaves: out too
                samples = [s for s in samples if s.is_local and not s.group_id.endswith(RESCUE_GROUP_SUFFIX)]
                tm = self.trainer.step(samples, token_weight_fn=None)
            sync_weights(self.backend, self.policy.model)  # no-op for hf; in-place weight load for vllm
        return samples, tm

    # ------------------------------------------------------------------ charges, credits, bookkeeping
    def _settle(self, rnd: Round, batch: BuiltBatch, trained: list[Sample], tm: dict[str, Any]) -> StepResult:
        """Hand the screen's charges and the credits to the swarm layer; count rescues; advance the step;
        checkpoint when due; write the round's metrics row."""
        m = rnd.m
        external_used = [s for s in trained if not s.is_local]
        # standing for what we trained on and the screen judged, nothing else (its warm-up keeps nothing)
        updated = not tm.get("skipped") and tm.get("nonfinite_updates", 0) < tm.get("iterations", 1)
        judged = not self.cfg.external.screen.enabled or not m.get("screen/warmup")
        credits = batch.credits(trained) if external_used and updated and judged and self.swarm is not None else []
        self._apply_standing(batch.charges, credits)
        if rnd.rescue_swarm is not None:
            if updated and external_used:  # a rescued question leaves the book once its group trained
                for g in batch.trained_rescue:
                    self.rescue_book.take(g.key)
            self.rescue_totals["rescued"] += len(batch.trained_rescue) if updated and external_used else 0
            m["rescue/pending"] = len(self.rescue_book)
            m["rescue/all_wrong_total"] = self.rescue_totals["all_wrong"]
            m["rescue/rescued_total"] = self.rescue_totals["rescued"]
        self.step += 1

        if self.save_due():
            with self.timer.phase("checkpoint"):
                self.save()

        phases = self.timer.reset()
        wall = time.perf_counter() - rnd.t_start
        m.update(
            {
                "reward": rnd.correct / max(rnd.n_leaves, 1),
                "format": rnd.fmt / max(rnd.n_leaves, 1),
                "leaves": rnd.n_leaves,
                "leaves_pruned": rnd.n_pruned,
                "task_stream": rnd.stream,
                "groups": batch.advantages.num_groups,
                "zero_variance_groups": batch.advantages.num_zero_variance_groups,
                "samples_local": len(batch.local),
                "samples_external": len(external_used),
                "tokens_generated": rnd.gen_tokens,
                "tokens_total": self.tokens_generated,
                "tokens_per_s": rnd.gen_tokens / max(phases.get("sample", 0.0), 1e-9),
                "step_time": wall,
                "time": {k: round(v, 4) for k, v in phases.items()},
                "rss_bytes": node_memory_bytes(),  # with the DHT child, p2pd and torch's shm manager
                "unix_time": time.time(),
            }
        )
        m.update({f"train/{k}": v for k, v in tm.items()})
        self.metrics.write(m)
        return StepResult(self.step, m, rnd.trees)

    def _apply_standing(self, charges: list[Charge], credits: list[Credit]) -> None:
        """The one place the round's verdicts on peers reach the swarm layer: each charge (``SwarmHook.charge``:
        samples the screen rejected), then each credit (``SwarmHook.credit``: useful trees we trained on)."""
        if self.swarm is None:
            return
        for peer, reason, n in charges:
            self.swarm.charge(peer, reason, n)
        for peer, n in credits:
            self.swarm.credit(peer, n)
