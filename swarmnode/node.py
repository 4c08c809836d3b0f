"""The node: one round loop, read top to bottom (design.md §1).

Each step:

1. **draw** tasks whose answers a program can check (TaskRefs any node can regenerate);
2. **sample** tree-structured rollouts from the current policy;
3. **score** every leaf with the task's verifier;
4. **publish** the verified trees (pruned) to the swarm, signed;
5. **gather** peers' trees, re-verified locally (the swarm layer trusts no claim);
6. **process**: advantages per source (local trees, each external group on its own), batch composition;
7. **update**: a clipped policy-gradient step; checkpoint every ``save_steps`` and on SIGINT/SIGTERM.

Steps 4–5 run only when a swarm is attached (``Node.swarm``); a solo node skips them.
"""

from __future__ import annotations

import logging
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch

from swarmnode.config import RunConfig, dump_config
from swarmnode.evaluation import EvalResult, evaluate
from swarmnode.monitor.metrics import MetricsWriter, PhaseTimer, rss_bytes
from swarmnode.monitor.runtime import NodeMonitor
from swarmnode.policy.backends import generate_rollouts, make_generation_backend, sync_weights
from swarmnode.policy.loading import Policy, load_policy
from swarmnode.policy.memory import plan_for_model
from swarmnode.rollout.advantages import compute_advantages
from swarmnode.rollout.sampler import PromptSpec
from swarmnode.rollout.tree import RolloutTree
from swarmnode.tasks.base import Task
from swarmnode.tasks.mix import TaskMix, stream_for_peer
from swarmnode.train.batch import samples_from_trees
from swarmnode.rollout.peer_tree import PeerTree
from swarmnode.train.external import compose_batch, make_token_weight_fn, process_external
from swarmnode.train.checkpoint import load_latest_checkpoint, load_training_state, restore_rng, save_checkpoint
from swarmnode.train.samples import Sample
from swarmnode.train.trainer import Trainer

log = logging.getLogger("swarmnode.node")


