"""Resuming with a changed config: which keys may change, the refusal that names them, and the optimizer
hyper-parameters and learning rate brought in line with the new config (docs/guide/operations.md, "Resuming").

:func:`resume_config_changes` compares a run's config with the one its checkpoint was trained with
(:class:`~swarmnode.train.checkpoint_files.CheckpointInfo`); :func:`apply_optimizer_config` and
:func:`resync_learning_rate` act on an optimizer and scheduler that
:func:`~swarmnode.train.checkpoint.load_training_state` restored.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from swarmnode.config import RunConfig
from swarmnode.train.checkpoint_files import CheckpointError, CheckpointInfo

# the checkpoint logger: these messages are the checkpoint module's (log filters and tests name it)
logger = logging.getLogger("swarmnode.train.checkpoint")

#: dotted keys (or prefixes ending in ``.``) whose change on resume does not change what is trained: how long,
#: where, how it is watched, evaluated and checkpointed, where it runs, how it talks to the swarm
RESUME_FREE_KEYS: tuple[str, ...] = (
    "steps", "run_dir", "status_port", "threads", "log_every", "eval_every", "eval_at_start", "report_to",
    "checkpoint.", "monitor.", "swarm.", "external.", "levers.", "tasks.eval_size", "tasks.probes",
    "model.device", "model.backend", "model.gpu_memory_utilization", "model.attn_implementation",
)

#: keys a resumed run can never take from the new config: the checkpoint's weights and tokenizer are the model
RESUME_FIXED_KEYS: tuple[str, ...] = ("model.name_or_path", "model.dtype")

#: the ``swarmnode run`` flag that lets a resumed run apply changed training-defining keys
ALLOW_CHANGE_FLAG = "--allow-config-change"


class ConfigChangedError(CheckpointError):
    """A resumed run's config differs from its checkpoint's in training-defining keys; the message names each
    key with both values, and the flag that allows the change (or why it cannot be allowed).

    Attributes:
        changes: ``(dotted key, value in the checkpoint, new value)`` triples.
    """

    def __init__(self, msg: str, changes: list[tuple[str, Any, Any]]) -> None:
        super().__init__(msg)
        self.changes = changes


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def _free(key: str) -> bool:
    return any(key == f or (f.endswith(".") and key.startswith(f)) for f in RESUME_FREE_KEYS)


def config_changes(saved: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The training-defining keys whose values differ between two configs.

    Args:
        saved: the checkpoint's config as a plain dict (``RunConfig.model_dump(mode="json")``).
        new: the new config, likewise.

    Returns:
        ``(dotted key, saved value, new value)`` sorted by key; keys of :data:`RESUME_FREE_KEYS` are left out. A
        key present on one side only counts (a missing value is ``None``).
    """
    a, b = _flatten(saved), _flatten(new)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if not _free(k) and a.get(k) != b.get(k)]


def check_resume_config(info: CheckpointInfo, new: dict[str, Any], saved: dict[str, Any],
                        allow: bool) -> list[tuple[str, Any, Any]]:
    """Compare the config of a resumed run with its checkpoint's (docs/guide/operations.md, "Resuming").

    Args:
        info: the checkpoint resumed from (named in messages).
        new: the new config as a plain dict; ``saved``: the checkpoint's, likewise.
        allow: :data:`ALLOW_CHANGE_FLAG` was given: training-defining changes are returned to be applied
            (except :data:`RESUME_FIXED_KEYS`).

    Returns:
        the changes to apply (empty when the configs agree on every training-defining key).

    Raises:
        ConfigChangedError: changes without ``allow`` (each key listed with both values and the flag), or a
            change of a :data:`RESUME_FIXED_KEYS` key (never applicable: the checkpoint's weights are the model).
    """
    changes = config_changes(saved, new)
    if not changes:
        return []
    lines = "\n".join(f"  {k}: {old!r} in the checkpoint -> {val!r} now" for k, old, val in changes)
    fixed = [k for k, _, _ in changes if k in RESUME_FIXED_KEYS]
    if fixed:
        raise ConfigChangedError(
            f"cannot resume {info.path} with a different {', '.join(fixed)}: the checkpoint's weights are the model. "
            f"Changed:\n{lines}\nUse another --run-dir to train that model from step 0, or restore the old value",
            changes)
    if not allow:
        raise ConfigChangedError(
            f"the config differs from the one {info.path} (step {info.step}) was trained with, in keys that "
            f"define the training:\n{lines}\nNothing was changed. Restore those values to resume as before, pass "
            f"{ALLOW_CHANGE_FLAG} to apply them from step {info.step} on (the run directory's config.yaml then "
            "records the new values and node.log the change), or use another --run-dir", changes)
    return changes


def resume_config_changes(info: CheckpointInfo, cfg: RunConfig, allow: bool) -> list[tuple[str, Any, Any]]:
    """:func:`check_resume_config` of ``cfg`` against the config saved in ``info`` (its ``config.yaml``).

    A saved config that no longer validates (written by another version) is not compared: a warning says so and
    nothing is refused."""
    import yaml

    from swarmnode.config import RunConfig as _RunConfig

    try:
        saved = _RunConfig.model_validate(yaml.safe_load(info.config_yaml) or {}).model_dump(mode="json")
    except (ValueError, yaml.YAMLError) as e:
        logger.warning("cannot compare the config with %s/config.yaml (%s); resuming with the new config",
                       info.path, str(e).splitlines()[0])
        return []
    return check_resume_config(info, cfg.model_dump(mode="json"), saved, allow)


def resync_learning_rate(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR) -> list[float]:
    """Set every group's current learning rate from ``scheduler``'s own schedule at its restored step.

    A loaded ``scheduler.pt`` restores the step count and the rate the *saved* run computed for its next update.
    When this run's schedule differs (``--steps`` raised on a finished run: a cosine over a longer horizon), that
    saved rate is stale, e.g. 0.0 at the end of the old cosine, and the first resumed update would use it. Calling
    this after :func:`load_training_state` makes the first update follow the schedule the run now has (for an
    unchanged schedule it changes nothing).

    Returns:
        the learning rate of each parameter group (floats).
    """
    for g, base, fn in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        g["lr"] = base * fn(scheduler.last_epoch)
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    return list(scheduler._last_lr)


def apply_optimizer_config(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
                           learning_rate: float, weight_decay: float, betas: tuple[float, float]) -> None:
    """Make a resumed optimizer use new hyper-parameters (its state dict restored the checkpoint's).

    ``learning_rate`` becomes every group's ``initial_lr`` and the scheduler's base rate, and the current rate is
    recomputed from the schedule at the scheduler's step; ``weight_decay`` applies to the first group (the
    trainer's decayed weights; the other group, biases and norms, keeps 0); ``betas`` to all groups. Adam's
    moment estimates are kept.
    """
    for i, g in enumerate(optimizer.param_groups):
        g["initial_lr"] = learning_rate
        g["betas"] = tuple(betas)
        if i == 0:
            g["weight_decay"] = weight_decay
    scheduler.base_lrs = [learning_rate] * len(optimizer.param_groups)
    for g, fn in zip(optimizer.param_groups, scheduler.lr_lambdas):
        g["lr"] = learning_rate * fn(scheduler.last_epoch)
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
