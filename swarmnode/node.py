"""The node: one round loop, read top to bottom (docs/reference/design.md §1).

Each step:

1. **draw** tasks whose answers a program can check (TaskRefs any node can regenerate); with
   ``swarm.curriculum`` on, the task mix is reweighted toward tasks the swarm solves about half the time
   (``tasks/curriculum.py``);
2. **sample** tree-structured rollouts from the current policy;
3. **score** every leaf with the task's verifier;
4. **publish** the verified trees (pruned) to the swarm, signed;
5. **gather** peers' trees, re-verified locally (the swarm layer trusts no claim);
6. **process**: advantages per source (local trees, each external group on its own), batch composition; with
   ``swarm.expansion`` on, a re-verified peer tree's promising prefix is first continued by our own policy
   (``rollout/expansion.py``: the prefix is context only, the continuation is ours and trains as local);
7. **update**: a clipped policy-gradient step; checkpoint every ``save_steps`` steps, after ``save_seconds`` of
   wall clock since the last checkpoint, and on SIGINT/SIGTERM.

Steps 4–5 run only when a swarm is attached (``Node.swarm``); a solo node skips them. Once a stop is requested
(SIGINT/SIGTERM, the memory guard) the step still finishes and checkpoints, but it waits for a running publish at most
``swarm.stop_wait_seconds`` and skips gather, so a call hung on the network cannot hold the stop past a supervisor's
grace (:meth:`Node._watched`).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, TypeVar, runtime_checkable

import numpy as np
import torch

from swarmnode.config import RunConfig, dump_config
from swarmnode.evaluation import EvalResult, evaluate_mix
from swarmnode.monitor.metrics import MetricsWriter, PhaseTimer, node_memory_bytes
from swarmnode.monitor.runtime import WATCHED_CALL_THREAD, NodeMonitor
from swarmnode.monitor.status import SwarmProbe
from swarmnode.policy.backends import generate_rollouts, make_generation_backend, sync_weights
from swarmnode.policy.loading import Policy, check_context, load_policy
from swarmnode.policy.memory import plan_for_model
from swarmnode.policy.threads import apply_threads
from swarmnode.rollout.advantages import compute_advantages
from swarmnode.rollout.step_credit import StepCredit, apply_step_credit, step_reports, step_reward_bonus
from swarmnode.rollout.expansion import Expansion, Fork, expand_forks, select_forks
from swarmnode.rollout.sampler import PromptSpec
from swarmnode.rollout.tree import RolloutTree
from swarmnode.rundir import (
    CHILDREN_FILE,
    EXIT_DISK,
    ExclusiveLock,
    check_writable,
    checkpoint_bytes,
    disk_error,
    end_stale_children,
    free_bytes,
    is_disk_error,
    lock_run_dir,
)
from swarmnode.tasks.base import Task, TaskRef
from swarmnode.tasks.curriculum import LocalRates, PeerRates, curriculum_weights, tally_votes
from swarmnode.tasks.mix import TaskMix, stream_for_peer
from swarmnode.tasks.partition import is_heldout_question
from swarmnode.tasks.steps import check_steps
from swarmnode.train.batch import compose_batch, samples_from_trees, trained_groups_by_peer
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.train.external import process_external
from swarmnode.train.off_policy import make_token_weight_fn
from swarmnode.train.rescue import (
    CORRECT_THRESHOLD,
    RESCUE_GROUP_SUFFIX,
    MergedGroup,
    RescueBook,
    RescueHelper,
    is_all_wrong,
    merge_rescue,
)
from swarmnode.train.screen import SCREEN_REASON, LikelihoodScreen
from swarmnode.train.checkpoint import (
    ALLOW_CHANGE_FLAG,
    QUARANTINE_DIR,
    CheckpointError,
    apply_optimizer_config,
    corrupt_checkpoints,
    load_latest_checkpoint,
    load_training_state,
    restore_rng,
    resync_learning_rate,
    resume_config_changes,
    save_checkpoint,
)
from swarmnode.train.samples import Sample
from swarmnode.train.trainer import Trainer

log = logging.getLogger("swarmnode.node")


class SwarmHook(SwarmProbe, Protocol):
    """The swarm layer as the node, the CLI and the monitor use it (``swarm/gossip.py``'s ``SwarmClient``
    implements it): every method any of them calls is declared here or in
    :class:`~swarmnode.monitor.status.SwarmProbe` (``swarm_id``, ``peer_id``, ``dht``, ``close``: what the
    monitor reads)."""

    def publish(self, trees: list[RolloutTree], step: int, policy_version: int) -> dict[str, Any]:
        """Publish scored local trees; returns metrics. Never raises on network trouble. No verification runs in
        it (the node may call it off the main thread, see :meth:`Node.run_step`)."""

    def gather(self, step: int, policy_version: int) -> tuple[list[PeerTree], dict[str, Any]]:
        """Return peers' trees accepted by the verification pipeline (leaf rewards are OUR re-scores), and metrics.

        Never raises on network trouble or hostile input; rejected input is counted, never returned. Called on
        the main thread (the verifiers' time limits are SIGALRM timers), so it must return within its own
        budget whatever the network does: no unbounded wait on a lock, a DHT call or another thread. The node
        does not call it once a stop is requested."""

    def charge(self, peer_id: str, reason: str, n: int = 1) -> None:
        """Charge ``peer_id`` for ``n`` of its samples the trainer rejected under ``reason`` (e.g.
        ``"likelihood_screen"``): a soft rejection each, counted in the peer's record. Never raises."""

    def credit(self, peer_id: str, n: int = 1) -> None:
        """Credit ``peer_id`` with ``n`` useful trees: groups of its samples this step trained on, each with reward
        contrast of its own (:func:`~swarmnode.train.batch.trained_groups_by_peer`), in a step whose update ran
        and whose likelihood screen (when on) was out of its warm-up. Its earned standing
        (``swarm/peers.py``), the only way a key stops being young. Never raises."""

    def share_task_rates(self, rates: dict[str, tuple[int, int]] | None) -> None:
        """Our per-task success counts (task key -> ``(n, k)``) for our next heartbeats (swarm curriculum only).
        Never raises."""

    def peer_task_rates(self) -> list[PeerRates]:
        """Peers' per-task success counts from their heartbeats, one entry per peer id, ages measured by us
        (swarm curriculum only; untrusted, :func:`~swarmnode.tasks.curriculum.tally_votes` bounds them)."""

    def recover(self, reason: str) -> None:
        """Restart the network side (DHT) after the round stalled in the swarm layer; the node's round loop calls
        it when the monitor flags such a stall, from the main thread, possibly while a watched ``publish`` is
        still blocked on its own thread. Never raises on network trouble."""

    def note_accuracy(self, accuracy: float | None) -> None:
        """Record the last held-out accuracy in [0, 1] (None: unknown) for the heartbeats (the CLI calls it)."""

    def maddrs(self) -> list[str]:
        """Multiaddrs other nodes can bootstrap from (the CLI prints them)."""


@runtime_checkable
class RescueSwarm(Protocol):
    """The three swarm-layer methods of rescue (``swarm.rescue``; docs/guide/swarm.md "Rescue"). A
    :class:`SwarmHook` without them (an older wrapper) still runs: the node then skips rescue."""

    def announce_rescue(self, refs: Sequence[TaskRef] | None) -> None:
        """The questions (TaskRefs) we got all wrong, for our next heartbeats. Never raises."""

    def rescue_requests(self) -> list[tuple[str, TaskRef]]:
        """Peers' requests ``(peer_id, TaskRef)`` from their newest valid heartbeats (untrusted; each may carry
        a ``standing`` attribute, the asker's earned standing). Never raises."""

    def publish_rescue(self, trees: list[RolloutTree], step: int, policy_version: int) -> dict[str, Any]:
        """Publish our scored answers (each with a correct leaf) as ordinary signed bundles; returns metrics."""


_T = TypeVar("_T")

#: Flags on a signal number in the signal pipe (:meth:`Node.install_signal_handlers`): a signal while stopping
#: that was ignored, and the one that forced the stop.
_SIGNAL_REPEATED, _SIGNAL_FORCED = 0x40, 0x80


# Failures of external input inside steps 6-7 that must not kill the node: the
# allocator's RuntimeError ("can't allocate memory", CUDA OOM is a RuntimeError too), MemoryError, and the
# ValueError / TypeError / IndexError of bad shapes or ids.
_EXTERNAL_FAILURES = (RuntimeError, MemoryError, ValueError, TypeError, IndexError)


class NothingToTrainError(ValueError):
    """The run directory's newest checkpoint is already at or past ``steps``: resuming would train nothing.

    Raised by :class:`Node` (with ``require_steps_left``) before the model loads, so nothing in the run
    directory has changed.

    Attributes:
        run_dir: the run directory.
        checkpoint: the newest valid checkpoint's directory.
        step: its step.
        steps: the configured total (``steps``, which counts the resumed steps too).
    """

    def __init__(self, run_dir: Path, checkpoint: Path, step: int, steps: int) -> None:
        self.run_dir, self.checkpoint, self.step, self.steps = run_dir, checkpoint, int(step), int(steps)
        super().__init__(
            f"run dir {run_dir} is already at step {step} ({checkpoint}); steps={steps} would train nothing: "
            f"set steps > {step} (it counts all steps, the resumed ones included), or use another run dir to start "
            "from step 0")


@dataclass
class StepResult:
    """What one round produced (for the CLI's live view and the tests)."""

    step: int
    metrics: dict[str, Any]
    trees: list[RolloutTree] = field(default_factory=list)


class Node:
    """A swarmnode node: owns the policy, the task mix, the trainer and the run directory.

    Args:
        cfg: the validated run configuration.
        swarm: an optional swarm layer; ``None`` trains solo.
        fresh: start from step 0 when the run directory's checkpoints are all corrupt (they stay quarantined);
            without it that case raises; with a valid checkpoint present it raises too.
        tasks: the task mix of ``cfg.tasks`` when the caller has built it already (the CLI builds it before it
            touches the run directory, so that a task source that cannot be built is a configuration error);
            ``None`` builds it here.
        probes: likewise the ``tasks.probes`` mixes (:meth:`TaskMix.probes_from_config`); ``None`` builds them at
            the first :meth:`evaluate`.
        require_steps_left: refuse a run directory whose newest checkpoint is already at or past ``cfg.steps``
            (:class:`NothingToTrainError`, before the model loads) instead of resuming a run that trains nothing
            (the CLI sets it; a library caller may resume a finished run, e.g. to evaluate it).

    Raises:
        swarmnode.rundir.LockedError: another process uses the run directory (the message names its PID).
        swarmnode.train.checkpoint.CheckpointError: every checkpoint is corrupt and ``fresh`` is False.
        NothingToTrainError: ``require_steps_left`` and the newest checkpoint is at step ``>= cfg.steps``.
        swarmnode.config.ConfigError / FileNotFoundError / ValueError from loading the model or tasks, with
        messages naming what failed.
    """

    def __init__(self, cfg: RunConfig, swarm: SwarmHook | None = None, *, fresh: bool = False,
                 tasks: TaskMix | None = None, probes: dict[str, TaskMix] | None = None,
                 require_steps_left: bool = False, allow_config_change: bool = False) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.swarm = swarm
        self.stop_requested = False
        self.forced_by: int | None = None  # the signal that forced an immediate stop (install_signal_handlers)
        self._signals_while_stopping = 0
        self._signal_pipe: tuple[int, int] | None = None  # (read, write) fds of the signal announcements
        self._signal_thread: threading.Thread | None = None
        self.timer = PhaseTimer()
        self.step = 0
        self.tokens_generated = 0
        self._seed_everything(cfg.seed)

        self.tasks = tasks if tasks is not None else TaskMix.from_config(cfg.tasks, base_dir=Path.cwd())
        self._probes: dict[str, TaskMix] | None = probes  # built at the first evaluate() when None
        # one process per run directory (rundir.py); then end the DHT/p2pd a killed predecessor left behind
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.run_lock = lock_run_dir(self.run_dir)
        except OSError as e:  # read-only or full: one line naming the directory
            raise disk_error(self.run_dir, e) from None
        self.disk_error: str | None = None
        self.locks: list[ExclusiveLock] = [self.run_lock]
        try:
            end_stale_children(self.run_dir / CHILDREN_FILE)
            self._load(cfg, fresh, require_steps_left, allow_config_change)
        except BaseException:  # a Node that failed to start does not keep the run directory
            self.run_lock.release()
            raise

    def _load(self, cfg: RunConfig, fresh: bool, require_steps_left: bool = False,
              allow_config_change: bool = False) -> None:
        """The rest of ``__init__`` (under the run directory's lock): checkpoint, monitor, model, trainer."""
        ckpt = load_latest_checkpoint(self.run_dir, quarantine=True)
        if ckpt is None and corrupt_checkpoints(self.run_dir) and not fresh:
            raise CheckpointError(
                f"every checkpoint in {self.run_dir / 'checkpoints'} is corrupt; they were moved aside to "
                f"{self.run_dir / 'checkpoints' / QUARANTINE_DIR} (nothing was deleted). Restore one from a backup, "
                "or start again from step 0 with --fresh")
        if ckpt is not None and fresh:
            raise CheckpointError(f"--fresh: {ckpt.path} is a valid checkpoint (step {ckpt.step}); a fresh start "
                                  "would later delete it. Use another --run-dir to start from step 0")
        if require_steps_left and ckpt is not None and ckpt.step >= cfg.steps:  # before anything is written
            raise NothingToTrainError(self.run_dir, ckpt.path, ckpt.step, cfg.steps)
        # training-defining keys changed since the checkpoint: refused (ConfigChangedError), or applied and listed
        self.config_changes = resume_config_changes(ckpt, cfg, allow_config_change) if ckpt is not None else []
        # status.json (written from here on), status endpoint, stall/memory watchdogs (monitor/)
        self.monitor = NodeMonitor(self)
        model_cfg = cfg.model
        if ckpt is not None:
            model_cfg = cfg.model.model_copy(update={"name_or_path": str(ckpt.model_path)})
        # prompts + max_completion_length should fit the model's positions: checked before the weights load
        questions = [self.tasks.get(r).question for r in self.tasks.eval_refs(64)]

        def context_check(tok: Any, system: str | None, positions: int | None, source: str) -> None:
            problem = check_context(tok, system, positions, questions, cfg.sampling.max_completion_length, source)
            if problem:
                log.warning("%s", problem)

        self.policy: Policy = load_policy(model_cfg, check=context_check)
        apply_threads(cfg.threads)
        plan = None
        if self.policy.device.type == "cuda":  # size micro-batches and decode rows to the GPU; refuse what cannot fit
            plan = plan_for_model(self.policy.model, self.policy.device, cfg.sampling,
                                  utilization=cfg.model.gpu_memory_utilization)
        self.backend = make_generation_backend(self.policy, cfg.model, cfg.sampling, plan)
        self.base_model_id = self.policy.model_id
        ref_model = None
        if cfg.train.beta > 0:
            ref_model = load_policy(cfg.model).model
            ref_model.eval().requires_grad_(False)
        self.trainer = Trainer(
            self.policy.model,
            cfg.train,
            max_completion_length=cfg.sampling.max_completion_length,
            total_steps=max(cfg.steps, 1),
            ref_model=ref_model,
            temperature=cfg.sampling.temperature,
            pad_token_id=self.policy.tokenizer.pad_token_id or 0,
        )
        if ckpt is not None:
            self.step = int(ckpt.step)
            load_training_state(ckpt, self.trainer.optimizer, self.trainer.scheduler)
            resync_learning_rate(self.trainer.optimizer, self.trainer.scheduler)  # this run's horizon (--steps)
            self.trainer.step_count = self.step
            restore_rng(ckpt)
            if self.config_changes:  # applied for real: the optimizer's and the RNG's restored state included
                t = cfg.train
                apply_optimizer_config(self.trainer.optimizer, self.trainer.scheduler, t.learning_rate,
                                       t.weight_decay, (t.adam_beta1, t.adam_beta2))
                if any(k == "seed" for k, _, _ in self.config_changes):
                    self._seed_everything(cfg.seed)
                log.warning("resumed with a changed config (%s): %s", ALLOW_CHANGE_FLAG, "; ".join(
                    f"{k}: {old!r} -> {new!r}" for k, old, new in self.config_changes))
            self.tokens_generated = int(ckpt.extra.get("tokens_generated", 0))
            self.base_model_id = str(ckpt.extra.get("base_model_id", self.base_model_id))
            log.info("resumed from %s at step %d", ckpt.path, self.step)
        self.local_rates = LocalRates(cfg.swarm.curriculum.window_steps)  # our recent per-task success (curriculum)
        rc = cfg.swarm.rescue
        # rescue (train/rescue.py): our pending all-wrong groups, and which peers' questions we answer
        self.rescue_book = RescueBook(rc.max_age_steps, cfg.sampling.prompts_per_step * (rc.max_age_steps + 1))
        self.rescue_helper = RescueHelper(rc, answered_ttl_steps=4 * rc.max_age_steps)
        self.rescue_totals = {"all_wrong": 0, "rescued": 0}  # since this process started
        self.token_weight_fn = make_token_weight_fn(cfg.swarm)
        self.screen = LikelihoodScreen.from_config(
            cfg.swarm.screen,
            temperature=cfg.sampling.temperature,
            pad_token_id=self.policy.tokenizer.pad_token_id or 0,
            max_rows=cfg.train.micro_batch_size,
            max_tokens=cfg.train.max_tokens_per_micro_batch,
        )
        self.resumed_from = ckpt.path if ckpt is not None else None
        self.saved_step, self.saved_at = self.step, time.monotonic()  # the last checkpoint (or the start)
        self.checkpoint_bytes = checkpoint_bytes(self.policy.model)  # bytes; measured after each save
        if ckpt is not None:
            self.checkpoint_bytes = sum(int(f.get("size", 0)) for f in ckpt.manifest.get("files", {}).values())
        check_writable(self.run_dir, need=self.checkpoint_bytes)  # DiskError: full or read-only, before training
        (self.run_dir / "config.yaml").write_text(dump_config(cfg), encoding="utf-8")
        # one history: rows of steps after the checkpoint we resume from are about to be trained again
        self.metrics = MetricsWriter(self.run_dir / "metrics.jsonl", resume_step=self.step)
        if self.metrics.discarded:
            log.info("removed %d metrics rows of steps after %d (the run that wrote them died before checkpointing "
                     "them); kept in metrics.discarded.jsonl", self.metrics.discarded, self.step)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _seed_everything(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % (2**32))
        torch.manual_seed(seed)

    def step_generator(self, step: int) -> torch.Generator:
        """The sampling RNG of ``step``: a pure function of (seed, step), so a resumed run samples as an uninterrupted one."""
        return torch.Generator(device="cpu").manual_seed((self.cfg.seed * 1_000_003 + step) % (2**63))

    @property
    def task_stream(self) -> int:
        """The training task stream this node draws from (``TaskMix.refs_for_step``'s ``stream``).

        ``tasks.stream`` when set; otherwise derived from the swarm identity (:func:`stream_for_peer`), so nodes
        of one swarm draw different questions by default; ``0`` for a solo node.
        """
        if self.cfg.tasks.stream is not None:
            return self.cfg.tasks.stream
        if self.swarm is None:
            return 0
        return stream_for_peer(self.swarm.peer_id)

    def prompt_for(self, task: Task) -> str:
        """The prompt text of a task (the tokenizer's chat template when it has one)."""
        return self.policy.prompt(task.question)

    def _prompt_spec(self, task: Task) -> PromptSpec:
        text = self.prompt_for(task)
        ids = self.policy.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = ids[-self.cfg.sampling.max_prompt_length :]
        return PromptSpec(task=task.ref, prompt_ids=ids, prompt_text=text, task_name=task.name)

    # ------------------------------------------------------------------ the two swarm levers
    def task_weights(self) -> tuple[list[float] | None, dict[str, Any]]:
        """This step's per-source sampling weights under the swarm curriculum, and their metrics.

        ``None`` (the configured weights) when ``swarm.curriculum.enabled`` is off. Otherwise each source's rate
        is the median of our own recent rate and one vote per peer (:func:`tally_votes`; young peers never
        outvote the trusted ones), and its weight is its configured weight times a factor within
        ``[min_factor, max_factor]`` (:func:`curriculum_weights`).
        Metrics: ``curriculum/rate/<task>`` (NaN = no votes), ``curriculum/share/<task>`` (share of the draws) and
        ``curriculum/voters`` (peers whose votes were used for at least one task).
        """
        cc = self.cfg.swarm.curriculum
        if not cc.enabled:
            return None, {}
        keys = [self.tasks.source_key(i) for i in range(len(self.tasks.sources))]
        peers: list[PeerRates] = []
        if self.swarm is not None:
            peers = self.swarm.peer_task_rates()
        tallies = tally_votes(keys, self.local_rates.counts(), peers, min_samples=cc.min_samples,
                              max_age_s=cc.max_age_seconds, max_voters=cc.max_voters,
                              established_after=self.cfg.swarm.established_after,
                              own_peer_id=None if self.swarm is None else self.swarm.peer_id)
        rates = {k: t.rate for k, t in tallies.items()}
        weights = curriculum_weights(self.tasks.weights, [rates[k] for k in keys], min_factor=cc.min_factor,
                                     max_factor=cc.max_factor)
        total = sum(weights)
        # peers whose votes were used for at least one task (not every heartbeat read)
        m: dict[str, Any] = {"curriculum/voters": len({p for t in tallies.values() for p in t.peers})}
        for i, k in enumerate(keys):
            name = self._task_label(i)
            m[f"curriculum/rate/{name}"] = float("nan") if rates[k] is None else rates[k]
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
        if not self.cfg.swarm.curriculum.enabled:
            return
        self.local_rates.observe(step_counts)
        if self.swarm is not None:
            self.swarm.share_task_rates(self.local_rates.counts())

    def expand(self, candidates: list[PeerTree], step: int, exclude_peers: set[str],
               metrics: dict[str, Any] | None = None) -> list[Expansion]:
        """Cross-node tree expansion (``swarm.expansion``): continue the most promising prefixes of this step's
        re-verified peer trees with our own policy, under our own prompt, scored by our verifier
        (:func:`~swarmnode.rollout.expansion.expand_forks`). Only trees of established keys are expanded, one
        fork per peer (:func:`~swarmnode.rollout.expansion.select_forks`); peers in ``exclude_peers`` (rejected by
        the likelihood screen this step) are not, and with the screen on a fork whose prefix our policy finds
        unlikely is skipped (:meth:`screen_prefixes`; their count goes to ``metrics["expansion/prefix_rejected"]``),
        and so is a fork whose prefix has a reasoning line a program finds wrong (:meth:`check_prefix_steps`,
        ``metrics["expansion/prefix_wrong_step"]``). Returns the new trees (never published)."""
        xc = self.cfg.swarm.expansion
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
        """The forks whose prefix passes the likelihood screen (``swarm.screen``), in order, and how many did not.

        A fork's prefix becomes the context our policy continues from, so it meets the rule peers' completions
        meet (:class:`~swarmnode.train.screen.LikelihoodScreen`): its per-token log-probs under our current policy,
        after our own prompt for the task, must not fall below the reference's mean and window thresholds. A
        prefix of text our policy would not write (an injected instruction, a payload) is skipped; the peer is not
        charged (honest prefixes fail too now and then). With the screen off, or still in warm-up, every fork
        passes. ``prompt_of`` gives our prompt for a task (default: built from the regenerated task). Raises what
        the forward raises (the caller drops the expansion)."""
        th = self.screen.thresholds() if self.cfg.swarm.screen.enabled else None
        if th is None or not forks:
            return forks, 0
        prompt_of = prompt_of or self._prompt_for_ref
        rows = [Sample(prompt_ids=list(prompt_of(f.task).prompt_ids),
                       completion_ids=list(f.prefix_ids), advantages=[0.0] * len(f.prefix_ids)) for f in forks]
        stats = self.screen.score(self.policy.model, rows)
        kept = [f for f, (mean, win) in zip(forks, stats) if mean >= th[0] and win >= th[1]]
        return kept, len(forks) - len(kept)

    def _expansion_samples(self, candidates: list[PeerTree], step: int, exclude: set[str],
                           m: dict[str, Any]) -> list[Sample]:
        """The local samples of this step's expansions (:meth:`expand`), with their metrics put into ``m``:
        ``expansion/forks``, ``expansion/leaves``, ``expansion/correct`` (mean), ``expansion/zero_variance``,
        ``expansion/samples``, ``expansion/tokens``, ``expansion/prefix_wrong_step``, ``expansion/prefix_rejected``,
        ``expansion/failed``. A failure
        is dropped, never fatal."""
        cfg = self.cfg
        try:
            with self.timer.phase("expand"):
                exps = self.expand(candidates, step, exclude, m)
            trees_x = [e.tree for e in exps]
            if not trees_x:
                m.update({"expansion/forks": 0, "expansion/samples": 0})
                return []
            adv = compute_advantages(trees_x, cfg.train.advantage_estimator, cfg.train.scale_rewards,
                                     std_floor=cfg.train.advantage_std_floor)
            samples = samples_from_trees(trees_x, adv, source="local",
                                         drop_zero_variance=cfg.train.drop_zero_variance_groups,
                                         mask_truncated=cfg.train.mask_truncated_completions)
        except _EXTERNAL_FAILURES as e:
            m["expansion/failed"] = 1
            log.warning("step %d: expanding peer prefixes failed (%s: %s); skipped", step + 1, type(e).__name__,
                        str(e)[:200])
            return []
        tokens = sum(t.generated_tokens() for t in trees_x)
        self.tokens_generated += tokens
        corr = [c for e in exps for c in e.correct]
        m.update({"expansion/forks": len(exps), "expansion/leaves": len(corr),
                  "expansion/correct": sum(corr) / max(len(corr), 1),
                  "expansion/zero_variance": adv.num_zero_variance_groups,
                  "expansion/samples": len(samples), "expansion/tokens": tokens})
        return samples

    def _external_step_credit(self) -> StepCredit | None:
        """Our step checks for peers' completions (``swarm.external_step_credit`` with step credit on), or None."""
        t = self.cfg.train
        if not self.cfg.swarm.external_step_credit or (t.step_credit == "none" and not t.step_reward_weight):
            return None
        return StepCredit(self.tasks.get, self.policy.tokenizer, mask=t.step_credit == "mask",
                          weight=t.step_reward_weight)

    # ------------------------------------------------------------------ rescue
    def _rescue_swarm(self) -> RescueSwarm | None:
        """The swarm layer as rescue uses it, or None (no swarm, rescue off, or a hook without the methods)."""
        if self.swarm is None or not self.cfg.swarm.rescue.enabled or not isinstance(self.swarm, RescueSwarm):
            return None
        return self.swarm

    def answer_rescue(self, step: int, m: dict[str, Any]) -> None:
        """The helper's side of rescue: answer at most ``swarm.rescue.answer_prompts`` of the peers' requests
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
        except _EXTERNAL_FAILURES as e:
            m["rescue/failed"] = 1
            log.warning("step %d: answering %d rescue requests failed (%s: %s); skipped", step + 1, len(chosen),
                        type(e).__name__, str(e)[:200])

    def merge_rescued(self, rescue_cands: list[PeerTree], m: dict[str, Any]) -> list[MergedGroup]:
        """The asker's side of rescue: merge the peer trees of our pending questions into our stored all-wrong
        groups (:func:`~swarmnode.train.rescue.merge_rescue`), at most ``swarm.rescue.max_requests`` groups a step;
        a merged entry leaves the book. The peer's samples are marked ``admitted_by_form`` as other peers' samples
        are (``swarm.screen.admit_step_form``, :meth:`~swarmnode.rollout.step_credit.StepCredit.admits`), so a worked
        solution in exact step form meets no likelihood screen. Metrics into ``m``: ``rescue/merged`` (groups),
        ``rescue/merged_samples``."""
        cfg = self.cfg
        by_key: dict[str, list[PeerTree]] = {}
        for pt in rescue_cands:
            by_key.setdefault(pt.task_key, []).append(pt)
        out: list[MergedGroup] = []
        admit = self._external_step_credit() if cfg.swarm.screen.admit_step_form != "off" else None
        for key, pts in by_key.items():
            if len(out) >= cfg.swarm.rescue.max_requests:
                break
            entry = self.rescue_book.get(key)
            if entry is None:
                continue
            task = self.tasks.get(entry.ref)

            def score(text: str, task=task) -> tuple[bool, float]:
                d = self.tasks.score_detail(task, text, external=True)
                return d["correct"] >= CORRECT_THRESHOLD, d["reward"]

            try:
                g = merge_rescue(entry, pts, score, max_merged=cfg.swarm.rescue.max_merged,
                                 estimator=cfg.train.advantage_estimator, scale_rewards=cfg.train.scale_rewards,
                                 std_floor=cfg.train.advantage_std_floor,
                                 mask_truncated=cfg.train.mask_truncated_completions,
                                 max_len=cfg.swarm.max_external_completion_length or cfg.sampling.max_completion_length,
                                 our_model_id=self.base_model_id, our_tokenizer_id=self.policy.tokenizer_id)
            except _EXTERNAL_FAILURES as e:
                log.warning("rescue: merging %d peer trees of %s failed (%s: %s); skipped", len(pts), key,
                            type(e).__name__, str(e)[:200])
                continue
            if g is not None:
                if admit is not None:  # as any peer sample: a worked solution in exact step form skips the screen
                    for smp in g.peer:
                        smp.admitted_by_form = admit.admits(entry.ref, smp.completion_ids)
                out.append(g)
                self.rescue_book.take(key)
        m["rescue/merged"] = len(out)
        m["rescue/merged_samples"] = sum(len(g.own) + len(g.peer) for g in out)
        return out

    # ------------------------------------------------------------------ the round
    def run_step(self) -> StepResult:
        """One round: draw -> sample -> score -> publish -> gather -> process -> update (-> checkpoint)."""
        cfg, step = self.cfg, self.step
        t_start = time.perf_counter()
        m: dict[str, Any] = {"step": step + 1}

        # 1. draw (with the swarm curriculum on, from task weights the swarm's success rates moved)
        stream = self.task_stream
        weights, cm = self.task_weights()
        m.update(cm)
        refs = self.tasks.refs_for_step(step, cfg.sampling.prompts_per_step, stream=stream, weights=weights)
        tasks = [self.tasks.get(r) for r in refs]

        # 2. sample
        with self.timer.phase("sample"):
            trees = generate_rollouts(
                self.backend,
                self.policy.tokenizer,
                [self._prompt_spec(t) for t in tasks],
                cfg.sampling,
                policy_version=step,
                generator=self.step_generator(step),
            )
        for tr in trees:
            tr.model_id, tr.tokenizer_id = self.base_model_id, self.policy.tokenizer_id
        gen_tokens = sum(t.generated_tokens() for t in trees)  # pruned branches' tokens were generated too
        n_pruned = sum(len(t.pruned_leaves()) for t in trees)
        trees = [t.without_pruned() for t in trees]  # a pruned branch is neither scored nor trained on

        # 3. score
        with self.timer.phase("score"):
            correct, fmt, n_leaves = 0.0, 0.0, 0
            success: dict[str, list[int]] = {}  # task key -> [leaves, correct leaves] (the curriculum's counts)
            all_wrong: list[RolloutTree] = []  # own groups with no exact-correct leaf (rescue)
            for task, tree in zip(tasks, trees):
                counts = success.setdefault(self.tasks.source_key(self.tasks.source_index(task.ref)), [0, 0])
                leaf_correct = []
                for leaf in tree.leaves():
                    d = self.tasks.score_detail(task, tree.completion_text(leaf))
                    tree.nodes[leaf].reward = d["reward"]
                    correct += d["correct"]
                    fmt += d["format"]
                    n_leaves += 1
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
        self.tokens_generated += gen_tokens
        rescue_swarm = self._rescue_swarm()
        if rescue_swarm is not None:  # hold our all-wrong groups and announce the newest (next heartbeats)
            rc = cfg.swarm.rescue
            m.update({f"rescue/{k}": 0 for k in (
                "requests_seen", "answered", "answered_leaves_correct", "merged", "merged_samples", "refused_heldout",
                "refused_task", "refused_standing", "refused_budget", "refused_skipped", "refused_repeat")})
            m["rescue/expired"] = self.rescue_book.expire(step)
            for tree in all_wrong:
                self.rescue_book.add(tree, step)
            self.rescue_totals["all_wrong"] += len(all_wrong)
            asked = self.rescue_book.refs(rc.max_requests)
            rescue_swarm.announce_rescue(asked)
            m["rescue/asked"] = len(asked)

        # 4. publish, 5. gather (swarm only); a swarm-layer stall the monitor flags is acted on here
        candidates: list[PeerTree] = []
        rescue_cands: list[PeerTree] = []
        if self.swarm is not None:
            swarm = self.swarm
            with self.timer.phase("gossip"):
                m.update(self._watched(lambda: swarm.publish(trees, step, policy_version=step), "publish", dict))
            if not self.stop_requested:  # stopping: this step trains on its local samples, then checkpoints
                with self.timer.phase("verify"):
                    candidates, sm = swarm.gather(step, policy_version=step)
                    m.update(sm)
                if rescue_swarm is not None:  # answers to our pending questions leave normal external processing
                    rescue_cands = [c for c in candidates if c.task_key in self.rescue_book]
                    candidates = [c for c in candidates if c.task_key not in self.rescue_book]
                    self.answer_rescue(step, m)  # spare budget: peers' questions, sampled, scored, published
            self._act_on_stall_flag()
        rescued = self.merge_rescued(rescue_cands, m) if rescue_cands else []
        rescue_peer = [s for g in rescued for s in g.peer]

        # 6. process: local advantages from the local trees; each external group normalized within its own
        #    source (peer, task), bounded in tokens and length, screened by likelihood, capped in share
        #    (with step checks on: a process reward for the right steps, and no credit against a line's verdict)
        reports = step_reports(trees, tasks) if cfg.train.step_credit != "none" or cfg.train.step_reward_weight else None
        bonus = step_reward_bonus(reports, cfg.train.step_reward_weight) if cfg.train.step_reward_weight else None
        adv = compute_advantages(trees, cfg.train.advantage_estimator, cfg.train.scale_rewards,
                                 std_floor=cfg.train.advantage_std_floor, reward_bonus=bonus)
        if reports is not None:  # the bonus pays checked lines only: the answer keeps the outcome's advantage
            outcome = compute_advantages(trees, cfg.train.advantage_estimator, cfg.train.scale_rewards,
                                         std_floor=cfg.train.advantage_std_floor) if bonus else None
            m.update(apply_step_credit(trees, reports, adv, self.policy.tokenizer, outcome=outcome,
                                       mask=cfg.train.step_credit == "mask"))
        local = samples_from_trees(
            trees,
            adv,
            source="local",
            drop_zero_variance=cfg.train.drop_zero_variance_groups,
            mask_truncated=cfg.train.mask_truncated_completions,
        )
        external: list[Sample] = []
        m["external/failed"] = 0
        if candidates:
            ext_credit = self._external_step_credit()
            local_bonus = ({t.task.key(): [b.get(leaf, 0.0) for leaf in t.leaves()] for t, b in zip(trees, bonus)}
                           if ext_credit is not None and bonus else None)  # `joint` pools with the local bonus
            try:
                external, em = process_external(
                    candidates,
                    cfg.swarm,
                    current_version=step,
                    our_model_id=self.base_model_id,
                    our_tokenizer_id=self.policy.tokenizer_id,
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
            except _EXTERNAL_FAILURES as e:  # peer input never kills the node: drop it, count it, go on
                external = []
                m["external/failed"] += 1
                m["external/failed_stage"] = "process"
                log.warning("step %d: processing %d external trees failed (%s: %s); training on local samples only",
                            step + 1, len(candidates), type(e).__name__, str(e)[:200])
        screened_out: set[str] = set()
        external += rescue_peer  # rescue answers meet the screen with the other external samples
        if cfg.swarm.screen.enabled and self.swarm is not None:
            # our own completions of this step join the reference, then peers' are scored against it
            self.screen.observe(tree.completion_logprobs(leaf) for tree in trees for leaf in tree.leaves())
            if external:
                try:
                    with self.timer.phase("screen"):
                        sr = self.screen.screen(self.policy.model, external)
                    external = sr.kept
                    m.update(sr.metrics)
                    for peer, n in sr.rejected_by_peer.items():
                        self.swarm.charge(peer, SCREEN_REASON, n)
                        screened_out.add(peer)
                except _EXTERNAL_FAILURES as e:
                    m["external/failed"] += 1
                    m["external/failed_stage"] = "screen"
                    log.warning("step %d: screening %d external samples failed (%s: %s); training on local samples "
                                "only", step + 1, len(external), type(e).__name__, str(e)[:200])
                    external = []
        rescue_kept = [s for s in external if s.group_id.endswith(RESCUE_GROUP_SUFFIX)]
        external = [s for s in external if not s.group_id.endswith(RESCUE_GROUP_SUFFIX)]
        batch, bm = compose_batch(local, external, cfg.swarm.max_external_share)
        trained_rescue: list[MergedGroup] = []
        if rescued:
            # a merged group trains only with a peer sample the screen kept; added after the external cap (bounded
            # by max_requests x (max_merged + our group's leaves)), as expansions are
            kept_ids = {id(s) for s in rescue_kept}
            for g in rescued:
                peer = [s for s in g.peer if id(s) in kept_ids]
                if peer:
                    batch += g.own + peer
                    trained_rescue.append(g)
            m["rescue/merged"] = len(trained_rescue)
            m["rescue/merged_samples"] = sum(len(g.own) + len([s for s in g.peer if id(s) in kept_ids])
                                             for g in trained_rescue)
        if cfg.swarm.expansion.enabled and candidates:
            # continue re-verified peers' promising prefixes with our policy: the prefix is context only, the
            # continuation is ours (on-policy, our log-probs, our verifier's rewards), so it trains as local
            # samples -- added after the external cap, so they never make room for more external samples
            batch += self._expansion_samples(candidates, step, screened_out, m)
        external_used = [s for s in batch if not s.is_local]
        m.update(bm)

        # 7. update (a failure with external samples in the batch: gradients zeroed, redone on local samples)
        with self.timer.phase("train"):
            try:
                tm = self.trainer.step(batch, token_weight_fn=self.token_weight_fn if external_used else None)
            except _EXTERNAL_FAILURES as e:
                if not external_used:
                    raise  # our own samples: a real bug, not peer input
                self.trainer.optimizer.zero_grad(set_to_none=True)
                m["external/failed"] += 1
                m["external/failed_stage"] = "train"
                m["external/failed_samples"] = len(external_used)
                log.warning("step %d: training on %d external samples failed (%s: %s); redoing the step on local "
                            "samples only", step + 1, len(external_used), type(e).__name__, str(e)[:200])
                # our wrong leaves of a rescued group lose their contrast with the peers' leaves: out too
                batch = [s for s in batch if s.is_local and not s.group_id.endswith(RESCUE_GROUP_SUFFIX)]
                external_used = []
                tm = self.trainer.step(batch, token_weight_fn=None)
            sync_weights(self.backend, self.policy.model)  # no-op for hf; in-place weight load for vllm
        # standing for what we trained on and the screen judged, nothing else (its warm-up keeps nothing)
        updated = not tm.get("skipped") and tm.get("nonfinite_updates", 0) < tm.get("iterations", 1)
        judged = not cfg.swarm.screen.enabled or not m.get("screen/warmup")
        if external_used and updated and judged and self.swarm is not None:
            for peer, n in trained_groups_by_peer(external, batch).items():
                self.swarm.credit(peer, n)
            for g in trained_rescue:
                for peer in g.peers:  # a rescued group is a useful tree of each peer that answered it
                    self.swarm.credit(peer, 1)
        if rescue_swarm is not None:
            self.rescue_totals["rescued"] += len(trained_rescue) if updated and external_used else 0
            m["rescue/pending"] = len(self.rescue_book)
            m["rescue/all_wrong_total"] = self.rescue_totals["all_wrong"]
            m["rescue/rescued_total"] = self.rescue_totals["rescued"]
        self.step += 1

        if self.save_due():
            with self.timer.phase("checkpoint"):
                self.save()

        phases = self.timer.reset()
        wall = time.perf_counter() - t_start
        m.update(
            {
                "reward": correct / max(n_leaves, 1),
                "format": fmt / max(n_leaves, 1),
                "leaves": n_leaves,
                "leaves_pruned": n_pruned,
                "task_stream": stream,
                "groups": adv.num_groups,
                "zero_variance_groups": adv.num_zero_variance_groups,
                "samples_local": len(local),
                "samples_external": len(external_used),
                "tokens_generated": gen_tokens,
                "tokens_total": self.tokens_generated,
                "tokens_per_s": gen_tokens / max(phases.get("sample", 0.0), 1e-9),
                "step_time": wall,
                "time": {k: round(v, 4) for k, v in phases.items()},
                "rss_bytes": node_memory_bytes(),  # with the DHT child, p2pd and torch's shm manager
                "unix_time": time.time(),
            }
        )
        m.update({f"train/{k}": v for k, v in tm.items()})
        self.metrics.write(m)
        return StepResult(self.step, m, trees)

    # ------------------------------------------------------------------ evaluation / checkpoints
    def evaluate(self, n: int | None = None, progress: Callable[[int, int], None] | None = None) -> EvalResult:
        """Exact greedy pass@1 on ``n`` held-out questions (default ``tasks.eval_size``), per task, with the
        ``tasks.probes`` generalization probes (swarmnode/evaluation.py). ``progress(done, total)`` is called
        after each decoding batch (questions, probes included); the monitor counts each batch as progress and
        shows ``done/total`` and an ETA in the status."""
        if self._probes is None:
            self._probes = TaskMix.probes_from_config(self.cfg.tasks, base_dir=Path.cwd())

        def on_progress(done: int, total: int) -> None:
            self.monitor.eval_progress(done, total)
            if progress is not None:
                progress(done, total)

        with self.monitor.activity("evaluating"):
            return evaluate_mix(
                self.policy.model,
                self.policy.tokenizer,
                self.tasks,
                self.prompt_for,
                max_new_tokens=self.cfg.sampling.max_completion_length,
                n=n or self.cfg.tasks.eval_size,
                probes=self._probes,
                progress=on_progress,
            )

    def log_eval(self, res: EvalResult, tag: str) -> None:
        self.metrics.write(
            {"step": self.step, "eval": tag, **res.to_dict(), "eval_seconds": res.seconds,
             "tokens_total": self.tokens_generated, "unix_time": time.time()}
        )
        self.monitor.observe_eval(tag, res)

    def save_due(self) -> bool:
        """Whether the step just finished ends with a checkpoint: every ``checkpoint.save_steps`` steps, the last
        step, or ``checkpoint.save_seconds`` (wall clock, > 0) after the last checkpoint (or the start)."""
        ck = self.cfg.checkpoint
        if self.step % ck.save_steps == 0 or self.step == self.cfg.steps:
            return True
        return ck.save_seconds > 0 and time.monotonic() - self.saved_at >= ck.save_seconds

    def save(self) -> Path | None:
        """Checkpoint now (atomic; the previous good checkpoint survives a crash mid-write).

        Returns the checkpoint directory, or None when the run directory cannot take it (disk full, read-only):
        then the previous checkpoint is kept, the error is logged in one line (path, free and needed space), and
        the node stops after this step with exit code :data:`~swarmnode.rundir.EXIT_DISK` (``disk_error``)."""
        try:
            path = self._save()
        except Exception as e:  # noqa: BLE001 - only disk errors are handled; the rest propagate
            free = free_bytes(self.run_dir)
            if not (is_disk_error(e) or (free is not None and free < self.checkpoint_bytes)):
                raise
            err = disk_error(self.run_dir / "checkpoints", e, self.checkpoint_bytes)
            last = f"step {self.saved_step}" if self.saved_step else "none yet"
            self.disk_error = (f"{err}. The checkpoint of step {self.step} was not written; the last good checkpoint "
                               f"({last}) is kept. Free some space and run the same command to resume from it.")
            log.error("%s", self.disk_error)
            self.monitor.request_stop(EXIT_DISK, self.disk_error)
            return None
        self.saved_step, self.saved_at = self.step, time.monotonic()
        self.checkpoint_bytes = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())  # measured
        return path

    def _save(self) -> Path:
        return save_checkpoint(
            self.run_dir,
            self.step,
            self.policy.model,
            self.policy.tokenizer,
            self.trainer.optimizer,
            self.trainer.scheduler,
            config_yaml=dump_config(self.cfg),
            extra={"tokens_generated": self.tokens_generated, "base_model_id": self.base_model_id},
            keep_last=self.cfg.checkpoint.keep_last,
            policy_meta={"system_prompt": self.policy.system_prompt},
        )

    # ------------------------------------------------------------------ the loop
    def request_stop(self, reason: str) -> None:
        """Finish the current step, checkpoint and leave :meth:`run` (signals and the memory watchdog call this)."""
        if not self.stop_requested:
            log.info("stop requested: %s", reason)
        self.stop_requested = True

    def recover_swarm(self, reason: str) -> bool:
        """Restart the swarm layer's DHT (``SwarmHook.recover``) after a stall; whether a swarm was there to restart.

        Logs the outcome; a failing restart is logged (with what to do) and never raises."""
        if self.swarm is None:
            return False
        try:
            self.swarm.recover(reason)
            log.warning("swarm layer restarted after a stall (%s)", reason)
        except Exception as e:  # noqa: BLE001 - a failed restart must not end the round
            log.error("restarting the swarm layer failed: %s: %s -- restart the node (it resumes from its newest "
                      "checkpoint)", type(e).__name__, e)
        return True

    def _act_on_stall_flag(self) -> None:
        """Take the monitor's swarm-recovery flag and, when it is up, restart the swarm layer (the monitor only
        observes and flags; the round loop acts). A stopping node restarts nothing: it is about to close it."""
        reason = self.monitor.take_swarm_recovery()
        if reason is not None and not self.stop_requested:
            self.recover_swarm(reason)

    def _watched(self, call: Callable[[], _T], name: str, on_stop: Callable[[], _T]) -> _T:
        """Run ``call`` on a helper thread (:data:`~swarmnode.monitor.runtime.WATCHED_CALL_THREAD`) while the
        round loop waits for it and, every ``watchdog_interval`` seconds, acts on the monitor's swarm-recovery
        flag: a stalled swarm call is what blocks the round, so the loop restarts the swarm layer while it waits.

        Once a stop is requested it waits at most ``swarm.stop_wait_seconds`` more (seconds, counted from when it
        sees the stop), then leaves the call behind (logged, naming ``name``) and returns ``on_stop()``, so the
        step ends and the node checkpoints and exits however long the call hangs (e.g. on a DHT restart).

        Returns ``call()``'s value; re-raises its exception. The helper is a daemon thread: a call left behind,
        or a signal that forces the stop (``KeyboardInterrupt`` here), does not keep the process alive."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["value"] = call()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting loop
                box["error"] = e
            finally:
                done.set()

        threading.Thread(target=target, name=WATCHED_CALL_THREAD, daemon=True).start()
        bound = float(self.cfg.swarm.stop_wait_seconds)
        give_up_at: float | None = None  # monotonic seconds; set once the stop is seen
        while True:
            wait = self.monitor.interval
            if self.stop_requested:
                now = time.monotonic()
                if give_up_at is None:
                    give_up_at = now + bound
                if now >= give_up_at:
                    log.warning("stopping: the swarm call %s did not return within swarm.stop_wait_seconds=%g s; "
                                "leaving it behind to checkpoint and exit", name, bound)
                    return on_stop()
                wait = min(wait, give_up_at - now)
            if done.wait(wait):
                break
            self._act_on_stall_flag()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def install_signal_handlers(self) -> None:
        """First SIGINT/SIGTERM: finish the current step, checkpoint, exit (a graceful stop).

        While the node is stopping (after a signal or the memory guard), a SIGTERM is logged and ignored:
        supervisors and users repeat SIGTERM, and the stop they asked for is already under way. A SIGINT
        (Ctrl-C again), or a third signal, forces the stop: ``KeyboardInterrupt`` is raised where the main thread
        is, :attr:`forced_by` is set to the signal number, and :meth:`run` leaves without its final checkpoint
        (the previous one is kept); :meth:`close` records it in the monitor (``exit_code`` 128 + the signal
        number, as for a process killed by it, and an ``exit_reason`` naming the last checkpoint), so that
        nothing claims a clean checkpoint.

        The handler takes no lock: CPython runs it on the main thread between two bytecodes, possibly while that
        thread holds a non-reentrant lock (the status tracker's, inside any status update). Logging from it went
        through the monitor's warning collector into that same lock and deadlocked the node for good (no step,
        no checkpoint, the monitor's watchdog stuck behind it too). So it only sets :attr:`stop_requested` (and
        :attr:`forced_by` before it raises ``KeyboardInterrupt``) and writes the signal number into a pipe; the
        ``swarmnode-signals`` thread logs the announcement. Idempotent."""
        if self._signal_pipe is not None:
            return
        r, w = os.pipe()
        os.set_blocking(w, False)  # the handler must never block on it
        self._signal_pipe = (r, w)

        def announce() -> None:  # the one reader of the pipe; 0 ends it (close)
            try:
                while True:
                    data = os.read(r, 1)
                    if not data or data[0] == 0:
                        return
                    flag = data[0] & (_SIGNAL_REPEATED | _SIGNAL_FORCED)
                    signum = data[0] ^ flag
                    if flag == _SIGNAL_FORCED:
                        log.error("signal %d received while stopping: stopping at once, without the final "
                                  "checkpoint (the previous checkpoint is kept)", signum)
                    elif flag == _SIGNAL_REPEATED:
                        log.warning("signal %d received while stopping: ignored, the node is already checkpointing "
                                    "after this step and exiting (Ctrl-C or one more signal stops it at once, "
                                    "without that checkpoint)", signum)
                    else:
                        log.warning("signal %d received: checkpointing after this step, then exiting (Ctrl-C "
                                    "again, or a third signal, stops at once without that checkpoint)", signum)
            except OSError:
                return
            finally:
                os.close(r)

        self._signal_thread = threading.Thread(target=announce, name="swarmnode-signals", daemon=True)
        self._signal_thread.start()

        def announce_from_handler(code: int) -> None:
            pipe = self._signal_pipe  # None after close(): nothing to announce to
            if pipe is not None:
                try:
                    os.write(pipe[1], bytes([code]))
                except OSError:  # pipe full: the stop itself is requested all the same
                    pass

        def handler(signum, frame):  # noqa: ARG001 - no lock, no logging, no allocation-heavy work here
            if self.stop_requested:  # already stopping (a signal before, or the memory guard)
                self._signals_while_stopping += 1
                if signum == signal.SIGINT or self._signals_while_stopping >= 2:
                    self.forced_by = signum
                    announce_from_handler(_SIGNAL_FORCED | signum)
                    raise KeyboardInterrupt
                announce_from_handler(_SIGNAL_REPEATED | signum)
                return
            self.stop_requested = True
            announce_from_handler(signum)

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def _close_signal_pipe(self) -> None:
        """End the ``swarmnode-signals`` thread after it logged what is pending (bounded), and close the pipe."""
        pipe, self._signal_pipe = self._signal_pipe, None
        if pipe is None:
            return
        w = pipe[1]
        try:
            os.write(w, b"\0")
        except OSError:
            pass
        if self._signal_thread is not None:
            self._signal_thread.join(timeout=5.0)
        os.close(w)

    def run(self, on_step: Callable[[StepResult], None] | None = None) -> None:
        """Run until ``cfg.steps`` optimizer steps are done or a stop is requested; checkpoint at the end (not
        after a stop forced by a repeated signal, :meth:`install_signal_handlers`: its ``KeyboardInterrupt``
        propagates at once)."""
        self.monitor.begin_training()
        try:
            while self.step < self.cfg.steps and not self.stop_requested:
                res = self.run_step()
                self.monitor.observe_step(res)
                if self.cfg.eval_every and self.step % self.cfg.eval_every == 0 and self.step < self.cfg.steps:
                    self.log_eval(self.evaluate(), "periodic")
                if on_step is not None:
                    on_step(res)
        finally:
            if self.step != self.saved_step and self.disk_error is None and self.forced_by is None:
                self.save()
            self.monitor.end_training()

    def close(self) -> None:
        """Shut down in a fixed order (idempotent): the swarm layer (its threads, bundle server and DHT child,
        each bounded by its timeout), then the monitor (the final ``stopped`` status), the metrics file, and last
        the identity and run-directory locks. After a stop forced by a repeated signal, the monitor's
        ``exit_code`` becomes 128 + the signal number (unless the memory or stall watchdog set one) and its
        ``exit_reason`` says which checkpoint is the last one."""
        self._close_signal_pipe()  # pending announcements are logged before the final status
        if self.forced_by is not None and not self.monitor.exit_code:  # the CLI exits with it (status.json too)
            name = signal.Signals(self.forced_by).name
            if self.saved_step == self.step and self.step > 0:
                why = f"stopped at once by a {name} while already stopping, after the checkpoint of step {self.step}"
            else:
                resume = (f"the last checkpoint is step {self.saved_step}: run the same command to resume from it"
                          if self.saved_step else "there is no checkpoint yet: the same command starts from step 0")
                why = (f"stopped at once by a {name} while already stopping, without the final checkpoint: step "
                       f"{self.step} was not saved; {resume}")
            self.monitor.exit_code, self.monitor.exit_reason = 128 + self.forced_by, why
        if self.swarm is not None:
            self.swarm.close()
        self.monitor.close()
        self.metrics.close()
        for lk in reversed(self.locks):
            lk.release()
