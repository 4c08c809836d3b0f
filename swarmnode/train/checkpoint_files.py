"""The on-disk layout of checkpoints: names, the manifest check, the quarantine and its listing.

What :mod:`swarmnode.train.checkpoint` writes and reads (its module docstring shows the layout of
``<run_dir>/checkpoints/``): the ``step-XXXXXXXX`` directory names, :class:`CheckpointInfo`,
:func:`verify_checkpoint` (every file the manifest lists present with the right size and SHA-256),
:func:`quarantine_checkpoint` (a failing checkpoint moved to ``quarantine/``, never deleted) and
:func:`corrupt_checkpoints` (what the quarantine holds), with the fsync and atomic-write helpers the save uses.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the checkpoint logger: these messages are the checkpoint module's (log filters and tests name it)
logger = logging.getLogger("swarmnode.train.checkpoint")

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


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    out = []
    if not root.is_dir():
        return out
    for p in root.iterdir():
        m = STEP_RE.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out, reverse=True)


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


# ------------------------------------------------------------------------------------------ verify, quarantine, list
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
