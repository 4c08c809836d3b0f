"""Optional metric sinks beside ``metrics.jsonl`` and Prometheus: TensorBoard and Weights & Biases (TRL's
``report_to``).

``report_to: [tensorboard]`` writes event files to ``<run_dir>/tensorboard/`` (``tensorboard --logdir
<run_dir>/tensorboard``); ``report_to: [wandb]`` logs to a W&B run in ``<run_dir>/wandb/``, **offline** unless
``WANDB_MODE`` says otherwise (``wandb sync <run_dir>/wandb/offline-run-*`` uploads it later; ``WANDB_MODE=online``
and a ``wandb login`` log live; ``WANDB_PROJECT`` names the project, default ``swarmnode``). Both are optional
extras (``pip install 'swarmnode[tensorboard]'`` / ``'swarmnode[wandb]'``); a sink whose package is missing is a
configuration error at start-up, naming the extra. Every numeric value of a step record is logged under its
metrics key (``reward``, ``train/loss``, ...), step = the optimizer step; evaluations as ``eval/accuracy`` and
``eval/<task>``.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any, Sequence

log = logging.getLogger(__name__)

SINKS = ("tensorboard", "wandb")


class ReporterError(ValueError):
    """A ``report_to`` sink cannot start (its optional package is missing); the message names the extra."""


def _scalars(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in record.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[prefix + k] = float(v)
        elif isinstance(v, dict) and k in ("time", "per_task"):
            out.update(_scalars(v, f"{prefix}{k}/"))
    return out


class Reporters:
    """The configured sinks; :meth:`step` and :meth:`evaluation` log to each, :meth:`close` flushes.

    Args:
        sinks: names from :data:`SINKS` (``RunConfig.report_to``).
        run_dir: the node's run directory (where the sinks write).
        config: the run configuration as a plain dict (W&B stores it with the run).

    Raises:
        ReporterError: a sink's package is missing.
        ValueError: an unknown sink name.
    """

    def __init__(self, sinks: Sequence[str], run_dir: str | os.PathLike, config: dict[str, Any] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self._tb: Any = None
        self._wandb: Any = None
        for s in sinks:
            if s not in SINKS:
                raise ValueError(f"report_to: unknown sink {s!r}; expected one of {', '.join(SINKS)}")
        if "tensorboard" in sinks:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ReporterError(f"report_to: tensorboard needs the tensorboard package ({e}): pip install "
                                    "'swarmnode[tensorboard]', or remove tensorboard from report_to") from None
            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        if "wandb" in sinks:
            try:
                import wandb
            except ImportError as e:
                raise ReporterError(f"report_to: wandb needs the wandb package ({e}): pip install "
                                    "'swarmnode[wandb]', or remove wandb from report_to") from None
            (self.run_dir / "wandb").mkdir(parents=True, exist_ok=True)
            self._wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "swarmnode"), dir=str(self.run_dir),
                                     name=self.run_dir.name, config=config or {}, resume="allow",
                                     mode=os.environ.get("WANDB_MODE", "offline"))

    @property
    def active(self) -> bool:
        return self._tb is not None or self._wandb is not None

    def step(self, record: dict[str, Any]) -> None:
        """Log one ``metrics.jsonl`` step record (its numeric values) at its ``step``."""
        if not self.active:
            return
        step = int(record.get("step", 0))
        values = {k: v for k, v in _scalars(record).items() if k not in ("step", "unix_time")}
        self._log(values, step)

    def evaluation(self, tag: str, step: int, accuracy: float, per_task: dict[str, float] | None) -> None:
        """Log a held-out evaluation: ``eval/accuracy`` and ``eval/<task>`` at ``step`` (``tag`` only in W&B)."""
        if not self.active:
            return
        values = {"eval/accuracy": float(accuracy)}
        values.update({f"eval/{k}": float(v) for k, v in (per_task or {}).items() if isinstance(v, (int, float))})
        self._log(values, int(step))

    def _log(self, values: dict[str, float], step: int) -> None:
        try:
            if self._tb is not None:
                for k, v in values.items():
                    self._tb.add_scalar(k, v, step)
                self._tb.flush()
            if self._wandb is not None:
                self._wandb.log(values, step=step)
        except Exception:  # noqa: BLE001 - a sink must never stop training
            log.warning("report_to: logging to a sink failed; metrics.jsonl keeps every value", exc_info=True)

    def close(self) -> None:
        """Flush and close every sink (idempotent)."""
        tb, self._tb = self._tb, None
        wb, self._wandb = self._wandb, None
        try:
            if tb is not None:
                tb.close()
            if wb is not None:
                wb.finish()
        except Exception:  # noqa: BLE001
            log.warning("report_to: closing a sink failed", exc_info=True)
