"""Every setting of a node, as pydantic models, with YAML loading and readable errors.

One documented field per knob, TRL's names where TRL has one (``num_generations``, ``beta``,
``epsilon``, ``epsilon_high``, ``loss_type``, ``scale_rewards``, ``max_completion_length``,
``learning_rate``, ``max_grad_norm``, ``temperature``, ``top_p``). Each section is read by one layer of the
node (docs/reference/architecture.md); docs/reference/config.md lists every field, generated from these models.

> Parameters that control the run

- ``steps``, ``seed``, ``run_dir``, ``eval_every``, ``eval_at_start``, ``log_every``, ``status_port``,
  ``report_to``, ``threads``: the node's loop and front end (node/, cli.py, monitor/).

> Parameters that control the model, the tasks and the rollouts

- ``model`` (:class:`ModelConfig`): policy loading (policy/).
- ``tasks`` (:class:`TasksConfig`, ``tasks.sources[]``, ``tasks.probes[]``): the task mix and held-out
  evaluation (tasks/, evaluation.py).
- ``sampling`` (:class:`SamplingConfig`, ``sampling.tree``): rollouts (rollout/).

> Parameters that control the training

- ``train`` (:class:`TrainConfig`): loss, advantages and optimizer (train/, rollout/advantages.py).

> Parameters that control the swarm

- ``swarm`` (:class:`SwarmConfig`): which swarm and who we are: ``enabled``, ``swarm_id``, ``identity_path``,
  ``allowlist`` (node/hooks.py, swarm/info.py, swarm/verify.py).
- ``swarm.net`` (:class:`NetConfig`): the network layer (swarm/gossip.py and the DHT, publisher, fetcher,
  scheduler and transport it wires; node/stop.py): addresses (``initial_peers``, ``host_maddrs``,
  ``announce_maddrs``), DHT buckets, reads and timeouts, polling, heartbeats, fetch and serve limits and budgets,
  the bundle store, the stop wait.
- ``swarm.trust`` (:class:`TrustConfig`): what the verifier and admission enforce (swarm/verify.py, peers.py,
  admission.py, rates.py): freshness, clock skew, replay window, rate limit, bans, young keys (trees, standing,
  establishment), per-peer tree caps, bundle byte and token caps.
- ``external`` (:class:`ExternalConfig`, ``external.screen``): what the trainer does with peers' samples
  (train/external.py, batch.py, off_policy.py, screen.py, process.py): ``num_external``, shares, selection,
  staleness and age, normalization, ``off_policy`` (``luffy_gamma``, ``tis_cap``), ``external_step_credit``,
  length policy and caps, the likelihood screen.
- ``levers`` (:class:`LeversConfig`): the swarm levers (node/levers.py): ``curriculum``, ``expansion``,
  ``rescue``.

> Parameters that control checkpoints and monitoring

- ``checkpoint`` (:class:`CheckpointConfig`), ``monitor`` (:class:`MonitorConfig`).

Derived defaults: a key whose default is "None = derived from other keys" (``swarm.net.poll_interval``,
``gather_budget_seconds``, ``publisher_fetch_budget_seconds``, ``swarm.trust.max_young_trees``,
``external.max_external_completion_length``) is filled by a validator of its section (or of :class:`RunConfig`
when it depends on another section), so every reader sees a plain number; a dump writes ``None`` for it again
(``base._Derived``). The bounds of config values are checked here, by pydantic, and nowhere else on the way
from the config to its readers (functions that take plain arguments still check them for direct callers).

Old keys: before the swarm settings were grouped by consumer they all lived under ``swarm`` (``swarm.num_external``,
``swarm.bucket_seconds``, ``swarm.screen.enabled``, ...). A file, a saved run directory's ``config.yaml``, an
override or ``--swarm-set`` that uses one is moved to the new key with one warning (swarmnode/config/aliases.py);
an old key and its new key together are an error.

Modules: ``base.py`` (strict models, :class:`ConfigError`, derived keys), ``sections.py`` (model, tasks,
sampling, train, checkpoint, monitor), ``swarm.py`` (swarm, swarm.net, swarm.trust, external, levers),
``run.py`` (:class:`RunConfig`), ``aliases.py`` (the old flat swarm keys), ``load.py`` (YAML in and out).

:func:`load_config` reads a YAML file, applies CLI overrides (dotted keys) and validates. Any problem
(unknown key, wrong type, impossible value, unreadable file) raises :class:`ConfigError` whose message
names the file, the key and what was expected -- before any model is loaded.
"""

from swarmnode.config.aliases import AliasConflict, migrate_key
from swarmnode.config.base import ConfigError
from swarmnode.config.load import DEFAULT_CONFIG_PATH, dump_config, load_config, read_yaml, set_dotted
from swarmnode.config.run import RunConfig
from swarmnode.config.sections import (CheckpointConfig, ModelConfig, MonitorConfig, ProbeConfig, SamplingConfig,
                                       TaskSourceConfig, TasksConfig, TrainConfig, TreeConfig)
from swarmnode.config.swarm import (CurriculumConfig, ExpansionConfig, ExternalConfig, LeversConfig, NetConfig,
                                    RescueConfig, ScreenConfig, SwarmConfig, TrustConfig)

__all__ = [
    "DEFAULT_CONFIG_PATH", "AliasConflict", "CheckpointConfig", "ConfigError", "CurriculumConfig", "ExpansionConfig",
    "ExternalConfig", "LeversConfig", "ModelConfig", "MonitorConfig", "NetConfig", "ProbeConfig", "RescueConfig",
    "RunConfig", "SamplingConfig", "ScreenConfig", "SwarmConfig", "TaskSourceConfig", "TasksConfig", "TrainConfig",
    "TreeConfig", "TrustConfig", "dump_config", "load_config", "migrate_key", "read_yaml", "set_dotted",
]
