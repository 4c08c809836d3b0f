"""``status.json`` in a node's run directory: written atomically (:func:`write_status_file`), read back only when
it is a node's (:func:`read_status_file`, :func:`is_status_document`), marked when the process exits at start-up
(:func:`mark_start_failure`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from swarmnode.monitor.metrics import _clean
from swarmnode.monitor.status.document import STATUS_KIND

__all__ = ["STATUS_FILE", "is_status_document", "mark_start_failure", "read_status_file", "write_status_file"]

STATUS_FILE = "status.json"
"""The status document's file name in a node's run directory."""


def write_status_file(run_dir: str | os.PathLike, status: dict[str, Any], fsync: bool = False) -> None:
    """Atomically write ``run_dir/status.json`` (temp file in the same directory, then ``os.replace``).

    ``fsync`` also flushes it to disk first (not needed for readers on the same machine).
    """
    p = Path(run_dir) / STATUS_FILE
    tmp = p.with_name(f".{STATUS_FILE}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(_clean(status), f)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, p)


def is_status_document(data: Any) -> bool:
    """Whether ``data`` is a swarmnode node's status document (``kind`` :data:`STATUS_KIND`, a ``node`` with a pid)."""
    return (isinstance(data, dict) and data.get("kind") == STATUS_KIND and isinstance(data.get("node"), dict)
            and isinstance(data["node"].get("pid"), int) and isinstance(data.get("state"), str))


def mark_start_failure(run_dir: str | os.PathLike, code: int, reason: str) -> bool:
    """Record in ``status.json`` that this process exited at start-up with ``code`` because of ``reason`` (a
    configuration or environment error, already printed): state ``stopped`` with ``exit {code, reason}``, so that
    ``swarmnode status`` says why instead of "killed or crashed".

    Only a document written by this process (its ``node.pid``) is changed; returns whether it was."""
    doc = read_status_file(run_dir)
    if not doc or (doc.get("node") or {}).get("pid") != os.getpid():
        return False
    if doc.get("state") == "stopped" and (doc.get("exit") or {}).get("code") not in (None, 0):
        return False  # a stop with its own non-zero reason (signal, disk) stays; a clean close on the way out does not
    doc.update({"state": "stopped", "phase": None, "updated_at": time.time(),
                "exit": {"code": int(code), "reason": f"did not start: {reason}"}})
    try:
        write_status_file(run_dir, doc)
    except OSError:
        return False
    return True


def read_status_file(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """Read ``run_dir/status.json``; ``None`` if missing, unreadable or not a node's (:func:`is_status_document`)."""
    try:
        data = json.loads((Path(run_dir) / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if is_status_document(data) else None
