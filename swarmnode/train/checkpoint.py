"""Crash-safe checkpoints: write to a temp dir, hash every file, rename into place, move a ``latest`` pointer.

Layout of ``<run_dir>/checkpoints/``::

    step-00000025/
        model/                  model.save_pretrained (safetensors) + tokenizer.save_pretrained
        optimizer.pt            optimizer.state_dict()       (torch.save; loads with weights_only=True)
        scheduler.pt            scheduler.state_dict()
        rng.pt                  python / numpy / torch (+ CUDA) RNG states
        config.yaml             the run configuration text
        trainer_state.json      {"step": ..., "extra": {...}}
        manifest.json           {"format": 1, "step": ..., "files": {relpath: {"sha256", "size"}}}
    latest                      text file: the directory name of the newest checkpoint
    .tmp-step-…                 an in-progress (or crashed) save; never loaded, removed by the next save
    quarantine/step-…-<time>    a checkpoint that failed verification, moved aside (never deleted)

Protocol of :func:`save_checkpoint`: everything is written into ``.tmp-step-XXXXXXXX-<pid>-<rand>``, each file
is fsynced, ``manifest.json`` (SHA-256 and size of every other file) is written and fsynced last, the
directory is fsynced and ``os.rename``\\ d to ``step-XXXXXXXX`` (atomic on POSIX), the parent is fsynced, then
``latest`` is replaced atomically (write ``latest.tmp``, fsync, ``os.replace``). Only after that are old
checkpoints beyond ``keep_last`` deleted, and only complete ones older than the new one (an incomplete one is
quarantined instead; a newer one is never touched). A crash at any point leaves every earlier checkpoint
intact: a half-written save is only ever a ``.tmp-*`` directory.

:func:`load_latest_checkpoint` picks the newest ``step-*`` directory whose manifest verifies (every listed
file present with the right size and hash); a corrupt or partial one is skipped with a warning and the
previous good one is used. With ``quarantine=True`` (what the node does; it holds the run directory's lock) a
failing one is moved into ``quarantine/`` so that it is neither loaded nor pruned, and stays for inspection.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from swarmnode.config import RunConfig
from swarmnode.policy.loading import POLICY_META_FILE

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest"
MANIFEST = "manifest.json"
MODEL_SUBDIR = "model"
STEP_RE = re.compile(r"^step-(\d{8})$")
QUARANTINE_DIR = "quarantine"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read."""


@dataclass
class CheckpointInfo:
    """A verified checkpoint on disk.

    Attributes:
        path: the ``step-XXXXXXXX`` directory.
        step: the optimizer step it was saved at.
        model_path: directory with the model (``from_pretrained``-loadable) and tokenizer files.
        config_yaml: the saved run configuration text.
        extra: the ``extra`` dict given to :func:`save_checkpoint`.
        manifest: the parsed manifest.
        skipped: ``(path, reason)`` of newer checkpoints that failed verification and were skipped.
    """

    path: Path
    step: int
    model_path: Path
    config_yaml: str
    extra: dict[str, Any]
    manifest: dict[str, Any]
    skipped: list[tuple[Path, str]] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ fs helpers
def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def step_dir_name(step: int) -> str:
    """``step-XXXXXXXX`` (8 digits, zero padded)."""
    return f"step-{int(step):08d}"


# ------------------------------------------------------------------------------------------ RNG
def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and every CUDA device) RNG states, as tensors/ints only.

    The numpy state is stored as ``(name, tensor of the key, pos, has_gauss, cached_gaussian)`` so the file
    loads with ``torch.load(weights_only=True)``.
    """
    py = random.getstate()
    name, key, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [name, torch.from_numpy(np.asarray(key, dtype=np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`rng_state`. CUDA states are restored only when CUDA is available."""
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(int(x) for x in internal), gauss))
    name, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, key.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            logger.warning(
                "checkpoint has %d CUDA RNG states but %d devices are visible; CUDA RNG not restored",
                len(cuda_states), torch.cuda.device_count(),
            )