class SwarmHook(Protocol):
    """What the node needs from a swarm layer (implemented in ``swarmnode.swarm``)."""

    peer_id: str
    """This node's printable peer id (derived from its Ed25519 key); names its default task stream."""

    def publish(self, trees: list[RolloutTree], step: int, policy_version: int) -> dict[str, Any]:
        """Publish scored local trees; returns metrics. Never raises on network trouble."""

    def gather(self, step: int, policy_version: int) -> tuple[list[PeerTree], dict[str, Any]]:
        """Return peers' trees accepted by the verification pipeline (leaf rewards are OUR re-scores), and metrics.

        Never raises on network trouble or hostile input; rejected input is counted, never returned."""

    def close(self) -> None: ...


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

    Raises:
        swarmnode.config.ConfigError / FileNotFoundError / ValueError from loading the model or tasks, with
        messages naming what failed.
    """

    def __init__(self, cfg: RunConfig, swarm: SwarmHook | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.swarm = swarm
        self.stop_requested = False
        self.timer = PhaseTimer()
        self.step = 0
        self.tokens_generated = 0
        self._seed_everything(cfg.seed)

        self.tasks = TaskMix.from_config(cfg.tasks, base_dir=Path.cwd())
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.monitor = NodeMonitor(self)  # status.json, status endpoint, stall/memory watchdogs (monitor/)

        ckpt = load_latest_checkpoint(self.run_dir)
        model_cfg = cfg.model
        if ckpt is not None:
            model_cfg = cfg.model.model_copy(update={"name_or_path": str(ckpt.model_path)})
        self.policy: Policy = load_policy(model_cfg)
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
            self.trainer.step_count = self.step
            restore_rng(ckpt)
            self.tokens_generated = int(ckpt.extra.get("tokens_generated", 0))
            self.base_model_id = str(ckpt.extra.get("base_model_id", self.base_model_id))
            log.info("resumed from %s at step %d", ckpt.path, self.step)
        self.token_weight_fn = make_token_weight_fn(cfg.swarm)
        self.resumed_from = ckpt.path if ckpt is not None else None
        (self.run_dir / "config.yaml").write_text(dump_config(cfg), encoding="utf-8")
        self.metrics = MetricsWriter(self.run_dir / "metrics.jsonl")

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

    # ------------------------------------------------------------------ the round
    def run_step(self) -> StepResult:
        """One round: draw -> sample -> score -> publish -> gather -> process -> update (-> checkpoint)."""
        cfg, step = self.cfg, self.step
        t_start = time.perf_counter()
        m: dict[str, Any] = {"step": step + 1}

        # 1. draw
        stream = self.task_stream
        refs = self.tasks.refs_for_step(step, cfg.sampling.prompts_per_step, stream=stream)
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
            for task, tree in zip(tasks, trees):
                for leaf in tree.leaves():
                    d = self.tasks.score_detail(task, tree.completion_text(leaf))
                    tree.nodes[leaf].reward = d["reward"]
                    correct += d["correct"]
                    fmt += d["format"]
                    n_leaves += 1
                tree.update_stats()
        self.tokens_generated += gen_tokens

        # 4. publish, 5. gather (swarm only)
        candidates: list[PeerTree] = []
        if self.swarm is not None:
            with self.timer.phase("gossip"):
                m.update(self.swarm.publish(trees, step, policy_version=step))
            with self.timer.phase("verify"):
                candidates, sm = self.swarm.gather(step, policy_version=step)
                m.update(sm)

        # 6. process: local advantages from the local trees; each external group normalized within its own
        #    source (peer, task), length-controlled, and capped in share (train/external.py)
        adv = compute_advantages(trees, cfg.train.advantage_estimator, cfg.train.scale_rewards)
        local = samples_from_trees(
            trees,
            adv,
            source="local",
            drop_zero_variance=cfg.train.drop_zero_variance_groups,
            mask_truncated=cfg.train.mask_truncated_completions,
        )
        external: list[Sample] = []
        if candidates:
            external, em = process_external(
                candidates,
                cfg.swarm,
                current_version=step,
                our_model_id=self.base_model_id,
                our_tokenizer_id=self.policy.tokenizer_id,
                local_rewards_by_task={t.task.key(): t.leaf_rewards() for t in trees},
                scale_rewards=cfg.train.scale_rewards,
                rng=random.Random(cfg.seed * 7_919 + step),
            )
            m.update(em)
        batch, bm = compose_batch(local, external, cfg.swarm.max_external_share)
        external_used = [s for s in batch if not s.is_local]
        m.update(bm)

        # 7. update
        with self.timer.phase("train"):
            tm = self.trainer.step(batch, token_weight_fn=self.token_weight_fn if external_used else None)
            sync_weights(self.backend, self.policy.model)  # no-op for hf; in-place weight load for vllm
        self.step += 1

        if self.step % cfg.checkpoint.save_steps == 0 or self.step == cfg.steps:
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
                "rss_bytes": rss_bytes(),
                "unix_time": time.time(),
            }
        )
        m.update({f"train/{k}": v for k, v in tm.items()})
        self.metrics.write(m)
        return StepResult(self.step, m, trees)

    # ------------------------------------------------------------------ evaluation / checkpoints
    def evaluate(self, n: int | None = None) -> EvalResult:
        """Greedy accuracy on ``n`` held-out tasks (default ``tasks.eval_size``) drawn with ``tasks.eval_seed``."""
        refs = self.tasks.eval_refs(n or self.cfg.tasks.eval_size)
        tasks = [self.tasks.get(r) for r in refs]
        with self.monitor.activity("evaluating"):
            return evaluate(
                self.policy.model,
                self.policy.tokenizer,
                tasks,
                self.prompt_for,
                lambda t, c: self.tasks.score_detail(t, c)["correct"],
                max_new_tokens=self.cfg.sampling.max_completion_length,
            )

    def log_eval(self, res: EvalResult, tag: str) -> None:
        self.metrics.write(
            {"step": self.step, "eval": tag, "accuracy": res.accuracy, "per_task": res.per_task, "n": res.n,
             "tokens_total": self.tokens_generated, "unix_time": time.time()}
        )
        self.monitor.observe_eval(tag, res)

    def save(self) -> Path:
        """Checkpoint now (atomic; the previous good checkpoint survives a crash mid-write)."""
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
    def install_signal_handlers(self) -> None:
        """First SIGINT/SIGTERM: finish the current step, checkpoint, exit. Second: stop immediately."""

        def handler(signum, frame):  # noqa: ARG001
            if self.stop_requested:
                raise KeyboardInterrupt
            self.stop_requested = True
            log.warning("signal %d received: checkpointing after this step, then exiting (again to force)", signum)

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def run(self, on_step: Callable[[StepResult], None] | None = None) -> None:
        """Run until ``cfg.steps`` optimizer steps are done or a stop is requested; checkpoint at the end."""
        last_saved = self.step
        self.monitor.begin_training()
        try:
            while self.step < self.cfg.steps and not self.stop_requested:
                res = self.run_step()
                self.monitor.observe_step(res)
                if self.step % self.cfg.checkpoint.save_steps == 0 or self.step == self.cfg.steps:
                    last_saved = self.step
                if self.cfg.eval_every and self.step % self.cfg.eval_every == 0 and self.step < self.cfg.steps:
                    self.log_eval(self.evaluate(), "periodic")
                if on_step is not None:
                    on_step(res)
        finally:
            if self.step != last_saved:
                self.save()
            self.monitor.end_training()

    def close(self) -> None:
        self.monitor.close()
        self.metrics.close()
        if self.swarm is not None:
            self.swarm.close()
