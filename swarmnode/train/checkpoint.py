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

This module saves and loads; the layout, the manifest check and the quarantine are
:mod:`swarmnode.train.checkpoint_files`, resuming with a changed config :mod:`swarmnode.train.resume` (both
re-exported here).
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from swarmnode.policy.loading import POLICY_META_FILE
from swarmnode.train.checkpoint_files import (
    CHECKPOINT_DIR,
    FORMAT_VERSION,
    LATEST,
    MANIFEST,
    MODEL_SUBDIR,
    QUARANTINE_DIR,
    STEP_RE,
    CheckpointError,
    CheckpointInfo,
    _files_under,
    _fsync_dir,
    _fsync_file,
    _pid_alive,
    _sha256,
    _step_dirs,
    _tmp_pid,
    _write_text_atomic,
    corrupt_checkpoints,
    quarantine_checkpoint,
    step_dir_name,
    verify_checkpoint,
)
from swarmnode.train.resume import (
    ALLOW_CHANGE_FLAG,
    RESUME_FIXED_KEYS,
    RESUME_FREE_KEYS,
    ConfigChangedError,
    apply_optimizer_config,
    check_resume_config,
    config_changes,
    resume_config_changes,
    resync_learning_rate,
)

__all__ = [
    "ALLOW_CHANGE_FLAG", "CHECKPOINT_DIR", "FORMAT_VERSION", "LATEST", "MANIFEST", "MODEL_SUBDIR", "QUARANTINE_DIR",
    "RESUME_FIXED_KEYS", "RESUME_FREE_KEYS", "STEP_RE", "CheckpointError", "CheckpointInfo", "ConfigChangedError",
    "apply_optimizer_config", "check_resume_config", "config_changes", "corrupt_checkpoints", "load_latest_checkpoint",
    "load_model_weights", "load_training_state", "quarantine_checkpoint", "restore_rng", "resume_config_changes",
    "resync_learning_rate", "rng_state", "save_checkpoint", "set_rng_state", "step_dir_name", "verify_checkpoint",
]

logger = logging.getLogger(__name__)


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


# ------------------------------------------------------------------------------------------ load
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