# ------------------------------------------------------------------------------------------ save
def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    model: Any,
    tokenizer: Any | None,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    config_yaml: str,
    extra: dict[str, Any] | None = None,
    keep_last: int = 2,
    policy_meta: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint atomically and return its ``step-XXXXXXXX`` directory.

    Args:
        run_dir: the run directory; checkpoints go to ``run_dir/checkpoints``.
        step: optimizer step (>= 0); saving the same step again replaces that checkpoint.
        model: a ``transformers`` model (``save_pretrained``; safetensors).
        tokenizer: a tokenizer with ``save_pretrained``, or ``None``.
        optimizer / scheduler: objects with ``state_dict()``, or ``None``.
        config_yaml: the run configuration as YAML text.
        extra: JSON-serializable dict saved in ``trainer_state.json`` (e.g. task-stream position, metrics).
        keep_last: complete checkpoints to keep (>= 1); older ones are deleted after the new one is in place.
        policy_meta: JSON-serializable dict written next to the weights as ``model/swarmnode.json``
            (:data:`POLICY_META_FILE`; e.g. the system prompt the policy was trained with), so that loading the
            model directory alone -- ``swarmnode eval``, a resumed run -- prompts it as it was trained.

    Raises:
        ValueError: ``step < 0`` or ``keep_last < 1``; ``extra`` or ``policy_meta`` not JSON-serializable.
        OSError / any exception from the model or tokenizer: the partial temp dir is removed on a normal
            exception; on a hard crash it is left as ``.tmp-*`` and ignored by loading. Previous
            checkpoints are untouched in both cases.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    try:
        state_json = json.dumps({"step": int(step), "extra": extra or {}}, indent=2, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint `extra` must be JSON-serializable: {e}") from None
    try:
        meta_json = json.dumps(policy_meta, indent=2, sort_keys=True) if policy_meta is not None else None
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint `policy_meta` must be JSON-serializable: {e}") from None
    root = Path(run_dir) / CHECKPOINT_DIR
    root.mkdir(parents=True, exist_ok=True)
    name = step_dir_name(step)
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        model_dir = tmp / MODEL_SUBDIR
        model.save_pretrained(model_dir, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(model_dir)
        if meta_json is not None:
            (model_dir / POLICY_META_FILE).write_text(meta_json, encoding="utf-8")
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / "config.yaml").write_text(config_yaml, encoding="utf-8")
        (tmp / "trainer_state.json").write_text(state_json, encoding="utf-8")
        files = {}
        for p in _files_under(tmp):
            _fsync_file(p)
            files[p.relative_to(tmp).as_posix()] = {"sha256": _sha256(p), "size": p.stat().st_size}
        manifest = {"format": FORMAT_VERSION, "step": int(step), "created": time.time(), "files": files}
        with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        for d in [tmp, *sorted((p for p in tmp.rglob("*") if p.is_dir()), reverse=True)]:
            _fsync_dir(d)
        if final.exists():
            # re-saving a step: move the old one aside first (rename is atomic), delete it after
            trash = root / f".tmp-old-{name}-{secrets.token_hex(4)}"
            os.rename(final, trash)
            try:
                os.rename(tmp, final)
            except BaseException:
                os.rename(trash, final)  # put the previous save of this step back
                raise
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_text_atomic(root / LATEST, name + "\n")
    _prune(root, keep_last, keep=final)
    return final


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    out = []
    if not root.is_dir():
        return out
    for p in root.iterdir():
        m = STEP_RE.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out, reverse=True)


def _prune(root: Path, keep_last: int, keep: Path) -> None:
    """Delete complete checkpoints beyond the ``keep_last`` newest that are older than ``keep`` (just written and
    verified); quarantine incomplete ones instead of deleting them; never touch one newer than ``keep``."""
    kept = 0
    keep_step = int(STEP_RE.match(keep.name).group(1))
    for step, p in _step_dirs(root):
        if p == keep or step > keep_step:
            kept += p == keep
            continue
        if kept < keep_last and (p / MANIFEST).is_file():
            kept += 1
            continue
        if (p / MANIFEST).is_file():
            shutil.rmtree(p, ignore_errors=True)
        else:
            quarantine_checkpoint(p, "manifest.json missing")
    for p in root.iterdir():  # leftovers of crashed saves by this process or others that are gone
        if p.name.startswith(".tmp-") and p.is_dir():
            pid = _tmp_pid(p.name)
            if pid is None or pid == os.getpid() or not _pid_alive(pid):
                shutil.rmtree(p, ignore_errors=True)


def _tmp_pid(name: str) -> int | None:
    m = re.match(r"^\.tmp-step-\d{8}-(\d+)-[0-9a-f]+$", name)
    return int(m.group(1)) if m else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ------------------------------------------------------------------------------------------ load
