"""The node as a whole: :class:`Node`, its construction (run directory, checkpoint, model, trainer), evaluation,
checkpoints, :meth:`Node.run` and :meth:`Node.close`.

The round itself is :meth:`Node.run_step` (``node/loop.py``); the parts of the node live beside it
(``node/stop.py``, ``node/levers.py``).
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from swarmnode.config import RunConfig, dump_config
from swarmnode.evaluation import EvalResult, evaluate_mix
from swarmnode.monitor.metrics import MetricsWriter, PhaseTimer
from swarmnode.monitor.runtime import NodeMonitor
from swarmnode.node.hooks import SwarmHook
from swarmnode.node.levers import Levers
from swarmnode.node.loop import RoundLoop, StepResult
from swarmnode.node.stop import StopControl
from swarmnode.policy.backends import make_generation_backend
from swarmnode.policy.loading import Policy, check_context, load_policy
from swarmnode.policy.memory import plan_for_model
from swarmnode.policy.threads import apply_threads
from swarmnode.rollout.sampler import PromptSpec
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
from swarmnode.tasks.base import Task
from swarmnode.tasks.curriculum import LocalRates
from swarmnode.tasks.mix import TaskMix, stream_for_peer
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
from swarmnode.train.off_policy import make_token_weight_fn
from swarmnode.train.process import BatchBuilder
from swarmnode.train.rescue import RescueBook, RescueHelper
from swarmnode.train.screen import LikelihoodScreen
from swarmnode.train.trainer import Trainer

log = logging.getLogger("swarmnode.node")


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


class Node(RoundLoop, StopControl, Levers):
    """A swarmnode node: owns the policy, the task mix, the trainer and the run directory.

    Its round is :meth:`run_step` (``node/loop.py``); stop control comes from ``node/stop.py``, the curriculum,
    expansion and rescue from ``node/levers.py``; construction, evaluation, checkpoints, :meth:`run` and
    :meth:`close` are here.

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
        self.local_rates = LocalRates(cfg.levers.curriculum.window_steps)  # our recent per-task success (curriculum)
        rc = cfg.levers.rescue
        # rescue (train/rescue.py): our pending all-wrong groups, and which peers' questions we answer
        self.rescue_book = RescueBook(rc.max_age_steps, cfg.sampling.prompts_per_step * (rc.max_age_steps + 1))
        self.rescue_helper = RescueHelper(rc, answered_ttl_steps=4 * rc.max_age_steps)
        self.rescue_totals = {"all_wrong": 0, "rescued": 0}  # since this process started
        self.token_weight_fn = make_token_weight_fn(cfg.external)
        self.screen = LikelihoodScreen.from_config(
            cfg.external.screen,
            temperature=cfg.sampling.temperature,
            pad_token_id=self.policy.tokenizer.pad_token_id or 0,
            max_rows=cfg.train.micro_batch_size,
            max_tokens=cfg.train.max_tokens_per_micro_batch,
        )
        # step 6 of the round (train/process.py): local and peers' samples to the batch
        self.builder = BatchBuilder(cfg, get_task=self.tasks.get, tokenizer=self.policy.tokenizer,
                                    tokenizer_id=self.policy.tokenizer_id, model=self.policy.model,
                                    our_model_id=self.base_model_id, screen=self.screen, phase=self.timer.phase)
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


    # ------------------------------------------------------------------ evaluation, checkpoints
    def evaluate(self, n: int | None = None, progress: Callable[[int, int], None] | None = None) -> EvalResult:
        """Exact greedy pass@1 on ``n`` held-out questions (default ``tasks.eval_size``), per task, with the
        ``tasks.probes`` generalization probes (swarmnode/evaluation.py). ``progress(done, total)`` is called
        after each decoding batch (questions, probes included); the monitor counts each batch as progress and
        shows ``done/total`` and an ETA in the status."""
        if self._probes is None:
            self._probes = TaskMix.probes_from_config(self.cfg.tasks, base_dir=Path.cwd())

        held_out = n or self.cfg.tasks.eval_size

        def on_progress(done: int, total: int) -> None:
            self.monitor.eval_progress(done, total, held_out=held_out)
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


    # ------------------------------------------------------------------ run, close
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
