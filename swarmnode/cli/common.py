"""What every command shares: the console, the one-line error exit, config loading, task building and logging.

Every command module imports its helpers from here; importing this module first also sets the OpenMP wait policy
(before anything imports torch).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import typer
from rich.console import Console

from swarmnode.config import ConfigError, RunConfig, load_config
from swarmnode.policy.threads import passive_openmp_wait

passive_openmp_wait()  # before anything imports torch: waiting OpenMP threads sleep instead of spinning

if TYPE_CHECKING:  # the heavy modules load lazily, inside the commands that need them
    from swarmnode.tasks.mix import TaskMix

console = Console(stderr=False, soft_wrap=True)  # never wrap a line: errors, paths and addresses stay copy-pasteable


def _fail(msg: str, code: int = 2) -> None:
    """Print ``error: <msg>`` (plain text, never markup) and exit with ``code`` (2: a usage, configuration or
    start-up error). Raises :class:`typer.Exit`; never returns."""
    from rich.markup import escape

    console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False)  # a message is text, never markup
    raise typer.Exit(code)


def _load(config: Optional[Path], overrides: dict) -> RunConfig:
    """The config of YAML file ``config`` (``None``: the packaged default) with the flags' ``overrides`` (dotted key
    path -> value; ``None`` values are not set). A :class:`ConfigError` is one error line and exit 2."""
    try:
        return load_config(config, overrides)
    except ConfigError as e:
        _fail(str(e))
        raise  # unreachable


def _build_tasks(cfg: RunConfig, config: Optional[Path]) -> tuple[TaskMix, dict[str, TaskMix]]:
    """The task mix and the ``tasks.probes`` mixes of ``cfg``. A source that cannot be built (an unknown dataset,
    a bad dataset config, an unreadable JSONL file, a ``max_answer_share`` its answers cannot meet) is a
    configuration error: exit 2 with a message naming the config file (when one was given) and the key."""
    from swarmnode.tasks.mix import TaskMix

    try:
        return (TaskMix.from_config(cfg.tasks, base_dir=Path.cwd()),
                TaskMix.probes_from_config(cfg.tasks, base_dir=Path.cwd()))
    except (ValueError, OSError) as e:
        _fail(f"invalid configuration{f' in {config}' if config is not None else ''}:\n  {e}")
        raise  # unreachable


@contextlib.contextmanager
def _held_logs(level: int) -> Iterator[list[logging.LogRecord]]:
    """Hold the log records (``level`` and above) emitted inside, before logging is set up (``node.log`` is not
    open yet); :func:`_replay_logs` hands them to the handlers set up later."""
    held: list[logging.LogRecord] = []

    class _Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append(record)

    root, hold = logging.getLogger(), _Hold(level)
    prev = root.level
    root.addHandler(hold)
    root.setLevel(level)
    try:
        yield held
    finally:
        root.removeHandler(hold)
        root.setLevel(prev)


def _replay_logs(records: list[logging.LogRecord]) -> None:
    """Hand the ``records`` held by :func:`_held_logs` to the handlers set up since (``node.log``, the terminal)."""
    for rec in records:
        logging.getLogger(rec.name).handle(rec)


def _setup_logging(run_dir: Path | None, verbose: bool, swarm: bool = False) -> None:
    """Structured rotating ``node.log`` in the run dir, warnings on the terminal, rate-limited third-party noise."""
    from swarmnode.monitor.logs import setup_logging

    setup_logging(run_dir, verbose, console=console if run_dir is not None else None, swarm=swarm)