def verify_checkpoint(path: str | os.PathLike) -> str | None:
    """Check a ``step-*`` directory against its manifest. Returns ``None`` if good, else the reason."""
    path = Path(path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        return "manifest.json missing (partial checkpoint)"
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        files = manifest["files"]
        if not isinstance(files, dict) or not files:
            return "manifest lists no files"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable manifest: {e}"
    for rel, meta in files.items():
        p = path / rel
        if not p.is_file():
            return f"missing file {rel}"
        try:
            if p.stat().st_size != int(meta["size"]):
                return f"size mismatch for {rel}"
            if _sha256(p) != meta["sha256"]:
                return f"sha256 mismatch for {rel}"
        except (OSError, KeyError, TypeError, ValueError) as e:
            return f"cannot check {rel}: {e}"
    for required in ("trainer_state.json", "config.yaml", "rng.pt", f"{MODEL_SUBDIR}/config.json"):
        if required not in files:
            return f"manifest does not list {required}"
    return None


def quarantine_checkpoint(path: Path, reason: str) -> Path | None:
    """Move a bad ``step-*`` directory to ``checkpoints/quarantine/<name>-<unix time>`` (never deletes it) and log
    where; returns the new path (None if it could not be moved: it is then left in place)."""
    qdir = path.parent / QUARANTINE_DIR
    dest = qdir / f"{path.name}-{int(time.time())}"
    try:
        qdir.mkdir(exist_ok=True)
        while dest.exists():
            dest = dest.with_name(dest.name + "x")
        os.rename(path, dest)
    except OSError as e:
        logger.error("checkpoint %s is corrupt (%s) and could not be moved aside: %s", path, reason, e)
        return None
    logger.warning("checkpoint %s is corrupt (%s); moved it to %s (kept for inspection, never loaded)", path, reason,
                   dest)
    return dest


def corrupt_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The quarantined checkpoints of ``run_dir`` (``checkpoints/quarantine/*``), oldest name first."""
    q = Path(run_dir) / CHECKPOINT_DIR / QUARANTINE_DIR
    return sorted(p for p in q.iterdir() if p.is_dir()) if q.is_dir() else []


def load_latest_checkpoint(run_dir: str | os.PathLike, quarantine: bool = False) -> CheckpointInfo | None:
    """The newest checkpoint of ``run_dir`` that verifies, or ``None`` if there is none.

    Candidates are the ``step-XXXXXXXX`` directories (never ``.tmp-*``), newest step first. Each is verified
    against its manifest (:func:`verify_checkpoint`); a failing one is skipped with a logged warning and
    recorded in ``CheckpointInfo.skipped``. The ``latest`` pointer is advisory: a complete checkpoint newer
    than the pointer (crash between the rename and the pointer update) is used, and a disagreement is logged.

    Args:
        run_dir: the run directory.
        quarantine: move each failing checkpoint aside (:func:`quarantine_checkpoint`); only for the process that
            holds the run directory (readers such as ``swarmnode eval`` leave them in place).
    """
    root = Path(run_dir) / CHECKPOINT_DIR
    skipped: list[tuple[Path, str]] = []
    pointer = None
    if (root / LATEST).is_file():
        try:
            pointer = (root / LATEST).read_text(encoding="utf-8").strip()
        except OSError:
            pointer = None
    for step, path in _step_dirs(root):
        reason = verify_checkpoint(path)
        if reason is not None:
            moved = quarantine_checkpoint(path, reason) if quarantine else None
            if moved is None:
                logger.warning("skipping checkpoint %s: %s", path, reason)
            skipped.append((moved or path, reason))
            continue
        if pointer is not None and pointer != path.name:
            logger.warning("checkpoint pointer %r disagrees with newest valid checkpoint %s", pointer, path.name)
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
        return CheckpointInfo(
            path=path,
            step=int(state.get("step", step)),
            model_path=path / MODEL_SUBDIR,
            config_yaml=(path / "config.yaml").read_text(encoding="utf-8"),
            extra=dict(state.get("extra") or {}),
            manifest=manifest,
            skipped=skipped,
        )
    if skipped:
        logger.warning("no valid checkpoint in %s (%d skipped)", root, len(skipped))
    return None


def load_training_state(
    info: CheckpointInfo,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    map_location: str | torch.device | None = None,
) -> None:
    """Load the optimizer and scheduler states of ``info`` into the given objects.

    Raises:
        CheckpointError: the checkpoint has no state for a given object.
    """
    for obj, fname in ((optimizer, "optimizer.pt"), (scheduler, "scheduler.pt")):
        if obj is None:
            continue
        p = info.path / fname
        if not p.is_file():
            raise CheckpointError(f"checkpoint {info.path} has no {fname}")
        obj.load_state_dict(torch.load(p, map_location=map_location, weights_only=True))


def load_model_weights(info: CheckpointInfo, model: torch.nn.Module) -> None:
    """Load the checkpoint's safetensors weights into an existing model of the same architecture.

    Tied parameters (e.g. ``lm_head.weight`` tied to the embeddings, stored once) may be absent from the
    file; any other missing or unexpected key raises.

    Raises:
        CheckpointError: no safetensors file, or keys that do not match the model.
    """
    from safetensors.torch import load_file

    files = sorted(info.model_path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no .safetensors weights in {info.model_path}")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    result = model.load_state_dict(sd, strict=False)
    if result.unexpected_keys:
        raise CheckpointError(f"checkpoint weights have keys the model lacks: {result.unexpected_keys[:5]}")
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded_ptrs = {params[k].data_ptr() for k in sd if k in params}
    really_missing = [k for k in result.missing_keys if k not in params or params[k].data_ptr() not in loaded_ptrs]
    really_missing = [k for k in really_missing if k in params]  # buffers (e.g. rotary inv_freq) are rebuilt
    if really_missing:
        raise CheckpointError(f"checkpoint weights miss model parameters: {really_missing[:5]}")


def restore_rng(info: CheckpointInfo) -> None:
    """Restore the python / numpy / torch (and CUDA) RNG states saved in ``info``."""
    p = info.path / "rng.pt"
    if not p.is_file():
        raise CheckpointError(f"checkpoint {info.path} has no rng.pt")
    set_rng_state(torch.load(p, weights_only=True))


# ------------------------------------------------------------------------------------------ resume with a changed config
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
