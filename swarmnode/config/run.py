"""The whole node configuration, :class:`RunConfig`: every section, the old flat swarm keys moved to their
sections before validation (swarmnode/config/aliases.py) and the values derived across sections."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from swarmnode.config.aliases import migrate_data
from swarmnode.config.base import _fill, _Strict
from swarmnode.config.sections import (CheckpointConfig, ModelConfig, MonitorConfig, SamplingConfig, TasksConfig,
                                       TrainConfig)
from swarmnode.config.swarm import ExternalConfig, LeversConfig, SwarmConfig


class RunConfig(_Strict):
    """The whole node configuration."""

    steps: int = Field(600, ge=0, description="optimizer steps to run (total, counting resumed ones); default 600 (about 11 minutes of training on 2 idle cores with the embedded model, docs/lab/results_log.md)")
    seed: int = Field(0, ge=0, description="seed of the node's RNGs (sampling, selection, init); default 0")
    run_dir: str = Field("runs/default", description="run directory: checkpoints, metrics.jsonl, logs")
    eval_every: int = Field(0, ge=0, description="held-out eval every N steps (0: only before and after)")
    eval_at_start: bool = Field(True, description="held-out evaluation before the first step; default True")
    log_every: int = Field(
        10, ge=1,
        description="when stdout is not a terminal (nohup, systemd, a pipe): print one line every N steps (step, "
                    "reward, held-out accuracy, tokens/s, peers) instead of the progress bar. Default 10")
    status_port: int | None = Field(None, ge=0, le=65535, description="status/metrics HTTP port; None = off")
    report_to: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=list,
        description="metric sinks beside metrics.jsonl and Prometheus (TRL's report_to): tensorboard (event files "
                    "in <run_dir>/tensorboard) and/or wandb (offline in <run_dir>/wandb unless WANDB_MODE=online); "
                    "optional extras: pip install 'swarmnode[tensorboard]' / 'swarmnode[wandb]'. Default [] (none)")
    threads: int | None = Field(
        None, ge=1,
        description="intra-op CPU threads of torch (--threads). None (default) = OMP_NUM_THREADS when the environment "
                    "sets it, else torch's default (one per physical core) capped at the CPUs this process may use "
                    "(affinity and cgroup quota). Waiting threads sleep (OMP_WAIT_POLICY=PASSIVE unless the "
                    "environment sets it), which keeps a busy machine from slowing a step 30-fold "
                    "(docs/lab/benchmarks.md); 1 leaves the other cores to other work")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the policy (model.*)")
    tasks: TasksConfig = Field(default_factory=TasksConfig, description="task sources and mix (tasks.*)")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="rollout sampling (sampling.*)")
    train: TrainConfig = Field(default_factory=TrainConfig, description="loss, advantages, optimizer (train.*)")
    swarm: SwarmConfig = Field(
        default_factory=SwarmConfig, description="which swarm and who we are, its network layer and trust rules "
        "(swarm.*, swarm.net.*, swarm.trust.*)"
    )
    external: ExternalConfig = Field(
        default_factory=ExternalConfig, description="what the trainer does with peers' samples (external.*)"
    )
    levers: LeversConfig = Field(
        default_factory=LeversConfig, description="swarm levers: curriculum, expansion, rescue (levers.*)"
    )
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="checkpointing (checkpoint.*)")
    monitor: MonitorConfig = Field(
        default_factory=MonitorConfig, description="status endpoint and watchdogs (monitor.*)"
    )

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        """Move the old flat ``swarm.*`` keys to their sections (one warning each; swarmnode/config_aliases.py)."""
        return migrate_data(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _cross_checks(self) -> "RunConfig":
        _fill(self.swarm.trust, "max_young_trees", max(1, int(self.external.num_external) // 2))
        _fill(self.external, "max_external_completion_length", int(self.sampling.max_completion_length))
        if self.train.epsilon_high < self.train.epsilon:
            raise ValueError(
                f"train.epsilon_high ({self.train.epsilon_high}) must be >= train.epsilon ({self.train.epsilon})"
            )
        return self
